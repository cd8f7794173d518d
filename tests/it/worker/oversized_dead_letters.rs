//! A dead letter the broker refuses as too large, in exactly-once mode, on the
//! txn-broker with a size limit on the dead-letter topic (Kafka's
//! `max.message.bytes`). The refusal leaves the open transaction abortable, so the
//! letter without its value cannot follow in it: the transaction aborts, and the
//! command's redo must start from the smaller letter, or the same refusal comes
//! back on every redo and the partition never moves on.

use std::time::Duration;

use payment_worker::operator::{RecordKind, WorkloadRecord};
use payment_worker_devtools::SimulatorConfig;
use rdkafka::message::{Headers, Message, OwnedMessage};

use crate::support::answers::assert_one_answer_per_offset;
use crate::support::helpers::{read_topic, Stack};
use crate::support::txn_broker;

use super::exactly_once::{exactly_once_settings, read_committed};

/// The dead-letter topic's limit; the refused command is larger, the others far
/// smaller.
const DEAD_LETTER_LIMIT: usize = 4_000;
const OVERSIZED: usize = 6_000;

fn header(message: &OwnedMessage, name: &str) -> Option<String> {
    message.headers().and_then(|h| {
        h.iter()
            .find(|x| x.key == name)
            .and_then(|x| x.value.map(|v| String::from_utf8_lossy(v).into_owned()))
    })
}

fn record(key: &str, value: Vec<u8>) -> WorkloadRecord {
    WorkloadRecord {
        kind: RecordKind::Valid,
        key: Some(key.as_bytes().to_vec()),
        value: Some(value),
        partition_hint: None,
    }
}

fn command(key: &str) -> Vec<u8> {
    format!(
        r#"{{"idempotency_key":"{key}","account_id":"acct_1","amount_minor":1999,"currency":"EUR","payment_method":"pm_card_visa"}}"#
    )
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_letter_the_broker_refuses_as_too_large_goes_out_without_its_value_after_the_abort()
{
    let mut stack = Stack::new(1, SimulatorConfig::default()).await;
    let (_broker, bootstrap) =
        txn_broker::start_with_dead_letter_limit(1, &stack.settings, DEAD_LETTER_LIMIT).await;
    stack.settings.brokers = bootstrap;
    // Not JSON: refused as invalid, and dead-lettered with its value, which the
    // commands topic took but the dead-letter topic does not.
    let mut oversized = b"{\"idempotency_key\":\"oversized\",\"note\":\"".to_vec();
    oversized.resize(OVERSIZED, b'x');
    let records = [
        record("before", command("before")),
        record("oversized", oversized),
        record("after", command("after")),
    ];
    stack.produce(&records).await;
    let worker = stack.start_worker("eos-oversized", &exactly_once_settings());
    stack
        .wait_for_results(records.len(), Duration::from_secs(60))
        .await;
    stack.wait_for_commits(Duration::from_secs(30)).await;
    worker.stop().await.unwrap();

    // What a `read_committed` reader gets: one answer per command.
    let results = read_committed(&stack.settings).await;
    let answered = assert_one_answer_per_offset(&results, records.len());
    assert_eq!(answered[1].outcome, "rejected", "{answered:?}");
    for answer in [answered[0], answered[2]] {
        assert!(
            answer.outcome == "succeeded" || answer.outcome == "duplicate",
            "offset {}: {}",
            answer.source.offset,
            answer.outcome
        );
    }
    let letters = read_topic(&stack.settings, &stack.settings.dlq_topic, "read_committed").await;
    assert_eq!(letters.len(), 1, "one visible dead letter");
    let letter = &letters[0];
    assert_eq!(letter.payload(), None, "the value is dropped");
    assert_eq!(letter.key(), Some(b"oversized".as_slice()));
    assert_eq!(
        header(letter, "x-payload-dropped").as_deref(),
        Some("message_too_large")
    );
    assert_eq!(
        header(letter, "x-original-size"),
        Some(OVERSIZED.to_string())
    );
    assert_eq!(header(letter, "x-error-kind").as_deref(), Some("invalid"));
    assert_eq!(header(letter, "x-source-offset").as_deref(), Some("1"));
    // The refused form was written once and aborted, not retried forever.
    let written = read_topic(
        &stack.settings,
        &stack.settings.dlq_topic,
        "read_uncommitted",
    )
    .await;
    assert!(
        written.iter().all(|l| l.payload().is_none()),
        "the broker never took the whole letter"
    );
    let mut charged: Vec<String> = stack
        .ledger()
        .into_iter()
        .map(|e| e.idempotency_key)
        .collect();
    charged.sort();
    assert_eq!(
        charged,
        ["after", "before"],
        "each valid command charged once"
    );
}
