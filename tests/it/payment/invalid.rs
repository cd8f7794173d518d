//! Invalid commands never reach the gateway: each is dead-lettered with its reason.

use std::collections::HashSet;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use payment_worker::gateway::{HttpGateway, PaymentGateway};
use payment_worker::operator::{RecordKind, WorkloadRecord};
use payment_worker::payment::PaymentCommand;
use payment_worker::worker::{self};
use payment_worker_devtools::SimulatorConfig;
use rdkafka::message::{Headers, Message};

use crate::support::books::scan;
use crate::support::helpers::{quick_worker_settings, stop_all, Stack};

use super::rig::*;

/// A valid command's JSON with `field` replaced (`None`: removed).
fn with(key: &str, field: &str, value: Option<serde_json::Value>) -> Option<Vec<u8>> {
    let mut body = serde_json::json!({
        "idempotency_key": key, "account_id": "acct_42", "amount_minor": 100,
        "currency": "USD", "payment_method": "pm_card_visa",
    });
    let object = body.as_object_mut().unwrap();
    match value {
        Some(value) => object.insert(field.to_owned(), value),
        None => object.remove(field),
    };
    Some(body.to_string().into_bytes())
}

/// Like [`with`], with a JSON literal serde_json would not produce (`1e3`, 2^66).
fn with_literal(key: &str, field: &str, literal: &str) -> Option<Vec<u8>> {
    let body = String::from_utf8(with(key, field, Some(serde_json::json!("@literal@")))?).ok()?;
    Some(body.replace("\"@literal@\"", literal).into_bytes())
}

fn raw(text: &str) -> Option<Vec<u8>> {
    Some(text.as_bytes().to_vec())
}

/// Builds a record value from its Kafka key.
type Payload = Box<dyn Fn(&str) -> Option<Vec<u8>>>;

