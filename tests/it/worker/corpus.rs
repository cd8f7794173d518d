//! A corpus of bad input, published on the commands topic and consumed by a
//! running worker. Each bad record ends in the DLQ, unchanged (card numbers masked), with its exact
//! `x-error-kind` and a specific reason code; nothing invalid reaches the gateway;
//! the worker keeps going and commits past every one of them.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use payment_worker::devtools::SimulatorConfig;
use payment_worker::token::{IdempotencyKey, TokenMode, TokenPolicy};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use serde_json::{json, Value};

use crate::support::helpers::{quick_worker_settings, stop_all, Stack};

/// Limit given to the test producer and to the worker: the librdkafka default
/// (1,000,000 bytes) is below the 1 MiB record of the corpus.
const MAX_MESSAGE_BYTES: &str = "4194304";

#[derive(Debug, Clone)]
enum Expect {
    /// Dead-lettered with this `x-error-kind` and an `x-error-reason` starting with `code:`.
    Dead {
        kind: &'static str,
        code: &'static str,
    },
    /// Processed normally with this result outcome.
    Outcome(&'static str),
}

struct Case {
    name: String,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(&'static str, Vec<u8>)>,
    expect: Expect,
}

fn command(key: &str) -> serde_json::Map<String, Value> {
    let Value::Object(map) = json!({
        "idempotency_key": key, "account_id": "acct_corpus", "amount_minor": 1999,
        "currency": "EUR", "payment_method": "pm_card_visa", "description": "corpus",
    }) else {
        unreachable!()
    };
    map
}

/// A command for `key` with `field` replaced by the raw JSON text `raw` (or removed).
fn with_raw(key: &str, field: &str, raw: Option<&str>) -> Vec<u8> {
    let mut map = command(key);
    map.remove(field);
    let mut text = serde_json::to_string(&Value::Object(map)).unwrap();
    if let Some(raw) = raw {
        text.pop();
        text.push_str(&format!(",\"{field}\":{raw}}}"));
    }
    text.into_bytes()
}

fn dead(kind: &'static str, code: &'static str) -> Expect {
    Expect::Dead { kind, code }
}

fn invalid(code: &'static str) -> Expect {
    dead("invalid", code)
}

struct Corpus {
    cases: Vec<Case>,
}

impl Corpus {
    fn raw(&mut self, name: &str, key: Option<&[u8]>, value: Option<Vec<u8>>, expect: Expect) {
        self.cases.push(Case {
            name: name.to_owned(),
            key: key.map(<[u8]>::to_vec),
            value,
            headers: vec![],
            expect,
        });
    }

    /// A record keyed `c-<n>` whose value is `value`.
    fn keyed(&mut self, name: &str, value: Vec<u8>, expect: Expect) {
        let key = format!("c-{}", self.cases.len());
        self.raw(name, Some(key.as_bytes()), Some(value), expect);
    }

    /// A command keyed `c-<n>` with one field replaced by raw JSON (None: removed).
    fn field(&mut self, name: &str, field: &str, raw: Option<&str>, expect: Expect) {
        let key = format!("c-{}", self.cases.len());
        let value = with_raw(&key, field, raw);
        self.raw(name, Some(key.as_bytes()), Some(value), expect);
    }

