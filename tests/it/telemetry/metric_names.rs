//! How the collector's Prometheus exporter names OpenTelemetry metrics (the
//! worker's `/metrics` uses the same function), and which metric names the
//! dashboard and the alert rules query. `metric_export.rs` applies both to what a
//! real worker exports, over OTLP and at `/metrics`.

use std::collections::BTreeSet;
use std::path::Path;

use opentelemetry_proto::tonic::metrics::v1::{metric::Data, Metric};

pub(crate) fn read(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The collector's renaming, as the worker's own `/metrics` applies it too: one
/// implementation, checked against the collector's behaviour below.
pub(crate) use payment_worker::telemetry::prometheus::{prometheus_name, PrometheusKind};

/// Every series name Prometheus shows for a family (histograms and summaries have
/// several).
pub(crate) fn series_names(family: &str, kind: PrometheusKind) -> Vec<String> {
    match kind {
        PrometheusKind::Counter | PrometheusKind::Gauge => vec![family.to_owned()],
        PrometheusKind::Histogram => ["_bucket", "_sum", "_count"]
            .iter()
            .map(|s| format!("{family}{s}"))
            .collect(),
        PrometheusKind::Summary => vec![
            family.to_owned(),
            format!("{family}_sum"),
            format!("{family}_count"),
        ],
    }
}

/// How the exporter types an OTLP metric: monotonic sums are counters, other sums
/// (up-down counters) and gauges are gauges.
pub(crate) fn kind_of(metric: &Metric) -> Option<PrometheusKind> {
    match metric.data.as_ref()? {
        Data::Sum(sum) if sum.is_monotonic => Some(PrometheusKind::Counter),
        Data::Sum(_) | Data::Gauge(_) => Some(PrometheusKind::Gauge),
        Data::Histogram(_) => Some(PrometheusKind::Histogram),
        Data::Summary(_) => Some(PrometheusKind::Summary),
        // Exponential histograms become native histograms, queried by family name.
        Data::ExponentialHistogram(_) => Some(PrometheusKind::Gauge),
    }
}

pub(crate) fn collector_namespace() -> Option<String> {
    let config: serde_yaml::Value =
        serde_yaml::from_str(&read("deploy/otel-collector.yaml")).expect("collector YAML");
    config
        .get("exporters")
        .and_then(|e| e.get("prometheus"))
        .expect("the collector has a prometheus exporter")
        .get("namespace")
        .and_then(serde_yaml::Value::as_str)
        .map(str::to_owned)
}

/// Identifiers in a PromQL expression that name metrics of the worker or of the
/// known external exporters (label values inside quotes are skipped).
fn queried_metrics(expr: &str, into: &mut BTreeSet<String>) {
    let mut in_quote: Option<char> = None;
    let mut word = String::new();
    let flush = |word: &mut String, into: &mut BTreeSet<String>| {
        if word.starts_with("payment_worker_") || word.starts_with("kube_") {
            into.insert(std::mem::take(word));
        }
        word.clear();
    };
    for c in expr.chars() {
        match in_quote {
            Some(q) if c == q => in_quote = None,
            Some(_) => {}
            None if c == '"' || c == '\'' || c == '`' => {
                flush(&mut word, into);
                in_quote = Some(c);
            }
            None if c.is_ascii_alphanumeric() || c == '_' || c == ':' => word.push(c),
            None => flush(&mut word, into),
        }
    }
    flush(&mut word, into);
}

fn dashboard_queries(value: &serde_json::Value, into: &mut BTreeSet<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr" | "definition", serde_json::Value::String(expr)) => {
                        queried_metrics(expr, into)
                    }
                    _ => dashboard_queries(value, into),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| dashboard_queries(v, into)),
        _ => {}
    }
}

/// Metric names queried by the dashboard and by the alert rules.
pub(crate) fn metrics_queried_by_the_operator_kit() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/payment-worker.json")).expect("dashboard JSON");
    dashboard_queries(&dashboard, &mut names);
    let alerts: serde_yaml::Value =
        serde_yaml::from_str(&read("deploy/prometheus/alerts.yml")).expect("alerts YAML");
    for group in alerts["groups"].as_sequence().expect("rule groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            queried_metrics(
                rule["expr"].as_str().expect("every rule has an expr"),
                &mut names,
            );
        }
    }
    names
}

#[test]
fn names_follow_the_collector_prometheus_exporter() {
    let cases = [
        (
            "payment_worker.commands",
            "",
            PrometheusKind::Counter,
            None,
            "payment_worker_commands_total",
        ),
        (
            "payment_worker.command.duration",
            "s",
            PrometheusKind::Histogram,
            None,
            "payment_worker_command_duration_seconds",
        ),
        (
            "payment_worker.commands.in_flight",
            "",
            PrometheusKind::Gauge,
            None,
            "payment_worker_commands_in_flight",
        ),
        (
            "http.server.request.duration",
            "s",
            PrometheusKind::Histogram,
            None,
            "http_server_request_duration_seconds",
        ),
        (
            "system.cpu.time",
            "s",
            PrometheusKind::Counter,
            None,
            "system_cpu_time_seconds_total",
        ),
        (
            "requests.total",
            "",
            PrometheusKind::Counter,
            None,
            "requests_total",
        ),
        (
            "system.network.io",
            "By",
            PrometheusKind::Counter,
            None,
            "system_network_io_bytes_total",
        ),
        (
            "throughput",
            "By/s",
            PrometheusKind::Gauge,
            None,
            "throughput_bytes_per_second",
        ),
        (
            "cpu.utilization",
            "1",
            PrometheusKind::Gauge,
            None,
            "cpu_utilization_ratio",
        ),
        (
            "queue.size",
            "{message}",
            PrometheusKind::Gauge,
            None,
            "queue_size",
        ),
        // What the old collector config produced: the namespace doubles the prefix.
        (
            "payment_worker.commands",
            "",
            PrometheusKind::Counter,
            Some("payment_worker"),
            "payment_worker_payment_worker_commands_total",
        ),
        (
            "commands",
            "",
            PrometheusKind::Counter,
            Some("payment_worker"),
            "payment_worker_commands_total",
        ),
    ];
    for (name, unit, kind, namespace, expected) in cases {
        assert_eq!(
            prometheus_name(name, unit, kind, namespace),
            expected,
            "{name} [{unit}] {kind:?} ns {namespace:?}"
        );
    }
    assert_eq!(
        series_names(
            "payment_worker_command_duration_seconds",
            PrometheusKind::Histogram
        ),
        [
            "payment_worker_command_duration_seconds_bucket",
            "payment_worker_command_duration_seconds_sum",
            "payment_worker_command_duration_seconds_count"
        ]
    );
    let mut found = BTreeSet::new();
    queried_metrics(
        r#"sum by (kind) (rate(payment_worker_dead_letters_total{kind="payment_worker_not_a_metric"}[5m])) > 0"#,
        &mut found,
    );
    assert_eq!(
        found,
        BTreeSet::from(["payment_worker_dead_letters_total".to_owned()])
    );
}

#[test]
fn the_collector_does_not_double_the_prefix() {
    let namespace = collector_namespace();
    let name = prometheus_name(
        "payment_worker.commands",
        "",
        PrometheusKind::Counter,
        namespace.as_deref(),
    );
    assert_eq!(
        name, "payment_worker_commands_total",
        "namespace {namespace:?}"
    );
    for queried in metrics_queried_by_the_operator_kit() {
        assert!(
            !queried.contains("payment_worker_payment_worker"),
            "{queried}"
        );
    }
}
