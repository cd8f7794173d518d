//! `--results exactly-once`: results, dead letters and offsets leave the worker in
//! Kafka transactions.
//!
//! What librdkafka's mock cluster (2.12.1) can show, and what it cannot: it runs the
//! transactional protocol (InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn,
//! TxnOffsetCommit, EndTxn, with error injection), but it writes no commit/abort
//! markers, reports the high watermark as the last stable offset and no aborted
//! transactions (so a `read_committed` reader sees aborted records too), stores no
//! offset sent with a transaction, and ignores the group generation a
//! TxnOffsetCommit carries. These tests therefore check the worker's side: a
//! transaction that commits carries each command's answer once, and a transaction
//! the group coordinator refuses (ILLEGAL_GENERATION, what a fenced zombie gets) is
//! aborted and its commands are answered again, as duplicates carrying the
//! original answer, without a second charge.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use payment_worker::configuration::{ResultsMode, WorkerSettings};
use payment_worker::devtools::SimulatorConfig;
use payment_worker::operator::WorkloadSpec;
use payment_worker::worker::{self, ResultRecord};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use rdkafka::{Offset, TopicPartitionList};

use crate::support::helpers::{quick_worker_settings, unique, Stack};

pub(crate) fn exactly_once_settings() -> WorkerSettings {
    WorkerSettings {
        results: ResultsMode::ExactlyOnce,
        transaction_interval: Duration::from_millis(100),
        transaction_max_records: 200,
        ..quick_worker_settings()
    }
}

/// Every record of `topic` a `read_committed` reader gets, from the start of each
/// partition up to its end (the last stable offset, for such a reader).
pub(crate) async fn read_committed(
    settings: &payment_worker::configuration::KafkaSettings,
    topic: &str,
    partitions: i32,
) -> Vec<ResultRecord> {
    let settings = settings.clone();
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut config = worker::base_config(&settings);
        config
            .set("group.id", unique("reader"))
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed");
        let consumer: BaseConsumer = config.create().unwrap();
        let mut ends = HashMap::new();
        let mut list = TopicPartitionList::new();
        for p in 0..partitions {
            let (_, high) = consumer
                .fetch_watermarks(&topic, p, Duration::from_secs(10))
                .unwrap();
            ends.insert(p, high);
            list.add_partition_offset(&topic, p, Offset::Beginning)
                .unwrap();
        }
        consumer.assign(&list).unwrap();
        drop(list);
        let mut out = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        // Transaction markers take offsets too: read until every position passed the end.
        loop {
            if let Some(Ok(message)) = consumer.poll(Duration::from_millis(100)) {
                out.push(serde_json::from_slice(message.payload().unwrap()).unwrap());
            }
            let position = consumer.position().unwrap();
            let done = position.elements().iter().all(|e| match e.offset() {
                Offset::Offset(o) => o >= ends[&e.partition()],
                _ => ends[&e.partition()] == 0,
            });
            drop(position);
            if done {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the results topic was not read to its end"
            );
        }
        drop(consumer);
        out
    })
    .await
    .unwrap()
}

/// Every position answered; at most one first answer (`succeeded`/`declined`) per
/// key; every answer of a key names its one payment, and every duplicate carries
/// the original answer as the payment row holds it (`rows`: key → status,
/// gateway transaction id). Returns the answers per position.
pub(crate) fn check_answers<'a>(
    results: &'a [ResultRecord],
    positions: usize,
    rows: &HashMap<String, (String, Option<String>)>,
) -> HashMap<(i32, i64), Vec<&'a ResultRecord>> {
    let mut by_position: HashMap<(i32, i64), Vec<&ResultRecord>> = HashMap::new();
    for r in results {
        by_position
            .entry((r.source.partition, r.source.offset))
            .or_default()
            .push(r);
    }
    assert_eq!(by_position.len(), positions, "every command answered");
    let mut first: HashSet<&str> = HashSet::new();
    let mut payment: HashMap<&str, Option<uuid::Uuid>> = HashMap::new();
    for r in results {
        let key = r.idempotency_key.as_deref().unwrap();
        let (status, transaction) = &rows[key];
        let named = payment.entry(key).or_insert(r.payment_id);
        assert_eq!(*named, r.payment_id, "one payment per key: {r:?}");
        if r.outcome == "duplicate" {
            let original = r
                .original
                .as_ref()
                .expect("a duplicate carries the original");
            assert_eq!(&original.outcome, status, "{r:?}");
            assert_eq!(Some(original.payment_id), r.payment_id, "{r:?}");
            assert_eq!(&original.gateway_transaction_id, transaction, "{r:?}");
        } else {
            assert!(
                first.insert(key),
                "{key} answered as first processing twice"
            );
            assert_eq!(&r.outcome, status, "{r:?}");
            assert_eq!(&r.gateway_transaction_id, transaction, "{r:?}");
        }
    }
    by_position
}

