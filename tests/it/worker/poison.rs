//! Anything a broker can deliver: no record may stop a partition quietly. Every
//! record ends as a result or a dead letter, and the partition commits past it.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use payment_worker::kafka_headers as headers;
use payment_worker::payment::RejectionKind;
use payment_worker::worker;
use payment_worker_devtools::SimulatorConfig;
use proptest::prelude::*;
use rdkafka::message::{Message, OwnedHeaders, OwnedMessage, Timestamp};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use serde_json::json;

use crate::support::helpers::{ensure_services, Stack};
use crate::support::procs::{binary, Proc};

// ---------------------------------------------------------------------------
// Property: the record path is total.

fn header_list() -> impl Strategy<Value = Vec<(Vec<u8>, Option<Vec<u8>>)>> {
    let name = prop_oneof![
        3 => proptest::collection::vec(any::<u8>(), 0..16),
        1 => Just(b"traceparent".to_vec()),
        1 => Just(b"tracestate".to_vec()),
    ];
    let value = proptest::option::of(prop_oneof![
        3 => proptest::collection::vec(any::<u8>(), 0..64),
        1 => Just(b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_vec()),
    ]);
    let header = (name, value);
    prop_oneof![
        9 => proptest::collection::vec(header.clone(), 0..8),
        1 => proptest::collection::vec(header, 0..3000),
    ]
}

/// Raw bytes, or a command whose every field is arbitrary (control characters,
/// card-like digits and wrong types included), so validation is reached too.
fn record_value() -> impl Strategy<Value = Option<Vec<u8>>> {
    let text = prop_oneof![
        any::<String>(),
        "[A-Za-z0-9._:-]{1,20}",
        "[0-9 -]{12,24}",
        Just("4111 1111 1111 1111".to_owned()),
    ];
    let command = (
        text.clone(),
        text.clone(),
        any::<i64>(),
        prop_oneof![Just("EUR".to_owned()), text.clone()],
        text.clone(),
        proptest::option::of(text),
    )
        .prop_map(|(key, account, amount, currency, method, description)| {
            let mut value = json!({
                "idempotency_key": key, "account_id": account, "amount_minor": amount,
                "currency": currency, "payment_method": method,
            });
            if let Some(description) = description {
                value["description"] = json!(description);
            }
            serde_json::to_vec(&value).unwrap()
        });
    proptest::option::of(prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..256),
        command,
    ])
}

