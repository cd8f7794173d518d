//! Secrets, card numbers and payment methods never leave the process in
//! logs or exported spans. A workload runs through the real binary (debug logs as
//! JSON, spans exported over OTLP/HTTP to a sink in this test), and everything it
//! wrote is searched. `Debug` of every settings struct redacts secrets.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use payment_worker::configuration::{DatabaseSettings, KafkaSettings, RedisSettings};
use payment_worker::operator::{RecordKind, WorkloadRecord};
use payment_worker::redaction::redact_url;
use payment_worker_devtools::SimulatorConfig;
use tokio::io::AsyncReadExt;

use crate::support::cards::card_like_numbers;
use crate::support::helpers::{unique, Stack, PG_ADDR, REDIS_URL};

// ---------------------------------------------------------------------------
// Debug redaction of the settings.

#[test]
fn debug_of_the_settings_redacts_secrets() {
    let database =
        DatabaseSettings::with_url("postgres://payments:s3cr3t-db-pass@db.internal:5432/payments");
    let shown = format!("{database:?}");
    assert!(!shown.contains("s3cr3t-db-pass"), "{shown}");
    assert!(
        shown.contains("***") && shown.contains("db.internal"),
        "{shown}"
    );

    let redis = RedisSettings::with_url("redis://default:hunter2-redis@cache:6379/0", "pw");
    let shown = format!("{redis:?}");
    assert!(!shown.contains("hunter2-redis"), "{shown}");
    assert!(shown.contains("***") && shown.contains("cache"), "{shown}");

    let mut kafka = KafkaSettings::local("broker:9093", "group");
    kafka.extra = vec![
        ("sasl.password".into(), "kafka-pass-1".into()),
        (
            "sasl.jaas.config".into(),
            "org.apache.kafka.common.security.plain.PlainLoginModule password=\"kafka-pass-2\""
                .into(),
        ),
        ("ssl.key.password".into(), "kafka-pass-3".into()),
        (
            "sasl.oauthbearer.client.secret".into(),
            "kafka-pass-4".into(),
        ),
        ("ssl.keystore.password".into(), "kafka-pass-5".into()),
        ("sasl.username".into(), "kafka-user-6".into()),
    ];
    let shown = format!("{kafka:?}");
    for n in 1..=5 {
        assert!(!shown.contains(&format!("kafka-pass-{n}")), "{shown}");
    }
    // Even non-secret pass-through values are not printed, only that they are set.
    assert!(
        !shown.contains("kafka-user-6") && shown.contains("sasl.username"),
        "{shown}"
    );

    // A URL too broken to parse is not echoed back (it may hold the password).
    assert_eq!(
        redact_url("postgres://u:half-parsed-secret@[::1/db"),
        "<unparseable url>"
    );
    assert!(!redact_url("postgres://u:p%40ss%3Aword@h/db").contains("p%40ss"));
    // Postgres drivers take the password as a query parameter too.
    let shown =
        redact_url("postgres://u@h/db?sslmode=require&password=q-secret-1&sslpassword=q-secret-2");
    assert!(
        !shown.contains("q-secret") && shown.contains("sslmode=require"),
        "{shown}"
    );
    let database =
        DatabaseSettings::with_url("postgres://u@db.internal/payments?password=q-secret-3");
    assert!(!format!("{database:?}").contains("q-secret-3"));
    // The gateway client refuses credentials, but `run` logs its settings first.
    let cli = payment_worker::cli::Cli::try_parse_from([
        "payment-worker",
        "run",
        "--gateway-url",
        "https://user:gw-secret-4@gateway.internal/",
    ])
    .unwrap();
    let shown = format!("{cli:?}");
    assert!(
        !shown.contains("gw-secret-4") && shown.contains("gateway.internal"),
        "{shown}"
    );

    // The whole command line, as `run` logs it, and `audit`'s arguments.
    let url = "postgres://payments:cli-db-pass@127.0.0.1/payments";
    for args in [
        vec![
            "payment-worker",
            "run",
            "--database-url",
            url,
            "--redis-url",
            "redis://:cli-redis-pass@127.0.0.1:6379",
            "--kafka-config",
            "sasl.password=cli-kafka-pass",
        ],
        vec![
            "payment-worker",
            "audit",
            "--database-url",
            url,
            "--redis-url",
            "redis://:cli-redis-pass@127.0.0.1:6379",
        ],
        vec![
            "payment-worker",
            "process",
            "{}",
            "--database-url",
            url,
            "--redis-url",
            "redis://:cli-redis-pass@127.0.0.1:6379",
        ],
    ] {
        let cli = payment_worker::cli::Cli::try_parse_from(&args).unwrap();
        let shown = format!("{cli:?}");
        for secret in ["cli-db-pass", "cli-redis-pass", "cli-kafka-pass"] {
            assert!(
                !shown.contains(secret),
                "{} leaks {secret}: {shown}",
                args[1]
            );
        }
    }
}

