//! The outcome of one command as `process` prints it (one JSON line).

use uuid::Uuid;

use crate::payment::{Attempt, Outcome};

/// An outcome as `process` prints it.
#[derive(Debug, serde::Serialize)]
pub struct OutcomeView {
    /// `succeeded`, `declined`, `duplicate`, `rejected` or `retry`.
    pub outcome: &'static str,
    /// The payment's id, when there is one.
    pub payment_id: Option<Uuid>,
    /// The gateway transaction id, the rejection reason or why to retry.
    pub detail: Option<String>,
}

impl From<&Attempt> for OutcomeView {
    fn from(attempt: &Attempt) -> Self {
        match attempt {
            Attempt::Final(outcome) | Attempt::Unbooked(outcome) => outcome.into(),
            Attempt::Retry { reason, .. } => Self {
                outcome: attempt.label(),
                payment_id: None,
                detail: Some(reason.clone()),
            },
        }
    }
}

impl From<&Outcome> for OutcomeView {
    fn from(outcome: &Outcome) -> Self {
        let detail = match outcome {
            Outcome::Rejected { kind, reason } => Some(format!("{}: {reason}", kind.as_str())),
            other => other.transaction_id().map(str::to_owned),
        };
        Self {
            outcome: outcome.label(),
            payment_id: outcome.payment_id(),
            detail,
        }
    }
}
