//! Kafka as managed services run it: librdkafka is built with TLS, SASL SCRAM and
//! every codec; compressed commands are consumed; a client verifies a TLS broker
//! against the configured CA; the worker's own settings cannot be passed through,
//! tuning settings can and win.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use payment_worker::configuration::KafkaSettings;
use payment_worker::worker;
use payment_worker_devtools::SimulatorConfig;
use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, FutureProducer, FutureRecord, Producer};
use tokio::io::AsyncReadExt;

use crate::support::helpers::{quick_worker_settings, unique, Stack};
use crate::support::pki::{path_str, TestPki};
use crate::support::procs::{binary, run_to_end};

#[test]
fn librdkafka_is_built_with_ssl_sasl_scram_and_zstd() {
    let native = ClientConfig::new().create_native_config().unwrap();
    let features = native.get("builtin.features").unwrap();
    let listed: Vec<&str> = features.split(',').collect();
    for wanted in [
        "ssl",
        "sasl_scram",
        "sasl_plain",
        "zstd",
        "lz4",
        "snappy",
        "gzip",
    ] {
        assert!(listed.contains(&wanted), "{wanted} missing from {features}");
    }
    // A SCRAM over TLS client is accepted by this build (a build without SSL
    // refuses `security.protocol=SASL_SSL` at creation).
    let producer: Result<BaseProducer, _> = ClientConfig::new()
        .set("bootstrap.servers", "127.0.0.1:1")
        .set("security.protocol", "SASL_SSL")
        .set("sasl.mechanism", "SCRAM-SHA-512")
        .set("sasl.username", "worker")
        .set("sasl.password", "secret")
        .set("compression.type", "zstd")
        .create();
    assert!(producer.is_ok(), "{:?}", producer.err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn zstd_and_lz4_compressed_commands_are_consumed() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let mut expected = Vec::new();
    for codec in ["zstd", "lz4", "gzip", "snappy"] {
        let mut settings = stack.settings.clone();
        // A tuning setting passed through the worker's own configuration path.
        settings
            .extra
            .push(("compression.type".into(), codec.into()));
        let config = worker::producer_config(&settings);
        assert_eq!(config.get("compression.type"), Some(codec));
        let producer: FutureProducer = config.create().unwrap();
        for n in 0..3 {
            let key = unique(&format!("{codec}-{n}"));
            let value = serde_json::json!({"idempotency_key": key, "account_id": "acct_codec",
                "amount_minor": 300 + n, "currency": "EUR", "payment_method": "pm_card_visa"})
            .to_string();
            producer
                .send(
                    FutureRecord::to(&stack.settings.commands_topic)
                        .key(&key)
                        .payload(&value),
                    Duration::from_secs(10),
                )
                .await
                .unwrap();
            expected.push(key);
        }
    }
    let running = stack.start_worker("codec-worker", &quick_worker_settings());
    let results = stack
        .wait_for_results(expected.len(), Duration::from_secs(60))
        .await;
    crate::support::helpers::stop_all(vec![running]).await;
    assert_eq!(results.len(), expected.len());
    let rows: HashMap<String, String> = stack
        .payment_rows()
        .await
        .into_iter()
        .map(|(key, status, _)| (key, status))
        .collect();
    for key in &expected {
        assert_eq!(
            rows.get(key).map(String::as_str),
            Some("succeeded"),
            "{key}"
        );
    }
    assert_eq!(stack.ledger().len(), expected.len());
}

#[test]
fn passed_through_tuning_settings_win_over_the_worker_defaults() {
    let mut settings = KafkaSettings::local("127.0.0.1:1", "g");
    settings.extra = vec![
        ("queued.max.messages.kbytes".into(), "2048".into()),
        ("auto.commit.interval.ms".into(), "1000".into()),
        ("linger.ms".into(), "20".into()),
        ("security.protocol".into(), "SASL_SSL".into()),
    ];
    let consumer = worker::consumer_config(&settings);
    assert_eq!(consumer.get("queued.max.messages.kbytes"), Some("2048"));
    assert_eq!(consumer.get("auto.commit.interval.ms"), Some("1000"));
    assert_eq!(consumer.get("security.protocol"), Some("SASL_SSL"));
    assert_eq!(consumer.get("enable.auto.offset.store"), Some("false"));
    assert_eq!(consumer.get("isolation.level"), Some("read_committed"));
    let producer = worker::producer_config(&settings);
    assert_eq!(producer.get("linger.ms"), Some("20"));
    assert_eq!(producer.get("acks"), Some("all"));
    assert_eq!(producer.get("enable.idempotence"), Some("true"));
    assert!(settings.check_passthrough().is_ok());

    for owned in [
        "acks",
        "topic.acks",
        "Enable.Auto.Commit",
        "isolation.level",
        "session.timeout.ms",
    ] {
        settings.extra = vec![(owned.into(), "x".into())];
        let error = settings.check_passthrough().expect_err(owned);
        assert!(
            error.to_string().contains("cannot be passed through"),
            "{error}"
        );
    }
}

#[tokio::test]
async fn run_refuses_settings_the_worker_owns() {
    // Nothing listens on these addresses: the refusal comes before any connection.
    let env: HashMap<String, String> = [
        ("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none"),
        ("REDIS_URL", "redis://127.0.0.1:1"),
        ("KAFKA_BROKERS", "127.0.0.1:1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let (status, lines) = run_to_end(
        "run-acks-flag",
        binary(&["run", "--kafka-config", "acks=1"], &env),
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(status.code(), Some(2), "a usage error: {lines:?}");
    assert!(
        lines
            .join("\n")
            .contains("\"acks\" cannot be passed through"),
        "{lines:?}"
    );

    // A drain deadline the session timeout cannot hold: refused before the stores
    // are reached (or migrated).
    let (status, lines) = run_to_end(
        "run-drain-past-session",
        binary(&["run", "--drain-deadline", "20s"], &env),
        Duration::from_secs(30),
    )
    .await;
    let output = lines.join("\n");
    assert!(!status.success(), "{output}");
    assert!(
        output.contains("must be below the session timeout")
            && !output.contains("cannot reach Postgres"),
        "{output}"
    );

    // A secret written with the wrong separator is refused without being repeated.
    let (status, lines) = run_to_end(
        "run-malformed-setting",
        binary(
            &["run", "--kafka-config", "sasl.password:typo-secret-7"],
            &env,
        ),
        Duration::from_secs(30),
    )
    .await;
    let output = lines.join("\n");
    assert_eq!(status.code(), Some(2), "a usage error: {output}");
    assert!(
        output.contains("key=value") && !output.contains("typo-secret-7"),
        "{output}"
    );

    let mut env = env;
    env.insert("KAFKA_CONFIG_ENABLE_AUTO_COMMIT".into(), "false".into());
    let (status, lines) = run_to_end(
        "run-auto-commit-env",
        binary(&["run"], &env),
        Duration::from_secs(30),
    )
    .await;
    let output = lines.join("\n");
    assert_eq!(status.code(), Some(2), "a usage error: {output}");
    assert!(
        output.contains("\"enable.auto.commit\" cannot be passed through")
            && !output.contains("cannot reach Postgres"),
        "{output}"
    );
}

/// Collects librdkafka's error callbacks (a failed handshake is reported there).
#[derive(Clone, Default)]
struct ErrorLog(Arc<Mutex<Vec<String>>>);

impl ClientContext for ErrorLog {
    fn error(&self, error: KafkaError, reason: &str) {
        self.0.lock().unwrap().push(format!("{error}: {reason}"));
    }
}

impl rdkafka::producer::ProducerContext for ErrorLog {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: Self::DeliveryOpaque) {}
}

/// A TLS listener (rustls) on a free port: reports the outcome of each handshake.
async fn tls_listener(
    pki: &TestPki,
) -> (
    u16,
    tokio::sync::mpsc::UnboundedReceiver<Result<(), String>>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(pki.rustls_server());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                match acceptor.accept(tcp).await {
                    Ok(mut tls) => {
                        let _ = tx.send(Ok(()));
                        // Read the client's first Kafka request, then hang up: this
                        // listener speaks TLS, not Kafka.
                        let mut buf = [0u8; 64];
                        let _ = tls.read(&mut buf).await;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e.to_string()));
                    }
                }
            });
        }
    });
    (port, rx)
}

