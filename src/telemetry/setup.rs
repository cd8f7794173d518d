//! Start and stop of logs, traces and metrics: the global subscriber (log format,
//! filters), propagator and providers, and the warnings held until logging starts.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::filter::FilterExt as _;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use super::providers::{install_crypto_provider, meter_provider, tracer_provider};
use super::{LogFields, COMMAND_SPAN, SERVICE_NAME};

/// Held by `main`; `shutdown` flushes buffered spans and metrics.
pub struct Telemetry {
    tracer_provider: Option<SdkTracerProvider>,
    meter_provider: Option<SdkMeterProvider>,
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
    let filter = filter.and(command_spans_and_events());
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
    // Already initialised (a test installed its own): keep that one. The traces
    // layer stays even when absent (`None`): the log layer alone as the one
    // per-layer-filtered layer drops the events inside the spans its filter
    // disables (a gateway failure's warning inside the POST's span), which
    // `cli::commands::logs_written_to_a_file_are_plain_text_…` catches.
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

/// What the log layer sees besides its level filter: events, and the command span.
/// It says it passes every level, so the layer's maximum level is its level
/// filter's: without that hint the subscriber's would be `TRACE`, and the `log`
/// crate's maximum with it (set from it as the subscriber is installed), so that
/// every `log::trace!` of a dependency (librdkafka's wrapper logs each handle it
/// frees, several per record) went through `LogTracer` to be dropped there.
fn command_spans_and_events<S>() -> impl tracing_subscriber::layer::Filter<S> {
    tracing_subscriber::filter::filter_fn(|meta| {
        meta.is_event()
            || (meta.name() == COMMAND_SPAN && meta.target().starts_with("payment_worker"))
    })
    .with_max_level_hint(tracing::level_filters::LevelFilter::TRACE)
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

#[cfg(test)]
mod tests {
    use tracing::level_filters::LevelFilter;
    use tracing_subscriber::filter::FilterExt as _;
    use tracing_subscriber::layer::Filter;
    use tracing_subscriber::Registry;

    use super::*;

    /// The log layer's filter keeps the level filter's maximum, which the `log`
    /// crate's maximum is set from: dependencies' `log::debug!` and `trace!` then
    /// stop at one comparison instead of crossing into tracing.
    #[test]
    fn the_log_filter_keeps_the_level_filters_maximum() {
        let filter = EnvFilter::new("info").and(command_spans_and_events());
        assert_eq!(
            Filter::<Registry>::max_level_hint(&filter),
            Some(LevelFilter::INFO)
        );
        let filter = EnvFilter::new("debug").and(command_spans_and_events());
        assert_eq!(
            Filter::<Registry>::max_level_hint(&filter),
            Some(LevelFilter::DEBUG)
        );
    }
}