fn message(
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    header_list: &[(Vec<u8>, Option<Vec<u8>>)],
) -> OwnedMessage {
    let headers = header_list
        .iter()
        .fold(OwnedHeaders::new(), |all, (name, value)| {
            headers::append_raw(all, name, value.as_deref())
        });
    OwnedMessage::new(
        value,
        key,
        "payments.commands".to_owned(),
        Timestamp::NotAvailable,
        0,
        7,
        Some(headers),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn any_record_becomes_a_command_or_an_invalid_verdict_with_a_reason_code(
        key in proptest::option::of(prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..40),
            "[A-Za-z0-9._:-]{1,20}".prop_map(String::into_bytes),
        ]),
        value in record_value(),
        header_list in header_list(),
    ) {
        ensure_services();
        let record = message(key, value, &header_list);
        // The path of a record from the poll thread up to the processor.
        let span = worker::command_span(&record, "proptest-group");
        let _ = worker::lane_of(&record);
        let _ = worker::record_key(&record);
        match span.in_scope(|| worker::Inbound::read(&record).command) {
            Ok(payment_worker::payment::Command::Charge(command)) => {
                let description = command.description.as_deref().unwrap_or("");
                prop_assert!(!description.chars().any(char::is_control));
                prop_assert!(!command.account_id.chars().any(char::is_control));
                prop_assert!((1..=1_000_000_000_000).contains(&command.amount_minor));
            }
            Ok(payment_worker::payment::Command::Refund(command)) => {
                let reason = command.reason.as_deref().unwrap_or("");
                prop_assert!(!reason.chars().any(char::is_control));
                prop_assert!((1..=1_000_000_000_000).contains(&command.amount_minor));
            }
            Err(undecodable) => {
                let code = undecodable.code();
                prop_assert!(!code.is_empty());
                prop_assert!(
                    code.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                    "{}",
                    code
                );
                let reason = undecodable.to_string();
                prop_assert!(reason.starts_with(&format!("{code}: ")), "{}", reason);
                // The dead letter keeps every header, whatever its name, but trace
                // context (`traceparent`, `tracestate`, `baggage`) that is invalid or
                // holds a card number, which is dropped and named in
                // `x-headers-redacted` (the contract since trace context is read
                // strictly).
                let letter = worker::dead_letter_headers(&record, &worker::DeadLetter {
                    kind: RejectionKind::Invalid,
                    reason: &reason,
                    attempts: 1,
                    charge_unknown: false,
                    redacted: None,
                    key_hmac: None,
                });
                let kept = headers::raw(&letter).len();
                let ours = headers::raw(record.headers().unwrap())
                    .iter()
                    .filter(|h| h.name.starts_with(b"x-"))
                    .count();
                let trace_context = header_list
                    .iter()
                    .filter(|(name, _)| {
                        ["traceparent", "tracestate", "baggage"]
                            .iter()
                            .any(|t| name.eq_ignore_ascii_case(t.as_bytes()))
                    })
                    .count();
                prop_assert!(kept + ours + trace_context >= header_list.len() + 6);
                // Refused for a card number (`card_number_as_key`, `_in_account_id`,
                // `_as_payment_method`, `_in_description`): its dead letter is masked.
                if code.starts_with("card_number_") {
                    let redacted = payment_worker::payment::redact_payload(
                        record.payload().unwrap_or_default(),
                    );
                    if let payment_worker::payment::RedactedPayload::Masked(masked) = redacted {
                        prop_assert_ne!(Some(masked.as_slice()), record.payload());
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// A `run` process fed poison on one partition.

const MAX_MESSAGE_BYTES: &str = "4194304";

pub(crate) fn producer(stack: &Stack) -> FutureProducer {
    let mut settings = stack.settings.clone();
    settings
        .extra
        .push(("message.max.bytes".into(), MAX_MESSAGE_BYTES.into()));
    worker::producer_config(&settings).create().unwrap()
}

pub(crate) async fn send(
    producer: &FutureProducer,
    topic: &str,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: OwnedHeaders,
) -> i64 {
    let mut record: FutureRecord<'_, [u8], [u8]> =
        FutureRecord::to(topic).partition(0).headers(headers);
    if let Some(key) = key {
        record = record.key(key);
    }
    if let Some(value) = value {
        record = record.payload(value);
    }
    let delivery = producer
        .send(record, Timeout::After(Duration::from_secs(10)))
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    delivery.offset
}

/// Sends a valid command with idempotency key `key`, keyed by it, to partition 0 of
/// the commands topic; returns its offset.
pub(crate) async fn send_command(producer: &FutureProducer, stack: &Stack, key: &str) -> i64 {
    let value = serde_json::to_vec(&command(key)).unwrap();
    let topic = &stack.settings.commands_topic;
    send(
        producer,
        topic,
        Some(key.as_bytes()),
        Some(&value),
        OwnedHeaders::new(),
    )
    .await
}

pub(crate) fn command(key: &str) -> serde_json::Value {
    json!({"idempotency_key": key, "account_id": "acct_poison", "amount_minor": 1500,
        "currency": "EUR", "payment_method": "pm_card_visa", "description": "poison"})
}

pub(crate) fn with(key: &str, field: &str, value: &str) -> Vec<u8> {
    let mut command = command(key);
    command[field] = json!(value);
    serde_json::to_vec(&command).unwrap()
}

/// `Ok(outcome)` for a processed command, `Err((kind, code))` for a dead letter.
type Expected = Result<&'static str, (&'static str, &'static str)>;

pub(crate) fn header_value(message: &OwnedMessage, name: &str) -> Option<String> {
    message
        .headers()
        .and_then(|h| headers::last_value(h, name))
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

pub(crate) async fn start_run(stack: &Stack, name: &str, extra: &[(&str, &str)]) -> Proc {
    let mut env = stack.run_env();
    env.insert(
        "KAFKA_CONFIG_MESSAGE_MAX_BYTES".into(),
        MAX_MESSAGE_BYTES.into(),
    );
    for (k, v) in extra {
        env.insert((*k).to_owned(), (*v).to_owned());
    }
    let mut proc = Proc::spawn(name, binary(&["run"], &env));
    proc.wait_for(Duration::from_secs(60), |l| {
        (l.contains("assigned") && !l.contains("\"partitions\":0")).then_some(())
    })
    .await;
    proc
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn poison_records_are_answered_and_the_partition_commits_past_them() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let topic = stack.settings.commands_topic.clone();
    let producer = producer(&stack);
    let mut expected: BTreeMap<i64, Expected> = BTreeMap::new();
    let mut put = |offset: i64, expect: Expected| expected.insert(offset, expect);

    let valid = |key: &str| serde_json::to_vec(&command(key)).unwrap();
    let headers = headers::append_raw(OwnedHeaders::new(), b"\xff\xfe-not-utf8", Some(b"x"));
    let o = send(
        &producer,
        &topic,
        Some(b"p-name"),
        Some(&valid("p-name")),
        headers,
    )
    .await;
    put(o, Ok("succeeded"));
    let headers = headers::append_raw(OwnedHeaders::new(), b"traceparent", Some(b"00-\xff\xff-01"));
    let o = send(
        &producer,
        &topic,
        Some(b"p-tp"),
        Some(&valid("p-tp")),
        headers,
    )
    .await;
    put(o, Ok("succeeded"));
    let many = (0..2000).fold(OwnedHeaders::new(), |all, n| {
        headers::append_raw(all, format!("h{n}").as_bytes(), Some(b"v"))
    });
    let o = send(
        &producer,
        &topic,
        Some(b"p-many"),
        Some(&valid("p-many")),
        many,
    )
    .await;
    put(o, Ok("succeeded"));
    for (field, code) in [
        ("idempotency_key", "invalid_idempotency_key"),
        ("account_id", "invalid_account_id"),
        ("currency", "invalid_currency_format"),
        ("payment_method", "invalid_payment_method"),
        ("description", "description_control_character"),
    ] {
        let key = format!("p-nul-{}", field.replace('_', "-"));
        let value = with(&key, field, "a\u{0}b");
        let o = send(
            &producer,
            &topic,
            Some(key.as_bytes()),
            Some(&value),
            OwnedHeaders::new(),
        )
        .await;
        put(o, Err(("invalid", code)));
    }
    for (key, field, text, code) in [
        (
            "p-esc",
            "description",
            "red \u{1b}[31m text",
            "description_control_character",
        ),
        ("p-del", "account_id", "acct\u{7f}", "invalid_account_id"),
        (
            "p-cr",
            "payment_method",
            "pm\r\nx",
            "invalid_payment_method",
        ),
    ] {
        let o = send(
            &producer,
            &topic,
            Some(key.as_bytes()),
            Some(&with(key, field, text)),
            OwnedHeaders::new(),
        )
        .await;
        put(o, Err(("invalid", code)));
    }
    let mut nested = serde_json::to_string(&command("p-deep")).unwrap();
    nested.pop();
    nested.push_str(&format!(
        r#","extra":{}{}}}"#,
        "[".repeat(5000),
        "]".repeat(5000)
    ));
    // Deep nesting is refused where it matters and skipped where it is ignored.
    let o = send(
        &producer,
        &topic,
        Some(b"p-deep"),
        Some(nested.as_bytes()),
        OwnedHeaders::new(),
    )
    .await;
    put(o, Ok("succeeded"));
    let deep = format!("{}1{}", "[".repeat(5000), "]".repeat(5000));
    let mut in_field = serde_json::to_string(&command("p-deep-field")).unwrap();
    in_field = in_field.replace("\"acct_poison\"", &deep);
    let o = send(
        &producer,
        &topic,
        Some(b"p-deep-field"),
        Some(in_field.as_bytes()),
        OwnedHeaders::new(),
    )
    .await;
    put(o, Err(("invalid", "malformed_json")));
    let o = send(
        &producer,
        &topic,
        Some(b"p-deep-top"),
        Some(deep.as_bytes()),
        OwnedHeaders::new(),
    )
    .await;
    put(o, Err(("invalid", "not_an_object")));
    let mut large = command("p-large");
    large["padding"] = json!("z".repeat(1_000_000));
    let o = send(
        &producer,
        &topic,
        Some(b"p-large"),
        Some(&serde_json::to_vec(&large).unwrap()),
        OwnedHeaders::new(),
    )
    .await;
    put(o, Ok("succeeded"));
    for n in 0..50 {
        let key = format!("p-ok-{n}");
        let o = send(
            &producer,
            &topic,
            Some(key.as_bytes()),
            Some(&valid(&key)),
            OwnedHeaders::new(),
        )
        .await;
        put(o, Ok("succeeded"));
    }

    let mut run = start_run(&stack, "poison-run", &[]).await;
    let results = stack
        .wait_for_results(expected.len(), Duration::from_secs(15))
        .await;
    run.assert_running();
    let by_offset: HashMap<i64, String> = results
        .iter()
        .map(|r| (r.source.offset, r.outcome.clone()))
        .collect();
    let letters: HashMap<i64, OwnedMessage> = stack
        .dead_letters()
        .await
        .into_iter()
        .map(|m| {
            (
                header_value(&m, "x-source-offset")
                    .unwrap()
                    .parse()
                    .unwrap(),
                m,
            )
        })
        .collect();
    for (offset, expect) in &expected {
        match expect {
            Ok(outcome) => {
                assert_eq!(
                    by_offset.get(offset).map(String::as_str),
                    Some(*outcome),
                    "offset {offset}"
                );
                assert!(
                    !letters.contains_key(offset),
                    "offset {offset} was dead-lettered"
                );
            }
            Err((kind, code)) => {
                assert_eq!(
                    by_offset.get(offset).map(String::as_str),
                    Some("rejected"),
                    "offset {offset}"
                );
                let letter = letters
                    .get(offset)
                    .unwrap_or_else(|| panic!("offset {offset}: no dead letter"));
                assert_eq!(header_value(letter, "x-error-kind").as_deref(), Some(*kind));
                let reason = header_value(letter, "x-error-reason").unwrap();
                assert!(
                    reason.starts_with(&format!("{code}:")),
                    "offset {offset}: {reason}"
                );
            }
        }
    }
    assert_eq!(stack.ledger().len(), 55, "one charge per valid command");
    let end = expected.keys().last().unwrap() + 1;
    let deadline = Instant::now() + Duration::from_secs(15);
    while stack.committed().await.get(&0).copied().unwrap_or(-1) < end {
        assert!(
            Instant::now() < deadline,
            "committed offset never reached {end}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    run.stop(Duration::from_secs(20)).await;
}
