//! The token store: failed operations, tokens found in another state than expected,
//! waits behind another owner's lease, expired rows purged.

use std::fmt::Display;

use opentelemetry::KeyValue;

use super::InternalEvent;
use crate::telemetry::metrics::metrics;

/// A token operation failed (`payment_worker.atomic_operation.failures`). No log
/// line: each caller logs what the failure means where it happened.
pub struct TokenOperationFailed {
    /// `reserve`, `extend`, `confirm`, `restore`.
    pub operation: &'static str,
    /// `unavailable` (retryable) or `corrupt`.
    pub reason: &'static str,
}

impl InternalEvent for TokenOperationFailed {
    fn emit(self) {
        metrics().atomic_operation_failures.add(
            1,
            &[
                KeyValue::new("operation", self.operation),
                KeyValue::new("reason", self.reason),
            ],
        );
    }
}

/// Which settle the store refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleTransition {
    /// `processing → completed`, after the payment's commit.
    Confirm,
    /// `processing → pending`, after an attempt that charged nothing.
    Restore,
}

/// The store refused to settle a token this attempt held: another owner has it now
/// (`payment_worker.token.inconsistencies`, expected `processing`, actual `not_owned`).
pub struct SettleRefused<'a> {
    /// The token's key (written by its own `Display`, which redacts card numbers).
    pub key: &'a dyn Display,
    /// Which settle.
    pub transition: SettleTransition,
}

impl InternalEvent for SettleRefused<'_> {
    fn emit(self) {
        count_inconsistency("processing", "not_owned");
        match self.transition {
            SettleTransition::Confirm => tracing::warn!(
                idempotency_key = %self.key,
                "confirm refused: lease lost after commit; the next owner will find the row"
            ),
            SettleTransition::Restore => {
                tracing::warn!(idempotency_key = %self.key, "restore refused: lease lost")
            }
        }
    }
}

/// `audit --repair` corrected a token found in another state than the payments say
/// (`payment_worker.token.inconsistencies`); the log line is what operators alert on.
pub struct TokenInconsistencyRepaired<'a> {
    /// The token's key.
    pub key: &'a dyn Display,
    /// The state the payments imply.
    pub expected: &'static str,
    /// The state found.
    pub actual: &'static str,
}

impl InternalEvent for TokenInconsistencyRepaired<'_> {
    fn emit(self) {
        count_inconsistency(self.expected, self.actual);
        tracing::warn!(
            idempotency_key = %self.key,
            expected = self.expected,
            actual = self.actual,
            "token inconsistency repaired"
        );
    }
}

fn count_inconsistency(expected: &'static str, actual: &'static str) {
    metrics().token_inconsistencies.add(
        1,
        &[
            KeyValue::new("expected", expected),
            KeyValue::new("actual", actual),
        ],
    );
}

/// A wait behind another owner's lease ended (`payment_worker.token.settle_waits`).
pub struct SettleWaitEnded {
    /// What ended it: `notification`, `already_settled`, `listener_reconnected`,
    /// `backoff`, `drain`.
    pub woken_by: &'static str,
}

impl InternalEvent for SettleWaitEnded {
    fn emit(self) {
        metrics()
            .settle_waits
            .add(1, &[KeyValue::new("woken_by", self.woken_by)]);
    }
}

/// One purge statement deleted expired token rows (`payment_worker.tokens.purged`).
pub struct TokensPurged {
    /// Rows deleted.
    pub count: u64,
}

impl InternalEvent for TokensPurged {
    fn emit(self) {
        metrics().tokens_purged.add(self.count, &[]);
    }
}
