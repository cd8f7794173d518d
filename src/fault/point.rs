//! The points of the payment path where a test build can crash, freeze or pause an
//! attempt. The names exist only where the hooks do (feature `fault-injection`).

/// A point of the payment path where a test can crash, freeze or pause an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPoint {
    /// Token reserved, transaction not begun.
    AfterReserve,
    /// `processing` row inserted (uncommitted), gateway not called.
    AfterInsert,
    /// Stripe gateway: PaymentIntent created and its id recorded, not confirmed.
    AfterCreate,
    /// Gateway charged, transaction not committed.
    AfterCharge,
    /// Transaction committed, token not confirmed.
    AfterCommit,
    /// Result (and dead letter) published, the command not yet settled: its offset
    /// not stored, in exactly-once mode its answer in the open transaction. A `Fail`
    /// armed here does nothing: there is no step left to fail.
    AfterAnswer,
}

#[cfg(feature = "fault-injection")]
impl FaultPoint {
    /// The point `PAYMENT_WORKER_FAULT` names (`after_reserve`, …); `None` for anything else.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "after_reserve" => Some(Self::AfterReserve),
            "after_insert" => Some(Self::AfterInsert),
            "after_create" => Some(Self::AfterCreate),
            "after_charge" => Some(Self::AfterCharge),
            "after_commit" => Some(Self::AfterCommit),
            "after_answer" => Some(Self::AfterAnswer),
            _ => None,
        }
    }

    /// The point's name, as `PAYMENT_WORKER_FAULT` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AfterReserve => "after_reserve",
            Self::AfterInsert => "after_insert",
            Self::AfterCreate => "after_create",
            Self::AfterCharge => "after_charge",
            Self::AfterCommit => "after_commit",
            Self::AfterAnswer => "after_answer",
        }
    }
}
