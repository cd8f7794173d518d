//! The typed events (`telemetry/events/`): each records on its own instrument, with its
//! own attributes, under the names and descriptions operators query (checked here on
//! an in-memory exporter, rendered as the worker's `/metrics` renders), and writes the
//! log line its call site wrote before the events existed.
//!
//! The instruments bind to the global meter provider the first time any is used, so
//! the metric test installs its provider before emitting anything: nextest runs it in
//! a process of its own (`.config/nextest.toml`).

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use payment_worker::telemetry::emit;
use payment_worker::telemetry::events::{
    CommandEnded, CommandFinished, CommandRetried, CommandStarted, CommandsAbandoned,
    ConsumerLagMeasured, GatewayCallFailed, GatewayListingIncomplete, HandlerPanicked,
    PoolAcquireEnded, RecordDeadLettered, SettleRefused, SettleTransition, SettleWaitEnded,
    TokenInconsistencyRepaired, TokenOperationFailed, TokensPurged,
};
use payment_worker::telemetry::prometheus::render;

/// Every event once (some twice), as the product emits them.
fn emit_every_event() {
    let key = "key-1";
    let error = "connection refused";
    emit(CommandStarted);
    emit(CommandStarted);
    emit(CommandStarted);
    emit(CommandEnded);
    emit(CommandsAbandoned { count: 1 });
    emit(CommandFinished {
        outcome: "succeeded",
        duration: Duration::from_millis(20),
    });
    emit(CommandRetried {
        reason: "gateway unavailable",
        after: Duration::from_millis(100),
    });
    emit(RecordDeadLettered {
        kind: "invalid_amount",
        reason: &"amount must be positive",
        partition: 2,
        offset: 40,
    });
    emit(HandlerPanicked {
        partition: 2,
        offset: 41,
        panics: 1,
        panic: "boom",
    });
    emit(GatewayCallFailed {
        key: &key,
        operation: "charge",
        class: "transient",
        status: Some(503),
        error: &error,
    });
    emit(GatewayCallFailed {
        key: &key,
        operation: "charge",
        class: "unknown_outcome",
        status: None,
        error: &error,
    });
    emit(GatewayCallFailed {
        key: &key,
        operation: "lookup",
        class: "protocol",
        status: Some(999),
        error: &error,
    });
    emit(GatewayListingIncomplete {
        key: &key,
        why: &"after 10 pages",
    });
    emit(ConsumerLagMeasured {
        partition: 3,
        lag: 42,
    });
    emit(PoolAcquireEnded {
        waited: Duration::from_millis(3),
        error: None,
    });
    emit(PoolAcquireEnded {
        waited: Duration::from_secs(2),
        error: Some(&sqlx::Error::PoolTimedOut),
    });
    emit(TokenOperationFailed {
        operation: "reserve",
        reason: "unavailable",
    });
    emit(SettleRefused {
        key: &key,
        transition: SettleTransition::Confirm,
    });
    emit(SettleRefused {
        key: &key,
        transition: SettleTransition::Restore,
    });
    emit(TokenInconsistencyRepaired {
        key: &key,
        expected: "completed",
        actual: "pending",
    });
    emit(SettleWaitEnded {
        woken_by: "notification",
    });
    emit(TokensPurged { count: 7 });
}

