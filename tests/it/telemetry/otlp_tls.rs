//! OTLP over `https://`: a trace receiver behind TLS with a certificate from a CA
//! made at test time, once over gRPC and once over HTTP/protobuf. A worker given that
//! CA (`OTEL_EXPORTER_OTLP_CERTIFICATE`) exports its spans there; with another CA
//! nothing arrives. A receiver that requires client certificates gets the spans of
//! a worker that presents one (`OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE`, `…_KEY`) and
//! nothing from one without; with `OTEL_EXPORTER_OTLP_COMPRESSION=gzip` every
//! request arrives gzip-encoded.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use payment_worker::operator::{RecordKind, WorkloadRecord};
use payment_worker_devtools::SimulatorConfig;
use prost::Message as _;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tonic::transport::{Identity, Server, ServerTlsConfig};

use crate::support::helpers::{unique, Stack};
use crate::support::pki::{path_str, TestPki};
use crate::support::procs::{binary, Proc};

#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<String>>>, Arc<Mutex<Vec<Option<String>>>>);

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
        let encoding = request
            .metadata()
            .get("grpc-encoding")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        self.1.lock().unwrap().push(encoding);
        self.record(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// A gRPC trace receiver behind TLS; with `require_clients` it also asks every
/// client for a certificate the test CA signed.
async fn tls_receiver(pki: &TestPki, require_clients: bool) -> (u16, Received) {
    let received = Received::default();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let identity = Identity::from_pem(&pki.server_cert_pem, &pki.server_key_pem);
    // It takes gzip, as a collector does; each request's `grpc-encoding` is recorded.
    let service = TraceServiceServer::new(received.clone())
        .accept_compressed(tonic::codec::CompressionEncoding::Gzip);
    let mut tls = ServerTlsConfig::new().identity(identity);
    if require_clients {
        tls = tls.client_ca_root(tonic::transport::Certificate::from_pem(&pki.ca_pem));
    }
    let mut server = Server::builder().tls_config(tls).unwrap();
    let router = server.add_service(service);
    tokio::spawn(async move {
        let _ = router
            .serve(format!("127.0.0.1:{port}").parse().unwrap())
            .await;
    });
    (port, received)
}

/// An OTLP/HTTP trace receiver behind TLS: HTTP/1.1 `POST /v1/traces` with a
/// protobuf body (gzip-encoded when its `content-encoding` says so), answered 200
/// with an empty protobuf response. It records each request's `content-encoding`.
async fn https_http_receiver(pki: &TestPki, require_clients: bool) -> (u16, Received) {
    let received = Received::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let acceptor = tokio_rustls::TlsAcceptor::from(if require_clients {
        pki.rustls_server_requiring_clients()
    } else {
        pki.rustls_server()
    });
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
                while let Some((encoding, body)) = read_http_request(&mut stream).await {
                    let body = match encoding.as_deref() {
                        Some("gzip") => {
                            let mut plain = Vec::new();
                            let mut decoder = flate2::read::GzDecoder::new(body.as_slice());
                            if std::io::Read::read_to_end(&mut decoder, &mut plain).is_err() {
                                plain.clear();
                            }
                            plain
                        }
                        _ => body,
                    };
                    sink.1.lock().unwrap().push(encoding);
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

/// One request's `content-encoding` and body, or `None` when the connection ends.
async fn read_http_request<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut BufReader<S>,
) -> Option<(Option<String>, Vec<u8>)> {
    let mut length = 0usize;
    let mut encoding = None;
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
            if name.eq_ignore_ascii_case("content-encoding") {
                encoding = Some(value.trim().to_ascii_lowercase());
            }
        }
    }
    let mut body = vec![0; length];
    stream.read_exact(&mut body).await.ok()?;
    Some((encoding, body))
}

async fn run_one_command(
    stack: &Stack,
    port: u16,
    protocol: &str,
    ca: &std::path::Path,
    name: &str,
    extra: &[(&str, &str)],
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
    env.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
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

    run_one_command(
        &stack,
        port,
        protocol,
        &pki.wrong_ca(),
        "otlp-wrong-ca",
        &[],
    )
    .await;
    assert!(
        received.0.lock().unwrap().is_empty(),
        "spans crossed a TLS connection the worker should have refused ({protocol})"
    );

    run_one_command(&stack, port, protocol, &pki.ca(), "otlp-tls", &[]).await;
    assert_spans_of_a_command(&received, protocol);
}

