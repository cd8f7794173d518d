//! The worker's metric instruments (created once, no-ops until a meter provider is
//! installed). Private to `telemetry`: the product records on them only through the
//! typed events of `events/`, each of which names its instruments and attributes.

use std::sync::OnceLock;

use opentelemetry::metrics::{Counter, Histogram, Meter, UpDownCounter};

use super::SERVICE_NAME;

/// The instruments. Attributes are low-cardinality by construction: operation
/// names, outcome labels, error kinds, partition numbers; never a key, token,
/// account or payment method.
pub(super) struct Metrics {
    /// `payment_worker.atomic_operation.failures`: a token script or statement that failed, by operation and reason.
    pub(super) atomic_operation_failures: Counter<u64>,
    /// `payment_worker.token.inconsistencies`: a token found in another state than the operation expected.
    pub(super) token_inconsistencies: Counter<u64>,
    /// `payment_worker.commands`: commands finished, by outcome.
    pub(super) commands: Counter<u64>,
    /// `payment_worker.command.duration`: seconds from first attempt to final outcome.
    pub(super) processing_duration: Histogram<f64>,
    /// `payment_worker.commands.in_flight`: commands admitted and not finished.
    pub(super) in_flight: UpDownCounter<i64>,
    /// `payment_worker.command.retries`: attempts that ended in a retry.
    pub(super) retries: Counter<u64>,
    /// `payment_worker.dead_letters`: records dead-lettered, by kind.
    pub(super) dead_letters: Counter<u64>,
    /// `payment_worker.panics`: panics caught while handling a record.
    pub(super) panics: Counter<u64>,
    /// `payment_worker.gateway.failures`: gateway calls that failed, by operation and kind.
    pub(super) gateway_failures: Counter<u64>,
    /// `payment_worker.consumer.lag`: records behind the high watermark, by partition.
    pub(super) consumer_lag: opentelemetry::metrics::Gauge<i64>,
    /// `payment_worker.tokens.purged`: expired token rows deleted.
    pub(super) tokens_purged: Counter<u64>,
    /// `payment_worker.token.settle_waits`: waits of a reservation that met another
    /// owner's lease, by what ended them (`woken_by`).
    pub(super) settle_waits: Counter<u64>,
    /// `payment_worker.db.pool.acquire`: seconds a payment transaction waited for its
    /// connection from the payment pool (by `result`: `ok`, `timeout`, `error`).
    pub(super) pool_acquire: Histogram<f64>,
}

fn build_metrics(meter: &Meter) -> Metrics {
    Metrics {
        atomic_operation_failures: meter
            .u64_counter("payment_worker.atomic_operation.failures")
            .with_description("Token store operations that failed (operation, reason)")
            .build(),
        token_inconsistencies: meter
            .u64_counter("payment_worker.token.inconsistencies")
            .with_description("A token found in another state than expected (expected, actual)")
            .build(),
        commands: meter
            .u64_counter("payment_worker.commands")
            .with_description("Commands finished, by outcome")
            .build(),
        processing_duration: meter
            .f64_histogram("payment_worker.command.duration")
            .with_unit("s")
            .with_description("Time from dispatch to acknowledged result, by outcome")
            // The SDK's default bounds (0, 5, 10, 25, …) suit milliseconds: in seconds
            // every payment would fall in the first bucket and p50/p99 would be noise.
            .with_boundaries(vec![
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                60.0, 300.0,
            ])
            .build(),
        in_flight: meter
            .i64_up_down_counter("payment_worker.commands.in_flight")
            .with_description("Commands being processed")
            .build(),
        retries: meter
            .u64_counter("payment_worker.command.retries")
            .with_description("Attempts that ended in a retry")
            .build(),
        dead_letters: meter
            .u64_counter("payment_worker.dead_letters")
            .with_description("Records sent to the dead-letter topic, by kind")
            .build(),
        panics: meter
            .u64_counter("payment_worker.panics")
            .with_description("Panics caught while handling a record")
            .build(),
        gateway_failures: meter
            .u64_counter("payment_worker.gateway.failures")
            .with_description(
                "Gateway calls that did not answer usably (operation, class, HTTP status)",
            )
            .build(),
        consumer_lag: meter
            .i64_gauge("payment_worker.consumer.lag")
            .with_description("Messages behind the high watermark, per partition")
            .build(),
        tokens_purged: meter
            .u64_counter("payment_worker.tokens.purged")
            .with_description("Expired token rows deleted by the purge (Postgres token store)")
            .build(),
        settle_waits: meter
            .u64_counter("payment_worker.token.settle_waits")
            .with_description(
                "Waits behind another owner's lease, by what ended them (woken_by: \
                 notification, already_settled, listener_reconnected, backoff, drain)",
            )
            .build(),
        pool_acquire: meter
            .f64_histogram("payment_worker.db.pool.acquire")
            .with_unit("s")
            .with_description(
                "Time a payment waited for its payment-pool connection (result: ok, timeout, error)",
            )
            .with_boundaries(vec![
                0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0,
            ])
            .build(),
    }
}

/// The process-wide instruments (no-ops until a meter provider is installed).
pub(super) fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(|| build_metrics(&opentelemetry::global::meter(SERVICE_NAME)))
}
