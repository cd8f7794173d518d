//! Start and stop of logs, traces and metrics: the global subscriber (log format,
//! filters), propagator and providers, and the warnings held until logging starts.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::filter::FilterExt as _;
use tracing_subscriber::filter::FilterFn;
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
    // are several per payment. Those go to traces only.
    let json = std::env::var("LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json"));
    // Already initialised (a test installed its own): keep that one.
    let _ = match &tracer_provider {
        // With an exporter each layer filters for itself: the traces layer records
        // every span at debug and above, whatever the log level.
        Some(provider) => {
            let logs = log_layer(json).with_filter(per_layer_log_filter(filter));
            let traces = tracing_opentelemetry::layer()
                .with_tracer(provider.tracer(SERVICE_NAME))
                .with_filter(EnvFilter::new(
                    "info,payment_worker=debug,h2=off,tonic=off,hyper=off,reqwest=off",
                ));
            tracing_subscriber::registry()
                .with(logs)
                .with(traces)
                .try_init()
        }
        // Without one the log layer is the only reader, and its filters are the
        // subscriber's (global): a client span no layer would record is not built
        // at all (its callsite is disabled where it is written, its fields never
        // evaluated), which is most of the telemetry's cost per payment. Global,
        // not per-layer: a lone per-layer filter that disables a span also drops
        // the events inside it (a gateway failure's warning inside the POST's
        // span), which `cli::commands::logs_written_to_a_file_…` catches.
        None => tracing_subscriber::registry()
            .with(filter)
            .with(command_spans_and_events())
            .with(log_layer(json))
            .try_init(),
    };
    log_early_warnings();
    Telemetry {
        tracer_provider,
        meter_provider,
    }
}

/// The log lines' writer: JSON with the span list (`LOG_FORMAT=json`), or text,
/// coloured only for a person at a terminal.
fn log_layer<S>(json: bool) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    if json {
        tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            // The command span (with trace_id and span_id) is in every line's list.
            .with_span_list(true)
            .with_writer(std::io::stderr)
            .boxed()
    } else {
        let colours = std::io::IsTerminal::is_terminal(&std::io::stderr())
            && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
        tracing_subscriber::fmt::layer()
            .with_ansi(colours)
            .fmt_fields(LogFields)
            .with_writer(std::io::stderr)
            .boxed()
    }
}

/// What the log layer sees besides its level filter: events, and the command span.
///
/// As a per-layer filter (beside the traces layer) it is given a `TRACE` hint, so
/// that the layer's maximum level is its level filter's. Without a hint the
/// subscriber's would be `TRACE`, and the `log` crate's maximum with it (set from
/// it as the subscriber is installed): every `log::trace!` of a dependency
/// (librdkafka's wrapper logs each handle it frees, several per record) would go
/// through `LogTracer` to be dropped there. As a global filter it has no hint, and
/// the level filter's alone counts.
fn command_spans_and_events() -> FilterFn<impl Fn(&tracing::Metadata<'_>) -> bool> {
    tracing_subscriber::filter::filter_fn(|meta| {
        meta.is_event()
            || (meta.name() == COMMAND_SPAN && meta.target().starts_with("payment_worker"))
    })
}

/// The log layer's filter beside the traces layer: the level filter, and the
/// command span and events (with the `TRACE` hint said above).
fn per_layer_log_filter<S>(level: EnvFilter) -> impl tracing_subscriber::layer::Filter<S> {
    level.and(
        command_spans_and_events().with_max_level_hint(tracing::level_filters::LevelFilter::TRACE),
    )
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
    use tracing_subscriber::layer::Filter;
    use tracing_subscriber::Registry;

    use super::*;

    /// Both ways of filtering keep the level filter's maximum, which the `log`
    /// crate's maximum is set from: dependencies' `log::debug!` and `trace!` then
    /// stop at one comparison instead of crossing into tracing.
    #[test]
    fn the_log_filter_keeps_the_level_filters_maximum() {
        for (level, max) in [("info", LevelFilter::INFO), ("debug", LevelFilter::DEBUG)] {
            let beside_traces = per_layer_log_filter(EnvFilter::new(level));
            assert_eq!(
                Filter::<Registry>::max_level_hint(&beside_traces),
                Some(max)
            );
            let alone = tracing_subscriber::registry()
                .with(EnvFilter::new(level))
                .with(command_spans_and_events())
                .with(log_layer(false));
            assert_eq!(tracing::Subscriber::max_level_hint(&alone), Some(max));
        }
    }

    /// Without an exporter a client span (not the command span) is disabled where
    /// it is written, while an event inside it is still enabled.
    #[test]
    fn alone_the_log_filters_disable_client_spans_but_not_their_events() {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let subscriber = tracing_subscriber::registry()
            .with(EnvFilter::new("info"))
            .with(command_spans_and_events())
            .with(Recorder(seen.clone()));
        tracing::subscriber::with_default(subscriber, || {
            let command = tracing::info_span!(target: "payment_worker::worker", COMMAND_SPAN);
            let _command = command.enter();
            let post = tracing::info_span!(target: "payment_worker::gateway", "gateway.post");
            assert!(post.is_disabled(), "a client span is not built");
            let _post = post.enter();
            tracing::warn!(target: "payment_worker::gateway", "gateway call failed");
        });
        let seen = seen.lock().map(|seen| seen.clone()).unwrap_or_default();
        assert_eq!(
            seen,
            [
                format!("span {COMMAND_SPAN}"),
                format!("event in {COMMAND_SPAN}")
            ]
        );
    }

    /// Records the spans built and, for each event, the span it is in.
    struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

    impl<S> Layer<S> for Recorder
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        fn on_new_span(
            &self,
            attrs: &tracing::span::Attributes<'_>,
            _: &tracing::span::Id,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            if let Ok(mut seen) = self.0.lock() {
                seen.push(format!("span {}", attrs.metadata().name()));
            }
        }

        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            ctx: tracing_subscriber::layer::Context<'_, S>,
        ) {
            let parent = ctx
                .event_span(event)
                .map(|span| span.name())
                .unwrap_or("none");
            if let Ok(mut seen) = self.0.lock() {
                seen.push(format!("event in {parent}"));
            }
        }
    }
}