fn assert_spans_of_a_command(received: &Received, protocol: &str) {
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

/// A receiver that requires client certificates: nothing from a worker without
/// one, the command's spans from a worker that presents the test CA's client
/// certificate.
async fn spans_cross_only_with_a_client_certificate(
    port: u16,
    received: Received,
    protocol: &str,
    pki: &TestPki,
) {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    run_one_command(&stack, port, protocol, &pki.ca(), "otlp-anonymous", &[]).await;
    assert!(
        received.0.lock().unwrap().is_empty(),
        "spans reached a receiver requiring client certificates without one ({protocol})"
    );
    run_one_command(
        &stack,
        port,
        protocol,
        &pki.ca(),
        "otlp-client-cert",
        &[
            (
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                path_str(&pki.client_cert()),
            ),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", path_str(&pki.client_key())),
        ],
    )
    .await;
    assert_spans_of_a_command(&received, protocol);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_grpc_receiver_requiring_client_certificates_gets_spans_only_from_a_worker_with_one() {
    let pki = TestPki::new();
    let (port, received) = tls_receiver(&pki, true).await;
    spans_cross_only_with_a_client_certificate(port, received, "grpc", &pki).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_http_receiver_requiring_client_certificates_gets_spans_only_from_a_worker_with_one() {
    let pki = TestPki::new();
    let (port, received) = https_http_receiver(&pki, true).await;
    spans_cross_only_with_a_client_certificate(port, received, "http/protobuf", &pki).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn otlp_compression_gzip_compresses_every_export() {
    let pki = TestPki::new();
    let (port, received) = https_http_receiver(&pki, false).await;
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    run_one_command(
        &stack,
        port,
        "http/protobuf",
        &pki.ca(),
        "otlp-gzip",
        &[("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")],
    )
    .await;
    assert_spans_of_a_command(&received, "http/protobuf gzip");
    let encodings = received.1.lock().unwrap().clone();
    assert!(!encodings.is_empty());
    assert!(
        encodings.iter().all(|e| e.as_deref() == Some("gzip")),
        "requests not gzip-encoded: {encodings:?}"
    );

    // Over gRPC too: every export arrives gzip-encoded (`grpc-encoding: gzip`).
    let (grpc_port, grpc_received) = tls_receiver(&pki, false).await;
    run_one_command(
        &stack,
        grpc_port,
        "grpc",
        &pki.ca(),
        "otlp-grpc-gzip",
        &[("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")],
    )
    .await;
    assert_spans_of_a_command(&grpc_received, "grpc gzip");
    let encodings = grpc_received.1.lock().unwrap().clone();
    assert!(!encodings.is_empty());
    assert!(
        encodings.iter().all(|e| e.as_deref() == Some("gzip")),
        "gRPC requests not gzip-encoded: {encodings:?}"
    );

    // A compression the exporter cannot do is refused, not silently dropped.
    let mut env = stack.run_env();
    env.insert(
        "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
        format!("https://localhost:{port}"),
    );
    env.insert("OTEL_EXPORTER_OTLP_COMPRESSION".into(), "zstd".into());
    let (_, lines) = crate::support::procs::run_to_end(
        "otlp-zstd",
        binary(&["migrate"], &env),
        Duration::from_secs(60),
    )
    .await;
    let output = lines.join("\n");
    assert!(
        output.contains("OTEL_EXPORTER_OTLP_COMPRESSION") && output.contains("gzip or none"),
        "{output}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spans_reach_an_https_grpc_receiver_verified_with_the_configured_ca() {
    let pki = TestPki::new();
    let (port, received) = tls_receiver(&pki, false).await;
    spans_cross_tls_only_with_the_right_ca(port, received, "grpc", &pki).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spans_reach_an_https_http_receiver_verified_with_the_configured_ca() {
    let pki = TestPki::new();
    let (port, received) = https_http_receiver(&pki, false).await;
    spans_cross_tls_only_with_the_right_ca(port, received, "http/protobuf", &pki).await;
}
