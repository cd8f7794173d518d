//! The names an operator queries are the names Prometheus really shows. A worker
//! process exports its metrics over OTLP to an in-test receiver, the received
//! metrics are renamed the way the collector's Prometheus exporter renames them
//! (with the namespace of `deploy/otel-collector.yaml`), and every metric queried by
//! `deploy/grafana/payment-worker.json` and `deploy/prometheus/alerts.yml` must be
//! among them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::metrics::v1::{metric::Data, Metric};
use payment_worker::gateway::SimulatorConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use redis::AsyncCommands;
use tokio::sync::{mpsc, Notify};

use crate::helpers::{unique, Stack, REDIS_URL};
use crate::telemetry::start_receiver;

/// Metrics some alerts query that come from elsewhere than the worker.
const EXTERNAL_METRICS: &[&str] = &[
    // kube-state-metrics, on Kubernetes only.
    "kube_pod_container_status_restarts_total",
];

/// Attribute keys the worker may put on a metric: all low-cardinality.
const ALLOWED_ATTRIBUTES: &[&str] = &[
    "outcome",
    "kind",
    "operation",
    "reason",
    "expected",
    "actual",
    "partition",
];

fn read(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PrometheusKind {
    Counter,
    Gauge,
    Histogram,
    Summary,
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
fn prometheus_name(
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

/// Every series name Prometheus shows for a family (histograms and summaries have
/// several).
fn series_names(family: &str, kind: PrometheusKind) -> Vec<String> {
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
fn kind_of(metric: &Metric) -> Option<PrometheusKind> {
    match metric.data.as_ref()? {
        Data::Sum(sum) if sum.is_monotonic => Some(PrometheusKind::Counter),
        Data::Sum(_) | Data::Gauge(_) => Some(PrometheusKind::Gauge),
        Data::Histogram(_) => Some(PrometheusKind::Histogram),
        Data::Summary(_) => Some(PrometheusKind::Summary),
        // Exponential histograms become native histograms, queried by family name.
        Data::ExponentialHistogram(_) => Some(PrometheusKind::Gauge),
    }
}

fn collector_namespace() -> Option<String> {
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
fn metrics_queried_by_the_operator_kit() -> BTreeSet<String> {
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

fn command(key: &str) -> String {
    serde_json::json!({"idempotency_key": key, "account_id": "acct_ops", "amount_minor": 1250,
        "currency": "EUR", "payment_method": "pm_card_visa"})
    .to_string()
}

/// The held key's POST: the gateway tells the test it arrived, waits until the test
/// has taken the token away from the worker, then answers 503.
const HELD_PREFIX: &str = "held-";

struct Gate {
    simulator: String,
    http: reqwest::Client,
    arrived: mpsc::UnboundedSender<String>,
    release: Notify,
    held_once: AtomicBool,
}

async fn forward(gate: &Gate, request: reqwest::RequestBuilder) -> Response {
    match request.send().await {
        Ok(answer) => {
            let status =
                StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
            let body = answer.bytes().await.unwrap_or_default();
            (status, [("content-type", "application/json")], body).into_response()
        }
        Err(error) => (
            StatusCode::BAD_GATEWAY,
            format!("{} unreachable: {error}", gate.simulator),
        )
            .into_response(),
    }
}

async fn post_charge(
    State(gate): State<Arc<Gate>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    if key.starts_with(HELD_PREFIX) {
        if !gate.held_once.swap(true, Ordering::SeqCst) {
            let _ = gate.arrived.send(key);
            gate.release.notified().await;
        }
        return (StatusCode::SERVICE_UNAVAILABLE, "held by the test").into_response();
    }
    let mut request = gate
        .http
        .post(format!("{}/charges", gate.simulator))
        .body(body);
    for (name, value) in &headers {
        if name != "host" && name != "content-length" {
            request = request.header(name, value);
        }
    }
    forward(&gate, request).await
}

async fn get_charge(State(gate): State<Arc<Gate>>, UrlPath(key): UrlPath<String>) -> Response {
    forward(
        &gate,
        gate.http.get(format!("{}/charges/{key}", gate.simulator)),
    )
    .await
}

async fn start_gate(simulator: String) -> (String, Arc<Gate>, mpsc::UnboundedReceiver<String>) {
    let (arrived, held) = mpsc::unbounded_channel();
    let gate = Arc::new(Gate {
        simulator,
        http: reqwest::Client::new(),
        arrived,
        release: Notify::new(),
        held_once: AtomicBool::new(false),
    });
    let app = axum::Router::new()
        .route("/charges", axum::routing::post(post_charge))
        .route("/charges/{key}", axum::routing::get(get_charge))
        .with_state(Arc::clone(&gate));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, gate, held)
}

async fn produce(stack: &Stack, records: &[(String, String)]) {
    let producer: FutureProducer = payment_worker::worker::producer_config(&stack.settings)
        .create()
        .unwrap();
    for (key, value) in records {
        producer
            .send(
                FutureRecord::to(&stack.settings.commands_topic)
                    .key(key)
                    .payload(value),
                Timeout::After(Duration::from_secs(10)),
            )
            .await
            .unwrap();
    }
}

fn string_of(value: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        other => format!("{other:?}"),
    }
}

/// (attribute key, value) pairs of every data point of a metric.
fn attributes(metric: &Metric) -> Vec<(String, String)> {
    let pairs = |kvs: &[opentelemetry_proto::tonic::common::v1::KeyValue]| {
        kvs.iter()
            .map(|kv| (kv.key.clone(), string_of(kv.value.as_ref())))
            .collect::<Vec<_>>()
    };
    match metric.data.as_ref() {
        Some(Data::Sum(s)) => s
            .data_points
            .iter()
            .flat_map(|p| pairs(&p.attributes))
            .collect(),
        Some(Data::Gauge(g)) => g
            .data_points
            .iter()
            .flat_map(|p| pairs(&p.attributes))
            .collect(),
        Some(Data::Histogram(h)) => h
            .data_points
            .iter()
            .flat_map(|p| pairs(&p.attributes))
            .collect(),
        _ => Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_exports_every_metric_the_dashboard_and_the_alerts_query() {
    let stack = Stack::new(2, SimulatorConfig::default()).await;
    let (otlp, received) = start_receiver().await;
    let (gateway, gate, mut held) = start_gate(stack.simulator.url()).await;

    let run = unique("ops").replace('_', "-");
    let held_key = format!("{HELD_PREFIX}{run}");
    let corrupt_key = format!("corrupt-{run}");
    let mut records: Vec<(String, String)> = (0..4)
        .map(|i| {
            let key = format!("paid-{i}-{run}");
            let value = command(&key);
            (key, value)
        })
        .collect();
    records.push((
        format!("bad-{run}"),
        "this is not a payment command".to_owned(),
    ));
    records.push((held_key.clone(), command(&held_key)));
    records.push((corrupt_key.clone(), command(&corrupt_key)));
    // A token key of the wrong type: every reserve of that key fails as corrupt.
    let mut redis = stack.redis.conn.clone();
    let corrupt_token = format!("{}:token:{{{corrupt_key}}}", stack.redis.prefix);
    let _: () = redis.set(&corrupt_token, "not a token hash").await.unwrap();
    produce(&stack, &records).await;

    let health = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_payment-worker"))
        .arg("run")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HEALTH_LISTEN", health.to_string())
        .env("KAFKA_BROKERS", &stack.settings.brokers)
        .env("KAFKA_GROUP_ID", &stack.settings.group_id)
        .env("KAFKA_SESSION_TIMEOUT", "6s")
        .env("DRAIN_DEADLINE", "3s")
        .env("DATABASE_URL", &stack.db.url)
        .env("REDIS_URL", REDIS_URL)
        .env("REDIS_KEY_PREFIX", &stack.redis.prefix)
        .env("GATEWAY_URL", &gateway)
        // The held and the corrupt command give up quickly: retries_exhausted.
        .env("RETRY_BUDGET", "3s")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{otlp}"))
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        .env("OTEL_SERVICE_NAME", "payment-worker")
        .env("OTEL_METRIC_EXPORT_INTERVAL", "1000")
        .kill_on_drop(true)
        .spawn()
        .unwrap();

    // While the held key's charge is at the gateway, another owner takes its token:
    // the worker's restore after the 503 is refused, a token inconsistency.
    let arrived = tokio::time::timeout(Duration::from_secs(90), held.recv())
        .await
        .expect("the held command reaches the gateway")
        .expect("gateway channel open");
    assert_eq!(arrived, held_key);
    let held_token = format!("{}:token:{{{held_key}}}", stack.redis.prefix);
    let _: () = redis
        .hset(&held_token, "owner", "another-worker:takeover")
        .await
        .unwrap();
    gate.release.notify_one();

    stack
        .wait_for_results(records.len(), Duration::from_secs(120))
        .await;

    let namespace = collector_namespace();
    let mut queried = metrics_queried_by_the_operator_kit();
    for external in EXTERNAL_METRICS {
        queried.remove(*external);
    }
    // The lead's panic counter is queried by the dashboard and an alert; until the
    // worker declares it, this branch's worker cannot export it.
    let panics = "payment_worker_panics_total";
    assert!(
        queried.contains(panics),
        "the dashboard and alerts watch panics"
    );
    if !read("src/telemetry.rs").contains("\"payment_worker.panics\"") {
        eprintln!("{panics}: not declared by src/telemetry.rs yet; not required");
        queried.remove(panics);
    }
    assert!(
        queried.len() >= 8,
        "suspiciously few metrics queried: {queried:?}"
    );

    let exported = |received: &crate::telemetry::Received| -> BTreeMap<String, String> {
        received
            .metric_data
            .iter()
            .filter_map(|m| {
                let kind = kind_of(m)?;
                let family = prometheus_name(&m.name, &m.unit, kind, namespace.as_deref());
                Some(
                    series_names(&family, kind)
                        .into_iter()
                        .map(|s| (s, m.name.clone()))
                        .collect::<Vec<_>>(),
                )
            })
            .flatten()
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let missing = loop {
        let names = exported(&received.lock().unwrap());
        let missing: Vec<&String> = queried.iter().filter(|q| !names.contains_key(*q)).collect();
        if missing.is_empty() || Instant::now() > deadline {
            break missing.into_iter().cloned().collect::<Vec<_>>();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };

    let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "graceful exit after SIGTERM: {status:?}");

    let received = received.lock().unwrap();
    let names = exported(&received);
    assert!(
        missing.is_empty(),
        "queried by the dashboard or the alerts but not exported by the worker: {missing:?}\nexported: {:?}",
        names.keys().collect::<Vec<_>>()
    );

    // What made each failure metric appear is what the scenario did.
    let attrs: BTreeSet<(String, String, String)> = received
        .metric_data
        .iter()
        .flat_map(|m| {
            attributes(m)
                .into_iter()
                .map(|(k, v)| (m.name.clone(), k, v))
        })
        .collect();
    let has = |metric: &str, key: &str, value: &str| {
        attrs.contains(&(metric.to_owned(), key.to_owned(), value.to_owned()))
    };
    assert!(
        has("payment_worker.dead_letters", "kind", "invalid"),
        "{attrs:?}"
    );
    assert!(
        has("payment_worker.dead_letters", "kind", "retries_exhausted"),
        "{attrs:?}"
    );
    assert!(
        has(
            "payment_worker.atomic_operation.failures",
            "operation",
            "reserve"
        ),
        "{attrs:?}"
    );
    assert!(
        has(
            "payment_worker.atomic_operation.failures",
            "reason",
            "corrupt"
        ),
        "{attrs:?}"
    );
    assert!(
        has(
            "payment_worker.token.inconsistencies",
            "actual",
            "not_owned"
        ),
        "{attrs:?}"
    );
    assert!(
        has("payment_worker.commands", "outcome", "succeeded"),
        "{attrs:?}"
    );
    // Labels stay low-cardinality: known keys, never an idempotency key.
    for (metric, key, value) in &attrs {
        assert!(
            ALLOWED_ATTRIBUTES.contains(&key.as_str()),
            "{metric} carries attribute {key}"
        );
        assert!(
            !records.iter().any(|(k, _)| value.contains(k.as_str())),
            "{metric} {key}={value}"
        );
    }
    // Latency buckets resolve milliseconds, so p50/p95/p99 panels mean something.
    let bounds: Vec<f64> = received
        .metric_data
        .iter()
        .filter(|m| m.name == "payment_worker.command.duration")
        .filter_map(|m| match m.data.as_ref() {
            Some(Data::Histogram(h)) => h.data_points.first().map(|p| p.explicit_bounds.clone()),
            _ => None,
        })
        .next()
        .expect("the duration histogram was exported");
    assert!(
        bounds.iter().filter(|b| **b < 0.1).count() >= 4,
        "duration buckets are too coarse for payments: {bounds:?}"
    );
}