/// (Kafka key, value, the reason code it must be refused with).
fn invalid_table() -> Vec<(String, Option<Vec<u8>>, &'static str)> {
    use serde_json::json;
    let cases: Vec<(Payload, &'static str)> = vec![
        (Box::new(|_| None), "empty_payload"),
        (Box::new(|_| raw(" \n\t ")), "empty_payload"),
        (Box::new(|_| Some(vec![0xff, 0xfe, 0x00])), "not_utf8"),
        (
            Box::new(|k| raw(&format!("{{\"idempotency_key\": \"{k}\", "))),
            "malformed_json",
        ),
        (
            Box::new(|k| raw(&format!("{{\"idempotency_key\": \"{k}\"}} trailing"))),
            "malformed_json",
        ),
        (Box::new(|_| raw("[1, 2, 3]")), "not_an_object"),
        (Box::new(|_| raw("\"pm_card_visa\"")), "not_an_object"),
        (
            Box::new(|k| {
                raw(&format!(
                    "{{\"idempotency_key\":\"{k}\",\"account_id\":\"a\",\"amount_minor\":1,\"amount_minor\":100000,\
                     \"currency\":\"USD\",\"payment_method\":\"pm_card_visa\"}}"
                ))
            }),
            "duplicate_field",
        ),
        (Box::new(|k| with(k, "account_id", None)), "missing_field"),
        (
            Box::new(|k| with(k, "amount_minor", Some(json!(null)))),
            "null_field",
        ),
        (
            Box::new(|k| with(k, "amount_minor", Some(json!("100")))),
            "wrong_type",
        ),
        (
            Box::new(|k| with(k, "payment_method", Some(json!(42)))),
            "wrong_type",
        ),
        (
            Box::new(|k| {
                with(
                    k,
                    "idempotency_key",
                    Some(json!(format!("{k} with spaces"))),
                )
            }),
            "invalid_idempotency_key",
        ),
        (
            Box::new(|k| with(k, "idempotency_key", Some(json!("k".repeat(129))))),
            "invalid_idempotency_key",
        ),
        (
            Box::new(|k| with(k, "idempotency_key", Some(json!("{tag}*")))),
            "invalid_idempotency_key",
        ),
        (
            Box::new(|k| with(k, "account_id", Some(json!("   ")))),
            "invalid_account_id",
        ),
        (
            Box::new(|k| with(k, "account_id", Some(json!("a".repeat(65))))),
            "invalid_account_id",
        ),
        (
            Box::new(|k| with(k, "account_id", Some(json!("acct 4111111111111111")))),
            "card_number_in_account_id",
        ),
        (
            Box::new(|k| with(k, "amount_minor", Some(json!(19.99)))),
            "amount_not_integer",
        ),
        (
            Box::new(|k| with_literal(k, "amount_minor", "1e3")),
            "amount_not_integer",
        ),
        (
            Box::new(|k| with(k, "amount_minor", Some(json!(0)))),
            "amount_out_of_range",
        ),
        (
            Box::new(|k| with(k, "amount_minor", Some(json!(-5)))),
            "amount_out_of_range",
        ),
        (
            Box::new(|k| with(k, "amount_minor", Some(json!(1_000_000_000_001_i64)))),
            "amount_out_of_range",
        ),
        (
            Box::new(|k| with_literal(k, "amount_minor", "99999999999999999999")),
            "amount_out_of_range",
        ),
        (
            Box::new(|k| with(k, "currency", Some(json!("US")))),
            "invalid_currency_format",
        ),
        (
            Box::new(|k| with(k, "currency", Some(json!("usd")))),
            "currency_not_upper_case",
        ),
        (
            Box::new(|k| with(k, "currency", Some(json!("ABC")))),
            "unknown_currency",
        ),
        (
            Box::new(|k| with(k, "currency", Some(json!("XAU")))),
            "currency_not_payable",
        ),
        (
            Box::new(|k| with(k, "payment_method", Some(json!("4111 1111 1111 1111")))),
            "card_number_as_payment_method",
        ),
        (
            Box::new(|k| with(k, "payment_method", Some(json!("")))),
            "invalid_payment_method",
        ),
        (
            Box::new(|k| with(k, "payment_method", Some(json!("pm_\u{7}card")))),
            "invalid_payment_method",
        ),
        (
            Box::new(|k| with(k, "payment_method", Some(json!("p".repeat(129))))),
            "invalid_payment_method",
        ),
        (
            Box::new(|k| with(k, "description", Some(json!("d".repeat(513))))),
            "description_too_long",
        ),
        (
            Box::new(|k| {
                with(
                    k,
                    "description",
                    Some(json!("card 5555555555554444 please")),
                )
            }),
            "card_number_in_description",
        ),
        // Well-formed, but its Kafka key names another payment: refused by the worker.
        (
            Box::new(|k| with(k, "idempotency_key", Some(json!(format!("{k}-elsewhere"))))),
            "kafka_key_mismatch",
        ),
    ];
    cases
        .into_iter()
        .enumerate()
        .map(|(n, (value, code))| {
            let key = format!("inv-{n:02}");
            let value = value(&key);
            (key, value, code)
        })
        .collect()
}

