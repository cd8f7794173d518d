//! Logs, traces and metrics. Logs go to stderr (stdout is for command output), as
//! JSON lines with `LOG_FORMAT=json`; the level comes from `RUST_LOG`.
//!
//! OpenTelemetry is configured only by the standard `OTEL_*` variables: with no
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or a per-signal endpoint) nothing is exported and
//! the instruments are no-ops. `OTEL_EXPORTER_OTLP_PROTOCOL` picks `grpc` or
//! `http/protobuf`; `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_TRACES_SAMPLER(_ARG)` and `OTEL_METRIC_EXPORT_INTERVAL` are honoured by the SDK.
//! Over gRPC and over HTTP an `https://` endpoint is verified against the system roots
//! plus the CA in `OTEL_EXPORTER_OTLP_CERTIFICATE` (or the per-signal
//! `…_TRACES_CERTIFICATE`, `…_METRICS_CERTIFICATE`) when given, and the client
//! presents `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE` with `…_CLIENT_KEY` (per signal
//! too) when the receiver asks for one. `OTEL_EXPORTER_OTLP_COMPRESSION` (`gzip` or
//! `none`, per signal too) is honoured by the exporters.
//!
//! `OTEL_METRICS_EXPORTER` picks where metrics go: `otlp` (the default, when an
//! endpoint is set), `prometheus` (text at `/metrics` on the health listener,
//! `telemetry/prometheus.rs`), both (`otlp,prometheus`) or `none`.

use std::sync::OnceLock;

use opentelemetry::metrics::{Counter, Histogram, Meter, UpDownCounter};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::filter::FilterExt as _;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// `service.name` of every span and metric.
pub const SERVICE_NAME: &str = "payment-worker";

/// The span of one command, end to end: the one span that log lines carry.
pub const COMMAND_SPAN: &str = "process";

mod log_fields;
pub mod prometheus;
mod trace_context;
mod w3c;
pub use log_fields::LogFields;
pub use trace_context::{
    adopt_remote_parent, current_trace_headers, link_to, remote_context, trace_ids,
    with_trace_headers, CardFreeIds, RemoteContext, BAGGAGE, TRACEPARENT, TRACESTATE,
};
pub use w3c::{parse_traceparent, sanitize_baggage, sanitize_tracestate, TraceParent};

/// Held by `main`; `shutdown` flushes buffered spans and metrics.
pub struct Telemetry {
    tracer_provider: Option<SdkTracerProvider>,
    meter_provider: Option<SdkMeterProvider>,
}

fn env_set(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.trim().is_empty())
}

fn sdk_disabled() -> bool {
    std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"))
}

fn otlp_wanted(signal_endpoint: &str) -> bool {
    !sdk_disabled() && (env_set("OTEL_EXPORTER_OTLP_ENDPOINT") || env_set(signal_endpoint))
}

/// Where metrics go, from `OTEL_METRICS_EXPORTER` (a comma-separated list of
/// `otlp`, `prometheus`, `none`; unset means `otlp`). OTLP still needs an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct MetricExporters {
    otlp: bool,
    prometheus: bool,
}

fn metric_exporters(say_what_is_ignored: bool) -> MetricExporters {
    if sdk_disabled() {
        return MetricExporters::default();
    }
    let listed = std::env::var("OTEL_METRICS_EXPORTER").unwrap_or_default();
    let mut exporters = MetricExporters::default();
    if listed.trim().is_empty() {
        exporters.otlp = true;
    }
    for name in listed.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match name.to_ascii_lowercase().as_str() {
            "otlp" => exporters.otlp = true,
            "prometheus" => exporters.prometheus = true,
            "none" => {}
            other if say_what_is_ignored => eprintln!(
                "payment-worker: OTEL_METRICS_EXPORTER {other:?} is not supported (otlp, prometheus or none); ignored"
            ),
            _ => {}
        }
    }
    exporters.otlp = exporters.otlp && otlp_wanted("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT");
    exporters
}

