//! One trace per command, parented by `traceparent`, with the
//! token verdict and outcome; duplicates link to the trace that charged; and the
//! binary exports spans and metrics over OTLP configured only by `OTEL_*`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry::trace::{SpanId, SpanKind, TraceId};
use opentelemetry_sdk::trace::SpanData;
use payment_worker_devtools::SimulatorConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

use crate::support::cards::card_like_numbers;
use crate::support::helpers::{
    card_free_trace_id, quick_worker_settings, span_exporter, stop_all, unique, Stack,
};

fn command(key: &str) -> String {
    serde_json::json!({"idempotency_key": key, "account_id": "acct_7", "amount_minor": 4200,
        "currency": "EUR", "payment_method": "pm_card_visa"})
    .to_string()
}

async fn produce_traced(stack: &Stack, key: &str, traceparent: &str) {
    let producer: FutureProducer = payment_worker::worker::producer_config(&stack.settings)
        .create()
        .unwrap();
    let value = command(key);
    let record = FutureRecord::to(&stack.settings.commands_topic)
        .key(key)
        .payload(&value)
        .headers(OwnedHeaders::new().insert(Header {
            key: "traceparent",
            value: Some(traceparent),
        }));
    producer
        .send(record, Timeout::After(Duration::from_secs(10)))
        .await
        .unwrap();
}

fn attr(span: &SpanData, name: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == name)
        .map(|kv| kv.value.to_string())
}

