//! Answers the broker refuses, in exactly-once mode, on the txn-broker. A refused
//! record leaves the open transaction abortable, so it is aborted and its commands
//! are answered again: the redo must not send the same refused record (an abort
//! loop while the worker looks healthy). A result too large for its topic goes out
//! without its key, as a dead letter too large goes out smaller; any other refusal
//! no retry can fix ends the worker with exit code 4.

use std::time::Duration;

use nix::sys::signal::Signal;
use payment_worker::operator::{RecordKind, WorkloadRecord};
use payment_worker_devtools::SimulatorConfig;
use rdkafka::message::{Headers, Message, OwnedMessage};

use crate::support::answers::assert_one_answer_per_offset;
use crate::support::helpers::{read_topic, result_records, Stack};
use crate::support::txn_broker;

use super::exactly_once::{exactly_once_settings, read_committed};

/// The results topic's limit; a result with the long key is larger.
const RESULTS_LIMIT: usize = 4_000;
const LONG_KEY: usize = 5_000;

fn record(key: Vec<u8>, value: Vec<u8>) -> WorkloadRecord {
    WorkloadRecord {
        kind: RecordKind::Valid,
        key: Some(key),
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

fn header(message: &OwnedMessage, name: &str) -> Option<String> {
    message.headers().and_then(|h| {
        h.iter()
            .find(|x| x.key == name)
            .and_then(|x| x.value.map(|v| String::from_utf8_lossy(v).into_owned()))
    })
}

fn charged(stack: &Stack) -> Vec<String> {
    let mut keys: Vec<String> = stack
        .ledger()
        .into_iter()
        .map(|e| e.idempotency_key)
        .collect();
    keys.sort();
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_result_the_broker_refuses_as_too_large_goes_out_unkeyed_after_the_abort() {
    let mut stack = Stack::new(1, SimulatorConfig::default()).await;
    let (_broker, bootstrap) =
        txn_broker::start_with_results_limit(1, &stack.settings, RESULTS_LIMIT).await;
    stack.settings.brokers = bootstrap;
    // A key of 5,000 bytes: no idempotency key (refused as invalid), and echoed on
    // its result, which the results topic does not take. Its dead letter fits.
    let long_key = vec![b'k'; LONG_KEY];
    let records = [
        record(b"before".to_vec(), command("before")),
        record(long_key.clone(), command("long")),
        record(b"after".to_vec(), command("after")),
    ];
    stack.produce(&records).await;
    let worker = stack.start_worker("eos-long-key", &exactly_once_settings());
    // Within the time a healthy worker needs; an abort loop never gets there.
    stack
        .wait_for_results(records.len(), Duration::from_secs(60))
        .await;
    stack.wait_for_commits(Duration::from_secs(30)).await;
    worker.stop().await.unwrap();

    // What a `read_committed` reader gets: one answer per command.
    let committed = read_topic(
        &stack.settings,
        &stack.settings.results_topic,
        "read_committed",
    )
    .await;
    let results = result_records(&committed);
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
    let result_at = |offset: i64| {
        committed
            .iter()
            .find(|m| result_records(std::slice::from_ref(*m))[0].source.offset == offset)
            .unwrap()
    };
    let long = result_at(1);
    assert_eq!(long.key(), None, "the result went out without its key");
    // Only that one: the others keep their keys.
    for (offset, key) in [(0, "before"), (2, "after")] {
        assert_eq!(
            result_at(offset).key(),
            Some(key.as_bytes()),
            "offset {offset}"
        );
    }
    // The keyed hash (`x-key-hmac-sha256`, once an unsalted `x-key-sha256`): this
    // in-process worker has no KEY_HASH_SECRET_FILE, so it keys with the process's
    // random secret, which this test shares.
    assert_eq!(
        header(long, "x-key-hmac-sha256"),
        Some(payment_worker::redaction::KeyHasher::for_this_process().hex(&long_key)),
        "its key's hash correlates it"
    );
    assert_eq!(header(long, "x-key-sha256"), None, "no unkeyed hash");
    assert_eq!(read_committed(&stack.settings).await.len(), 3);
    // The dead letter, which fits, carries the key as it came.
    let letters = read_topic(&stack.settings, &stack.settings.dlq_topic, "read_committed").await;
    assert_eq!(letters.len(), 1, "one visible dead letter");
    assert_eq!(letters[0].key(), Some(long_key.as_slice()));
    assert_eq!(header(&letters[0], "x-source-offset").as_deref(), Some("1"));
    // The refused, keyed result was written and aborted, never committed.
    let written = read_topic(
        &stack.settings,
        &stack.settings.results_topic,
        "read_uncommitted",
    )
    .await;
    assert!(
        written
            .iter()
            .all(|m| m.key().is_none_or(|k| k.len() < LONG_KEY)),
        "the broker never took the keyed result"
    );
    assert_eq!(
        charged(&stack),
        ["after", "before"],
        "each valid command charged once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_produce_refused_for_good_ends_the_worker_with_exit_code_4_and_loses_nothing() {
    let mut stack = Stack::new(1, SimulatorConfig::default()).await;
    let (mut broker, bootstrap) = txn_broker::start(1, &stack.settings).await;
    stack.settings.brokers = bootstrap;
    let records = [
        record(b"first".to_vec(), command("first")),
        record(b"second".to_vec(), command("second")),
    ];
    stack.produce(&records).await;
    // The worker's first answer is refused with INVALID_RECORD.
    broker.signal(Signal::SIGUSR2);
    broker
        .wait_for(Duration::from_secs(10), |line| {
            line.contains("txn-broker produce refusal armed")
                .then_some(())
        })
        .await;
    let worker = stack.start_worker("eos-refused", &exactly_once_settings());
    let failure = tokio::time::timeout(Duration::from_secs(60), worker.failed())
        .await
        .expect(
            "a produce refused for good ends the worker instead of aborting and redoing forever",
        );
    assert_eq!(failure.exit_code(), 4, "{failure}");
    let text = failure.to_string();
    assert!(
        text.contains("InvalidRecord") || text.contains("Invalid record"),
        "the reason names the refusal: {text}"
    );
    let _ = worker.stop().await;
    // Nothing was answered or committed: the commands wait for the next member.
    assert!(read_committed(&stack.settings).await.is_empty());
    assert!(
        stack.committed().await.values().all(|offset| *offset <= 0),
        "{:?}",
        stack.committed().await
    );
    // The next member answers both, once each.
    let next = stack.start_worker("eos-next", &exactly_once_settings());
    stack
        .wait_for_results(records.len(), Duration::from_secs(60))
        .await;
    stack.wait_for_commits(Duration::from_secs(30)).await;
    next.stop().await.unwrap();
    // A `read_committed` reader stops at the refused member's transaction until the
    // broker aborts it (its timeout): wait for the answers behind it.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let answered = loop {
        let answered = read_committed(&stack.settings).await;
        if answered.len() >= 2 || std::time::Instant::now() > deadline {
            break answered;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_one_answer_per_offset(&answered, records.len());
    assert_eq!(charged(&stack), ["first", "second"], "each charged once");
}
