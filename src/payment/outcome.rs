use std::time::Duration;

use uuid::Uuid;

/// Why a command was refused for good; the `x-error-kind` of its dead-letter record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectionKind {
    /// The command breaks a rule of a command.
    Invalid,
    /// `issued` mode: the token was never issued, expired, or was consumed.
    TokenMissing,
    /// The idempotency key was already used for a different request.
    KeyReused,
    /// Transient failures outlasted the retry budget; the token was restored.
    RetriesExhausted,
    /// The worker itself failed on this record: a database error that says our own
    /// code is wrong (SQLSTATE class 42), or a panic while handling it three times.
    Internal,
}

impl RejectionKind {
    /// Every kind, in the order the docs list them.
    pub const ALL: [Self; 5] = [
        Self::Invalid,
        Self::TokenMissing,
        Self::KeyReused,
        Self::RetriesExhausted,
        Self::Internal,
    ];

    /// The rejection's code in results and dead letters (`invalid`, `key_reused`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Invalid => "invalid",
            Self::TokenMissing => "token_missing",
            Self::KeyReused => "key_reused",
            Self::RetriesExhausted => "retries_exhausted",
            Self::Internal => "internal",
        }
    }
}

/// The final answer a command got the first time, as a duplicate repeats it: a
/// consumer that missed the first result still learns what happened.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OriginalAnswer {
    /// `succeeded` or `declined`.
    pub outcome: String,
    /// The payment's id.
    pub payment_id: Uuid,
    /// The gateway's transaction id, when the first answer charged (or refunded).
    pub gateway_transaction_id: Option<String>,
    /// The refund's id, when the command was a refund (`outcome` is then
    /// `refunded` or `refund_declined`, and `payment_id` the payment refunded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refund_id: Option<Uuid>,
}

/// What happened to one command, for good: the only values a result or dead letter
/// is ever built from. A transient failure is an [`Attempt::Retry`] instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Charged; the row is committed `succeeded`.
    Succeeded {
        /// The payment's id.
        payment_id: Uuid,
        /// The gateway's transaction id.
        transaction_id: String,
    },
    /// Declined by the gateway; the row is committed `declined`.
    Declined {
        /// The payment's id.
        payment_id: Uuid,
        /// The gateway's transaction id.
        transaction_id: String,
    },
    /// Refunded; the refund's row is committed `refunded`.
    Refunded {
        /// The payment refunded.
        payment_id: Uuid,
        /// The refund's id.
        refund_id: Uuid,
        /// The gateway's id of the refund.
        transaction_id: String,
    },
    /// The gateway refused to refund; the refund's row is committed `declined`.
    RefundDeclined {
        /// The payment the refund was for.
        payment_id: Uuid,
        /// The refund's id.
        refund_id: Uuid,
        /// The gateway's id of the refusal.
        transaction_id: String,
    },
    /// Already handled: `payment_id` is the original payment, `original` its first
    /// answer (when its row could be read), repeated like a cached response.
    Duplicate {
        /// The payment's id.
        payment_id: Uuid,
        /// The first answer, read from the payment row (boxed: a duplicate is the
        /// rare answer, and every other one stays small).
        original: Option<Box<OriginalAnswer>>,
    },
    /// Final refusal: dead-lettered and answered, never retried.
    Rejected {
        /// Why, as a code.
        kind: RejectionKind,
        /// Why, in words.
        reason: String,
    },
}

/// What one attempt at a command came to: a final outcome, or a transient failure
/// to try again. Split from [`Outcome`] so that code building results and dead
/// letters never sees a value that is never published; only the retry loop (and the
/// `process` command's exit status) looks at `Retry`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// The command's answer, to be published.
    Final(Outcome),
    /// A final answer given while a charge the gateway made is booked nowhere: the
    /// database refused, for good, to record it. Published like `Final`, marked
    /// `x-charge-unknown`, and kept where `audit` lists it against the ledger.
    Unbooked(Outcome),
    /// A transient failure; the token was restored (or left to its lease when the
    /// outcome is unknown). Try again no sooner than `after`.
    Retry {
        /// Wait at least this long before the next attempt.
        after: Duration,
        /// What failed.
        reason: String,
        /// What this attempt learnt about a charge at the gateway.
        charge: ChargeEvidence,
    },
}

impl Attempt {
    /// The final outcome label, or `retry` (what `process` prints; a low-cardinality label).
    pub fn label(&self) -> &'static str {
        match self {
            Self::Final(outcome) | Self::Unbooked(outcome) => outcome.label(),
            Self::Retry { .. } => "retry",
        }
    }

    /// This attempt as it counts when `earlier` attempts (this delivery's, or the
    /// token's previous holder) may have charged: until an answer is booked the charge
    /// stays unknown. A retry keeps it so; a refusal that books nothing is answered
    /// as unbooked (flagged, and listed for `audit`). Answers a payment row gave are
    /// booked and never pass through here.
    pub fn knowing(self, earlier: ChargeEvidence) -> Self {
        match (self, earlier) {
            (Self::Retry { after, reason, .. }, ChargeEvidence::MayHaveCharged) => Self::Retry {
                after,
                reason,
                charge: ChargeEvidence::MayHaveCharged,
            },
            (Self::Final(rejected @ Outcome::Rejected { .. }), ChargeEvidence::MayHaveCharged) => {
                Self::Unbooked(rejected)
            }
            (attempt, _) => attempt,
        }
    }

    /// The final outcome, if this attempt reached one.
    pub fn into_final(self) -> Option<Outcome> {
        match self {
            Self::Final(outcome) | Self::Unbooked(outcome) => Some(outcome),
            Self::Retry { .. } => None,
        }
    }
}