// ---------------------------------------------------------------------------
// A run of the binary, searched.

/// Receives OTLP/HTTP exports (traces and metrics) and keeps the raw bodies:
/// protobuf carries strings verbatim, so searching the bytes searches the spans.
/// Request path and body of each export.
type Exports = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

pub(super) struct OtlpSink {
    url: String,
    bodies: Exports,
    pub(super) task: tokio::task::JoinHandle<()>,
}

impl OtlpSink {
    pub(super) async fn start() -> Self {
        let bodies: Exports = Arc::default();
        let stored = Arc::clone(&bodies);
        let app =
            axum::Router::new().fallback(move |uri: axum::http::Uri, body: axum::body::Bytes| {
                let stored = Arc::clone(&stored);
                async move {
                    stored
                        .lock()
                        .unwrap()
                        .push((uri.path().to_owned(), body.to_vec()));
                    axum::http::StatusCode::OK
                }
            });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { url, bodies, task }
    }

    pub(super) fn bodies(&self, path: &str) -> Vec<Vec<u8>> {
        self.bodies
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, b)| b.clone())
            .collect()
    }
}

struct Secrets {
    db_password: String,
    kafka_password: String,
    methods: Vec<String>,
    cards: Vec<&'static str>,
}

/// A key of the idempotency-key alphabet that is a (test) card number.
const CARD_KEY: &str = "4000056655665556";

fn command_json(key: &str, method: &str) -> String {
    serde_json::json!({"idempotency_key": key, "account_id": "acct_sec", "amount_minor": 4200,
        "currency": "EUR", "payment_method": method, "description": "security run"})
    .to_string()
}

pub(super) fn binary(
    stack: &Stack,
    database_url: &str,
    sink: &OtlpSink,
) -> tokio::process::Command {
    // PW_TEST_BINARY runs another build (e.g. the base commit's) for a before/after
    // comparison.
    let program = std::env::var("PW_TEST_BINARY")
        .unwrap_or_else(|_| crate::support::procs::BINARY.to_owned());
    let mut command = tokio::process::Command::new(program);
    // Nothing inherited: no ambient KAFKA_CONFIG_* or URL may change what is tested.
    command
        .env_clear()
        .env("RUST_LOG", "debug")
        .env("LOG_FORMAT", "json")
        .env("DATABASE_URL", database_url)
        .env("REDIS_URL", REDIS_URL)
        .env("REDIS_KEY_PREFIX", &stack.redis.prefix)
        .env("GATEWAY_URL", stack.simulator.url())
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &sink.url)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        .env("OTEL_METRIC_EXPORT_INTERVAL", "500")
        .env("OTEL_BSP_SCHEDULE_DELAY", "200")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