/// Warnings raised before logging starts (while the command line is parsed) wait
/// here for [`init`].
static EARLY_WARNINGS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Logs `message` at `warn`; raised before logging has started (a setting read
/// while the command line is parsed), it is held and logged as logging starts.
pub fn warn_at_start(message: String) {
    if tracing::dispatcher::has_been_set() {
        tracing::warn!("{message}");
    } else if let Ok(mut held) = EARLY_WARNINGS.lock() {
        held.push(message);
    }
}

fn log_early_warnings() {
    let held = match EARLY_WARNINGS.lock() {
        Ok(mut held) => std::mem::take(&mut *held),
        Err(_) => return,
    };
    for message in held {
        tracing::warn!("{message}");
    }
}

fn resource() -> Resource {
    // The SDK reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES itself; what they
    // leave out is filled in here, never overridden.
    let mut builder = Resource::builder()
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
    if !env_set("OTEL_SERVICE_NAME") {
        builder = builder.with_service_name(SERVICE_NAME);
    }
    let given = std::env::var("OTEL_RESOURCE_ATTRIBUTES").unwrap_or_default();
    if let Some(instance) = instance_id(&given, host_name()) {
        builder = builder.with_attribute(KeyValue::new("service.instance.id", instance));
    }
    builder.build()
}

/// Each replica names itself (`service.instance.id`), so a collector keeps the
/// replicas' series apart and a restarted container continues its own: the host
/// name, which is the container's or the pod's, unless OTEL_RESOURCE_ATTRIBUTES
/// already says it. No shell in the image has to put it there.
fn instance_id(resource_attributes: &str, host: Option<String>) -> Option<String> {
    let given = resource_attributes
        .split(',')
        .any(|pair| pair.split('=').next().map(str::trim) == Some("service.instance.id"));
    if given {
        None
    } else {
        host.filter(|h| !h.is_empty())
    }
}

fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| name.trim().to_owned())
}

