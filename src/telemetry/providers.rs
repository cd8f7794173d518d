//! The tracer and meter providers: which exporters each signal gets (OTLP, with our
//! TLS client when needed; Prometheus for metrics), from `OTEL_METRICS_EXPORTER`.

use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::SdkTracerProvider;

use super::otlp_target::{check_compression, otlp_wanted, protocol, sdk_disabled, OtlpTarget};
use super::resource::resource;
use super::{prometheus, CardFreeIds};

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

pub(super) fn tracer_provider() -> Option<SdkTracerProvider> {
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

pub(super) fn meter_provider() -> Option<SdkMeterProvider> {
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
