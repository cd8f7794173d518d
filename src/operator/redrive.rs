//! `payment-worker dlq redrive`: puts dead letters back on the commands topic.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::{Offset, TopicPartitionList};

use super::topics::{partition_count, partition_ranges, read_ranges, PartitionRange};
use crate::configuration::KafkaSettings;
use crate::payment::RejectionKind;
use crate::worker::{
    base_config, create_client, producer_config, without_dead_letter_headers, CHARGE_UNKNOWN,
    ERROR_KIND, KEY_HMAC_SHA256, LEGACY_KEY_SHA256, ORIGINAL_DROPPED, PAYLOAD_DROPPED,
    PAYLOAD_REDACTED,
};

/// `payment-worker dlq redrive`: which dead letters, how many.
#[derive(Debug, clap::Args)]
pub struct RedriveArgs {
    /// The cluster, the group (its `.dlq-redrive` group keeps the progress) and the topics.
    #[command(flatten)]
    pub kafka: KafkaSettings,
    /// Only records with this `x-error-kind`. Progress is one offset per partition,
    /// so records of other kinds are passed over for good.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(RejectionKind::ALL.map(RejectionKind::as_str)))]
    pub kind: Option<String>,
    /// Redrive at most this many records.
    #[arg(long)]
    pub max: Option<usize>,
}

/// Puts dead letters back on the commands topic (original key, value and headers),
/// remembering progress in the `<group>.dlq-redrive` group: every 100 records, at
/// the end, and before a failed send ends the run, so the next run starts with the
/// record that failed. Only a run killed outright sends again what it sent since its
/// last commit (up to 100 records); the worker answers those as duplicates of the
/// first, charging nothing.
/// The topic is read [`WINDOW`] offsets per partition at a time, up to where it
/// ended when the run began: memory stays bounded however large the backlog.
/// A dead letter whose value is not the original (card numbers masked, or the value
/// dropped for size) is never sent: the masked command could pass the rules the
/// original broke and be charged as something nobody asked for.
pub async fn redrive(args: RedriveArgs) -> anyhow::Result<()> {
    // Before any connection: dead letters redriven into the dead-letter topic
    // itself would be read again by the next redrive, and a passed-through setting
    // the worker owns (`KAFKA_CONFIG_BOOTSTRAP_SERVERS`) would quietly override a
    // flag.
    args.kafka.check_topics()?;
    args.kafka.check_passthrough()?;
    let kafka = args.kafka.clone();
    let (ends, progress) = tokio::task::spawn_blocking({
        let kafka = kafka.clone();
        move || where_the_run_starts(&kafka)
    })
    .await??;
    let producer: FutureProducer = create_client(&producer_config(&kafka))?;
    let mut run = Run {
        args: &args,
        producer,
        progress,
        sent: 0,
        altered: 0,
    };
    // A window at a time, so that memory and each read stay bounded however many
    // dead letters an outage left, and `--max` bounds what is read as well.
    loop {
        let ranges = windows(&ends, &run.progress.next);
        if ranges.is_empty() || run.max_reached() {
            break;
        }
        let records = tokio::task::spawn_blocking({
            let (kafka, ranges) = (kafka.clone(), ranges.clone());
            move || read_ranges(&kafka, &kafka.dlq_topic, &ranges)
        })
        .await??;
        if run.window(&records).await?.is_break() {
            break;
        }
        // Offsets of the window that hold no record to redrive (transaction markers,
        // aborted records) are passed too.
        for range in &ranges {
            run.progress.reached(range.partition, range.to);
        }
    }
    let Run {
        progress,
        sent,
        altered,
        ..
    } = run;
    progress.finish().await?;
    print_summary(sent, altered);
    Ok(())
}

/// Where each dead-letter partition ends now (this run's work) and where the
/// `.dlq-redrive` group left off, with the consumer that commits the progress.
/// Blocking: run off the runtime.
fn where_the_run_starts(kafka: &KafkaSettings) -> anyhow::Result<(Vec<(i32, i64)>, Progress)> {
    let group = format!("{}.dlq-redrive", kafka.group_id);
    let mut config = base_config(kafka);
    config
        .set("group.id", &group)
        .set("enable.auto.commit", "false");
    let probe: BaseConsumer = create_client(&config)?;
    let partitions = partition_count(kafka, &kafka.dlq_topic)?;
    let mut list = TopicPartitionList::new();
    for p in 0..partitions {
        list.add_partition(&kafka.dlq_topic, p);
    }
    let committed = probe.committed_offsets(list, Duration::from_secs(10))?;
    let starts: HashMap<i32, i64> = committed
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect();
    drop(committed);
    // What the topic holds now is this run's work; letters that arrive
    // while it runs are left for the next run.
    let run = partition_ranges(kafka, &kafka.dlq_topic, |p, low| {
        starts.get(&p).copied().unwrap_or(low)
    })?;
    let ends: Vec<(i32, i64)> = run.iter().map(|r| (r.partition, r.to)).collect();
    let progress = Progress {
        next: run.iter().map(|r| (r.partition, r.from)).collect(),
        uncommitted: 0,
        topic: kafka.dlq_topic.clone(),
        committer: Arc::new(probe),
    };
    Ok((ends, progress))
}