    /// A command whose `idempotency_key` field (and record key) is `raw_key`.
    fn with_key(&mut self, name: &str, raw_key: &str) {
        let value = with_raw(
            "x",
            "idempotency_key",
            Some(&serde_json::to_string(raw_key).unwrap()),
        );
        self.raw(
            name,
            Some(raw_key.as_bytes()),
            Some(value),
            invalid("invalid_idempotency_key"),
        );
    }
}

fn corpus() -> Vec<Case> {
    let mut c = Corpus { cases: vec![] };
    // Not JSON, or not an object.
    c.keyed(
        "invalid utf-8",
        vec![0xff, 0xfe, 0x00, 0x7b],
        invalid("not_utf8"),
    );
    let mut bad_inside = with_raw("c-1", "account_id", Some("\"acct\""));
    let at = bad_inside.len() - 3;
    bad_inside.insert(at, 0xc3);
    c.keyed(
        "invalid utf-8 inside a string",
        bad_inside,
        invalid("not_utf8"),
    );
    c.keyed(
        "truncated json",
        br#"{"idempotency_key": "c-2", "account_id": "acct", "amo"#.to_vec(),
        invalid("malformed_json"),
    );
    c.keyed(
        "trailing garbage",
        [with_raw("c-3", "x", None), b"}".to_vec()].concat(),
        invalid("malformed_json"),
    );
    c.keyed(
        "json array",
        br#"[{"idempotency_key":"c-4"}]"#.to_vec(),
        invalid("not_an_object"),
    );
    c.keyed("json number", b"42".to_vec(), invalid("not_an_object"));
    c.keyed("json null", b"null".to_vec(), invalid("not_an_object"));
    c.keyed(
        "json string",
        br#""c-7""#.to_vec(),
        invalid("not_an_object"),
    );
    c.keyed("json boolean", b"true".to_vec(), invalid("not_an_object"));
    c.keyed("empty value", vec![], invalid("empty_payload"));
    c.keyed(
        "whitespace value",
        b" \n\t ".to_vec(),
        invalid("empty_payload"),
    );
    c.raw(
        "tombstone (null value)",
        Some(b"c-11".as_slice()),
        None,
        invalid("empty_payload"),
    );
    // Missing, null and mistyped fields.
    for field in [
        "idempotency_key",
        "account_id",
        "amount_minor",
        "currency",
        "payment_method",
    ] {
        c.field(
            &format!("missing {field}"),
            field,
            None,
            invalid("missing_field"),
        );
        c.field(
            &format!("null {field}"),
            field,
            Some("null"),
            invalid("null_field"),
        );
    }
    c.field(
        "numeric idempotency_key",
        "idempotency_key",
        Some("12345"),
        invalid("wrong_type"),
    );
    c.field(
        "object account_id",
        "account_id",
        Some("{\"id\":1}"),
        invalid("wrong_type"),
    );
    c.field(
        "amount as string",
        "amount_minor",
        Some("\"1999\""),
        invalid("wrong_type"),
    );
    c.field(
        "amount as bool",
        "amount_minor",
        Some("true"),
        invalid("wrong_type"),
    );
    c.field(
        "currency as number",
        "currency",
        Some("978"),
        invalid("wrong_type"),
    );
    c.field(
        "payment method as number",
        "payment_method",
        Some("4111111111111111"),
        invalid("wrong_type"),
    );
    c.field(
        "description as array",
        "description",
        Some("[\"x\"]"),
        invalid("wrong_type"),
    );
    c.keyed(
        "duplicate amount field",
        [
            with_raw("c-29", "description", None)
                .strip_suffix(b"}")
                .unwrap(),
            b",\"amount_minor\":1}",
        ]
        .concat(),
        invalid("duplicate_field"),
    );
    // Amounts.
    c.field(
        "float amount",
        "amount_minor",
        Some("19.99"),
        invalid("amount_not_integer"),
    );
    c.field(
        "exponent amount",
        "amount_minor",
        Some("1e3"),
        invalid("amount_not_integer"),
    );
    c.field(
        "integral float amount",
        "amount_minor",
        Some("1000.0"),
        invalid("amount_not_integer"),
    );
    c.field(
        "negative amount",
        "amount_minor",
        Some("-5"),
        invalid("amount_out_of_range"),
    );
    c.field(
        "zero amount",
        "amount_minor",
        Some("0"),
        invalid("amount_out_of_range"),
    );
    c.field(
        "amount over the maximum",
        "amount_minor",
        Some("1000000000001"),
        invalid("amount_out_of_range"),
    );
    c.field(
        "amount over i64",
        "amount_minor",
        Some("9223372036854775808"),
        invalid("amount_out_of_range"),
    );
    c.field(
        "amount over u64",
        "amount_minor",
        Some("100000000000000000000000"),
        invalid("amount_out_of_range"),
    );
    // Currencies.
    c.field(
        "lower-case currency",
        "currency",
        Some("\"eur\""),
        invalid("currency_not_upper_case"),
    );
    c.field(
        "unknown currency",
        "currency",
        Some("\"XYZ\""),
        invalid("unknown_currency"),
    );
    c.field(
        "two-letter currency",
        "currency",
        Some("\"EU\""),
        invalid("invalid_currency_format"),
    );
    c.field(
        "metal code",
        "currency",
        Some("\"XAU\""),
        invalid("currency_not_payable"),
    );
    // Card numbers and free text.
    c.field(
        "card number as payment method",
        "payment_method",
        Some("\"4111111111111111\""),
        invalid("card_number_as_payment_method"),
    );
    c.field(
        "card number with spaces",
        "payment_method",
        Some("\"4111 1111 1111 1111\""),
        invalid("card_number_as_payment_method"),
    );
    c.field(
        "card number with dashes",
        "payment_method",
        Some("\"5500-0000-0000-0004\""),
        invalid("card_number_as_payment_method"),
    );
    c.field(
        "amex number",
        "payment_method",
        Some("\"378282246310005\""),
        invalid("card_number_as_payment_method"),
    );
    c.field(
        "card number in account_id",
        "account_id",
        Some("\"acct 4111111111111111\""),
        invalid("card_number_in_account_id"),
    );
    c.field(
        "card number in description",
        "description",
        Some("\"paid with 4242-4242-4242-4242\""),
        invalid("card_number_in_description"),
    );
    let long_pm = serde_json::to_string(&"p".repeat(129)).unwrap();
    c.field(
        "over-long payment method",
        "payment_method",
        Some(&long_pm),
        invalid("invalid_payment_method"),
    );
    c.field(
        "empty payment method",
        "payment_method",
        Some("\"\""),
        invalid("invalid_payment_method"),
    );
    let long_account = serde_json::to_string(&"a".repeat(65)).unwrap();
    c.field(
        "over-long account_id",
        "account_id",
        Some(&long_account),
        invalid("invalid_account_id"),
    );
    c.field(
        "blank account_id",
        "account_id",
        Some("\"   \""),
        invalid("invalid_account_id"),
    );
    c.field(
        "account_id with a newline",
        "account_id",
        Some("\"a\\nb\""),
        invalid("invalid_account_id"),
    );
    let long_description = serde_json::to_string(&"d".repeat(513)).unwrap();
    c.field(
        "over-long description",
        "description",
        Some(&long_description),
        invalid("description_too_long"),
    );
    // Keys.
    c.with_key("over-long key", &"k".repeat(129));
    c.with_key("key with a space", "bad key");
    c.with_key("key with a hash tag", "{tag}");
    c.with_key("key with a glob", "key*");
    c.with_key("key with a slash", "a/b");
    c.with_key("empty key", "");
    let n = c.cases.len();
    c.raw(
        "record key differs from idempotency_key",
        Some(b"other-key".as_slice()),
        Some(with_raw(&format!("c-{n}"), "x", None)),
        invalid("kafka_key_mismatch"),
    );
    c.raw(
        "record key not utf-8",
        Some([0xff, 0x00].as_slice()),
        Some(with_raw(&format!("c-{}", n + 1), "x", None)),
        invalid("kafka_key_mismatch"),
    );
    // 1 MiB: a command whose description alone is a mebibyte.
    let big = serde_json::to_string(&"m".repeat(1 << 20)).unwrap();
    c.field(
        "1 MiB value",
        "description",
        Some(&big),
        invalid("description_too_long"),
    );
    // Valid commands with broken trace context: processed as usual.
    for (name, header) in [
        ("garbage traceparent", "garbage".as_bytes().to_vec()),
        (
            "traceparent with a forbidden version",
            b"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_vec(),
        ),
        (
            "traceparent with a zero trace id",
            b"00-00000000000000000000000000000000-b7ad6b7169203331-01".to_vec(),
        ),
        ("traceparent not utf-8", vec![0xff, 0xfe]),
    ] {
        let key = format!("c-{}", c.cases.len());
        c.cases.push(Case {
            name: name.to_owned(),
            key: Some(key.clone().into_bytes()),
            value: Some(with_raw(&key, "x", None)),
            headers: vec![
                ("traceparent", header),
                ("tracestate", b"=,=,\xff".to_vec()),
            ],
            expect: Expect::Outcome("succeeded"),
        });
    }
    // The same key again with another amount: refused, never charged.
    c.raw(
        "first use of a key",
        Some(b"reused".as_slice()),
        Some(with_raw("reused", "amount_minor", Some("100"))),
        Expect::Outcome("succeeded"),
    );
    c.raw(
        "key reused with another amount",
        Some(b"reused".as_slice()),
        Some(with_raw("reused", "amount_minor", Some("200"))),
        dead("key_reused", "idempotency_key_reused"),
    );
    c.cases
}

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
                // a card number is masked (all but its last four digits).
                assert_eq!(letter.key(), case.key.as_deref(), "case {}", case.name);
                if code.starts_with("card_number") {
                    let original = String::from_utf8(case.value.clone().unwrap()).unwrap();
                    let masked = payment_worker::payment::mask_card_numbers(&original);
                    assert_ne!(masked, original, "case {}", case.name);
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
                    assert_eq!(
                        letter.payload(),
                        case.value.as_deref(),
                        "case {}",
                        case.name
                    );
                    assert_eq!(header_text(letter, "x-payload-redacted"), None);
                }
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
