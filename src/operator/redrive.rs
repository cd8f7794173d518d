//! `payment-worker dlq redrive`: puts dead letters back on the commands topic.

use std::time::Duration;

use anyhow::Context;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::{Offset, TopicPartitionList};

use super::topics::{partition_count, read_partitions};
use crate::configuration::KafkaSettings;
use crate::payment::RejectionKind;
use crate::worker::{
    base_config, producer_config, without_dead_letter_headers, ERROR_KIND, ORIGINAL_DROPPED,
    PAYLOAD_DROPPED, PAYLOAD_REDACTED,
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
/// remembering progress in the `<group>.dlq-redrive` group so none is sent twice.
/// A dead letter whose value is not the original (card numbers masked, or the value
/// dropped for size) is never sent: the masked command could pass the rules the
/// original broke and be charged as something nobody asked for.
pub async fn redrive(args: RedriveArgs) -> anyhow::Result<()> {
    let kafka = args.kafka.clone();
    let group = format!("{}.dlq-redrive", kafka.group_id);
    let (records, next) = tokio::task::spawn_blocking({
        let kafka = kafka.clone();
        let group = group.clone();
        move || -> anyhow::Result<_> {
            let mut config = base_config(&kafka);
            config
                .set("group.id", &group)
                .set("enable.auto.commit", "false");
            let probe: BaseConsumer = config.create()?;
            let partitions = partition_count(&kafka, &kafka.dlq_topic)?;
            let mut list = TopicPartitionList::new();
            for p in 0..partitions {
                list.add_partition(&kafka.dlq_topic, p);
            }
            let committed = probe.committed_offsets(list, Duration::from_secs(10))?;
            let starts: std::collections::HashMap<i32, i64> = committed
                .elements()
                .iter()
                .filter_map(|e| match e.offset() {
                    Offset::Offset(o) => Some((e.partition(), o)),
                    _ => None,
                })
                .collect();
            drop(committed);
            drop(probe);
            let records = read_partitions(&kafka, &kafka.dlq_topic, |p, low| {
                starts.get(&p).copied().unwrap_or(low)
            })?;
            Ok((records, starts))
        }
    })
    .await??;
    let producer: FutureProducer = producer_config(&kafka).create()?;
    let mut sent = 0usize;
    let mut altered = 0usize;
    let mut progress: std::collections::HashMap<i32, i64> = next;
    for record in &records {
        if args.max.is_some_and(|m| sent >= m) {
            break;
        }
        let kind = record
            .headers()
            .and_then(|h| crate::kafka_headers::last_value(h, ERROR_KIND))
            .and_then(|v| String::from_utf8(v.to_vec()).ok());
        progress.insert(record.partition(), record.offset() + 1);
        if args.kind.as_ref().is_some_and(|k| Some(k) != kind.as_ref()) {
            continue;
        }
        if is_altered(record) {
            altered += 1;
            continue;
        }
        let mut out: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&kafka.commands_topic);
        if let Some(key) = record.key() {
            out = out.key(key);
        }
        if let Some(value) = record.payload() {
            out = out.payload(value);
        }
        let headers: Option<OwnedHeaders> = without_dead_letter_headers(record);
        if let Some(headers) = headers {
            out = out.headers(headers);
        }
        producer
            .send(out, Timeout::After(Duration::from_secs(30)))
            .await
            .map_err(|(e, _)| e)
            .context("producing a redriven record")?;
        sent += 1;
    }
    let topic = kafka.dlq_topic.clone();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        if progress.is_empty() {
            return Ok(());
        }
        let mut config = base_config(&kafka);
        config
            .set("group.id", &group)
            .set("enable.auto.commit", "false");
        let committer: BaseConsumer = config.create()?;
        let mut list = TopicPartitionList::new();
        for (p, o) in &progress {
            list.add_partition_offset(&topic, *p, Offset::Offset(*o))?;
        }
        committer
            .commit(&list, CommitMode::Sync)
            .context("committing redrive progress")?;
        drop(list);
        drop(committer);
        Ok(())
    })
    .await??;
    println!("redrove {sent} records");
    if altered > 0 {
        println!(
            "passed over {altered} dead letters whose value is not the original (masked or dropped); \
             their commands must be sent again by whoever sent them"
        );
    }
    Ok(())
}

/// The dead letter carries a masked or dropped value instead of the original.
fn is_altered(record: &rdkafka::message::OwnedMessage) -> bool {
    record.headers().is_some_and(|headers| {
        [PAYLOAD_REDACTED, PAYLOAD_DROPPED, ORIGINAL_DROPPED]
            .iter()
            .any(|name| crate::kafka_headers::last_value(headers, name).is_some())
    })
}
