//! The payment pool: how long a payment transaction waited for its connection.

use std::time::Duration;

use opentelemetry::KeyValue;

use super::InternalEvent;
use crate::telemetry::metrics::metrics;

/// A payment transaction's wait for its payment-pool connection ended, with a
/// connection or without (`payment_worker.db.pool.acquire`, by `result`: `ok`,
/// `timeout`, `error`). A wait that got nothing is logged.
pub struct PoolAcquireEnded<'a> {
    /// How long it waited.
    pub waited: Duration,
    /// Why no connection came, if none did.
    pub error: Option<&'a sqlx::Error>,
}

impl InternalEvent for PoolAcquireEnded<'_> {
    fn emit(self) {
        let result = match self.error {
            None => "ok",
            Some(sqlx::Error::PoolTimedOut) => "timeout",
            Some(_) => "error",
        };
        metrics().pool_acquire.record(
            self.waited.as_secs_f64(),
            &[KeyValue::new("result", result)],
        );
        if let Some(error) = self.error {
            tracing::warn!(
                pool_acquire_ms = u64::try_from(self.waited.as_millis()).unwrap_or(u64::MAX),
                %error,
                "no payment-pool connection for the payment transaction"
            );
        }
    }
}