/// The signal's protocol as the SDK resolves it; `None` when unset (the SDK then
/// uses HTTP/protobuf).
fn protocol(signal: &str) -> Option<String> {
    [
        format!("OTEL_EXPORTER_OTLP_{signal}_PROTOCOL"),
        "OTEL_EXPORTER_OTLP_PROTOCOL".to_owned(),
    ]
    .iter()
    .find_map(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
}

/// A certificate (chain) and its private key, PEM.
type PemPair = (Vec<u8>, Vec<u8>);

/// Where a signal is exported and which extra CA verifies it, from the standard
/// variables (the per-signal one first).
struct OtlpTarget {
    https: bool,
    ca_file: Option<String>,
    client_certificate: Option<String>,
    client_key: Option<String>,
    timeout: std::time::Duration,
}

impl OtlpTarget {
    fn of(signal: &str) -> Self {
        let first_set = |names: [String; 2]| {
            names
                .iter()
                .find_map(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
        };
        let endpoint = first_set([
            format!("OTEL_EXPORTER_OTLP_{signal}_ENDPOINT"),
            "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(),
        ]);
        let ca_file = first_set([
            format!("OTEL_EXPORTER_OTLP_{signal}_CERTIFICATE"),
            "OTEL_EXPORTER_OTLP_CERTIFICATE".to_owned(),
        ]);
        let client_certificate = first_set([
            format!("OTEL_EXPORTER_OTLP_{signal}_CLIENT_CERTIFICATE"),
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE".to_owned(),
        ]);
        let client_key = first_set([
            format!("OTEL_EXPORTER_OTLP_{signal}_CLIENT_KEY"),
            "OTEL_EXPORTER_OTLP_CLIENT_KEY".to_owned(),
        ]);
        // The SDK's own default (10 s) when unset or unreadable.
        let timeout_ms = first_set([
            format!("OTEL_EXPORTER_OTLP_{signal}_TIMEOUT"),
            "OTEL_EXPORTER_OTLP_TIMEOUT".to_owned(),
        ])
        .and_then(|ms| ms.trim().parse::<u64>().ok())
        .unwrap_or(10_000);
        Self {
            https: endpoint.is_some_and(|e| e.trim().to_ascii_lowercase().starts_with("https://")),
            ca_file,
            client_certificate,
            client_key,
            timeout: std::time::Duration::from_millis(timeout_ms),
        }
    }

    /// Whether this export needs our TLS set-up (an `https://` endpoint, a CA file or
    /// a client certificate).
    fn wants_tls(&self) -> bool {
        self.https || self.ca_file.is_some() || self.client_certificate.is_some()
    }

    /// The client certificate (chain) and its key, PEM, when both are set.
    fn client_identity(&self) -> Result<Option<PemPair>, String> {
        let read = |path: &str| std::fs::read(path).map_err(|e| format!("reading {path}: {e}"));
        match (&self.client_certificate, &self.client_key) {
            (Some(cert), Some(key)) => Ok(Some((read(cert)?, read(key)?))),
            (None, None) => Ok(None),
            _ => Err(
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_CLIENT_KEY go together"
                    .to_owned(),
            ),
        }
    }

    fn ca_pem(&self) -> Result<Option<Vec<u8>>, String> {
        self.ca_file
            .as_ref()
            .map(|path| std::fs::read(path).map_err(|e| format!("reading CA file {path}: {e}")))
            .transpose()
    }

    /// gRPC: the system roots and the CA file.
    fn grpc_tls(
        &self,
    ) -> Result<opentelemetry_otlp::tonic_types::transport::ClientTlsConfig, String> {
        use opentelemetry_otlp::tonic_types::transport::{Certificate, ClientTlsConfig, Identity};
        let mut config = ClientTlsConfig::new().with_native_roots();
        if let Some(pem) = self.ca_pem()? {
            config = config.ca_certificate(Certificate::from_pem(pem));
        }
        if let Some((cert, key)) = self.client_identity()? {
            config = config.identity(Identity::from_pem(cert, key));
        }
        Ok(config)
    }

    /// HTTP/protobuf: a blocking client verifying against the system roots and the CA
    /// file. Built on a thread of its own: a blocking client may not be created (nor
    /// dropped) on a tokio worker thread.
    fn http_client(&self) -> Result<reqwest::blocking::Client, String> {
        let mut builder = reqwest::blocking::Client::builder().timeout(self.timeout);
        if let Some(pem) = self.ca_pem()? {
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| format!("reading the OTLP CA certificate: {e}"))?;
            builder = builder.tls_certs_merge(certs);
        }
        if let Some((mut pem, key)) = self.client_identity()? {
            pem.push(b'\n');
            pem.extend(key);
            let identity = reqwest::Identity::from_pem(&pem)
                .map_err(|e| format!("reading the OTLP client certificate and key: {e}"))?;
            builder = builder.identity(identity);
        }
        std::thread::spawn(move || builder.build())
            .join()
            .map_err(|_| "building the OTLP HTTP client panicked".to_owned())?
            .map_err(|e| format!("building the OTLP HTTP client: {e}"))
    }
}

/// `OTEL_EXPORTER_OTLP_{signal}_COMPRESSION` or `OTEL_EXPORTER_OTLP_COMPRESSION`: the
/// SDK applies `gzip` itself; any other value than `gzip` or `none` would be skipped
/// by it with a warning few read, so the exporter is refused instead.
fn check_compression(signal: &str) -> Result<(), String> {
    for name in [
        format!("OTEL_EXPORTER_OTLP_{signal}_COMPRESSION"),
        "OTEL_EXPORTER_OTLP_COMPRESSION".to_owned(),
    ] {
        let Some(value) = std::env::var(&name).ok().filter(|v| !v.trim().is_empty()) else {
            continue;
        };
        return match value.trim().to_ascii_lowercase().as_str() {
            "gzip" | "none" => Ok(()),
            other => Err(format!(
                "{name}={other:?} is not supported: use gzip or none"
            )),
        };
    }
    Ok(())
}

/// One signal's exporter: plain endpoints leave the transport to the SDK (from the
/// protocol variable); TLS ones get our gRPC or HTTP client. A macro because the span
/// and metric builders are distinct types with the same methods.
macro_rules! otlp_exporter {
    ($exporter:ty, $signal:literal) => {{
        use opentelemetry_otlp::{WithHttpConfig, WithTonicConfig};
        check_compression($signal)?;
        let target = OtlpTarget::of($signal);
        let builder = <$exporter>::builder();
        let exporter = if !target.wants_tls() {
            builder.build()
        } else if protocol($signal).as_deref() == Some("grpc") {
            builder
                .with_tonic()
                .with_tls_config(target.grpc_tls()?)
                .build()
        } else {
            builder
                .with_http()
                .with_http_client(target.http_client()?)
                .build()
        };
        exporter.map_err(|e| e.to_string())
    }};
}

fn span_exporter() -> Result<opentelemetry_otlp::SpanExporter, String> {
    otlp_exporter!(opentelemetry_otlp::SpanExporter, "TRACES")
}

fn metric_exporter() -> Result<opentelemetry_otlp::MetricExporter, String> {
    otlp_exporter!(opentelemetry_otlp::MetricExporter, "METRICS")
}

fn tracer_provider() -> Option<SdkTracerProvider> {
    if !otlp_wanted("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        return None;
    }
    match span_exporter() {
        Ok(exporter) => Some(
            SdkTracerProvider::builder()
                .with_resource(resource())
                .with_id_generator(CardFreeIds::default())
                .with_batch_exporter(exporter)
                .build(),
        ),
        Err(error) => {
            eprintln!("payment-worker: OTLP span exporter not started: {error}");
            None
        }
    }
}

fn meter_provider() -> Option<SdkMeterProvider> {
    let exporters = metric_exporters(true);
    if !exporters.otlp && !exporters.prometheus {
        return None;
    }
    let mut builder = SdkMeterProvider::builder().with_resource(resource());
    if exporters.otlp {
        match metric_exporter() {
            Ok(exporter) => builder = builder.with_periodic_exporter(exporter),
            Err(error) => {
                eprintln!("payment-worker: OTLP metric exporter not started: {error}");
                if !exporters.prometheus {
                    return None;
                }
            }
        }
    }
    if exporters.prometheus {
        let reader = prometheus::PrometheusReader::new();
        prometheus::install(reader.clone());
        builder = builder.with_reader(reader);
    }
    Some(builder.build())
}

/// Makes ring the process-wide rustls provider. The OTLP HTTP client is built without
/// a provider of its own (one crypto library in the binary, the one sqlx and redis
/// use) and asks for the process default; a second call is harmless.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Whether metrics leave the process, over OTLP or at `/metrics` (so collecting
/// them is worth its cost).
pub fn metrics_exported() -> bool {
    let exporters = metric_exporters(false);
    exporters.otlp || exporters.prometheus
}

/// Installs the global subscriber, propagator and providers. Call inside the tokio
/// runtime (the gRPC exporter needs it). `default_filter` applies without `RUST_LOG`.
pub fn init(default_filter: &str) -> Telemetry {
    install_crypto_provider();
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let tracer_provider = tracer_provider();
    let meter_provider = meter_provider();
    if let Some(provider) = &meter_provider {
        opentelemetry::global::set_meter_provider(provider.clone());
    }
    // Postgres notices (`relation "_sqlx_migrations" already exists, skipping` on
    // every start) are routine: sqlx logs them at info, so without `RUST_LOG` they
    // are held back; `RUST_LOG=debug` (or `sqlx::postgres::notice=info`) shows them.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(format!("{default_filter},sqlx::postgres::notice=warn"))
    });
    // Log lines carry the command span (key, trace and span ids) and nothing deeper:
    // the fmt layer formats every span it is shown when the span opens, printed or
    // not, and the client spans below the command (token, statement, publish, POST)
    // are several per payment. Those go to traces only, and with no exporter they
    // are not built at all.
    let filter = filter.and(tracing_subscriber::filter::filter_fn(|meta| {
        meta.is_event()
            || (meta.name() == COMMAND_SPAN && meta.target().starts_with("payment_worker"))
    }));
    let json = std::env::var("LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json"));
    let logs = if json {
        tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            // The command span (with trace_id and span_id) is in every line's list.
            .with_span_list(true)
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed()
    } else {
        // Colours only for a person at a terminal: a log file or a pipe gets plain text.
        let colours = std::io::IsTerminal::is_terminal(&std::io::stderr())
            && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
        tracing_subscriber::fmt::layer()
            .with_ansi(colours)
            .fmt_fields(LogFields)
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed()
    };
    // Spans are exported whatever the log level: the trace is complete at `info`.
    let traces = tracer_provider.as_ref().map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer(SERVICE_NAME))
            .with_filter(EnvFilter::new(
                "info,payment_worker=debug,h2=off,tonic=off,hyper=off,reqwest=off",
            ))
    });
    // Already initialised (a test installed its own): keep that one.
    let _ = tracing_subscriber::registry()
        .with(logs)
        .with(traces)
        .try_init();
    log_early_warnings();
    Telemetry {
        tracer_provider,
        meter_provider,
    }
}