/// Waits until the trace's consumer span has ended (it ends last).
async fn trace_spans(trace_id: TraceId) -> Vec<SpanData> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let spans: Vec<SpanData> = span_exporter()
            .get_finished_spans()
            .unwrap()
            .into_iter()
            .filter(|s| s.span_context.trace_id() == trace_id)
            .collect();
        if spans.iter().any(|s| s.span_kind == SpanKind::Consumer) {
            return spans;
        }
        assert!(
            Instant::now() < deadline,
            "no consumer span for trace {trace_id}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn children<'a>(spans: &'a [SpanData], parent: &SpanData) -> Vec<&'a str> {
    let mut names: Vec<&str> = spans
        .iter()
        .filter(|s| s.parent_span_id == parent.span_context.span_id())
        .map(|s| s.name.as_ref())
        .collect();
    names.sort_unstable();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_command_is_one_readable_trace_and_a_replay_links_to_it() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    // Letters only after the prefix: a random hex run of 13+ digits can pass Luhn,
    // and the card-number check below must not trip over the key itself.
    let key: String = unique("traced")
        .replace('_', "-")
        .chars()
        .map(|c| {
            if c.is_ascii_digit() {
                (b'g' + (c as u8 - b'0')) as char
            } else {
                c
            }
        })
        .collect();
    let trace_a = card_free_trace_id();
    let remote_parent = SpanId::from_hex("00f067aa0ba902b7").unwrap();
    produce_traced(&stack, &key, &format!("00-{trace_a}-{remote_parent}-01")).await;
    let worker = stack.start_worker("t", &quick_worker_settings());
    stack.wait_for_results(1, Duration::from_secs(30)).await;
    let spans = trace_spans(trace_a).await;

    let consumer = spans
        .iter()
        .find(|s| s.span_kind == SpanKind::Consumer)
        .unwrap();
    assert_eq!(consumer.name, "payments.commands process");
    assert_eq!(
        consumer.parent_span_id, remote_parent,
        "parented by the traceparent header"
    );
    assert_eq!(attr(consumer, "messaging.system").as_deref(), Some("kafka"));
    assert_eq!(
        attr(consumer, "messaging.destination.name").as_deref(),
        Some("payments.commands")
    );
    assert_eq!(
        attr(consumer, "messaging.destination.partition.id").as_deref(),
        Some("0")
    );
    assert_eq!(
        attr(consumer, "messaging.kafka.offset").as_deref(),
        Some("0")
    );
    assert_eq!(
        attr(consumer, "messaging.consumer.group.name"),
        Some(stack.settings.group_id.clone())
    );
    assert_eq!(attr(consumer, "token.verdict").as_deref(), Some("reserved"));
    assert_eq!(
        attr(consumer, "payment.outcome").as_deref(),
        Some("succeeded")
    );

    assert_eq!(
        children(&spans, consumer),
        vec![
            "offset commit",
            "payment transaction",
            "payments.results send",
            "token confirm",
            "token reserve"
        ]
    );
    let reserve = spans.iter().find(|s| s.name == "token reserve").unwrap();
    assert_eq!(attr(reserve, "token.verdict").as_deref(), Some("reserved"));
    let transaction = spans
        .iter()
        .find(|s| s.name == "payment transaction")
        .unwrap();
    let statements = children(&spans, transaction);
    for expected in [
        "BEGIN payments",
        "INSERT payments",
        "POST /charges",
        "UPDATE payments",
        "COMMIT payments",
    ] {
        assert!(
            statements.contains(&expected),
            "{expected} missing under the transaction: {statements:?}"
        );
    }
    // A fresh lease is certainly still held at the POST and at COMMIT: no check.
    assert!(!statements.contains(&"token extend"), "{statements:?}");
    // The pre-existing check rides in the INSERT: no separate SELECT round trip.
    assert!(!statements.contains(&"SELECT payments"), "{statements:?}");
    let charge = spans.iter().find(|s| s.name == "POST /charges").unwrap();
    assert_eq!(charge.span_kind, SpanKind::Client);
    assert_eq!(
        attr(charge, "http.response.status_code").as_deref(),
        Some("200")
    );
    // The gateway received the trace context of the client span.
    let seen = stack
        .simulator
        .traceparent_of(&key)
        .expect("traceparent at the gateway");
    assert_eq!(
        seen,
        format!("00-{trace_a}-{}-01", charge.span_context.span_id())
    );
    // The row remembers the trace that charged.
    let (row_trace,): (Option<String>,) =
        sqlx::query_as("SELECT trace_id FROM payments WHERE idempotency_key = $1")
            .bind(&key)
            .fetch_one(&stack.db.pool)
            .await
            .unwrap();
    assert_eq!(row_trace, Some(trace_a.to_string()));
    // Nothing sensitive in any attribute.
    for span in &spans {
        for kv in &span.attributes {
            let value = kv.value.to_string();
            assert!(
                !value.contains("pm_card_visa"),
                "payment method in {}: {}",
                span.name,
                kv.key
            );
            assert!(
                card_like_numbers(&value).is_empty(),
                "card-like number in {}: {}",
                span.name,
                kv.key
            );
        }
    }

    // The same command replayed under another trace: a duplicate linked to trace A.
    let trace_b = card_free_trace_id();
    produce_traced(&stack, &key, &format!("00-{trace_b}-{remote_parent}-01")).await;
    stack.wait_for_results(2, Duration::from_secs(30)).await;
    let replay = trace_spans(trace_b).await;
    let consumer_b = replay
        .iter()
        .find(|s| s.span_kind == SpanKind::Consumer)
        .unwrap();
    assert_eq!(
        attr(consumer_b, "payment.outcome").as_deref(),
        Some("duplicate")
    );
    assert!(
        consumer_b
            .links
            .iter()
            .any(|l| l.span_context.trace_id() == trace_a),
        "the duplicate links to the trace that charged: {:?}",
        consumer_b.links
    );
    stop_all(vec![worker]).await;
}

/// An OTLP/HTTP receiver that decodes what it gets.
#[derive(Default)]
pub(crate) struct Received {
    pub spans: Vec<(String, HashMap<String, String>)>,
    pub metrics: Vec<String>,
    /// Every metric as received (name, unit, kind, data points), for tests that look
    /// at more than the name.
    pub metric_data: Vec<opentelemetry_proto::tonic::metrics::v1::Metric>,
    /// The sender's `service.instance.id` of each entry of `metric_data`, in order.
    pub metric_instances: Vec<Option<String>>,
    pub service_names: Vec<String>,
}