fn tls_client(port: u16, ca: &std::path::Path) -> (BaseProducer<ErrorLog>, ErrorLog) {
    let log = ErrorLog::default();
    let producer = ClientConfig::new()
        .set("bootstrap.servers", format!("localhost:{port}"))
        .set("security.protocol", "SSL")
        .set("ssl.ca.location", path_str(ca))
        .set("reconnect.backoff.ms", "200")
        .create_with_context(log.clone())
        .unwrap();
    (producer, log)
}

async fn first_handshake(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Result<(), String>>,
) -> Result<(), String> {
    tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .expect("the client never reached the TLS listener")
        .expect("listener alive")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_client_verifies_a_tls_broker_against_the_configured_ca() {
    let pki = TestPki::new();
    let (port, mut handshakes) = tls_listener(&pki).await;

    let (trusted, _) = tls_client(port, &pki.ca());
    // Metadata requests make the client connect; the answer never comes (the
    // listener is no broker), the handshake is what is checked.
    let trusted = tokio::task::spawn_blocking(move || {
        let _ = trusted
            .client()
            .fetch_metadata(None, Duration::from_millis(500));
        trusted
    });
    assert_eq!(first_handshake(&mut handshakes).await, Ok(()));
    let trusted = trusted.await.unwrap();
    tokio::task::spawn_blocking(move || drop(trusted))
        .await
        .unwrap();
    while handshakes.try_recv().is_ok() {}

    let (untrusting, errors) = tls_client(port, &pki.wrong_ca());
    let reported_errors = errors.clone();
    let untrusting = tokio::task::spawn_blocking(move || {
        let _ = untrusting
            .client()
            .fetch_metadata(None, Duration::from_secs(1));
        // Error callbacks are served by polling the client.
        for _ in 0..50 {
            untrusting.poll(Duration::from_millis(100));
            if !reported_errors.0.lock().unwrap().is_empty() {
                break;
            }
        }
        untrusting
    });
    let refused = first_handshake(&mut handshakes).await;
    assert!(
        refused.is_err(),
        "a client with the wrong CA completed the handshake"
    );
    let untrusting = untrusting.await.unwrap();
    let reported = errors.0.lock().unwrap().join("\n");
    tokio::task::spawn_blocking(move || drop(untrusting))
        .await
        .unwrap();
    assert!(
        reported.contains("SSL handshake failed") && reported.contains("certificate verify failed"),
        "the client must say the TLS handshake failed on verification: {reported}"
    );
}