fn header(message: &rdkafka::message::OwnedMessage, name: &str) -> Option<String> {
    message.headers().and_then(|h| {
        h.iter()
            .find(|x| x.key == name)
            .and_then(|x| x.value.map(|v| String::from_utf8_lossy(v).into_owned()))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn invalid_commands_are_dead_lettered_with_their_reason_and_never_reach_the_gateway() {
    let table = invalid_table();
    assert!(table.len() >= 25, "{} cases", table.len());
    let codes: HashSet<_> = table.iter().map(|(_, _, code)| *code).collect();
    assert!(codes.len() >= 22, "distinct reasons: {codes:?}");

    // Each payload is refused by the parser with exactly its reason.
    for (key, value, code) in &table {
        let parsed = PaymentCommand::parse(value.as_deref().unwrap_or_default());
        if *code == "kafka_key_mismatch" {
            assert!(parsed.is_ok(), "{key}");
        } else {
            assert_eq!(parsed.err().map(|e| e.code()), Some(*code), "{key}");
        }
    }

    // Through a real worker: every one dead-lettered, none reserved or charged.
    let mut stack = Stack::new(3, SimulatorConfig::default()).await;
    let gateway = Arc::new(CountingGateway {
        inner: HttpGateway::new(
            &stack.simulator.url(),
            Duration::from_secs(5),
            Duration::from_secs(1),
        )
        .unwrap(),
        charges: AtomicUsize::new(0),
        lookups: AtomicUsize::new(0),
        refunds: AtomicUsize::new(0),
    });
    stack.gateway = Arc::clone(&gateway) as Arc<dyn PaymentGateway>;
    let records: Vec<WorkloadRecord> = table
        .iter()
        .map(|(key, value, _)| WorkloadRecord {
            kind: RecordKind::Invalid,
            key: Some(key.clone().into_bytes()),
            value: value.clone(),
            partition_hint: None,
        })
        .collect();
    let worker = stack.start_worker("inv", &quick_worker_settings());
    stack.produce(&records).await;
    let results = stack
        .wait_for_results(table.len(), Duration::from_secs(120))
        .await;
    stack.wait_for_commits(Duration::from_secs(30)).await;
    stop_all(vec![worker]).await;

    let dead = stack.dead_letters().await;
    assert_eq!(dead.len(), table.len(), "one dead letter per command");
    assert_eq!(results.len(), table.len(), "one result per command");
    for (key, value, code) in &table {
        let letters: Vec<_> = dead
            .iter()
            .filter(|m| m.key() == Some(key.as_bytes()))
            .collect();
        assert_eq!(letters.len(), 1, "{key}");
        let letter = letters[0];
        if code.starts_with("card_number") {
            // Masked, all but the last four digits: a card number never lands on a topic.
            let original = String::from_utf8(value.clone().unwrap()).unwrap();
            let masked = payment_worker::payment::mask_card_numbers(&original);
            assert_ne!(masked, original, "{key}");
            assert_eq!(letter.payload(), Some(masked.as_bytes()), "{key}");
        } else {
            assert_eq!(
                letter.payload(),
                value.as_deref(),
                "{key}: the original value, unchanged"
            );
        }
        assert_eq!(
            header(letter, worker::ERROR_KIND).as_deref(),
            Some("invalid"),
            "{key}"
        );
        let reason = header(letter, worker::ERROR_REASON).unwrap_or_default();
        assert!(
            reason.starts_with(&format!("{code}: ")),
            "{key}: expected {code}, got {reason:?}"
        );
        for secret in ["4111", "5555555555554444", "pm_card_visa"] {
            assert!(
                !reason.contains(secret),
                "{key}: the reason leaks {secret:?}: {reason:?}"
            );
        }
        let result = results
            .iter()
            .find(|r| {
                r.source.partition == letter.partition()
                    && r.source.offset.to_string() == header(letter, "x-source-offset").unwrap()
            })
            .unwrap_or_else(|| panic!("no result for {key}"));
        assert_eq!(result.outcome, "rejected", "{key}");
        assert!(
            result.payment_id.is_none() && result.gateway_transaction_id.is_none(),
            "{key}"
        );
    }

    assert_eq!(
        (gateway.charges(), gateway.lookups()),
        (0, 0),
        "nothing reached the gateway"
    );
    assert!(stack.ledger().is_empty());
    assert!(stack.payment_rows().await.is_empty(), "no payment row");
    let mut conn = stack.redis.conn.clone();
    let tokens = scan(&mut conn, &format!("{}:*", stack.redis.prefix)).await;
    assert!(tokens.is_empty(), "no token was reserved: {tokens:?}");
}
