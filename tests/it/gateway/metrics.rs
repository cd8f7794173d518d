//! A gateway that refuses our access is retried, counted in
//! `payment_worker.gateway.failures` and logged at `error`, without the gateway's
//! error text, by the real binary exporting over OTLP.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use payment_worker::operator::{RecordKind, WorkloadRecord};
use payment_worker_devtools::SimulatorConfig;
use prost::Message;

use crate::support::helpers::{Stack, REDIS_URL};
use crate::support::scripted_gateway::{PostAnswer, ScriptedGateway};

/// One data point of the failure counter: its attributes, sorted, and its value.
type Point = (Vec<(String, String)>, u64);

/// Receives OTLP/HTTP metric exports; keeps the points of the gateway failure counter.
async fn start_metric_receiver() -> (std::net::SocketAddr, Arc<Mutex<Vec<Point>>>) {
    let points = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&points);
    let app = axum::Router::new()
        .route(
            "/v1/metrics",
            axum::routing::post(move |body: axum::body::Bytes| async move {
                let request = ExportMetricsServiceRequest::decode(body).expect("OTLP metrics");
                let mut points = sink.lock().unwrap();
                for resource in request.resource_metrics {
                    for scope in resource.scope_metrics {
                        for metric in scope.metrics {
                            if metric.name != "payment_worker.gateway.failures" {
                                continue;
                            }
                            let Some(Data::Sum(sum)) = metric.data else {
                                panic!("the failure counter is a sum: {:?}", metric.data);
                            };
                            for point in sum.data_points {
                                let mut attributes: Vec<(String, String)> = point
                                    .attributes
                                    .iter()
                                    .map(|kv| {
                                        let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                                            Some(Value::StringValue(s)) => s.clone(),
                                            other => format!("{other:?}"),
                                        };
                                        (kv.key.clone(), value)
                                    })
                                    .collect();
                                attributes.sort();
                                let value = match point.value {
                                    Some(opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsInt(v)) => v as u64,
                                    other => panic!("an integer counter: {other:?}"),
                                };
                                points.push((attributes, value));
                            }
                        }
                    }
                }
                axum::http::StatusCode::OK
            }),
        )
        .route(
            "/v1/traces",
            axum::routing::post(|| async { axum::http::StatusCode::OK }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, points)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gateway_refusing_our_access_is_retried_counted_and_logged_as_an_error() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let front = ScriptedGateway::start(&stack.simulator).await;
    let (addr, points) = start_metric_receiver().await;
    let key = "gw-401";
    // Two refusals of our credentials, then the gateway lets us in.
    front.script(key, &[PostAnswer::Refuse(401), PostAnswer::Refuse(401)]);
    let value = serde_json::json!({
        "idempotency_key": key, "account_id": "acct_7", "amount_minor": 777,
        "currency": "USD", "payment_method": "pm_card_visa",
    });
    stack
        .produce(&[WorkloadRecord {
            kind: RecordKind::Valid,
            key: Some(key.as_bytes().to_vec()),
            value: Some(value.to_string().into_bytes()),
            partition_hint: None,
        }])
        .await;

    let health = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let child = tokio::process::Command::new(crate::support::procs::BINARY)
        .arg("run")
        .env_clear()
        .env("HEALTH_LISTEN", health.to_string())
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("KAFKA_BROKERS", &stack.settings.brokers)
        .env("KAFKA_GROUP_ID", &stack.settings.group_id)
        .env("KAFKA_SESSION_TIMEOUT", "6s")
        .env("DRAIN_DEADLINE", "3s")
        .env("DATABASE_URL", &stack.db.url)
        .env("REDIS_URL", REDIS_URL)
        .env("REDIS_KEY_PREFIX", &stack.redis.prefix)
        .env("GATEWAY_URL", front.url())
        .env("RUST_LOG", "info")
        .env(
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            format!("http://{addr}/v1/metrics"),
        )
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        .env("OTEL_METRIC_EXPORT_INTERVAL", "500")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let results = stack.wait_for_results(1, Duration::from_secs(60)).await;
    let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("exits after SIGTERM")
        .unwrap();
    assert!(output.status.success(), "{:?}", output.status);

    assert_eq!(results[0].outcome, "succeeded", "{results:?}");
    assert_eq!(front.posts_seen(key), 3, "two refused, one charged");
    let ledger = stack.ledger();
    assert_eq!(ledger.len(), 1, "one charge: {ledger:?}");

    // Cumulative counter: the last export holds the total per attribute set.
    let expected: Vec<(String, String)> = [
        ("class", "transient"),
        ("http.response.status_code", "401"),
        ("operation", "charge"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let points = points.lock().unwrap();
    let counted = points
        .iter()
        .filter(|(attributes, _)| *attributes == expected)
        .map(|(_, value)| *value)
        .max();
    assert_eq!(counted, Some(2), "exported points: {points:?}");

    let stderr = String::from_utf8_lossy(&output.stderr);
    let alerts: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("ERROR") && line.contains("refuses our access"))
        .collect();
    assert_eq!(alerts.len(), 2, "one error line per refusal:\n{stderr}");
    for alert in &alerts {
        assert!(alert.contains(key) && alert.contains("401"), "{alert}");
    }
    for secret in ["scripted", "pm_card_visa"] {
        assert!(
            !stderr.contains(secret),
            "the log carries {secret:?}:\n{stderr}"
        );
    }
}