impl Telemetry {
    /// Flushes and stops the exporters; spans and metrics not yet exported are lost without it.
    pub fn shutdown(self) {
        if let Some(provider) = self.tracer_provider {
            if let Err(error) = provider.shutdown() {
                eprintln!("payment-worker: flushing spans failed: {error}");
            }
        }
        if let Some(provider) = self.meter_provider {
            if let Err(error) = provider.shutdown() {
                eprintln!("payment-worker: flushing metrics failed: {error}");
            }
        }
    }
}

/// The instruments. Attributes are low-cardinality by construction: operation
/// names, outcome labels, error kinds, partition numbers; never a key, token,
/// account or payment method.
pub struct Metrics {
    /// `payment_worker.atomic_operation.failures`: a token script or statement that failed, by operation and reason.
    pub atomic_operation_failures: Counter<u64>,
    /// `payment_worker.token.inconsistencies`: a token found in another state than the operation expected.
    pub token_inconsistencies: Counter<u64>,
    /// `payment_worker.commands`: commands finished, by outcome.
    pub commands: Counter<u64>,
    /// `payment_worker.command.duration`: seconds from first attempt to final outcome.
    pub processing_duration: Histogram<f64>,
    /// `payment_worker.commands.in_flight`: commands admitted and not finished.
    pub in_flight: UpDownCounter<i64>,
    /// `payment_worker.command.retries`: attempts that ended in a retry.
    pub retries: Counter<u64>,
    /// `payment_worker.dead_letters`: records dead-lettered, by kind.
    pub dead_letters: Counter<u64>,
    /// `payment_worker.panics`: panics caught while handling a record.
    pub panics: Counter<u64>,
    /// `payment_worker.gateway.failures`: gateway calls that failed, by operation and kind.
    pub gateway_failures: Counter<u64>,
    /// `payment_worker.consumer.lag`: records behind the high watermark, by partition.
    pub consumer_lag: opentelemetry::metrics::Gauge<i64>,
    /// `payment_worker.tokens.purged`: expired token rows deleted.
    pub tokens_purged: Counter<u64>,
    /// `payment_worker.token.settle_waits`: waits of a reservation that met another
    /// owner's lease, by what ended them (`woken_by`).
    pub settle_waits: Counter<u64>,
    /// `payment_worker.db.pool.acquire`: seconds a payment transaction waited for its
    /// connection from the payment pool (by `result`: `ok`, `timeout`, `error`).
    pub pool_acquire: Histogram<f64>,
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
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(|| build_metrics(&opentelemetry::global::meter(SERVICE_NAME)))
}

