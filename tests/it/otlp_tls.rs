//! OTLP over `https://`: a gRPC trace receiver behind TLS with a certificate from a
//! CA made at test time. A worker given that CA (`OTEL_EXPORTER_OTLP_CERTIFICATE`)
//! exports its spans there; with another CA nothing arrives.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use payment_worker::devtools::SimulatorConfig;
use payment_worker::operator::{RecordKind, WorkloadRecord};
use tonic::transport::{Identity, Server, ServerTlsConfig};

use crate::helpers::{unique, Stack};
use crate::pki::{path_str, TestPki};
use crate::procs::{binary, Proc};

#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<String>>>);

#[async_trait::async_trait]
impl TraceService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut names = self.0.lock().unwrap();
        for resource in request.into_inner().resource_spans {
            for scope in resource.scope_spans {
                names.extend(scope.spans.into_iter().map(|span| span.name));
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

async fn tls_receiver(pki: &TestPki) -> (u16, Received) {
    let received = Received::default();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let identity = Identity::from_pem(&pki.server_cert_pem, &pki.server_key_pem);
    let service = TraceServiceServer::new(received.clone());
    let mut server = Server::builder()
        .tls_config(ServerTlsConfig::new().identity(identity))
        .unwrap();
    let router = server.add_service(service);
    tokio::spawn(async move {
        let _ = router
            .serve(format!("127.0.0.1:{port}").parse().unwrap())
            .await;
    });
    (port, received)
}

async fn run_one_command(stack: &Stack, port: u16, ca: &std::path::Path, name: &str) {
    let key = unique(name).replace('_', "-");
    let value = serde_json::json!({"idempotency_key": key, "account_id": "acct_otlp",
        "amount_minor": 400, "currency": "EUR", "payment_method": "pm_card_visa"});
    stack
        .produce(&[WorkloadRecord {
            kind: RecordKind::Valid,
            key: Some(key.into_bytes()),
            value: Some(value.to_string().into_bytes()),
            partition_hint: None,
        }])
        .await;
    let before = stack.results().await.len();
    let mut env = stack.run_env();
    env.insert(
        "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
        format!("https://localhost:{port}"),
    );
    env.insert("OTEL_EXPORTER_OTLP_PROTOCOL".into(), "grpc".into());
    env.insert(
        "OTEL_EXPORTER_OTLP_CERTIFICATE".into(),
        path_str(ca).to_owned(),
    );
    let mut worker = Proc::spawn(name, binary(&["run"], &env));
    stack
        .wait_for_results(before + 1, Duration::from_secs(60))
        .await;
    // SIGTERM: the worker flushes its spans before it exits.
    worker.stop(Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spans_reach_an_https_receiver_verified_with_the_configured_ca() {
    let pki = TestPki::new();
    let (port, received) = tls_receiver(&pki).await;
    let stack = Stack::new(1, SimulatorConfig::default()).await;

    run_one_command(&stack, port, &pki.wrong_ca(), "otlp-wrong-ca").await;
    assert!(
        received.0.lock().unwrap().is_empty(),
        "spans crossed a TLS connection the worker should have refused"
    );

    run_one_command(&stack, port, &pki.ca(), "otlp-tls").await;
    let names = received.0.lock().unwrap().clone();
    for expected in [
        "payments.commands process",
        "token reserve",
        "POST /charges",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "span {expected} not received over TLS: {names:?}"
        );
    }
}