async fn rows(stack: &Stack) -> HashMap<String, (String, Option<String>)> {
    stack
        .payment_rows()
        .await
        .into_iter()
        .map(|(key, status, transaction)| (key, (status, transaction)))
        .collect()
}

/// Nothing fails: each command position has exactly one result, duplicates of the
/// workload carry the original answer, one charge per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_once_answers_every_command_once() {
    let stack = Stack::new(3, SimulatorConfig::default()).await;
    let spec = WorkloadSpec {
        count: 600,
        duplicate_ratio: 0.25,
        invalid_ratio: 0.0,
        decline_ratio: 0.05,
        seed: 15,
    };
    let records = payment_worker::operator::generate(&spec, &unique("eos"));
    stack.produce(&records).await;
    let worker = stack.start_worker("eos", &exactly_once_settings());
    stack
        .wait_for_results(records.len(), Duration::from_secs(120))
        .await;
    worker.stop().await.unwrap();

    let results = read_committed(&stack.settings, &stack.settings.results_topic, 3).await;
    let answers = check_answers(&results, records.len(), &rows(&stack).await);
    let repeated: Vec<_> = answers.iter().filter(|(_, a)| a.len() > 1).collect();
    assert!(repeated.is_empty(), "answered more than once: {repeated:?}");
    assert!(
        results.iter().any(|r| r.outcome == "duplicate"),
        "the workload's duplicates are answered as such"
    );
    stack.assert_books_balance().await;
    let keys: HashSet<_> = records.iter().map(|r| r.key.clone()).collect();
    assert_eq!(stack.ledger().len(), keys.len(), "one charge per key");
}

/// The group coordinator refuses the offsets of some transactions (ILLEGAL_GENERATION,
/// what a member fenced by a newer generation gets): each is aborted, the member
/// rewinds to its last committed offsets and answers those commands again. On the
/// mock cluster the aborted answers stay readable (it writes no abort markers), so
/// the repeats are visible here: every one of them is a `duplicate` carrying the
/// original answer, and nothing is charged twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_aborted_transaction_is_redone_as_duplicates_of_the_original_answers() {
    let stack = Stack::new(3, SimulatorConfig::default()).await;
    let spec = WorkloadSpec {
        count: 600,
        duplicate_ratio: 0.25,
        invalid_ratio: 0.0,
        decline_ratio: 0.05,
        seed: 16,
    };
    let records = payment_worker::operator::generate(&spec, &unique("eos-abort"));
    let worker = stack.start_worker("eos", &exactly_once_settings());
    crate::support::helpers::wait_for_stable_group(std::slice::from_ref(&worker), 3).await;
    // Armed before the first record: a transaction commits nothing until it holds
    // answers, so the first three that do are refused, whatever the machine's speed
    // (armed mid-run, a fast worker could have committed everything already).
    stack.kafka.cluster().request_errors(
        RDKafkaApiKey::TxnOffsetCommit,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_ILLEGAL_GENERATION; 3],
    );
    stack.produce(&records).await;
    stack
        .wait_for_results(records.len(), Duration::from_secs(120))
        .await;
    worker.stop().await.unwrap();

    let results = read_committed(&stack.settings, &stack.settings.results_topic, 3).await;
    let answers = check_answers(&results, records.len(), &rows(&stack).await);
    let repeats = answers.values().filter(|a| a.len() > 1).count();
    assert!(
        repeats > 0,
        "the aborted transactions' commands were redone"
    );
    for list in answers.values().filter(|a| a.len() > 1) {
        assert!(
            list[1..].iter().all(|r| r.outcome == "duplicate"),
            "a redone command is a duplicate: {list:?}"
        );
    }
    stack.assert_books_balance().await;
    let keys: HashSet<_> = records.iter().map(|r| r.key.clone()).collect();
    assert_eq!(stack.ledger().len(), keys.len(), "one charge per key");
    eprintln!(
        "exactly-once abort: {} results for {} commands, {repeats} redone",
        results.len(),
        records.len()
    );
}
