//! OTLP over `https://`: a trace receiver behind TLS with a certificate from a CA
//! made at test time, once over gRPC and once over HTTP/protobuf. A worker given that
//! CA (`OTEL_EXPORTER_OTLP_CERTIFICATE`) exports its spans there; with another CA
//! nothing arrives.

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
use prost::Message as _;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tonic::transport::{Identity, Server, ServerTlsConfig};

use crate::support::helpers::{unique, Stack};
use crate::support::pki::{path_str, TestPki};
use crate::support::procs::{binary, Proc};

#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<String>>>);

impl Received {
    fn record(&self, request: ExportTraceServiceRequest) {
        let mut names = self.0.lock().unwrap();
        for resource in request.resource_spans {
            for scope in resource.scope_spans {
                names.extend(scope.spans.into_iter().map(|span| span.name));
            }
        }
    }
}

#[async_trait::async_trait]
impl TraceService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.record(request.into_inner());
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

/// An OTLP/HTTP trace receiver behind TLS: HTTP/1.1 `POST /v1/traces` with a
/// protobuf body, answered 200 with an empty protobuf response.
async fn https_http_receiver(pki: &TestPki) -> (u16, Received) {
    let received = Received::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let acceptor = tokio_rustls::TlsAcceptor::from(pki.rustls_server());
    let sink = received.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, sink) = (acceptor.clone(), sink.clone());
            tokio::spawn(async move {
                // A refused handshake (the wrong-CA client) ends this connection only.
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut stream = BufReader::new(tls);
                while let Some(body) = read_http_request(&mut stream).await {
                    if let Ok(request) = ExportTraceServiceRequest::decode(body.as_slice()) {
                        sink.record(request);
                    }
                    let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                    if stream.get_mut().write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, received)
}

/// One request's body, or `None` when the connection ends.
async fn read_http_request<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut BufReader<S>,
) -> Option<Vec<u8>> {
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if stream.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0; length];
    stream.read_exact(&mut body).await.ok()?;
    Some(body)
}

async fn run_one_command(
    stack: &Stack,
    port: u16,
    protocol: &str,
    ca: &std::path::Path,
    name: &str,
) {
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
    env.insert("OTEL_EXPORTER_OTLP_PROTOCOL".into(), protocol.into());
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

/// The wrong CA first (nothing may arrive), then the right one (the command's spans
/// arrive).
async fn spans_cross_tls_only_with_the_right_ca(
    port: u16,
    received: Received,
    protocol: &str,
    pki: &TestPki,
) {
    let stack = Stack::new(1, SimulatorConfig::default()).await;

    run_one_command(&stack, port, protocol, &pki.wrong_ca(), "otlp-wrong-ca").await;
    assert!(
        received.0.lock().unwrap().is_empty(),
        "spans crossed a TLS connection the worker should have refused ({protocol})"
    );

    run_one_command(&stack, port, protocol, &pki.ca(), "otlp-tls").await;
    let names = received.0.lock().unwrap().clone();
    for expected in [
        "payments.commands process",
        "token reserve",
        "POST /charges",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "span {expected} not received over TLS ({protocol}): {names:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spans_reach_an_https_grpc_receiver_verified_with_the_configured_ca() {
    let pki = TestPki::new();
    let (port, received) = tls_receiver(&pki).await;
    spans_cross_tls_only_with_the_right_ca(port, received, "grpc", &pki).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spans_reach_an_https_http_receiver_verified_with_the_configured_ca() {
    let pki = TestPki::new();
    let (port, received) = https_http_receiver(&pki).await;
    spans_cross_tls_only_with_the_right_ca(port, received, "http/protobuf", &pki).await;
}
