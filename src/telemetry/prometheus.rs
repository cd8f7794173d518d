//! Prometheus text at `/metrics` (opt-in: `OTEL_METRICS_EXPORTER=prometheus`),
//! named as the OpenTelemetry collector's Prometheus exporter names the same
//! instruments, so the dashboard and the alert rules work against either.
//!
//! A reader of the meter provider of its own collects on each scrape (cumulative,
//! as Prometheus wants); nothing is kept between scrapes.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, Metric, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::reader::MetricReader;
use opentelemetry_sdk::metrics::{InstrumentKind, ManualReader, Pipeline, Temporality};

/// How the collector's exporter types a metric family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrometheusKind {
    /// A monotonic sum.
    Counter,
    /// A gauge or a non-monotonic sum (up-down counter).
    Gauge,
    /// An explicit-bucket histogram.
    Histogram,
    /// A summary.
    Summary,
}

impl PrometheusKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "histogram",
            Self::Summary => "summary",
        }
    }
}

/// The word the exporter appends for an OpenTelemetry (UCUM) unit.
fn unit_word(unit: &str) -> String {
    let known = match unit {
        "d" => "days",
        "h" => "hours",
        "min" => "minutes",
        "s" => "seconds",
        "ms" => "milliseconds",
        "us" => "microseconds",
        "ns" => "nanoseconds",
        "By" => "bytes",
        "KiBy" => "kibibytes",
        "MiBy" => "mebibytes",
        "GiBy" => "gibibytes",
        "KBy" => "kilobytes",
        "MBy" => "megabytes",
        "GBy" => "gigabytes",
        "m" => "meters",
        "V" => "volts",
        "A" => "amperes",
        "J" => "joules",
        "W" => "watts",
        "g" => "grams",
        "Cel" => "celsius",
        "Hz" => "hertz",
        "%" => "percent",
        "1" => "",
        other if other.starts_with('{') => "",
        other => {
            return other
                .split(|c: char| !c.is_ascii_alphanumeric())
                .filter(|t| !t.is_empty())
                .collect::<Vec<_>>()
                .join("_")
        }
    };
    known.to_owned()
}

/// The word after `per_` for the denominator of a unit such as `By/s`.
fn per_unit_word(unit: &str) -> String {
    match unit {
        "s" => "second".to_owned(),
        "m" => "minute".to_owned(),
        "h" => "hour".to_owned(),
        "d" => "day".to_owned(),
        "w" => "week".to_owned(),
        "mo" => "month".to_owned(),
        "y" => "year".to_owned(),
        other => unit_word(other),
    }
}

/// The metric family name the collector's Prometheus exporter shows: the name's
/// words joined by `_` (dots and other punctuation become separators), the unit
/// appended unless already a word of the name, `_total` on counters, `_ratio` on
/// unit-`1` gauges, and the exporter's `namespace` in front.
pub fn prometheus_name(
    name: &str,
    unit: &str,
    kind: PrometheusKind,
    namespace: Option<&str>,
) -> String {
    let mut words: Vec<String> = name
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect();
    let (main_unit, per_unit) = unit.split_once('/').unwrap_or((unit, ""));
    let main = unit_word(main_unit);
    if !main.is_empty() && !words.contains(&main) {
        words.push(main);
    }
    let per = if per_unit.is_empty() {
        String::new()
    } else {
        per_unit_word(per_unit)
    };
    if !per.is_empty() && !words.contains(&per) {
        words.push("per".to_owned());
        words.push(per);
    }
    match kind {
        PrometheusKind::Counter => {
            words.retain(|w| w != "total");
            words.push("total".to_owned());
        }
        PrometheusKind::Gauge if unit == "1" => {
            words.retain(|w| w != "ratio");
            words.push("ratio".to_owned());
        }
        _ => {}
    }
    if let Some(namespace) = namespace.filter(|n| !n.is_empty()) {
        words.insert(0, namespace.to_owned());
    }
    let joined = words.join("_");
    if joined.starts_with(|c: char| c.is_ascii_digit()) {
        format!("_{joined}")
    } else {
        joined
    }
}

