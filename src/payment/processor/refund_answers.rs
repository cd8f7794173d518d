//! A refund's answers that come from its row rather than the gateway: a duplicate,
//! a reused key, a missing token, a refusal before anything was reserved.

use super::*;
use crate::payment::refunds::{self, RefundRecord, RefundStatus};

/// Why a refund waits: its payment is not booked (yet). Retried within the budget;
/// when the budget runs out the refund is rejected `payment_unknown`.
pub const WAITING_FOR_PAYMENT: &str =
    "payment_unknown: no payment is booked under payment_idempotency_key (yet)";

impl Processor {
    /// A refund token already completed: a duplicate when its row says so.
    pub(super) async fn decide_refund_completed(
        &self,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        stored: Option<String>,
    ) -> Attempt {
        if stored.is_some_and(|stored| stored != fingerprint.as_str()) {
            return key_reused().into();
        }
        match self.find_refund(key).await {
            Ok(Some(row)) if row.fingerprint != *fingerprint => key_reused().into(),
            Ok(Some(row)) if row.status != RefundStatus::Processing => final_answer_of(&row).into(),
            // Completed by a holder whose row is not visible: read again shortly.
            Ok(_) => retry("refund token completed before its row shows"),
            Err(error) => database_failure("refund look-up", &error),
        }
    }

    /// No token (`issued` mode): a final row answers; a reservation without a token
    /// cannot be continued (it may have been sent), so it is answered as unbooked,
    /// flagged and listed for `audit`; no row means nothing was ever sent.
    pub(super) async fn recover_refund(
        &self,
        command: &RefundCommand,
        fingerprint: &Fingerprint,
        absence: Absence,
    ) -> Attempt {
        match self.find_refund(&command.idempotency_key).await {
            Ok(Some(row)) if row.fingerprint != *fingerprint => key_reused().into(),
            Ok(Some(row)) if row.status != RefundStatus::Processing => final_answer_of(&row).into(),
            Ok(Some(_)) => Attempt::Unbooked(Outcome::Rejected {
                kind: RejectionKind::TokenMissing,
                reason:
                    "token_missing: the refund's token is gone while its refund may have been sent"
                        .to_owned(),
            }),
            Ok(None) => Attempt::Final(Outcome::Rejected {
                kind: RejectionKind::TokenMissing,
                reason: match absence {
                    Absence::Missing => "token_missing: never issued, expired, or already consumed",
                    Absence::ExpiredWhileHeld => {
                        "token_missing: expired while held, before its refund was reserved"
                    }
                }
                .to_owned(),
            }),
            Err(error) => database_failure("refund look-up", &error),
        }
    }

    /// A refund refused for good outside an attempt (its payment never showed within
    /// the retry budget), kept as a `rejected` row so that every later delivery gets
    /// the same answer. A key that has a row already keeps it, and that row answers
    /// instead: another delivery may have refunded it meanwhile (the payment booked
    /// just after this one's last attempt), and "no payment" would then be false
    /// (`Some` is that answer). Best effort: a failure is logged, and a later
    /// delivery decides afresh.
    pub async fn keep_refund_refusal(
        &self,
        command: &RefundCommand,
        reason: &str,
    ) -> Option<Outcome> {
        let fingerprint = command.fingerprint();
        let kept = async {
            let _slot = self.slot().await;
            let mut conn = self.pool.acquire().await?;
            let stall = Stall::default();
            let kept = stall
                .bounded("keeping the refund's refusal", async {
                    let kept =
                        refunds::record_rejection(&mut conn, command, &fingerprint, None, reason)
                            .await?;
                    match kept {
                        Some(_) => Ok(None),
                        None => {
                            refunds::find_refund(&mut conn, command.idempotency_key.as_str()).await
                        }
                    }
                })
                .await;
            stall.release(conn);
            kept
        }
        .await;
        match kept {
            Ok(None) => None,
            Ok(Some(row)) if row.fingerprint != fingerprint => Some(key_reused()),
            Ok(Some(row)) if row.status == RefundStatus::Processing => Some(Outcome::Rejected {
                kind: RejectionKind::RetriesExhausted,
                reason: format!(
                    "retries_exhausted: {reason}; another delivery of this refund holds it \
                     now, and its answer is the refund's"
                ),
            }),
            Ok(Some(row)) => Some(final_answer_of(&row)),
            Err(error) => {
                tracing::warn!(
                    idempotency_key = %command.idempotency_key, %error,
                    "could not keep the refund's refusal; a later delivery decides afresh"
                );
                None
            }
        }
    }

    async fn find_refund(&self, key: &IdempotencyKey) -> Result<Option<RefundRecord>, sqlx::Error> {
        let mut conn = self.pool.acquire().await?;
        let stall = Stall::default();
        let found = stall
            .bounded(
                "refund look-up",
                refunds::find_refund(&mut conn, key.as_str()),
            )
            .await;
        stall.release(conn);
        found
    }
}

/// The final answer of a refund the gateway answered.
pub(super) fn refund_outcome(row: &RefundRecord, answer: &Charge) -> Outcome {
    let transaction_id = answer.transaction_id.clone();
    match answer.status {
        ChargeStatus::Approved => Outcome::Refunded {
            payment_id: row.payment_id.unwrap_or_default(),
            refund_id: row.id,
            transaction_id,
        },
        ChargeStatus::Declined => Outcome::RefundDeclined {
            payment_id: row.payment_id.unwrap_or_default(),
            refund_id: row.id,
            transaction_id,
        },
    }
}

/// A final refund row's answer, repeated: a duplicate of what the gateway answered,
/// or the refusal it keeps.
pub(super) fn final_answer_of(row: &RefundRecord) -> Outcome {
    let outcome = match row.status {
        RefundStatus::Refunded => "refunded",
        RefundStatus::Declined => "refund_declined",
        RefundStatus::Rejected | RefundStatus::Processing => {
            return Outcome::Rejected {
                kind: RejectionKind::Invalid,
                reason: row
                    .failure_reason
                    .clone()
                    .unwrap_or_else(|| "refund refused".to_owned()),
            }
        }
    };
    // A refunded or declined row always has its payment (only a refusal kept for
    // want of one has none, answered above).
    let payment_id = row.payment_id.unwrap_or_default();
    Outcome::Duplicate {
        payment_id,
        original: Some(Box::new(OriginalAnswer {
            outcome: outcome.to_owned(),
            payment_id,
            gateway_transaction_id: row.gateway_transaction_id.clone(),
            refund_id: Some(row.id),
        })),
    }
}
