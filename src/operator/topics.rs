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

/// The offsets the group `kafka` names committed in each partition of `topic`
/// (none for a partition it never committed), read without joining the group.
pub(super) fn group_offsets(
    kafka: &KafkaSettings,
    topic: &str,
) -> anyhow::Result<std::collections::HashMap<i32, i64>> {
    let partitions = partition_count(kafka, topic)?;
    let mut config = base_config(kafka);
    config
        .set("group.id", &kafka.group_id)
        .set("enable.auto.commit", "false");
    let consumer: BaseConsumer = create_client(&config)?;
    let mut list = TopicPartitionList::new();
    for partition in 0..partitions {
        list.add_partition(topic, partition);
    }
    let committed = consumer
        .committed_offsets(list, Duration::from_secs(10))
        .with_context(|| format!("reading the committed offsets of group {}", kafka.group_id))?;
    let mut offsets = std::collections::HashMap::new();
    for entry in committed.elements() {
        // An offset an open transaction sent is not known yet: not "none".
        entry
            .error()
            .with_context(|| format!("the committed offset of {topic}/{}", entry.partition()))?;
        if let Offset::Offset(offset) = entry.offset() {
            offsets.insert(entry.partition(), offset);
        }
    }
    // A partition list librdkafka returned that outlives its consumer makes the
    // consumer's drop hang: the list goes first.
    drop(committed);
    drop(consumer);
    Ok(offsets)
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

/// The `step`-th window of `ranges`: at most `width` offsets of each range, those
/// after the first `step` windows; empty once every range is covered. Reading a
/// topic window by window keeps what is held in memory, and each read's time, to
/// one window's records however large the topic.
pub(super) fn window(ranges: &[PartitionRange], width: i64, step: i64) -> Vec<PartitionRange> {
    let width = width.max(1);
    ranges
        .iter()
        .filter_map(|range| {
            let from = range.from.saturating_add(width.saturating_mul(step));
            let to = range.to.min(from.saturating_add(width));
            (to > from).then_some(PartitionRange {
                partition: range.partition,
                from,
                to,
                available: range.to - from,
            })
        })
        .collect()
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn range(partition: i32, from: i64, to: i64) -> PartitionRange {
        PartitionRange {
            partition,
            from,
            to,
            available: to - from,
        }
    }

    #[test]
    fn windows_cover_every_range_once_in_order_and_then_end() {
        let ranges = [range(0, 5, 12), range(1, 0, 3), range(2, 7, 7)];
        let windows: Vec<Vec<PartitionRange>> = (0..)
            .map(|step| window(&ranges, 3, step))
            .take_while(|w| !w.is_empty())
            .collect();
        let spans = |w: &Vec<PartitionRange>| -> Vec<(i32, i64, i64)> {
            w.iter().map(|r| (r.partition, r.from, r.to)).collect()
        };
        assert_eq!(
            windows.iter().map(spans).collect::<Vec<_>>(),
            vec![
                vec![(0, 5, 8), (1, 0, 3)],
                vec![(0, 8, 11)],
                vec![(0, 11, 12)],
            ]
        );
        // What each partition still holds from the window's start on.
        assert_eq!(windows[1][0].available, 4);
        assert!(window(&ranges, 3, 3).is_empty());
        // A width below one still moves on.
        assert_eq!(spans(&window(&ranges, 0, 1)), vec![(0, 6, 7), (1, 1, 2)]);
    }
}