/// What the run has done so far, and what it sends with.
struct Run<'a> {
    args: &'a RedriveArgs,
    producer: FutureProducer,
    progress: Progress,
    sent: usize,
    altered: usize,
}

impl Run<'_> {
    /// `--max` records were sent.
    fn max_reached(&self) -> bool {
        self.args.max.is_some_and(|m| self.sent >= m)
    }

    /// Redrives (or passes over) the records of one window in order, committing
    /// every [`COMMIT_EVERY`]; breaks once `--max` records were sent.
    async fn window(
        &mut self,
        records: &[rdkafka::message::OwnedMessage],
    ) -> anyhow::Result<ControlFlow<()>> {
        for record in records {
            if self.max_reached() {
                return Ok(ControlFlow::Break(()));
            }
            let kind = record
                .headers()
                .and_then(|h| crate::kafka_headers::last_value(h, ERROR_KIND))
                .and_then(|v| String::from_utf8(v.to_vec()).ok());
            let passed_over = self
                .args
                .kind
                .as_ref()
                .is_some_and(|k| Some(k) != kind.as_ref());
            if !passed_over && is_altered(record) {
                self.altered += 1;
            } else if !passed_over {
                self.send(record).await?;
                self.sent += 1;
            }
            self.progress.passed(record.partition(), record.offset());
            if self.progress.uncommitted >= COMMIT_EVERY {
                self.progress.commit().await?;
            }
        }
        Ok(ControlFlow::Continue(()))
    }

    /// Sends `record` back to the commands topic; on failure records the progress
    /// before it and says so in the error.
    async fn send(&mut self, record: &rdkafka::message::OwnedMessage) -> anyhow::Result<()> {
        let mut out: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(&self.args.kafka.commands_topic);
        if let Some(key) = record.key() {
            out = out.key(key);
        }
        if let Some(value) = record.payload() {
            out = out.payload(value);
        }
        let headers: Option<OwnedHeaders> = redriven_headers(record);
        if let Some(headers) = headers {
            out = out.headers(headers);
        }
        let delivered = self
            .producer
            .send(out, Timeout::After(Duration::from_secs(30)))
            .await
            .map_err(|(e, _)| e);
        let Err(error) = delivered else {
            return Ok(());
        };
        // What was sent stays sent: record it, so that the next run starts
        // with the record that failed and sends nothing twice.
        let sent = self.sent;
        let position = format!(
            "producing a redriven record (partition {}, offset {})",
            record.partition(),
            record.offset()
        );
        let context = match self.progress.commit().await {
            Ok(()) => format!(
                "{position}; the {sent} sent before it are recorded, run the redrive \
                 again to go on"
            ),
            Err(commit) => format!(
                "{position}; recording the {sent} sent before it failed too \
                 ({commit:#}), so the next run sends them again"
            ),
        };
        Err(anyhow::Error::new(error).context(context))
    }
}

/// What the run did, for the operator.
fn print_summary(sent: usize, altered: usize) {
    println!("redrove {sent} records");
    if altered > 0 {
        println!(
            "passed over {altered} dead letters whose value is not the original (masked or dropped); \
             their commands must be sent again by whoever sent them"
        );
    }
}

/// Records redriven (or passed over) between two progress commits: what a crash
/// may send twice.
const COMMIT_EVERY: usize = 100;

/// Offsets of each dead-letter partition read at a time: what a run holds in memory.
const WINDOW: i64 = 1000;

/// The next window of each partition that has not reached its end: at most
/// [`WINDOW`] offsets from where the redrive stands.
fn windows(ends: &[(i32, i64)], next: &HashMap<i32, i64>) -> Vec<PartitionRange> {
    ends.iter()
        .map(|&(partition, high)| {
            let from = next.get(&partition).copied().unwrap_or(high);
            PartitionRange {
                partition,
                from,
                to: high.min(from.saturating_add(WINDOW)),
                available: high - from,
            }
        })
        .filter(|range| range.to > range.from)
        .collect()
}

/// Where the redrive stands in each dead-letter partition, and the consumer of the
/// `.dlq-redrive` group that commits it.
struct Progress {
    next: HashMap<i32, i64>,
    uncommitted: usize,
    topic: String,
    committer: Arc<BaseConsumer>,
}

impl Progress {
    /// The record at `offset` is done with: redriven, or passed over for good.
    fn passed(&mut self, partition: i32, offset: i64) {
        self.next.insert(partition, offset + 1);
        self.uncommitted += 1;
    }

    /// Everything before `next` in `partition` is done with.
    fn reached(&mut self, partition: i32, next: i64) {
        let at = self.next.entry(partition).or_insert(next);
        *at = (*at).max(next);
    }

