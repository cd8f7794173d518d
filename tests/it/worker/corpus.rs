//! A corpus of bad input, published on the commands topic and consumed by a
//! running worker. Each bad record ends in the DLQ, unchanged (card numbers masked,
//! or the value dropped when masking cannot reach one), with its exact
//! `x-error-kind` and a specific reason code; nothing invalid reaches the gateway;
//! the worker keeps going and commits past every one of them.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use payment_worker::token::{IdempotencyKey, TokenMode, TokenPolicy};
use payment_worker_devtools::SimulatorConfig;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

use crate::support::cards::hidden_card_numbers;
use crate::support::helpers::{quick_worker_settings, read_topic, stop_all, Stack};

use super::corpus_cases::*;

async fn publish(stack: &Stack, cases: &[Case]) -> Vec<i64> {
    let producer: FutureProducer = payment_worker::worker::producer_config(&stack.settings)
        .set("message.max.bytes", MAX_MESSAGE_BYTES)
        .create()
        .unwrap();
    let mut offsets = vec![];
    for (n, case) in cases.iter().enumerate() {
        let mut headers = OwnedHeaders::new().insert(Header {
            key: "x-case",
            value: Some(&n.to_string()),
        });
        for (key, value) in &case.headers {
            headers = headers.insert(Header {
                key,
                value: Some(value),
            });
        }
        let mut record: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(&stack.settings.commands_topic)
                .partition(0)
                .headers(headers);
        if let Some(key) = &case.key {
            record = record.key(key);
        }
        if let Some(value) = &case.value {
            record = record.payload(value);
        }
        let delivery = producer
            .send(record, Timeout::After(Duration::from_secs(30)))
            .await
            .unwrap_or_else(|(e, _)| panic!("case {}: {e}", case.name));
        offsets.push(delivery.offset);
    }
    offsets
}

fn header(message: &OwnedMessage, name: &str) -> Option<Vec<u8>> {
    message.headers().and_then(|h| {
        h.iter()
            .find(|x| x.key == name)
            .and_then(|x| x.value.map(<[u8]>::to_vec))
    })
}

