//! Reading the payment topics outside any consumer group: partition counts,
//! watermarks, and ranges of records (for `replay --dry-run` and `dlq redrive`).

use std::time::{Duration, Instant};

use anyhow::Context;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use uuid::Uuid;

use crate::configuration::KafkaSettings;
use crate::worker::{base_config, create_client};

/// How many partitions `topic` has; an error when it has none (or does not exist).
pub fn partition_count(settings: &KafkaSettings, topic: &str) -> anyhow::Result<i32> {
    let consumer: BaseConsumer = create_client(&base_config(settings))?;
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .with_context(|| format!("fetching metadata of {topic}"))?;
    let count = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .map_or(0, |t| t.partitions().len() as i32);
    drop(metadata);
    anyhow::ensure!(
        count > 0,
        "topic {topic} has no partitions (does it exist?)"
    );
    Ok(count)
}

/// Where to read one partition: `[from, to)`; `available` is what the partition
/// holds from `from` on (more than `to - from` when a limit cut the range short).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionRange {
    /// The partition.
    pub partition: i32,
    /// First offset to read.
    pub from: i64,
    /// Offset to stop before.
    pub to: i64,
    /// Records the partition holds from `from` on.
    pub available: i64,
}

/// Every partition of `topic`, from `start(partition, low watermark)` (kept within
/// the watermarks) up to its high watermark as it is now.
pub fn partition_ranges(
    kafka: &KafkaSettings,
    topic: &str,
    start: impl Fn(i32, i64) -> i64,
) -> anyhow::Result<Vec<PartitionRange>> {
    let partitions = partition_count(kafka, topic)?;
    let probe: BaseConsumer = create_client(&base_config(kafka))?;
    let mut ranges = Vec::with_capacity(partitions as usize);
    for partition in 0..partitions {
        let (low, high) = probe.fetch_watermarks(topic, partition, Duration::from_secs(10))?;
        let from = start(partition, low).clamp(low, high);
        ranges.push(PartitionRange {
            partition,
            from,
            to: high,
            available: high - from,
        });
    }
    Ok(ranges)
}

/// Reads every partition of `topic` from `start(partition, low watermark)` up to
/// the high watermark, without a consumer group.
pub fn read_partitions(
    kafka: &KafkaSettings,
    topic: &str,
    start: impl Fn(i32, i64) -> i64,
) -> anyhow::Result<Vec<rdkafka::message::OwnedMessage>> {
    read_ranges(kafka, topic, &partition_ranges(kafka, topic, start)?)
}

/// How long a read of ranges may take before it fails.
const READ_DEADLINE: Duration = Duration::from_secs(60);

/// Whether the consumer's position in every partition of `ends` is at its end.
fn reached(
    consumer: &BaseConsumer,
    ends: &std::collections::HashMap<i32, i64>,
) -> anyhow::Result<bool> {
    let positions = consumer.position()?;
    let reached = positions.elements().iter().all(|e| match e.offset() {
        Offset::Offset(position) => position >= ends.get(&e.partition()).copied().unwrap_or(0),
        _ => false,
    });
    Ok(reached)
}

/// Reads `[from, to)` of each partition of `topic`, without a consumer group; an
/// error when the ends are not reached within a minute.
pub fn read_ranges(
    kafka: &KafkaSettings,
    topic: &str,
    ranges: &[PartitionRange],
) -> anyhow::Result<Vec<rdkafka::message::OwnedMessage>> {
    let mut config = base_config(kafka);
    config
        .set(
            "group.id",
            format!("payment-worker-reader-{}", Uuid::new_v4().simple()),
        )
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        // A start that retention removed meanwhile reads on from the earliest
        // record (librdkafka's default would jump to the end and never get there).
        .set("auto.offset.reset", "earliest");
    let consumer: BaseConsumer = create_client(&config)?;
    let mut list = TopicPartitionList::new();
    let mut ends = std::collections::HashMap::new();
    for range in ranges.iter().filter(|r| r.to > r.from) {
        list.add_partition_offset(topic, range.partition, Offset::Offset(range.from))?;
        ends.insert(range.partition, range.to);
    }
    if ends.is_empty() {
        drop(list);
        drop(consumer);
        return Ok(Vec::new());
    }
    consumer.assign(&list)?;
    drop(list);
    let mut out = Vec::new();
    // A fetch retried after an error may deliver a record again: count positions.
    let mut seen = std::collections::HashSet::new();
    let deadline = Instant::now() + READ_DEADLINE;
    // Done when every partition's position reached its end, not after as many
    // records as the ranges span: transaction markers and aborted records take
    // offsets that a `read_committed` reader never gets as records.
    while !reached(&consumer, &ends)? {
        if Instant::now() >= deadline {
            anyhow::bail!(
                "reading {topic}: {} records in {READ_DEADLINE:?}, and the partitions' ends \
                 {ends:?} not reached (is a transaction holding them open?)",
                out.len()
            );
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(message)) => {
                let position = (message.partition(), message.offset());
                if position.1 < ends.get(&position.0).copied().unwrap_or(0) && seen.insert(position)
                {
                    out.push(message.detach());
                }
            }
            Some(Err(error)) => tracing::warn!(%error, "reading {topic}"),
            None => {}
        }
    }
    drop(consumer);
    Ok(out)
}
