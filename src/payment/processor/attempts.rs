//! How an attempt's result is spelled: retries with what they learnt about a charge,
//! final outcomes, and what a row already decided.

use super::*;

/// A retry that learnt nothing new about a charge at the gateway.
pub(super) fn retry(reason: impl Into<String>) -> Attempt {
    retry_knowing(ChargeEvidence::Unchanged, reason)
}

pub(super) fn retry_knowing(charge: ChargeEvidence, reason: impl Into<String>) -> Attempt {
    Attempt::Retry {
        after: Duration::ZERO,
        reason: reason.into(),
        charge,
    }
}

/// A retry after which a charge may exist that no committed row records.
pub(super) fn retry_unknown(reason: impl Into<String>) -> Attempt {
    retry_knowing(ChargeEvidence::MayHaveCharged, reason)
}

pub(super) fn final_outcome(payment_id: Uuid, charge: &Charge) -> Outcome {
    let transaction_id = charge.transaction_id.clone();
    match charge.status {
        ChargeStatus::Approved => Outcome::Succeeded {
            payment_id,
            transaction_id,
        },
        ChargeStatus::Declined => Outcome::Declined {
            payment_id,
            transaction_id,
        },
    }
}

/// A failed database call as an attempt's end: retried while it may pass, final when its
/// SQLSTATE says it never will (a NUL in text, a refused constraint, our own SQL).
/// The reason names the SQLSTATE, not the server's message, which may quote data.
pub(super) fn database_failure(what: &str, error: &sqlx::Error) -> Attempt {
    let code = match error {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    }
    .unwrap_or_default();
    match classify_sqlx(error) {
        DatabaseFailure::Retryable => retry(format!("{what} failed: {error}")),
        DatabaseFailure::RefusedData => Attempt::Final(Outcome::Rejected {
            kind: RejectionKind::Invalid,
            reason: format!("database_refused: the database refused the command's data ({what}, SQLSTATE {code})"),
        }),
        DatabaseFailure::Bug => {
            tracing::error!(sqlstate = %code, what, "database error that retrying cannot fix");
            Attempt::Final(Outcome::Rejected {
                kind: RejectionKind::Internal,
                reason: format!("database_error: {what} failed with SQLSTATE {code}"),
            })
        }
    }
}

/// A failed database call after the gateway charged: the charge stands, so a retry
/// must look it up ([`retry_unknown`]); a final refusal is our own failure to book it
/// (`internal`): the answer says the charge is unbooked, and the token is left to its
/// lease, so a later delivery of the command looks the charge up.
pub(super) fn database_failure_after_charge(what: &str, error: &sqlx::Error) -> Attempt {
    match database_failure(what, error) {
        Attempt::Retry { reason, .. } => retry_unknown(reason),
        Attempt::Final(Outcome::Rejected { reason, .. }) => Attempt::Unbooked(Outcome::Rejected {
            kind: RejectionKind::Internal,
            reason: format!("{reason}; the gateway charged and no payment row records it"),
        }),
        other => other,
    }
}

/// The provenance an attempt writes on its payment row: the command's source, and
/// the trace and span current where the row is written (the ones that charge), so a
/// later duplicate can link to them. An attempt writes at most one row, either the
/// usual one under its reservation (`fence` of the claim) or a recovered charge
/// (`fence` 0); both build it here.
pub(super) fn row_context<'a>(context: &CommandContext<'a>, fence: u64) -> RowContext<'a> {
    let ids = crate::telemetry::trace_ids(&tracing::Span::current());
    let (trace_id, span_id) = match ids {
        Some((trace_id, span_id)) => (Some(trace_id), Some(span_id)),
        None => (None, None),
    };
    RowContext {
        source: context.source,
        trace_id: context.trace_id.map(str::to_owned).or(trace_id),
        span_id,
        fence,
    }
}

pub(super) fn key_reused() -> Outcome {
    Outcome::Rejected {
        kind: RejectionKind::KeyReused,
        reason: "idempotency_key_reused: the key was already used for a different request"
            .to_owned(),
    }
}

/// A row that already exists for the key decides the command (invariant I6).
pub(super) fn outcome_for_existing(existing: &PaymentRecord, fingerprint: &Fingerprint) -> Outcome {
    if &existing.fingerprint != fingerprint {
        key_reused()
    } else {
        Outcome::Duplicate {
            payment_id: existing.id,
            original: original_answer(existing).map(Box::new),
        }
    }
}

/// The answer a final row gave the first time (none for a row still `processing`).
pub(super) fn original_answer(row: &PaymentRecord) -> Option<OriginalAnswer> {
    (row.status != PaymentStatus::Processing).then(|| OriginalAnswer {
        outcome: row.status.as_str().to_owned(),
        payment_id: row.id,
        gateway_transaction_id: row.gateway_transaction_id.clone(),
        refund_id: None,
    })
}