pub(super) fn text_of(output: &std::process::Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A Kafka setting librdkafka refuses (one it does not know, as a Java client's
/// `sasl.jaas.config`, or a value it cannot take) stops the command with the
/// setting's name, never its value: the value may be a password.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kafka_setting_librdkafka_refuses_is_named_without_its_value() {
    let secret = format!("kfpw{}", uuid::Uuid::new_v4().simple());
    let db = crate::support::helpers::TestDb::new().await;
    let jaas = format!(
        r#"org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="{secret}";"#
    );
    let cases: [(&str, &str, &[&str]); 3] = [
        ("sasl.jaas.config", &jaas, &["produce", "--count", "1"]),
        ("security.protocol", &secret, &["produce", "--count", "1"]),
        ("sasl.jaas.config", &jaas, &["run"]),
    ];
    for (setting, value, args) in cases {
        let variable = format!(
            "KAFKA_CONFIG_{}",
            setting.to_ascii_uppercase().replace('.', "_")
        );
        let output = tokio::process::Command::new(crate::support::procs::BINARY)
            .env_clear()
            .env("RUST_LOG", "debug")
            .env("KAFKA_BROKERS", "127.0.0.1:9")
            .env("DATABASE_URL", &db.url)
            .env("REDIS_URL", REDIS_URL)
            .env("REDIS_KEY_PREFIX", unique("kafka-refused"))
            .env("GATEWAY_URL", "http://127.0.0.1:9")
            .env(&variable, value)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .await
            .unwrap();
        let text = text_of(&output);
        assert!(!output.status.success(), "{args:?} {setting}: {text}");
        assert!(
            text.contains(setting),
            "{args:?}: the setting is named: {text}"
        );
        assert!(
            !text.contains(&secret),
            "{args:?}: the value of {setting} was printed: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_of_the_binary_logs_and_exports_no_secret_card_number_or_payment_method() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let sink = OtlpSink::start().await;
    let tag = uuid::Uuid::new_v4().simple().to_string();
    // Trust authentication ignores the password, but it is in the URL every process gets.
    let role = unique("pw_sec");
    let secrets = Secrets {
        db_password: format!("dbpw{tag}"),
        kafka_password: format!("kfpw{tag}"),
        methods: (0..5)
            .map(|n| format!("pm_sec_{n}_{}", &tag[..12]))
            .collect(),
        cards: vec![
            "4111111111111111",
            "4111 1111 1111 1111",
            "5500-0000-0000-0004",
            "378282246310005",
            "4242424242424242",
        ],
    };
    sqlx::query(&format!(
        "CREATE ROLE {role} LOGIN SUPERUSER PASSWORD '{}'",
        secrets.db_password
    ))
    .execute(&stack.db.pool)
    .await
    .unwrap();
    let database_url = format!(
        "postgres://{role}:{}@{PG_ADDR}/{}",
        secrets.db_password, stack.db.name
    );
    let mut transcript = String::new();

    // `process`: two approved commands, then card numbers, which must be refused.
    for (n, method) in secrets.methods[..2].iter().enumerate() {
        let output = binary(&stack, &database_url, &sink)
            .args(["process", &command_json(&format!("sec-p{n}"), method)])
            .output()
            .await
            .unwrap();
        assert!(output.status.success(), "{}", text_of(&output));
        assert!(
            String::from_utf8_lossy(&output.stdout).contains("succeeded"),
            "{}",
            text_of(&output)
        );
        transcript.push_str(&text_of(&output));
    }
    for (n, card) in secrets.cards[..2].iter().enumerate() {
        let output = binary(&stack, &database_url, &sink)
            .args(["process", &command_json(&format!("sec-c{n}"), card)])
            .output()
            .await
            .unwrap();
        assert!(!output.status.success());
        assert!(
            text_of(&output).contains("card_number_as_payment_method"),
            "{}",
            text_of(&output)
        );
        transcript.push_str(&text_of(&output));
    }

    // `run`: a consumer-group member with a Kafka secret, fed good and bad commands.
    let mut records = vec![];
    for (n, method) in secrets.methods[2..].iter().enumerate() {
        let key = format!("sec-r{n}");
        records.push((key.clone(), command_json(&key, method)));
    }
    for (n, card) in secrets.cards.iter().enumerate() {
        let key = format!("sec-rc{n}");
        records.push((key.clone(), command_json(&key, card)));
    }
    // An upstream that keys its commands by card number: refused
    // (`card_number_as_key`), never stored or charged, and shown masked wherever
    // the key is echoed (answers, logs, spans).
    records.push((
        CARD_KEY.to_owned(),
        command_json(CARD_KEY, &secrets.methods[2]),
    ));
    let key = "sec-acct".to_owned();
    let in_account =
        command_json(&key, &secrets.methods[2]).replace("acct_sec", "acct 4111111111111111");
    records.push((key, in_account));
    let key = "sec-desc".to_owned();
    let in_description =
        command_json(&key, &secrets.methods[3]).replace("security run", "card 5500 0000 0000 0004");
    records.push((key, in_description));
    let records: Vec<WorkloadRecord> = records
        .into_iter()
        .map(|(key, value)| WorkloadRecord {
            kind: RecordKind::Valid,
            key: Some(key.into_bytes()),
            value: Some(value.into_bytes()),
            partition_hint: None,
        })
        .collect();
    stack.produce(&records).await;
    let mut worker = binary(&stack, &database_url, &sink)
        .env("KAFKA_BROKERS", &stack.settings.brokers)
        .env("KAFKA_GROUP_ID", &stack.settings.group_id)
        .env("KAFKA_SESSION_TIMEOUT", "6s")
        .env("WORKER_ID", "sec-worker")
        .args([
            "run",
            "--kafka-config",
            &format!("sasl.password={}", secrets.kafka_password),
        ])
        .spawn()
        .unwrap();
    let mut stdout = worker.stdout.take().unwrap();
    let mut stderr = worker.stderr.take().unwrap();
    let read_out = tokio::spawn(async move {
        let mut buf = Vec::new();
        let _ = stdout.read_to_end(&mut buf).await;
        buf
    });
    let read_err = tokio::spawn(async move {
        let mut buf = Vec::new();
        let _ = stderr.read_to_end(&mut buf).await;
        buf
    });
    let results = stack
        .wait_for_results(records.len(), Duration::from_secs(90))
        .await;
    assert_eq!(
        results.iter().filter(|r| r.outcome == "succeeded").count(),
        3,
        "{results:?}"
    );
    assert_eq!(
        results.iter().filter(|r| r.outcome == "rejected").count(),
        8,
        "{results:?}"
    );
    assert!(
        results.iter().any(|r| r
            .reason
            .as_deref()
            .is_some_and(|reason| { reason.starts_with("invalid: card_number_as_key:") })
            && r.idempotency_key.as_deref() == Some("************5556")),
        "the card-number key is refused and echoed masked: {results:?}"
    );
    stack.wait_for_commits(Duration::from_secs(30)).await;
    let pid = nix::unistd::Pid::from_raw(worker.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), worker.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "SIGTERM drains and exits cleanly");
    transcript.push_str(&String::from_utf8_lossy(&read_out.await.unwrap()));
    transcript.push('\n');
    transcript.push_str(&String::from_utf8_lossy(&read_err.await.unwrap()));

    // `audit` and a failing connection: error paths print URLs too.
    let output = binary(&stack, &database_url, &sink)
        .arg("audit")
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{}", text_of(&output));
    transcript.push_str(&text_of(&output));
    let unreachable = format!(
        "postgres://{role}:{}@127.0.0.1:1/nowhere",
        secrets.db_password
    );
    let output = binary(&stack, &unreachable, &sink)
        .arg("migrate")
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    assert!(
        text_of(&output).contains("cannot reach Postgres"),
        "{}",
        text_of(&output)
    );
    transcript.push_str(&text_of(&output));

    // The transcript is the real thing: JSON debug lines about these very commands.
    assert!(
        transcript.contains("\"level\":\"DEBUG\""),
        "debug logs were captured"
    );
    // The URL and the Kafka setting were logged, so their absence below is redaction.
    assert!(
        transcript.contains(&format!("{role}:***@")),
        "the database URL is logged redacted"
    );
    assert!(
        transcript.contains("sasl.password"),
        "the Kafka pass-through is logged by name"
    );
    for key in ["sec-p0", "sec-r0", "sec-rc0"] {
        assert!(transcript.contains(key), "the logs mention {key}");
    }
    let traces: Vec<Vec<u8>> = sink.bodies("/v1/traces");
    let spans = traces
        .iter()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        spans.contains("sec-r0") && spans.contains("sec-rc0"),
        "spans of the run were exported ({} exports)",
        traces.len()
    );
    assert!(
        spans.contains("************5556") && transcript.contains("************5556"),
        "the card-number key shows masked in spans and logs"
    );
    let metrics = sink
        .bodies("/v1/metrics")
        .iter()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .collect::<Vec<_>>()
        .join("\n");
    sink.task.abort();

    // Every topic the worker writes (the commands topic is the producer's own), and
    // every table, whole: key, value and headers of each record, each row as JSON.
    let mut topics = String::new();
    for record in stack.dead_letters().await {
        use rdkafka::message::Message;
        topics.push_str(&String::from_utf8_lossy(record.key().unwrap_or_default()));
        topics.push('\n');
        topics.push_str(&String::from_utf8_lossy(
            record.payload().unwrap_or_default(),
        ));
        topics.push('\n');
        for header in payment_worker::kafka_headers::raw(record.headers().unwrap()) {
            topics.push_str(&String::from_utf8_lossy(header.name));
            topics.push('=');
            topics.push_str(&String::from_utf8_lossy(header.value.unwrap_or_default()));
            topics.push('\n');
        }
    }
    assert!(
        topics.contains("x-payload-redacted=card_number") && topics.contains("1111"),
        "the refused commands were dead-lettered with their card numbers masked:\n{topics}"
    );
    // The results raw as well: their keys and headers, not only their JSON.
    let results_topic = crate::support::helpers::read_topic(
        &stack.settings,
        &stack.settings.results_topic,
        "read_uncommitted",
    )
    .await;
    assert!(!results_topic.is_empty());
    for record in results_topic {
        use rdkafka::message::Message;
        topics.push_str(&String::from_utf8_lossy(record.key().unwrap_or_default()));
        topics.push('\n');
        topics.push_str(&String::from_utf8_lossy(
            record.payload().unwrap_or_default(),
        ));
        topics.push('\n');
        let headers = record
            .headers()
            .map(payment_worker::kafka_headers::raw)
            .unwrap_or_default();
        for header in headers {
            topics.push_str(&String::from_utf8_lossy(header.name));
            topics.push('=');
            topics.push_str(&String::from_utf8_lossy(header.value.unwrap_or_default()));
            topics.push('\n');
        }
    }
    let mut tables = String::new();
    let table_names: Vec<String> = sqlx::query_scalar(
        "SELECT tablename::text FROM pg_tables \
         WHERE schemaname = 'public' AND tablename <> '_sqlx_migrations'",
    )
    .fetch_all(&stack.db.pool)
    .await
    .unwrap();
    assert!(
        table_names.iter().any(|t| t == "payments"),
        "{table_names:?}"
    );
    for table in &table_names {
        let rows: Vec<String> =
            sqlx::query_scalar(&format!("SELECT row_to_json(t)::text FROM \"{table}\" t"))
                .fetch_all(&stack.db.pool)
                .await
                .unwrap();
        tables.push_str(&rows.join("\n"));
        tables.push('\n');
    }
    assert!(tables.contains("sec-r0"), "the tables were read");

    for (what, text) in [
        ("logs", &transcript),
        ("spans", &spans),
        ("metrics", &metrics),
        ("topics", &topics),
        ("tables", &tables),
    ] {
        assert!(
            !text.contains(&secrets.db_password),
            "{what} leak the database password"
        );
        assert!(
            !text.contains(&secrets.kafka_password),
            "{what} leak the Kafka password"
        );
        // A dead letter carries its command's value (the payment method included)
        // so it can be redriven; everywhere else the method is a secret.
        if what != "topics" {
            for method in &secrets.methods {
                assert!(
                    !text.contains(method.as_str()),
                    "{what} leak the payment method {method}"
                );
            }
        }
        for card in &secrets.cards {
            assert!(!text.contains(card), "{what} leak the card number {card}");
        }
        let cards = card_like_numbers(text);
        assert!(!text.contains(CARD_KEY), "{what} leak the card-number key");
        assert!(
            cards.is_empty(),
            "{what} contain card-like numbers: {cards:?}"
        );
    }
    let _ = sqlx::query(&format!("DROP ROLE IF EXISTS {role}"))
        .execute(&stack.db.pool)
        .await;
}