/// Counts one wait behind another owner's lease by what ended it.
pub fn record_settle_wait(woken_by: &'static str) {
    metrics()
        .settle_waits
        .add(1, &[KeyValue::new("woken_by", woken_by)]);
}

/// Records how long a payment waited for its payment-pool connection.
pub fn record_pool_acquire(waited: std::time::Duration, result: &'static str) {
    metrics()
        .pool_acquire
        .record(waited.as_secs_f64(), &[KeyValue::new("result", result)]);
}

/// Counts a failed token operation (low-cardinality operation and reason).
pub fn record_atomic_failure(operation: &'static str, reason: &'static str) {
    metrics().atomic_operation_failures.add(
        1,
        &[
            KeyValue::new("operation", operation),
            KeyValue::new("reason", reason),
        ],
    );
}

/// Counts a token found in another state than the operation expected (by expected and actual state).
pub fn record_token_inconsistency(expected: &'static str, actual: &'static str) {
    metrics().token_inconsistencies.add(
        1,
        &[
            KeyValue::new("expected", expected),
            KeyValue::new("actual", actual),
        ],
    );
}

// ---------------------------------------------------------------------------
// Round trips, counted from the client spans the code opens for each one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Round trips made, by peer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RoundTrips {
    /// Statements on the `payments` table (`BEGIN` and `COMMIT` included).
    pub postgres: u64,
    /// Token-store operations: one Lua script each on Redis, one statement each on
    /// the Postgres token store.
    pub token_store: u64,
    /// HTTP requests to the gateway (charges and look-ups).
    pub gateway: u64,
}

/// A layer that counts round trips: every `statement`, `token` and `gateway …` span
/// stands for exactly one request to its peer. Install it (alone or beside the
/// others) where the cost of a payment is measured: the benchmark and tests.
#[derive(Debug, Clone, Default)]
pub struct RoundTripCounter {
    postgres: Arc<AtomicU64>,
    token_store: Arc<AtomicU64>,
    gateway: Arc<AtomicU64>,
}

impl RoundTripCounter {
    /// The round trips counted so far.
    pub fn snapshot(&self) -> RoundTrips {
        RoundTrips {
            postgres: self.postgres.load(Ordering::Relaxed),
            token_store: self.token_store.load(Ordering::Relaxed),
            gateway: self.gateway.load(Ordering::Relaxed),
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for RoundTripCounter {
    fn on_new_span(
        &self,
        attributes: &tracing::span::Attributes<'_>,
        _id: &tracing::span::Id,
        _context: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let counter = match attributes.metadata().name() {
            "statement" => &self.postgres,
            "token" => &self.token_store,
            name if name.starts_with("gateway ") => &self.gateway,
            _ => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::instance_id;

    #[test]
    fn a_replica_is_named_after_its_host_unless_the_attributes_name_it() {
        let host = || Some("worker-7f9c".to_owned());
        assert_eq!(instance_id("", host()).as_deref(), Some("worker-7f9c"));
        assert_eq!(
            instance_id("deployment.environment=prod", host()).as_deref(),
            Some("worker-7f9c")
        );
        assert_eq!(instance_id("a=b, service.instance.id=w1", host()), None);
        assert_eq!(instance_id("", None), None);
        assert_eq!(instance_id("", Some(String::new())), None);
    }
}
