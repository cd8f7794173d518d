//! The names an operator queries are the names Prometheus really shows. Worker
//! processes export their metrics over OTLP to an in-test receiver; the received
//! metrics are renamed the way the collector's Prometheus exporter renames them (with
//! the namespace of `deploy/otel-collector.yaml`), and every metric queried by
//! `deploy/grafana/payment-worker.json` and `deploy/prometheus/alerts.yml` must be
//! among them. The lag a member reports for a partition it no longer holds falls to
//! zero, so the queries' `max by (partition)` reads the owner's value. The same
//! worker also serves Prometheus text at `/metrics` (`OTEL_METRICS_EXPORTER=otlp,prometheus`):
//! scraped after the payments, it passes `promtool check metrics` and holds exactly
//! the families the collector would show, so the dashboard and the alerts work
//! without a collector.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::metrics::v1::{metric::Data, number_data_point, Metric};
use payment_worker_devtools::SimulatorConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use redis::AsyncCommands;
use tokio::sync::{mpsc, Notify};

use crate::support::helpers::{unique, Stack, REDIS_URL};
use crate::support::tokens::redis_token_key;
use crate::telemetry::metric_names::{
    collector_namespace, kind_of, metrics_queried_by_the_operator_kit, prometheus_name,
    series_names,
};
use crate::telemetry::traces::{start_receiver, Received};

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
    // payment_worker.gateway.failures: a failure class and the HTTP status (bounded).
    "class",
    "http.response.status_code",
    // payment_worker.db.pool.acquire: ok, timeout or error.
    "result",
    // payment_worker.token.settle_waits: notification or backoff.
    "woken_by",
];

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
        http: crate::support::helpers::http(),
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

