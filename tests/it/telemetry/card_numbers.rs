//! Card numbers where a producer may hide them besides the value: in the W3C trace
//! context a command carries (`tracestate`, `baggage`, which the worker used to
//! forward to results and the gateway and export in every span), in record keys
//! grouped any way (`41111111-11111111`, `4-111111111111111`, …, which the worker
//! used to take as idempotency keys), and in the message of a panic. A real worker
//! binary runs each, and everything it wrote is read raw: result and dead-letter
//! records (keys, headers, values), the gateway's requests, the exported spans
//! (OTLP bodies), its log lines and stderr, every table.

use std::process::Stdio;
use std::time::Duration;

use rdkafka::message::{Header, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use tokio::io::AsyncReadExt;

use super::secrets::{binary, text_of, OtlpSink};
use crate::support::cards::{card_like_numbers, hidden_card_numbers};
use crate::support::helpers::{card_free_trace_id, read_topic, result_records, unique, Stack};

/// The six groupings of 4111 1111 1111 1111 a key may come in.
const CARD_KEYS: [&str; 6] = [
    "41111111-11111111",
    "4-111111111111111",
    "4111111111-111111",
    "4111.1111.1111.1111",
    "4111/1111/1111/1111",
    "4111_1111_1111_1111",
];

/// The secret the worker keys `x-key-hmac-sha256` with.
const KEY_SECRET: &str = "test-key-hash-secret";

fn command_json(key: &str) -> String {
    serde_json::json!({"idempotency_key": key, "account_id": "acct_cards", "amount_minor": 4200,
        "currency": "EUR", "payment_method": "pm_card_visa"})
    .to_string()
}

async fn publish(stack: &Stack, key: &str, value: &str, headers: &[(&str, &str)]) {
    let producer: FutureProducer = payment_worker::worker::producer_config(&stack.settings)
        .create()
        .unwrap();
    let headers = headers
        .iter()
        .fold(OwnedHeaders::new(), |all, (name, value)| {
            all.insert(Header {
                key: name,
                value: Some(*value),
            })
        });
    let record = FutureRecord::to(&stack.settings.commands_topic)
        .key(key)
        .payload(value)
        .headers(headers);
    producer
        .send(record, Timeout::After(Duration::from_secs(10)))
        .await
        .unwrap();
}

fn header_text(record: &OwnedMessage, name: &str) -> Option<String> {
    record
        .headers()
        .and_then(|h| payment_worker::kafka_headers::last_value(h, name))
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// No record of `records` holds a card number in any reading of its key, value,
/// header names or values.
fn assert_no_card_in(records: &[OwnedMessage], what: &str) {
    for record in records {
        let at = format!("{what} offset {}", record.offset());
        let mut parts = vec![record.key(), record.payload()];
        for header in record
            .headers()
            .map(payment_worker::kafka_headers::raw)
            .unwrap_or_default()
        {
            parts.push(Some(header.name));
            parts.push(header.value);
        }
        for part in parts.into_iter().flatten() {
            let found = hidden_card_numbers(part);
            assert!(
                found.is_empty(),
                "{at}: {:?} holds {found:?}",
                String::from_utf8_lossy(part)
            );
        }
    }
}

/// The `x-key-hmac-sha256` of `key` as an operator computes it: `key-hash`, the key
/// on standard input.
async fn key_hash(secret_file: &std::path::Path, key: &str) -> String {
    let mut child = tokio::process::Command::new(crate::support::procs::BINARY)
        .env_clear()
        .env("KEY_HASH_SECRET_FILE", secret_file)
        .args(["key-hash", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use tokio::io::AsyncWriteExt;
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(key.as_bytes()).await.unwrap();
    drop(stdin);
    let output = child.wait_with_output().await.unwrap();
    assert!(output.status.success(), "{}", text_of(&output));
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}

/// A worker process and the readers of its output.
struct Running {
    child: tokio::process::Child,
    stdout: tokio::task::JoinHandle<Vec<u8>>,
    stderr: tokio::task::JoinHandle<Vec<u8>>,
}

fn start(mut command: tokio::process::Command) -> Running {
    let mut child = command.spawn().unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let stdout = tokio::spawn(async move {
        let mut buf = Vec::new();
        let _ = out.read_to_end(&mut buf).await;
        buf
    });
    let stderr = tokio::spawn(async move {
        let mut buf = Vec::new();
        let _ = err.read_to_end(&mut buf).await;
        buf
    });
    Running {
        child,
        stdout,
        stderr,
    }
}

impl Running {
    /// SIGTERM, a clean exit, and what the process wrote to stdout and stderr.
    async fn stop(mut self) -> String {
        let pid = nix::unistd::Pid::from_raw(self.child.id().unwrap() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .unwrap()
            .unwrap();
        assert!(status.success(), "SIGTERM drains and exits cleanly");
        format!(
            "{}\n{}",
            String::from_utf8_lossy(&self.stdout.await.unwrap()),
            String::from_utf8_lossy(&self.stderr.await.unwrap())
        )
    }
}

/// Runs the worker until `commands` commands are answered and committed; returns
/// what it wrote.
async fn run_worker(command: tokio::process::Command, stack: &Stack, commands: usize) -> String {
    let running = start(command);
    stack
        .wait_for_results(commands, Duration::from_secs(90))
        .await;
    stack.wait_for_commits(Duration::from_secs(30)).await;
    running.stop().await
}

/// The rows of every table, as JSON, one line each.
async fn tables(stack: &Stack) -> String {
    let names: Vec<String> =
        sqlx::query_scalar("SELECT tablename::text FROM pg_tables WHERE schemaname = 'public'")
            .fetch_all(&stack.db.pool)
            .await
            .unwrap();
    let mut text = String::new();
    for table in names {
        let rows: Vec<String> =
            sqlx::query_scalar(&format!("SELECT row_to_json(t)::text FROM \"{table}\" t"))
                .fetch_all(&stack.db.pool)
                .await
                .unwrap();
        text.push_str(&rows.join("\n"));
        text.push('\n');
    }
    text
}

/// The exported spans, every OTLP body as text (protobuf keeps strings verbatim).
fn exported_spans(sink: &OtlpSink) -> (String, Vec<Vec<u8>>) {
    let bodies = sink.bodies("/v1/traces");
    let text = bodies
        .iter()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .collect::<Vec<_>>()
        .join("\n");
    (text, bodies)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_card_number_in_trace_context_or_a_grouped_key_leaves_the_worker_nowhere() {
    let stack = Stack::new(1, payment_worker_devtools::SimulatorConfig::default()).await;
    let sink = OtlpSink::start().await;
    let dir = std::env::temp_dir().join(unique("pw-cards"));
    std::fs::create_dir_all(&dir).unwrap();
    let secret_file = dir.join("key-hash-secret");
    std::fs::write(&secret_file, format!("{KEY_SECRET}\n")).unwrap();

    // A valid command whose trace context hides card numbers: tracestate entries
    // plain and grouped, a baggage member percent-encoded.
    let traced = unique("traced").replace('_', "-");
    let trace_id = card_free_trace_id();
    let traceparent = format!("00-{trace_id}-00f067aa0ba902b7-01");
    publish(
        &stack,
        &traced,
        &command_json(&traced),
        &[
            ("traceparent", &traceparent),
            (
                "tracestate",
                "pan=4111111111111111,vendor=ok,grp=4111_1111_1111_1111",
            ),
            ("baggage", "user=alice,pan=4111%201111%201111%201111"),
        ],
    )
    .await;
    // Keys that are card numbers in every grouping, as an upstream keyed by card
    // would send them.
    for key in CARD_KEYS {
        publish(&stack, key, &command_json(key), &[]).await;
    }
    let mut worker = binary(&stack, &stack.db.url, &sink);
    worker
        .env("KAFKA_BROKERS", &stack.settings.brokers)
        .env("KAFKA_GROUP_ID", &stack.settings.group_id)
        .env("KAFKA_SESSION_TIMEOUT", "6s")
        .env("WORKER_ID", "cards-worker")
        .env("KEY_HASH_SECRET_FILE", &secret_file)
        .arg("run");
    let transcript = run_worker(worker, &stack, 1 + CARD_KEYS.len()).await;

    // Results, read raw.
    let results = read_topic(
        &stack.settings,
        &stack.settings.results_topic,
        "read_uncommitted",
    )
    .await;
    let parsed = result_records(&results);
    assert_eq!(parsed.len(), 1 + CARD_KEYS.len(), "{parsed:?}");
    let (record, traced_result) = results
        .iter()
        .zip(&parsed)
        .find(|(_, r)| r.idempotency_key.as_deref() == Some(traced.as_str()))
        .expect("the traced command's result");
    assert_eq!(traced_result.outcome, "succeeded", "{traced_result:?}");
    assert_eq!(
        header_text(record, "tracestate").as_deref(),
        Some("vendor=ok"),
        "only the valid, card-free tracestate entry is forwarded on the result"
    );
    assert!(
        header_text(record, "traceparent")
            .is_some_and(|p| p.starts_with(&format!("00-{trace_id}-"))),
        "the result stays in the command's trace"
    );
    assert_eq!(header_text(record, "baggage"), None);
    for key in CARD_KEYS {
        let expected_hmac = key_hash(&secret_file, key).await;
        let (record, result) = results
            .iter()
            .zip(&parsed)
            .find(|(record, _)| {
                header_text(record, "x-key-hmac-sha256").as_deref() == Some(expected_hmac.as_str())
            })
            .unwrap_or_else(|| panic!("{key}: no result with its keyed hash: {parsed:?}"));
        assert!(
            result
                .reason
                .as_deref()
                .is_some_and(|reason| reason.starts_with("invalid: card_number_as_key")),
            "{key}: {result:?}"
        );
        let echoed = result.idempotency_key.as_deref().unwrap_or_default();
        assert!(
            echoed.ends_with("1111") && echoed.contains('*'),
            "{key}: the result's key is masked: {echoed}"
        );
        assert_eq!(record.key(), Some(echoed.as_bytes()), "{key}");
    }

    // Dead letters: one per card key, each masked and keyed-hashed.
    let letters = stack.dead_letters().await;
    assert_eq!(letters.len(), CARD_KEYS.len());
    for key in CARD_KEYS {
        let expected_hmac = key_hash(&secret_file, key).await;
        let letter = letters
            .iter()
            .find(|l| {
                header_text(l, "x-key-hmac-sha256").as_deref() == Some(expected_hmac.as_str())
            })
            .unwrap_or_else(|| panic!("{key}: no dead letter with its keyed hash"));
        assert!(
            header_text(letter, "x-error-reason")
                .is_some_and(|r| r.starts_with("card_number_as_key:")),
            "{key}"
        );
        let echoed = String::from_utf8_lossy(letter.key().unwrap_or_default()).into_owned();
        assert!(
            echoed.ends_with("1111") && echoed.contains('*'),
            "{key}: {echoed}"
        );
        assert_eq!(header_text(letter, "x-key-sha256"), None, "no unkeyed hash");
    }
    assert_no_card_in(&results, "results");
    assert_no_card_in(&letters, "dead letters");

    // The gateway: only the traced command was charged, its request carried the
    // trace without the card-holding entries.
    let ledger = stack.ledger();
    assert_eq!(
        ledger
            .iter()
            .map(|e| e.idempotency_key.as_str())
            .collect::<Vec<_>>(),
        vec![traced.as_str()]
    );
    let sent = stack.simulator.trace_headers_of(&traced);
    let value = |name: &str| {
        sent.iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect::<Vec<_>>()
    };
    assert_eq!(value("tracestate"), vec!["vendor=ok"], "{sent:?}");
    assert!(
        value("traceparent")
            .iter()
            .all(|p| p.starts_with(&format!("00-{trace_id}-"))),
        "{sent:?}"
    );
    assert_eq!(value("traceparent").len(), 1, "{sent:?}");
    for (name, value) in &sent {
        assert!(
            hidden_card_numbers(value.as_bytes()).is_empty(),
            "{name}: {value}"
        );
    }

    // The spans, raw: the trace state is exported, without the card numbers.
    let (spans, bodies) = exported_spans(&sink);
    assert!(
        spans.contains(&traced),
        "the traced command's spans were exported"
    );
    assert!(
        spans.contains("vendor=ok"),
        "the kept trace state is exported"
    );
    for body in &bodies {
        let found = hidden_card_numbers(body);
        assert!(found.is_empty(), "an exported span holds {found:?}");
    }
    for text in [&spans, &transcript] {
        for literal in ["4111111111111111", "pan=", "4111_1111", "41111111-1111"] {
            assert!(!text.contains(literal), "{literal} left the worker");
        }
        assert!(
            card_like_numbers(text).is_empty(),
            "{:?}",
            card_like_numbers(text)
        );
    }
    // The logs, and every table.
    assert!(
        transcript.contains("card_number_as_key"),
        "the refusals were logged"
    );
    let rows = tables(&stack).await;
    assert!(rows.contains(&traced), "the tables were read");
    let found = hidden_card_numbers(rows.as_bytes());
    assert!(found.is_empty(), "a table holds {found:?}");
    sink.task.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The Stripe adapter sends the trace context on every request it makes for a
/// command: only what the worker kept of it, never a card-holding entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stripe_adapter_forwards_no_card_number_in_trace_context() {
    use payment_worker::configuration::StripeCompat;
    use payment_worker::payment::{Attempt, CommandContext, Outcome};
    use tracing::Instrument;

    use crate::support::scripted_stripe::ScriptedStripe;
    use crate::support::stripe::{command, StripeRig};

    const KEY: &str = "sk_test_trace_cards";
    let server = ScriptedStripe::start(&[(KEY, "acct_trace")]).await;
    let rig = StripeRig::new(&server.url(), StripeCompat::Stripe, Duration::from_secs(5)).await;
    let processor = rig.processor(std::sync::Arc::new(rig.gateway_with_key(KEY)));
    let trace_id = card_free_trace_id();
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: "traceparent",
            value: Some(&format!("00-{trace_id}-00f067aa0ba902b7-01")),
        })
        .insert(Header {
            key: "tracestate",
            value: Some("pan=4111111111111111,vendor=ok,dot=4111.1111.1111.1111"),
        });
    let span = tracing::info_span!("stripe trace check");
    payment_worker::telemetry::adopt_remote_parent(&span, Some(&headers));
    let key = unique("st-trace");
    let outcome = processor
        .process(
            &command(&key, 800, "USD", "pm_card_visa"),
            &CommandContext::default(),
        )
        .instrument(span)
        .await;
    assert!(
        matches!(outcome, Attempt::Final(Outcome::Succeeded { .. })),
        "{outcome:?}"
    );
    let received = server.received(&key);
    assert!(received.len() >= 2, "a create and a confirm: {received:?}");
    for request in &received {
        let names: Vec<&str> = request
            .trace_headers
            .iter()
            .map(|(n, _)| n.as_str())
            .collect();
        assert!(names.contains(&"traceparent"), "{request:?}");
        for (name, value) in &request.trace_headers {
            match name.as_str() {
                "traceparent" => assert!(value.starts_with(&format!("00-{trace_id}-")), "{value}"),
                "tracestate" => assert_eq!(value, "vendor=ok", "{request:?}"),
                _ => panic!("{name} forwarded: {request:?}"),
            }
        }
    }
}

/// A panic whose message quotes a record's key that is a card number: the panic
/// hook prints it masked, and so does the worker's log of the caught panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_panic_message_that_quotes_a_card_number_is_printed_and_logged_masked() {
    let stack = Stack::new(1, payment_worker_devtools::SimulatorConfig::default()).await;
    let sink = OtlpSink::start().await;
    let key = CARD_KEYS[0];
    publish(&stack, key, &command_json(key), &[]).await;
    let mut worker = binary(&stack, &stack.db.url, &sink);
    worker
        .env("KAFKA_BROKERS", &stack.settings.brokers)
        .env("KAFKA_GROUP_ID", &stack.settings.group_id)
        .env("KAFKA_SESSION_TIMEOUT", "6s")
        .env("WORKER_ID", "panics-worker")
        // The injected panic's message names the key it was hit for.
        .env(payment_worker::fault::Faults::ENV, "panic:after_answer")
        .env(payment_worker::fault::Faults::KEY_ENV, key)
        .arg("run");
    // Answered, panicked after the answer, twice more, then dead-lettered
    // `internal` on the third panic.
    let running = start(worker);
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let letters = stack.dead_letters().await;
        if letters
            .iter()
            .any(|l| header_text(l, "x-error-kind").as_deref() == Some("internal"))
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the third panic dead-letters the record: {} letters",
            letters.len()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    stack.wait_for_commits(Duration::from_secs(30)).await;
    let transcript = running.stop().await;
    assert!(
        transcript.contains("panicked at"),
        "the hook printed the panic: {transcript}"
    );
    assert!(
        transcript.contains("fault injected: panic at after_answer for key ********-****1111"),
        "the message is printed masked: {transcript}"
    );
    assert!(
        transcript.contains("handling a record panicked"),
        "the worker logged the caught panic: {transcript}"
    );
    assert!(
        !transcript.contains(key),
        "the key left in a panic message: {transcript}"
    );
    let found = card_like_numbers(&transcript);
    assert!(found.is_empty(), "{found:?}");
    let (spans, _) = exported_spans(&sink);
    assert!(card_like_numbers(&spans).is_empty());
    sink.task.abort();
}