#[test]
fn every_event_records_on_its_instrument_with_its_attributes() {
    let exporter = InMemoryMetricExporter::default();
    let provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(exporter.clone()).build())
        .build();
    opentelemetry::global::set_meter_provider(provider.clone());
    emit_every_event();
    provider.force_flush().expect("flush");
    let exported = exporter.get_finished_metrics().expect("exported metrics");
    let text = render(exported.last().expect("one export"));
    for line in [
        "# HELP payment_worker_commands_total Commands finished, by outcome",
        "payment_worker_commands_total{outcome=\"succeeded\"} 1",
        "payment_worker_command_duration_seconds_count{outcome=\"succeeded\"} 1",
        "payment_worker_command_duration_seconds_sum{outcome=\"succeeded\"} 0.02",
        "# HELP payment_worker_commands_in_flight Commands being processed",
        "payment_worker_commands_in_flight 1",
        "payment_worker_command_retries_total 1",
        "payment_worker_dead_letters_total{kind=\"invalid_amount\"} 1",
        "payment_worker_panics_total 1",
        "payment_worker_gateway_failures_total{class=\"transient\",http_response_status_code=\"503\",operation=\"charge\"} 1",
        "payment_worker_gateway_failures_total{class=\"unknown_outcome\",http_response_status_code=\"none\",operation=\"charge\"} 1",
        "payment_worker_gateway_failures_total{class=\"protocol\",http_response_status_code=\"999\",operation=\"lookup\"} 1",
        "payment_worker_gateway_failures_total{class=\"incomplete_listing\",http_response_status_code=\"none\",operation=\"lookup\"} 1",
        "# TYPE payment_worker_consumer_lag gauge",
        "payment_worker_consumer_lag{partition=\"3\"} 42",
        "payment_worker_db_pool_acquire_seconds_count{result=\"ok\"} 1",
        "payment_worker_db_pool_acquire_seconds_count{result=\"timeout\"} 1",
        "payment_worker_atomic_operation_failures_total{operation=\"reserve\",reason=\"unavailable\"} 1",
        "payment_worker_token_inconsistencies_total{actual=\"not_owned\",expected=\"processing\"} 2",
        "payment_worker_token_inconsistencies_total{actual=\"pending\",expected=\"completed\"} 1",
        "payment_worker_token_settle_waits_total{woken_by=\"notification\"} 1",
        "payment_worker_tokens_purged_total 7",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line:?} missing from:\n{text}"
        );
    }
    // No key, reason, panic text or error text reaches a label.
    for secret in [
        "key-1",
        "connection refused",
        "boom",
        "positive",
        "10 pages",
    ] {
        assert!(!text.contains(secret), "{secret:?} in:\n{text}");
    }
}

/// A writer the test reads back.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The product's log lines down to `debug`, as text without time or target, into
/// `captured` (the OpenTelemetry SDK's own lines are left out).
fn product_logs(captured: &Captured) -> impl tracing::Subscriber {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::Layer as _;
    let writer = captured.clone();
    let layer = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .without_time()
        .with_target(false)
        .with_writer(move || writer.clone())
        .with_filter(
            tracing_subscriber::filter::Targets::new()
                .with_target("payment_worker", tracing::Level::DEBUG),
        );
    tracing_subscriber::registry().with(layer)
}

#[test]
fn events_write_the_log_lines_of_their_call_sites() {
    let captured = Captured::default();
    tracing::subscriber::with_default(product_logs(&captured), emit_every_event);
    let bytes = captured.0.lock().unwrap().clone();
    let logs = String::from_utf8(bytes).expect("UTF-8 logs");
    let lines: Vec<&str> = logs.lines().collect();
    let expected = [
        "DEBUG retrying command reason=gateway unavailable after=100ms",
        " INFO dead-lettering kind=\"invalid_amount\" reason=amount must be positive partition=2 offset=40",
        "ERROR handling a record panicked; its token is left to its lease partition=2 offset=41 panics=1 panic=boom",
        " WARN gateway call failed idempotency_key=key-1 operation=\"charge\" status=503 class=\"transient\"",
        " WARN gateway call failed idempotency_key=key-1 operation=\"charge\" class=\"unknown_outcome\" error=connection refused",
        " WARN gateway call failed idempotency_key=key-1 operation=\"lookup\" status=999 class=\"protocol\"",
        "ERROR a listing to find a create whose answer was lost stopped before covering its window: the look-up failed idempotency_key=key-1 why=after 10 pages",
        " WARN no payment-pool connection for the payment transaction pool_acquire_ms=2000 error=pool timed out while waiting for an open connection",
        " WARN confirm refused: lease lost after commit; the next owner will find the row idempotency_key=key-1",
        " WARN restore refused: lease lost idempotency_key=key-1",
        " WARN token inconsistency repaired idempotency_key=key-1 expected=\"completed\" actual=\"pending\"",
    ];
    // Exactly these, in order: the metric-only events log nothing.
    assert_eq!(lines, expected, "logs:\n{logs}");

    let captured = Captured::default();
    tracing::subscriber::with_default(product_logs(&captured), || {
        emit(GatewayCallFailed {
            key: &"key-2",
            operation: "charge",
            class: "rejected",
            status: Some(401),
            error: &"unauthorized",
        })
    });
    let bytes = captured.0.lock().unwrap().clone();
    let logs = String::from_utf8(bytes).expect("UTF-8 logs");
    assert_eq!(
        logs.trim_end(),
        "ERROR the gateway refuses our access (credentials, URL or method): nothing was charged, \
         retrying idempotency_key=key-2 operation=\"charge\" status=401 class=\"rejected\""
    );
}
