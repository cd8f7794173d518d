//! The broker's half of zombie fencing (KIP-447), on the txn-broker, which carries
//! out transactions: a commit whose offsets carry a group generation that has moved
//! on is refused, the transaction aborts, and its records never reach a
//! `read_committed` reader.
//!
//! A worker process checks its own staleness before it commits (a poll loop that
//! stood still past the session timeout aborts), so the process-level zombie test
//! (`chaos::exactly_once`) is stopped by that check first. This test hands the
//! worker's `Transactions` the metadata a zombie would hold, to show that the
//! broker refuses what a zombie frozen right before its commit would send.

use std::time::{Duration, Instant};

use payment_worker::configuration::KafkaSettings;
use payment_worker::payment::SourcePosition;
use payment_worker::worker::{self, Transactions};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::OwnedMessage;
use rdkafka::producer::FutureRecord;

use crate::support::helpers::{committed_offsets, read_topic, unique};
use crate::support::txn_broker;

use super::exactly_once::{commit, start_transactions};

fn member(settings: &KafkaSettings) -> BaseConsumer {
    let mut config = worker::consumer_config(settings);
    config.set("group.id", &settings.group_id);
    let consumer: BaseConsumer = config.create().unwrap();
    consumer.subscribe(&[&settings.commands_topic]).unwrap();
    consumer
}

/// Polls every member until each holds `each` partitions.
fn poll_until_assigned(members: &[&BaseConsumer], each: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for member in members {
            member.poll(Duration::from_millis(50));
        }
        if members
            .iter()
            .all(|m| m.assignment().unwrap().count() == each)
        {
            return;
        }
        assert!(Instant::now() < deadline, "the group never settled");
    }
}

async fn read(settings: &KafkaSettings, isolation: &str) -> Vec<OwnedMessage> {
    read_topic(settings, &settings.results_topic, isolation).await
}

/// The high watermark and the last stable offset of results partition 0.
async fn ends(settings: &KafkaSettings) -> (i64, i64) {
    let settings = settings.clone();
    tokio::task::spawn_blocking(move || {
        let end = |isolation: &str| {
            let mut config = worker::base_config(&settings);
            config.set("isolation.level", isolation);
            let consumer: BaseConsumer = config.create().unwrap();
            let (_, high) = consumer
                .fetch_watermarks(&settings.results_topic, 0, Duration::from_secs(10))
                .unwrap();
            high
        };
        (end("read_uncommitted"), end("read_committed"))
    })
    .await
    .unwrap()
}

/// One answer produced in the open transaction for the command at `offset` of
/// partition 0, settled; then a commit with `group`.
async fn answer_and_commit(
    transactions: &std::sync::Arc<Transactions>,
    settings: &KafkaSettings,
    offset: i64,
    group: rdkafka::consumer::ConsumerGroupMetadata,
) -> Result<u64, String> {
    let at = SourcePosition {
        topic: settings.commands_topic.clone(),
        partition: 0,
        offset,
    };
    let guard = transactions.enter(&at).await;
    let payload = format!("answer to offset {offset}");
    transactions
        .producer()
        .send(
            FutureRecord::to(&settings.results_topic)
                .partition(0)
                .key("key")
                .payload(&payload),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(error, _)| error)
        .unwrap();
    transactions.settle(&settings.commands_topic, 0, offset + 1);
    guard.settled();
    commit(transactions, Some(group))
        .await
        .map(|(answers, _)| answers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_with_a_stale_group_generation_is_refused_and_its_answer_never_visible() {
    let names = KafkaSettings::local(String::new(), String::new());
    let (_broker, bootstrap) = txn_broker::start(2, &names).await;
    let settings = KafkaSettings::local(bootstrap, unique("group"));
    let transactions = start_transactions(&settings).await;

    // The zombie-to-be joins alone and keeps the metadata of that generation.
    let zombie = member(&settings);
    poll_until_assigned(&[&zombie], 2);
    let stale = zombie.group_metadata().unwrap();
    // A second member joins: the group moves to the next generation.
    let successor = member(&settings);
    poll_until_assigned(&[&zombie, &successor], 1);

    let refused = answer_and_commit(&transactions, &settings, 0, stale).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|reason| reason.contains("generation")),
        "the broker took a commit of a past generation: {refused:?}"
    );
    assert!(
        read(&settings, "read_committed").await.is_empty(),
        "the refused transaction's answer became visible"
    );
    assert_eq!(
        read(&settings, "read_uncommitted").await.len(),
        1,
        "the answer was written, then aborted"
    );
    // Aborted, not left open: a `read_committed` reader's end (the last stable
    // offset) is past the answer and its abort marker.
    assert_eq!(
        ends(&settings).await,
        (2, 2),
        "(high watermark, last stable offset) of the results partition"
    );
    let committed = committed_offsets(&settings, 2).await;
    assert_eq!(
        committed.get(&0),
        Some(&-1),
        "no offset committed: {committed:?}"
    );

    // With the current generation's metadata the same answer commits.
    let current = zombie.group_metadata().unwrap();
    let accepted = answer_and_commit(&transactions, &settings, 0, current).await;
    assert_eq!(accepted, Ok(1));
    let visible = read(&settings, "read_committed").await;
    assert_eq!(visible.len(), 1, "the committed answer, and only it");
    let committed = committed_offsets(&settings, 2).await;
    assert_eq!(committed.get(&0), Some(&1), "{committed:?}");
    drop((zombie, successor));
}