    /// Commits where each partition stands (synchronously, off the runtime).
    async fn commit(&mut self) -> anyhow::Result<()> {
        let mut list = TopicPartitionList::new();
        for (partition, next) in &self.next {
            list.add_partition_offset(&self.topic, *partition, Offset::Offset(*next))?;
        }
        let committer = Arc::clone(&self.committer);
        tokio::task::spawn_blocking(move || {
            if list.count() == 0 {
                return Ok(());
            }
            committer.commit(&list, CommitMode::Sync)
        })
        .await?
        .context("committing redrive progress")?;
        self.uncommitted = 0;
        Ok(())
    }

    /// The last commit. The consumer is dropped off the runtime too: closing it blocks.
    async fn finish(mut self) -> anyhow::Result<()> {
        self.commit().await?;
        let committer = self.committer;
        tokio::task::spawn_blocking(move || drop(committer)).await?;
        Ok(())
    }
}

/// The original headers, without the worker's dead-letter headers, except the flag
/// that a charge may exist: a redriven command still carries it, so whoever reads
/// the commands topic sees that this one is being settled, not charged afresh (the
/// worker itself looks the charge up because `unresolved_charges` holds the key).
fn redriven_headers(record: &rdkafka::message::OwnedMessage) -> Option<OwnedHeaders> {
    let flagged = record.headers().is_some_and(|headers| {
        crate::kafka_headers::any_value_is(headers, CHARGE_UNKNOWN, b"true")
    });
    let kept = without_dead_letter_headers(record);
    if !flagged {
        return kept;
    }
    Some(crate::kafka_headers::append_raw(
        kept.unwrap_or_default(),
        CHARGE_UNKNOWN.as_bytes(),
        Some(b"true"),
    ))
}

/// The dead letter carries a masked or dropped value instead of the original, or a
/// masked key (`x-key-hmac-sha256`, or `x-key-sha256` from an earlier version: its
/// key held a card number, and without it the value's own key would decide).
fn is_altered(record: &rdkafka::message::OwnedMessage) -> bool {
    record.headers().is_some_and(|headers| {
        [
            PAYLOAD_REDACTED,
            PAYLOAD_DROPPED,
            ORIGINAL_DROPPED,
            KEY_HMAC_SHA256,
            LEGACY_KEY_SHA256,
        ]
        .iter()
        .any(|name| crate::kafka_headers::last_value(headers, name).is_some())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dead_letter(headers: &[(&str, &str)]) -> rdkafka::message::OwnedMessage {
        let headers = headers
            .iter()
            .fold(OwnedHeaders::new(), |all, (name, value)| {
                crate::kafka_headers::append_raw(all, name.as_bytes(), Some(value.as_bytes()))
            });
        rdkafka::message::OwnedMessage::new(
            Some(b"{}".to_vec()),
            Some(b"k".to_vec()),
            "payments.dlq".into(),
            rdkafka::message::Timestamp::now(),
            0,
            0,
            Some(headers),
        )
    }

    fn names_and_values(headers: &OwnedHeaders) -> Vec<(String, String)> {
        crate::kafka_headers::raw(headers)
            .iter()
            .map(|h| {
                (
                    String::from_utf8_lossy(h.name).into_owned(),
                    String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn a_redrive_keeps_the_charge_unknown_flag_and_drops_the_other_dead_letter_headers() {
        let flagged = dead_letter(&[
            ("traceparent", "00-1-2-01"),
            (ERROR_KIND, "retries_exhausted"),
            (CHARGE_UNKNOWN, "true"),
        ]);
        let kept = redriven_headers(&flagged).expect("headers");
        assert_eq!(
            names_and_values(&kept),
            vec![
                ("traceparent".to_owned(), "00-1-2-01".to_owned()),
                (CHARGE_UNKNOWN.to_owned(), "true".to_owned())
            ]
        );
        let plain = dead_letter(&[
            ("traceparent", "00-1-2-01"),
            (ERROR_KIND, "invalid"),
            (LEGACY_KEY_SHA256, "9bbef194"),
        ]);
        let kept = redriven_headers(&plain).expect("headers");
        assert_eq!(
            names_and_values(&kept),
            vec![("traceparent".to_owned(), "00-1-2-01".to_owned())]
        );
    }

    #[test]
    fn a_window_holds_at_most_a_thousand_offsets_and_ends_where_the_run_began() {
        let ends = [(0, 2_500), (1, 40), (2, 7)];
        let next = HashMap::from([(0, 0), (1, 40), (2, 3)]);
        let ranges = windows(&ends, &next);
        assert_eq!(
            ranges
                .iter()
                .map(|r| (r.partition, r.from, r.to))
                .collect::<Vec<_>>(),
            vec![(0, 0, 1_000), (2, 3, 7)],
            "partition 1 is done"
        );
        let next = HashMap::from([(0, 2_000), (1, 40), (2, 7)]);
        assert_eq!(
            windows(&ends, &next)
                .iter()
                .map(|r| (r.partition, r.from, r.to))
                .collect::<Vec<_>>(),
            vec![(0, 2_000, 2_500)]
        );
        let done = HashMap::from([(0, 2_500), (1, 40), (2, 7)]);
        assert!(windows(&ends, &done).is_empty());
    }
}
