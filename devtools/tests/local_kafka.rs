//! The local Kafka (librdkafka's mock cluster, as `dev-kafka`, the demo and the bench
//! run it) finds a fetch offset without walking its whole partition log, and takes
//! a member's offset commit while another member is joining, as Kafka does: the two
//! changes `native/` links into the mock (`build.rs`).
#![cfg(target_os = "linux")]

use std::time::{Duration, Instant};

use payment_worker_devtools::LocalKafka;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

/// A name no other run of this test uses (the mock cluster lives in this process,
/// but a group or topic name says which test made it).
fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

extern "C" {
    /// Batches the mock's offset look-up has looked at in this process so far
    /// (`native/mock_msgset_find.c`).
    fn payment_worker_mock_batches_walked() -> u64;
}

fn batches_walked() -> u64 {
    // SAFETY: reads an atomic counter; no arguments, no shared state handed over.
    unsafe { payment_worker_mock_batches_walked() }
}

/// Batches on the partition before the rounds: a walk from the oldest batch looks at
/// all of them on every fetch of a consumer that keeps up.
const LOG_BATCHES: i64 = 3_000;
const ROUNDS: u64 = 20;

fn one_record_per_batch(bootstrap: &str) -> BaseProducer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "0")
        .set("batch.num.messages", "1")
        .create()
        .unwrap()
}

fn produce(producer: &BaseProducer, topic: &str, n: i64) {
    let payload = n.to_string();
    producer
        .send(BaseRecord::<str, str>::to(topic).payload(&payload))
        .unwrap();
}

/// Polls until one record arrives; returns its offset and payload.
fn next_record(consumer: &BaseConsumer) -> (i64, String) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Some(message) = consumer.poll(Duration::from_millis(100)) {
            let message = message.unwrap();
            let payload = String::from_utf8(message.payload().unwrap().to_vec()).unwrap();
            return (message.offset(), payload);
        }
    }
    panic!("no record within 20 s");
}

fn consumer_at(bootstrap: &str, topic: &str, offset: i64) -> BaseConsumer {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", unique("mock-lookup"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "error")
        .set("fetch.wait.max.ms", "5")
        .create()
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, 0, Offset::Offset(offset))
        .unwrap();
    consumer.assign(&assignment).unwrap();
    consumer
}

#[test]
fn a_consumer_that_keeps_up_costs_the_mock_a_few_batches_per_fetch_however_long_the_log() {
    let kafka = LocalKafka::start(1).unwrap();
    let bootstrap = kafka.bootstrap_servers();
    let topic = unique("mock-lookup");
    kafka.create_topic(&topic, 1).unwrap();
    let producer = one_record_per_batch(&bootstrap);
    // One record per batch (`batch.num.messages`), each batch its own produce
    // request: the log is LOG_BATCHES batches long.
    for n in 0..LOG_BATCHES {
        produce(&producer, &topic, n);
    }
    producer.flush(Duration::from_secs(30)).unwrap();

    // The same records, wherever a fetch starts: near the oldest batch, in the
    // middle, near the newest.
    for start in [3, LOG_BATCHES / 2, LOG_BATCHES - 3] {
        let consumer = consumer_at(&bootstrap, &topic, start);
        for expected in start..start + 3 {
            assert_eq!(next_record(&consumer), (expected, expected.to_string()));
        }
    }

    // A consumer at the end of the log, answered one new record at a time.
    let consumer = consumer_at(&bootstrap, &topic, LOG_BATCHES);
    let before = batches_walked();
    for round in 0..ROUNDS as i64 {
        let n = LOG_BATCHES + round;
        produce(&producer, &topic, n);
        producer.flush(Duration::from_secs(10)).unwrap();
        assert_eq!(next_record(&consumer), (n, n.to_string()));
    }
    let walked = batches_walked() - before;

    // At least one batch per answered fetch: the look-up linked in is the one
    // counted. Walking from the oldest batch would look at LOG_BATCHES per fetch;
    // other tests' fetches meanwhile add a few batches each.
    assert!(
        walked >= ROUNDS,
        "walked {walked}: the counted look-up is not linked in"
    );
    assert!(
        walked < ROUNDS * LOG_BATCHES as u64 / 2,
        "{ROUNDS} fetches at the end of a {LOG_BATCHES}-batch log walked {walked} batches"
    );
}

fn member_of(bootstrap: &str, group: &str, topic: &str) -> BaseConsumer {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("session.timeout.ms", "6000")
        .set("partition.assignment.strategy", "cooperative-sticky")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    consumer
}

/// Polls `consumer` for `period` (serving its group's callbacks).
fn serve(consumer: &BaseConsumer, period: Duration) {
    let until = Instant::now() + period;
    while Instant::now() < until {
        let _ = consumer.poll(Duration::from_millis(20));
    }
}

/// Kafka's group coordinator refuses an offset commit only between the JoinGroup
/// and the SyncGroup answers; while a rebalance is being prepared (a newcomer has
/// joined, the others have yet to), a member of the current generation commits. A
/// member draining the partitions it gives up relies on it. The mock refuses it in
/// that state unless `native/mock_offset_commit.c` is linked in.
#[test]
fn a_member_commits_while_a_newcomer_joins_the_group() {
    let kafka = LocalKafka::start(1).unwrap();
    let bootstrap = kafka.bootstrap_servers();
    let topic = unique("mock-commit");
    kafka.create_topic(&topic, 2).unwrap();
    let group = unique("mock-commit");

    let first = member_of(&bootstrap, &group, &topic);
    let deadline = Instant::now() + Duration::from_secs(20);
    while first.assignment().unwrap().count() < 2 {
        assert!(
            Instant::now() < deadline,
            "the first member got no assignment"
        );
        serve(&first, Duration::from_millis(100));
    }

    // The newcomer's JoinGroup starts a rebalance that waits up to the session
    // timeout for the first member to join again; the first member does not poll
    // meanwhile, so the group stays there.
    let newcomer = member_of(&bootstrap, &group, &topic);
    serve(&newcomer, Duration::from_millis(1_500));

    let mut offsets = TopicPartitionList::new();
    offsets
        .add_partition_offset(&topic, 0, Offset::Offset(42))
        .unwrap();
    first
        .commit(&offsets, rdkafka::consumer::CommitMode::Sync)
        .expect("a commit while the group prepares a rebalance");

    let mut query = TopicPartitionList::new();
    query.add_partition(&topic, 0);
    let committed = first
        .committed_offsets(query, Duration::from_secs(10))
        .unwrap();
    assert_eq!(
        committed.elements()[0].offset(),
        Offset::Offset(42),
        "the group holds the commit"
    );
    drop(newcomer);
}