/// A `payment-worker run` child exporting metrics every second to `otlp`, named
/// `instance` in its telemetry as the compose file and the manifests name workers.
fn spawn_worker(
    stack: &Stack,
    otlp: SocketAddr,
    gateway: &str,
    instance: &str,
    extra: &[(&str, &str)],
) -> tokio::process::Child {
    let health = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    tokio::process::Command::new(crate::support::procs::BINARY)
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
        .env("GATEWAY_URL", gateway)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{otlp}"))
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        .env("OTEL_SERVICE_NAME", "payment-worker")
        .env(
            "OTEL_RESOURCE_ATTRIBUTES",
            format!("service.instance.id={instance}"),
        )
        .env("OTEL_METRIC_EXPORT_INTERVAL", "1000")
        .envs(extra.iter().copied())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

async fn stop(mut child: tokio::process::Child) {
    let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "graceful exit after SIGTERM: {status:?}");
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
    // Its handling panics (an injected fault), three times, then it is dead-lettered.
    let panic_key = format!("panic-{run}");
    records.push((panic_key.clone(), command(&panic_key)));
    // A token key of the wrong type: every reserve of that key fails as corrupt.
    let mut redis = stack.redis.conn.clone();
    let corrupt_token = redis_token_key(&stack.redis.prefix, &corrupt_key);
    let _: () = redis.set(&corrupt_token, "not a token hash").await.unwrap();
    produce(&stack, &records).await;

    // The held and the corrupt command give up quickly: retries_exhausted.
    let health = crate::support::procs::free_port();
    let health_listen = format!("127.0.0.1:{health}");
    let child = spawn_worker(
        &stack,
        otlp,
        &gateway,
        "worker-1",
        &[
            ("HEALTH_LISTEN", &health_listen),
            ("OTEL_METRICS_EXPORTER", "otlp,prometheus"),
            ("RETRY_BUDGET", "3s"),
            ("PAYMENT_WORKER_FAULT", "panic:after_reserve"),
            ("PAYMENT_WORKER_FAULT_KEY", &panic_key),
            // The panicked attempt's token waits out its lease before the next try.
            ("LEASE", "2s"),
        ],
    );

    // While the held key's charge is at the gateway, another owner takes its token:
    // the worker's restore after the 503 is refused, a token inconsistency.
    let arrived = tokio::time::timeout(Duration::from_secs(90), held.recv())
        .await
        .expect("the held command reaches the gateway")
        .expect("gateway channel open");
    assert_eq!(arrived, held_key);
    let held_token = redis_token_key(&stack.redis.prefix, &held_key);
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
    assert!(
        queried.contains("payment_worker_panics_total"),
        "the dashboard and alerts watch panics"
    );
    assert!(
        queried.len() >= 8,
        "suspiciously few metrics queried: {queried:?}"
    );

    let exported = |received: &Received| -> BTreeMap<String, String> {
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

    let scraped = crate::support::helpers::http()
        .get(format!("http://{health_listen}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(scraped.status(), 200);
    let scraped = scraped.text().await.unwrap();
    stop(child).await;
    scrape_matches_the_collector(&scraped, &exported(&received.lock().unwrap()), &queried);

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

/// `/metrics` as Prometheus reads it: `promtool check metrics` accepts it, its series
/// are the ones the collector would show for what the same worker exported over
/// OTLP, and every metric the dashboard and the alerts query is among them.
fn scrape_matches_the_collector(
    scraped: &str,
    collector: &BTreeMap<String, String>,
    queried: &BTreeSet<String>,
) {
    let file = std::env::temp_dir().join(format!("pw-metrics-{}.txt", uuid::Uuid::new_v4()));
    std::fs::write(&file, scraped).unwrap();
    let output = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&file).unwrap())
        .output()
        .expect("promtool (apt-get install prometheus)");
    std::fs::remove_file(&file).ok();
    assert!(
        output.status.success(),
        "promtool check metrics refused /metrics:\n{}{}\n{scraped}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let series: BTreeSet<String> = scraped
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect();
    let collector: BTreeSet<String> = collector.keys().cloned().collect();
    assert_eq!(
        series, collector,
        "/metrics and the collector's view of the OTLP export differ"
    );
    let missing: Vec<&String> = queried.iter().filter(|q| !series.contains(*q)).collect();
    assert!(
        missing.is_empty(),
        "queried but not at /metrics: {missing:?}"
    );
}

/// The latest lag each worker instance reported, per partition.
fn latest_lag(received: &Received) -> BTreeMap<(String, i64), i64> {
    let mut latest = BTreeMap::new();
    for (metric, instance) in received.metric_data.iter().zip(&received.metric_instances) {
        let (Some(Data::Gauge(gauge)), Some(instance)) = (metric.data.as_ref(), instance) else {
            continue;
        };
        if metric.name != "payment_worker.consumer.lag" {
            continue;
        }
        for point in &gauge.data_points {
            let partition = point
                .attributes
                .iter()
                .find(|kv| kv.key == "partition")
                .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                    AnyValue::IntValue(p) => Some(*p),
                    _ => None,
                });
            let value = match point.value {
                Some(number_data_point::Value::AsInt(v)) => v,
                Some(number_data_point::Value::AsDouble(v)) => v as i64,
                None => continue,
            };
            if let Some(partition) = partition {
                latest.insert((instance.clone(), partition), value);
            }
        }
    }
    latest
}

async fn wait_for_lag<T>(
    received: &Arc<Mutex<Received>>,
    what: &str,
    found: impl Fn(&BTreeMap<(String, i64), i64>) -> Option<T>,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let latest = latest_lag(&received.lock().unwrap());
        if let Some(value) = found(&latest) {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "{what}; lag reported: {latest:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partitions_former_owner_reports_zero_lag_for_it() {
    // A backlog on both partitions that one worker drains slowly.
    let stack = Stack::new(
        2,
        SimulatorConfig {
            latency_ms: 100,
            ..SimulatorConfig::default()
        },
    )
    .await;
    let (otlp, received) = start_receiver().await;
    let run = unique("lag").replace('_', "-");
    let records: Vec<(String, String)> = (0..600)
        .map(|i| {
            let key = format!("lag-{i}-{run}");
            let value = command(&key);
            (key, value)
        })
        .collect();
    produce(&stack, &records).await;
    let slow = [("MAX_IN_FLIGHT", "1")];
    let gateway = stack.simulator.url();
    let first = spawn_worker(&stack, otlp, &gateway, "worker-a", &slow);
    wait_for_lag(
        &received,
        "worker-a reports a backlog on both partitions",
        |lag| {
            let a = |p: i64| lag.get(&("worker-a".to_owned(), p)).copied().unwrap_or(0);
            (a(0) > 0 && a(1) > 0).then_some(())
        },
    )
    .await;

    // A second member takes one partition over.
    let second = spawn_worker(&stack, otlp, &gateway, "worker-b", &slow);
    let moved = wait_for_lag(
        &received,
        "worker-b reports the backlog of a partition",
        |lag| {
            (0..2).find(|p| {
                lag.get(&("worker-b".to_owned(), *p))
                    .is_some_and(|v| *v > 0)
            })
        },
    )
    .await;
    // Its former owner stops claiming a backlog there: max by partition is the owner's.
    wait_for_lag(
        &received,
        "worker-a still reports lag for the partition it lost",
        |lag| (lag.get(&("worker-a".to_owned(), moved)) == Some(&0)).then_some(()),
    )
    .await;
    stop(second).await;
    stop(first).await;
}
