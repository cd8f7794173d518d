//! Settling the token: the short retry of confirm and restore, and what each token
//! call records in spans and metrics.

use super::*;
use crate::telemetry::events::TokenOperationFailed;

/// Confirm and restore are retried briefly on a transient error (a Redis failover, a
/// paused server, a dropped connection) before the token is left to its lease.
pub(super) fn settle_backoff() -> backon::ExponentialBuilder {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_secs(1))
        .with_total_delay(Some(Duration::from_secs(4)))
        .with_max_times(8)
        .with_jitter()
}

pub(super) fn note_settle_retry(
    operation: &'static str,
    key: &IdempotencyKey,
    error: &TokenError,
    after: Duration,
) {
    tracing::info!(idempotency_key = %key, %error, ?after, "token {operation} failed; trying again");
}

/// A client span for one token-store operation.
pub(super) fn token_span(operation: &'static str) -> tracing::Span {
    tracing::info_span!(
        "token",
        otel.name = format!("token {operation}"),
        otel.kind = "client",
        token.operation = operation,
        token.verdict = Empty,
    )
}

pub(super) fn verdict_label(reservation: &Reservation) -> &'static str {
    match reservation {
        Reservation::Reserved { .. } => "reserved",
        Reservation::InFlight { .. } => "in_flight",
        Reservation::Completed { .. } => "completed",
        Reservation::Missing => "missing",
        Reservation::Unsettled => "unsettled",
    }
}

pub(super) fn token_failure(operation: &'static str, error: &crate::token::TokenError) {
    let reason = if error.is_retryable() {
        "unavailable"
    } else {
        "corrupt"
    };
    crate::telemetry::emit(TokenOperationFailed { operation, reason });
}