/// An attribute key as a label name: what is not a letter, digit or `_` becomes `_`
/// (`http.response.status_code` → `http_response_status_code`).
fn label_name(key: &str) -> String {
    let name: String = key
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        format!("key_{name}")
    } else {
        name
    }
}

fn escape_label_value(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

fn labels<'a>(
    attributes: impl Iterator<Item = &'a KeyValue>,
    extra: Option<(&str, String)>,
) -> String {
    let mut pairs: BTreeMap<String, String> = attributes
        .map(|kv| (label_name(kv.key.as_str()), kv.value.to_string()))
        .collect();
    if let Some((name, value)) = extra {
        pairs.insert(name.to_owned(), value);
    }
    if pairs.is_empty() {
        return String::new();
    }
    let inner: Vec<String> = pairs
        .iter()
        .map(|(name, value)| format!("{name}=\"{}\"", escape_label_value(value)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

/// A bucket bound as Prometheus writes it.
fn bound(value: f64) -> String {
    if value.is_infinite() {
        "+Inf".to_owned()
    } else {
        format!("{value}")
    }
}

fn kind_of<T>(data: &MetricData<T>) -> PrometheusKind {
    match data {
        MetricData::Sum(sum) if sum.is_monotonic() => PrometheusKind::Counter,
        MetricData::Sum(_) | MetricData::Gauge(_) => PrometheusKind::Gauge,
        MetricData::Histogram(_) => PrometheusKind::Histogram,
        // Exponential histograms become native histograms at the collector, which the
        // text format cannot carry; the worker makes none.
        MetricData::ExponentialHistogram(_) => PrometheusKind::Gauge,
    }
}

/// One family's samples, written under `name`.
fn samples<T: Copy + std::fmt::Display>(name: &str, data: &MetricData<T>, out: &mut String) {
    match data {
        MetricData::Sum(sum) => {
            for point in sum.data_points() {
                let _ = writeln!(
                    out,
                    "{name}{} {}",
                    labels(point.attributes(), None),
                    point.value()
                );
            }
        }
        MetricData::Gauge(gauge) => {
            for point in gauge.data_points() {
                let _ = writeln!(
                    out,
                    "{name}{} {}",
                    labels(point.attributes(), None),
                    point.value()
                );
            }
        }
        MetricData::Histogram(histogram) => {
            for point in histogram.data_points() {
                let mut cumulative = 0u64;
                let bounds: Vec<f64> = point.bounds().chain([f64::INFINITY]).collect();
                for (upper, count) in bounds.iter().zip(point.bucket_counts()) {
                    cumulative += count;
                    let le = Some(("le", bound(*upper)));
                    let _ = writeln!(
                        out,
                        "{name}_bucket{} {cumulative}",
                        labels(point.attributes(), le)
                    );
                }
                let plain = labels(point.attributes(), None);
                let _ = writeln!(out, "{name}_sum{plain} {}", point.sum());
                let _ = writeln!(out, "{name}_count{plain} {}", point.count());
            }
        }
        MetricData::ExponentialHistogram(_) => {}
    }
}

fn family(metric: &Metric, out: &mut String) {
    let kind = match metric.data() {
        AggregatedMetrics::F64(data) => kind_of(data),
        AggregatedMetrics::U64(data) => kind_of(data),
        AggregatedMetrics::I64(data) => kind_of(data),
    };
    let name = prometheus_name(metric.name(), metric.unit(), kind, None);
    let _ = writeln!(out, "# HELP {name} {}", escape_help(metric.description()));
    let _ = writeln!(out, "# TYPE {name} {}", kind.as_str());
    match metric.data() {
        AggregatedMetrics::F64(data) => samples(&name, data, out),
        AggregatedMetrics::U64(data) => samples(&name, data, out),
        AggregatedMetrics::I64(data) => samples(&name, data, out),
    }
}

/// The exposition (text format 0.0.4) of everything collected.
pub fn render(metrics: &ResourceMetrics) -> String {
    let mut out = String::new();
    for scope in metrics.scope_metrics() {
        for metric in scope.metrics() {
            family(metric, &mut out);
        }
    }
    out
}

/// The meter provider's reader for `/metrics`; the provider holds one clone, the
/// scrape another.
#[derive(Debug, Clone)]
pub(super) struct PrometheusReader(Arc<ManualReader>);

impl PrometheusReader {
    pub(super) fn new() -> Self {
        Self(Arc::new(
            ManualReader::builder()
                .with_temporality(Temporality::Cumulative)
                .build(),
        ))
    }

    fn collect_text(&self) -> Result<String, String> {
        let mut collected = ResourceMetrics::default();
        self.0
            .collect(&mut collected)
            .map_err(|e| format!("collecting metrics: {e}"))?;
        Ok(render(&collected))
    }
}

impl MetricReader for PrometheusReader {
    fn register_pipeline(&self, pipeline: Weak<Pipeline>) {
        self.0.register_pipeline(pipeline);
    }

    fn collect(&self, metrics: &mut ResourceMetrics) -> OTelSdkResult {
        self.0.collect(metrics)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn temporality(&self, kind: InstrumentKind) -> Temporality {
        self.0.temporality(kind)
    }
}

static SCRAPED: OnceLock<PrometheusReader> = OnceLock::new();

/// Installs `reader` as the one `/metrics` serves.
pub(super) fn install(reader: PrometheusReader) {
    let _ = SCRAPED.set(reader);
}

/// The current metrics as Prometheus text; `None` when `/metrics` is not enabled
/// (`OTEL_METRICS_EXPORTER` without `prometheus`).
pub fn scrape() -> Option<Result<String, String>> {
    SCRAPED.get().map(PrometheusReader::collect_text)
}

/// Whether `/metrics` is enabled in this process.
pub fn enabled() -> bool {
    SCRAPED.get().is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::metrics::MeterProvider as _;
    use opentelemetry_sdk::metrics::SdkMeterProvider;

    #[test]
    fn instruments_render_as_the_collector_names_them() {
        let reader = PrometheusReader::new();
        let provider = SdkMeterProvider::builder()
            .with_reader(reader.clone())
            .build();
        let meter = provider.meter("test");
        let counter = meter
            .u64_counter("payment_worker.commands")
            .with_description("Commands finished")
            .build();
        counter.add(2, &[KeyValue::new("outcome", "succeeded")]);
        counter.add(1, &[KeyValue::new("outcome", "say \"no\"")]);
        let histogram = meter
            .f64_histogram("payment_worker.command.duration")
            .with_unit("s")
            .with_description("Time")
            .with_boundaries(vec![0.01, 0.1])
            .build();
        histogram.record(0.05, &[]);
        histogram.record(5.0, &[]);
        let gauge = meter
            .i64_up_down_counter("payment_worker.commands.in_flight")
            .with_description("In flight")
            .build();
        gauge.add(-3, &[KeyValue::new("http.response.status_code", 503)]);
        let text = reader.collect_text().unwrap();
        for line in [
            "# TYPE payment_worker_commands_total counter",
            "payment_worker_commands_total{outcome=\"succeeded\"} 2",
            "payment_worker_commands_total{outcome=\"say \\\"no\\\"\"} 1",
            "# TYPE payment_worker_command_duration_seconds histogram",
            "payment_worker_command_duration_seconds_bucket{le=\"0.01\"} 0",
            "payment_worker_command_duration_seconds_bucket{le=\"0.1\"} 1",
            "payment_worker_command_duration_seconds_bucket{le=\"+Inf\"} 2",
            "payment_worker_command_duration_seconds_sum 5.05",
            "payment_worker_command_duration_seconds_count 2",
            "# TYPE payment_worker_commands_in_flight gauge",
            "payment_worker_commands_in_flight{http_response_status_code=\"503\"} -3",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line:?} missing from:\n{text}"
            );
        }
    }
}
