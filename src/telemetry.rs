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

/// `service.name` of every span and metric.
pub const SERVICE_NAME: &str = "payment-worker";

/// The span of one command, end to end: the one span that log lines carry.
pub const COMMAND_SPAN: &str = "process";

pub mod events;
mod log_fields;
mod metrics;
mod otlp_target;
pub mod prometheus;
mod providers;
mod resource;
mod round_trips;
mod setup;
mod trace_context;
mod w3c;
pub use events::{emit, InternalEvent};
pub use log_fields::LogFields;
pub use providers::{install_crypto_provider, metrics_exported};
pub use round_trips::{RoundTripCounter, RoundTrips};
pub use setup::{init, warn_at_start, Telemetry};
pub use trace_context::{
    adopt_remote_parent, current_trace_headers, link_to, remote_context, trace_ids,
    with_trace_headers, CardFreeIds, RemoteContext, BAGGAGE, TRACEPARENT, TRACESTATE,
};
pub use w3c::{parse_traceparent, sanitize_baggage, sanitize_tracestate, TraceParent};