impl From<Outcome> for Attempt {
    fn from(outcome: Outcome) -> Self {
        Self::Final(outcome)
    }
}

/// What an attempt that ended in [`Attempt::Retry`] learnt about a charge at the
/// gateway. The retry loop folds these over the attempts, so when its budget ends
/// it can tell whether an earlier attempt may have charged: such a dead letter
/// carries `x-charge-unknown: true` and `audit` lists its key against the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChargeEvidence {
    /// Nothing new: the attempt ended before reaching the gateway, the gateway
    /// refused it without charging, or a look-up found no charge (which says only
    /// that none shows yet). What earlier attempts learnt still stands.
    #[default]
    Unchanged,
    /// A charge may exist that no committed payment row records: an unknown outcome
    /// the look-up could not resolve, or a charge made but not committed.
    MayHaveCharged,
}

impl ChargeEvidence {
    /// `MayHaveCharged` when `unknown`, else `Unchanged`.
    pub fn from_unknown(unknown: bool) -> Self {
        if unknown {
            Self::MayHaveCharged
        } else {
            Self::Unchanged
        }
    }

    /// Whether a charge may exist unrecorded, given what was known before (`earlier`).
    pub fn may_have_charged(self, earlier: bool) -> bool {
        match self {
            Self::Unchanged => earlier,
            Self::MayHaveCharged => true,
        }
    }
}

impl Outcome {
    /// The `outcome` field of the results topic, and a low-cardinality metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Succeeded { .. } => "succeeded",
            Self::Declined { .. } => "declined",
            Self::Duplicate { .. } => "duplicate",
            Self::Rejected { .. } => "rejected",
            Self::Refunded { .. } => "refunded",
            Self::RefundDeclined { .. } => "refund_declined",
        }
    }

    /// The payment's id, for outcomes that have one.
    pub fn payment_id(&self) -> Option<Uuid> {
        match self {
            Self::Succeeded { payment_id, .. }
            | Self::Declined { payment_id, .. }
            | Self::Refunded { payment_id, .. }
            | Self::RefundDeclined { payment_id, .. }
            | Self::Duplicate { payment_id, .. } => Some(*payment_id),
            Self::Rejected { .. } => None,
        }
    }

    /// The refund's id, for a refund's answers.
    pub fn refund_id(&self) -> Option<Uuid> {
        match self {
            Self::Refunded { refund_id, .. } | Self::RefundDeclined { refund_id, .. } => {
                Some(*refund_id)
            }
            Self::Duplicate { original, .. } => original.as_ref().and_then(|o| o.refund_id),
            _ => None,
        }
    }

    /// The gateway's transaction id of an answer that has one.
    pub fn transaction_id(&self) -> Option<&str> {
        match self {
            Self::Succeeded { transaction_id, .. }
            | Self::Declined { transaction_id, .. }
            | Self::Refunded { transaction_id, .. }
            | Self::RefundDeclined { transaction_id, .. } => Some(transaction_id),
            Self::Duplicate { .. } | Self::Rejected { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retry(charge: ChargeEvidence) -> Attempt {
        Attempt::Retry {
            after: Duration::ZERO,
            reason: "gateway: 503".to_owned(),
            charge,
        }
    }

    fn refused() -> Outcome {
        Outcome::Rejected {
            kind: RejectionKind::Invalid,
            reason: "gateway_rejected: HTTP 400".to_owned(),
        }
    }

    #[test]
    fn what_was_known_before_an_attempt_stays_known_until_an_answer_is_booked() {
        let unknown = ChargeEvidence::MayHaveCharged;
        assert_eq!(
            retry(ChargeEvidence::Unchanged).knowing(unknown),
            retry(unknown)
        );
        assert_eq!(
            Attempt::Final(refused()).knowing(unknown),
            Attempt::Unbooked(refused())
        );
        let booked = Outcome::Succeeded {
            payment_id: Uuid::nil(),
            transaction_id: "txn_1".to_owned(),
        };
        assert_eq!(
            Attempt::Final(booked.clone()).knowing(unknown),
            Attempt::Final(booked)
        );
        // Nothing known before: the attempt counts as it is.
        let nothing = ChargeEvidence::Unchanged;
        assert_eq!(
            retry(nothing).knowing(nothing),
            retry(ChargeEvidence::Unchanged)
        );
        assert_eq!(
            Attempt::Final(refused()).knowing(nothing),
            Attempt::Final(refused())
        );
        assert_eq!(ChargeEvidence::from_unknown(true), unknown);
        assert_eq!(ChargeEvidence::from_unknown(false), nothing);
    }
}