fn header_text(message: &OwnedMessage, name: &str) -> Option<String> {
    header(message, name).map(|v| String::from_utf8_lossy(&v).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_bad_record_is_dead_lettered_with_its_reason_and_the_worker_commits_past_it() {
    let mut stack = Stack::new(1, SimulatorConfig::default()).await;
    // The worker is deployed with the broker's message size, or it could neither
    // fetch nor dead-letter the largest record the topic accepts.
    stack
        .settings
        .extra
        .push(("message.max.bytes".into(), MAX_MESSAGE_BYTES.into()));
    let cases = corpus();
    let dead_count = cases
        .iter()
        .filter(|c| matches!(c.expect, Expect::Dead { .. }))
        .count();
    assert!(dead_count >= 40, "only {dead_count} bad cases");
    let names: HashSet<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names.len(), cases.len(), "case names are distinct");
    let values: HashSet<_> = cases
        .iter()
        .map(|c| (c.key.as_ref(), c.value.as_ref()))
        .collect();
    assert_eq!(values.len(), cases.len(), "cases are distinct records");

    let offsets = publish(&stack, &cases).await;
    let worker = stack.start_worker("corpus", &quick_worker_settings());
    let results = stack
        .wait_for_results(cases.len(), Duration::from_secs(120))
        .await;
    stack.wait_for_commits(Duration::from_secs(30)).await;

    // A valid command after the corpus: the worker is still consuming and charging.
    let last = Case {
        name: "after the corpus".into(),
        key: Some(b"after".to_vec()),
        value: Some(with_raw("after", "x", None)),
        headers: vec![],
        expect: Expect::Outcome("succeeded"),
    };
    let last_offset = publish(&stack, std::slice::from_ref(&last)).await[0];
    let results_after = stack
        .wait_for_results(cases.len() + 1, Duration::from_secs(60))
        .await;
    stack.wait_for_commits(Duration::from_secs(30)).await;
    let committed = stack.committed().await;
    let high = stack.high_watermarks().await;
    assert_eq!(
        committed.get(&0),
        high.get(&0),
        "committed offset == high watermark"
    );
    assert_eq!(high.get(&0), Some(&(last_offset + 1)));
    let dead_letters = stack.dead_letters().await;
    stop_all(vec![worker]).await;
    assert!(results.len() <= results_after.len());

    let outcome_at: HashMap<i64, Vec<&str>> =
        results_after.iter().fold(HashMap::new(), |mut m, r| {
            m.entry(r.source.offset)
                .or_default()
                .push(r.outcome.as_str());
            m
        });
    assert_eq!(outcome_at.get(&last_offset), Some(&vec!["succeeded"]));
    let dead_at: HashMap<i64, &OwnedMessage> = dead_letters
        .iter()
        .map(|m| {
            let offset = header_text(m, "x-source-offset").unwrap().parse().unwrap();
            (offset, m)
        })
        .collect();
    assert_eq!(
        dead_letters.len(),
        dead_count,
        "one dead letter per bad record, none for good ones"
    );

    let mut charged_expected: HashSet<String> = HashSet::from(["after".to_owned()]);
    let mut masked_letters = 0;
    let mut dropped_letters = 0;
    for (n, (case, offset)) in cases.iter().zip(&offsets).enumerate() {
        let outcomes = outcome_at
            .get(offset)
            .unwrap_or_else(|| panic!("case {}: no result", case.name));
        match &case.expect {
            Expect::Outcome(expected) => {
                assert_eq!(outcomes, &vec![*expected], "case {}", case.name);
                assert!(
                    !dead_at.contains_key(offset),
                    "case {}: dead-lettered",
                    case.name
                );
                charged_expected.insert(String::from_utf8(case.key.clone().unwrap()).unwrap());
            }
            Expect::Dead { kind, code } => {
                assert_eq!(outcomes, &vec!["rejected"], "case {}", case.name);
                let letter = dead_at
                    .get(offset)
                    .unwrap_or_else(|| panic!("case {}: no dead letter", case.name));
                assert_eq!(
                    header_text(letter, "x-error-kind").as_deref(),
                    Some(*kind),
                    "case {}",
                    case.name
                );
                let reason = header_text(letter, "x-error-reason").unwrap();
                assert!(
                    reason.starts_with(&format!("{code}:")),
                    "case {}: reason {reason:?}",
                    case.name
                );
                assert!(
                    !reason.contains("4111")
                        && !reason.contains("4242")
                        && !reason.contains("5500"),
                    "case {}: {reason}",
                    case.name
                );
                // The original record, with its own headers; unchanged, except that
                // a card number is masked (all but its last four digits), whichever
                // rule refused the record, or the value dropped where masking cannot
                // reach the number.
                assert_echoed_key(letter, case);
                assert_echoed_headers(letter, case);
                let original = case
                    .value
                    .as_deref()
                    .and_then(|v| std::str::from_utf8(v).ok())
                    .unwrap_or_default();
                let masked = payment_worker::payment::mask_card_numbers(original);
                if header_text(letter, "x-payload-dropped").as_deref() == Some("card_number") {
                    // A card number masking cannot reach: the value is not kept.
                    dropped_letters += 1;
                    assert!(
                        !hidden_card_numbers(case.value.as_deref().unwrap_or_default()).is_empty(),
                        "case {}: dropped a value that hides no card number",
                        case.name
                    );
                    assert_eq!(letter.payload(), None, "case {}", case.name);
                    assert_eq!(
                        header_text(letter, "x-payload-redacted").as_deref(),
                        Some("card_number"),
                        "case {}",
                        case.name
                    );
                } else if masked != original {
                    masked_letters += 1;
                    assert_eq!(
                        letter.payload(),
                        Some(masked.as_bytes()),
                        "case {}",
                        case.name
                    );
                    assert_eq!(
                        header_text(letter, "x-payload-redacted").as_deref(),
                        Some("card_number"),
                        "case {}",
                        case.name
                    );
                } else {
                    // Refused for a card number in its value, which was kept? A
                    // card number as its key leaves the value as it is.
                    assert!(
                        !code.starts_with("card_number") || *code == "card_number_as_key",
                        "case {}: refused for its card number, which was kept",
                        case.name
                    );
                    assert_eq!(
                        letter.payload(),
                        case.value.as_deref(),
                        "case {}",
                        case.name
                    );
                    assert_eq!(header_text(letter, "x-payload-redacted"), None);
                }
                // Whatever rule refused it, a dead letter holds no card number in
                // any reading of its value.
                let kept = hidden_card_numbers(letter.payload().unwrap_or_default());
                assert!(kept.is_empty(), "case {}: {kept:?}", case.name);
                assert_eq!(
                    header_text(letter, "x-case"),
                    Some(n.to_string()),
                    "case {}",
                    case.name
                );
                assert_eq!(
                    header_text(letter, "x-source-topic").as_deref(),
                    Some(stack.settings.commands_topic.as_str())
                );
                assert_eq!(
                    header_text(letter, "x-source-partition").as_deref(),
                    Some("0")
                );
                assert_eq!(
                    header_text(letter, "x-attempts").as_deref(),
                    Some("1"),
                    "case {}",
                    case.name
                );
            }
        }
    }

    // Six `card_number_*` refusals, and three records refused by an earlier rule
    // with a card number behind it (a number-typed payment method, a lower-case
    // currency, truncated JSON).
    assert!(
        masked_letters >= 9,
        "only {masked_letters} dead letters had a card number masked"
    );
    // A card number behind a JSON escape, two in UTF-16, one in both.
    assert_eq!(
        dropped_letters, 4,
        "dead letters whose card number could only be dropped"
    );

    // Nothing invalid reached the gateway: only the good keys were charged, once.
    let ledger = stack.ledger();
    let charged: Vec<&str> = ledger.iter().map(|e| e.idempotency_key.as_str()).collect();
    let charged_set: HashSet<String> = charged.iter().map(|k| (*k).to_owned()).collect();
    assert_eq!(charged.len(), charged_set.len(), "one charge per key");
    assert_eq!(charged_set, charged_expected);
    let reused = ledger
        .iter()
        .find(|e| e.idempotency_key == "reused")
        .unwrap();
    assert_eq!(
        reused.amount_minor, 100,
        "the first use of the key was charged, not the reuse"
    );
    assert_eq!(
        reused.attempts, 1,
        "the reused key never reached the gateway again"
    );
    stack.assert_books_balance().await;
    assert_no_card_number_on_any_output(&stack).await;
}

/// The dead letter's key is the record's, unless the record's key holds a card
/// number: then it is masked (its last four digits kept) and `x-key-hmac-sha256` is
/// the keyed hash of the original key (it was an unsalted `x-key-sha256` before the
/// contract asked for a keyed one), so operators holding the secret can correlate.
fn assert_echoed_key(letter: &OwnedMessage, case: &Case) {
    let original = case.key.as_deref();
    let holds_card = original.is_some_and(|key| !hidden_card_numbers(key).is_empty());
    let sha = header_text(letter, "x-key-hmac-sha256");
    assert_eq!(
        header_text(letter, "x-key-sha256"),
        None,
        "case {}",
        case.name
    );
    if !holds_card {
        assert_eq!(letter.key(), original, "case {}", case.name);
        assert_eq!(sha, None, "case {}", case.name);
        return;
    }
    let original = original.unwrap();
    let echoed = letter.key().unwrap_or_default();
    assert!(
        hidden_card_numbers(echoed).is_empty(),
        "case {}: key {:?}",
        case.name,
        String::from_utf8_lossy(echoed)
    );
    let last_four: String = String::from_utf8_lossy(original)
        .chars()
        .filter(char::is_ascii_digit)
        .collect::<Vec<_>>()
        .iter()
        .rev()
        .take(4)
        .rev()
        .collect();
    let echoed_digits: String = String::from_utf8_lossy(echoed)
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    assert!(
        echoed_digits.ends_with(&last_four) && String::from_utf8_lossy(echoed).contains('*'),
        "case {}: masked, the last four digits kept: {:?}",
        case.name,
        String::from_utf8_lossy(echoed)
    );
    // The in-process worker has no KEY_HASH_SECRET_FILE: it keys with the process's
    // random secret, which this test shares.
    assert_eq!(
        sha,
        Some(payment_worker::redaction::KeyHasher::for_this_process().hex(original)),
        "case {}",
        case.name
    );
}

/// A producer's header is copied as it came when it holds no card number;
/// otherwise it is masked and its (masked) name is listed in `x-headers-redacted`.
fn assert_echoed_headers(letter: &OwnedMessage, case: &Case) {
    let copied = payment_worker::kafka_headers::raw(letter.headers().unwrap());
    let redacted = header_text(letter, "x-headers-redacted");
    let mut expect_redacted = 0;
    for (name, value) in &case.headers {
        let holds_card = !hidden_card_numbers(name.as_bytes()).is_empty()
            || !hidden_card_numbers(value).is_empty();
        let verbatim = copied
            .iter()
            .any(|h| h.name == name.as_bytes() && h.value == Some(value.as_slice()));
        if holds_card {
            expect_redacted += 1;
            assert!(!verbatim, "case {}: header {name} copied", case.name);
        } else {
            assert!(verbatim, "case {}: header {name} not copied", case.name);
        }
    }
    let listed = redacted.as_deref().map_or(0, |r| r.split(',').count());
    assert_eq!(listed, expect_redacted, "case {}: {redacted:?}", case.name);
    if expect_redacted > 0 {
        // Each listed header is on the letter under its (masked) name, but a trace
        // context header of which nothing could be kept (a `tracestate` without a
        // valid `traceparent` is not read at all).
        for name in redacted.as_deref().unwrap_or_default().split(',') {
            let trace_context = ["traceparent", "tracestate", "baggage"].contains(&name);
            assert!(
                trace_context || copied.iter().any(|h| h.name == name.as_bytes()),
                "case {}: {name} listed but not on the letter",
                case.name
            );
        }
    }
}

/// Every record of every topic the worker writes, read raw (keys, header names and
/// values, values, in every reading a consumer might give the bytes), and every
/// row of every table: no card number anywhere.
async fn assert_no_card_number_on_any_output(stack: &Stack) {
    let mut seen = 0;
    for topic in [&stack.settings.results_topic, &stack.settings.dlq_topic] {
        for record in read_topic(&stack.settings, topic, "read_uncommitted").await {
            let at = format!("{topic} offset {}", record.offset());
            let key = hidden_card_numbers(record.key().unwrap_or_default());
            assert!(key.is_empty(), "{at}: key holds {key:?}");
            let value = hidden_card_numbers(record.payload().unwrap_or_default());
            assert!(value.is_empty(), "{at}: value holds {value:?}");
            for header in record
                .headers()
                .map(payment_worker::kafka_headers::raw)
                .unwrap_or_default()
            {
                let name = String::from_utf8_lossy(header.name);
                let found = hidden_card_numbers(header.name);
                assert!(
                    found.is_empty(),
                    "{at}: header name {name:?} holds {found:?}"
                );
                let found = hidden_card_numbers(header.value.unwrap_or_default());
                assert!(found.is_empty(), "{at}: header {name:?} holds {found:?}");
            }
            seen += 1;
        }
    }
    assert!(seen > 0, "the output topics were read");
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT tablename::text FROM pg_tables WHERE schemaname = 'public'")
            .fetch_all(&stack.db.pool)
            .await
            .unwrap();
    for table in tables {
        let rows: Vec<String> =
            sqlx::query_scalar(&format!("SELECT row_to_json(t)::text FROM \"{table}\" t"))
                .fetch_all(&stack.db.pool)
                .await
                .unwrap();
        for row in rows {
            let found = hidden_card_numbers(row.as_bytes());
            assert!(found.is_empty(), "table {table}: {row} holds {found:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_token_never_issued_is_dead_lettered_as_token_missing() {
    let stack = Stack::with_policy(
        1,
        SimulatorConfig::default(),
        TokenPolicy {
            mode: TokenMode::Issued,
            lease: Duration::from_secs(5),
            ..TokenPolicy::default()
        },
    )
    .await;
    let issued = IdempotencyKey::try_from("issued-1").unwrap();
    stack
        .tokens
        .issue(&issued, Duration::from_secs(3600))
        .await
        .unwrap();
    let cases = vec![
        Case {
            name: "never issued".into(),
            key: Some(b"never-issued".to_vec()),
            value: Some(with_raw("never-issued", "x", None)),
            headers: vec![],
            expect: dead("token_missing", "token_missing"),
        },
        Case {
            name: "issued".into(),
            key: Some(b"issued-1".to_vec()),
            value: Some(with_raw("issued-1", "x", None)),
            headers: vec![],
            expect: Expect::Outcome("succeeded"),
        },
    ];
    let offsets = publish(&stack, &cases).await;
    let worker = stack.start_worker("issued", &quick_worker_settings());
    let results = stack
        .wait_for_results(cases.len(), Duration::from_secs(60))
        .await;
    stack.wait_for_commits(Duration::from_secs(30)).await;
    let dead_letters = stack.dead_letters().await;
    stop_all(vec![worker]).await;

    let outcome = |offset: i64| {
        results
            .iter()
            .find(|r| r.source.offset == offset)
            .unwrap()
            .outcome
            .clone()
    };
    assert_eq!(outcome(offsets[0]), "rejected");
    assert_eq!(outcome(offsets[1]), "succeeded");
    assert_eq!(dead_letters.len(), 1);
    let letter = &dead_letters[0];
    assert_eq!(
        header_text(letter, "x-error-kind").as_deref(),
        Some("token_missing")
    );
    assert!(header_text(letter, "x-error-reason")
        .unwrap()
        .starts_with("token_missing:"));
    assert_eq!(
        header_text(letter, "x-source-offset"),
        Some(offsets[0].to_string())
    );
    assert_eq!(letter.payload(), cases[0].value.as_deref());
    let charged: Vec<String> = stack
        .ledger()
        .into_iter()
        .map(|e| e.idempotency_key)
        .collect();
    assert_eq!(charged, ["issued-1"], "the missing token was never charged");
}