pub(crate) async fn start_receiver() -> (std::net::SocketAddr, Arc<Mutex<Received>>) {
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message;
    let received = Arc::new(Mutex::new(Received::default()));
    let traces = Arc::clone(&received);
    let metrics = Arc::clone(&received);
    fn service_name(
        resource: Option<&opentelemetry_proto::tonic::resource::v1::Resource>,
    ) -> Option<String> {
        resource_attribute(resource, "service.name")
    }
    fn resource_attribute(
        resource: Option<&opentelemetry_proto::tonic::resource::v1::Resource>,
        name: &str,
    ) -> Option<String> {
        resource?
            .attributes
            .iter()
            .find(|kv| kv.key == name)
            .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s) => {
                    Some(s.clone())
                }
                _ => None,
            })
    }
    let app = axum::Router::new()
        .route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| async move {
                let request = ExportTraceServiceRequest::decode(body).expect("OTLP trace protobuf");
                let mut received = traces.lock().unwrap();
                for resource_spans in request.resource_spans {
                    if let Some(name) = service_name(resource_spans.resource.as_ref()) {
                        received.service_names.push(name);
                    }
                    for scope in resource_spans.scope_spans {
                        for span in scope.spans {
                            let attributes = span
                                .attributes
                                .iter()
                                .map(|kv| (kv.key.clone(), format!("{:?}", kv.value)))
                                .collect();
                            received.spans.push((span.name, attributes));
                        }
                    }
                }
                axum::http::StatusCode::OK
            }),
        )
        .route(
            "/v1/metrics",
            axum::routing::post(move |body: axum::body::Bytes| async move {
                let request =
                    ExportMetricsServiceRequest::decode(body).expect("OTLP metrics protobuf");
                let mut received = metrics.lock().unwrap();
                for resource_metrics in request.resource_metrics {
                    let instance = resource_attribute(
                        resource_metrics.resource.as_ref(),
                        "service.instance.id",
                    );
                    for scope in resource_metrics.scope_metrics {
                        for metric in scope.metrics {
                            received.metrics.push(metric.name.clone());
                            received.metric_data.push(metric);
                            received.metric_instances.push(instance.clone());
                        }
                    }
                }
                axum::http::StatusCode::OK
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, received)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_binary_exports_spans_and_metrics_over_otlp() {
    let stack = Stack::new(2, SimulatorConfig::default()).await;
    let (addr, received) = start_receiver().await;
    let key = unique("otlp").replace('_', "-");
    let trace = card_free_trace_id();
    produce_traced(&stack, &key, &format!("00-{trace}-00f067aa0ba902b7-01")).await;

    let health = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut child = tokio::process::Command::new(crate::support::procs::BINARY)
        .arg("run")
        .env_clear()
        .env("HEALTH_LISTEN", health.to_string())
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("KAFKA_BROKERS", &stack.settings.brokers)
        .env("KAFKA_GROUP_ID", &stack.settings.group_id)
        .env("KAFKA_SESSION_TIMEOUT", "6s")
        .env("DRAIN_DEADLINE", "3s")
        .env("DATABASE_URL", &stack.db.url)
        .env("REDIS_URL", crate::support::helpers::REDIS_URL)
        .env("REDIS_KEY_PREFIX", &stack.redis.prefix)
        .env("GATEWAY_URL", stack.simulator.url())
        // Telemetry: nothing but the standard variables.
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}"))
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        .env("OTEL_SERVICE_NAME", "payment-worker-under-test")
        .env("OTEL_METRIC_EXPORT_INTERVAL", "1000")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    stack.wait_for_results(1, Duration::from_secs(60)).await;
    for path in ["healthz", "readyz"] {
        let response = crate::support::helpers::http_get(format!("http://{health}/{path}"))
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "/{path}");
    }
    let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "graceful exit after SIGTERM: {status:?}");

    let received = received.lock().unwrap();
    let names: Vec<&str> = received.spans.iter().map(|(n, _)| n.as_str()).collect();
    for expected in [
        "payments.commands process",
        "token reserve",
        "payment transaction",
        "POST /charges",
        "token confirm",
        "payments.results send",
    ] {
        assert!(
            names.contains(&expected),
            "span {expected} not exported: {names:?}"
        );
    }
    assert!(received
        .service_names
        .iter()
        .all(|n| n == "payment-worker-under-test"));
    for expected in [
        "payment_worker.commands",
        "payment_worker.command.duration",
        "payment_worker.commands.in_flight",
    ] {
        assert!(
            received.metrics.iter().any(|m| m == expected),
            "metric {expected} not exported: {:?}",
            received.metrics
        );
    }
}
