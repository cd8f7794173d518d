//! Operator commands around the worker: `produce`, `replay`, `dlq redrive`, and
//! the health endpoints.

use std::io::BufRead;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::{Offset, TopicPartitionList};
use uuid::Uuid;

use super::dry_run::{dry_run_report, DryRunScope};
use super::kafka::{base_config, consumer_config, producer_config};
use super::messages::{without_dead_letter_headers, ERROR_KIND};
use super::workload::{generate, WorkloadRecord, WorkloadSpec};
use crate::configuration::{KafkaSettings, StoreSettings};
use crate::payment::Outcome;

/// An outcome as `process` prints it.
#[derive(Debug, serde::Serialize)]
pub struct OutcomeView {
    pub outcome: &'static str,
    pub payment_id: Option<Uuid>,
    pub detail: Option<String>,
}

impl From<&Outcome> for OutcomeView {
    fn from(outcome: &Outcome) -> Self {
        let detail = match outcome {
            Outcome::Succeeded { transaction_id, .. }
            | Outcome::Declined { transaction_id, .. } => Some(transaction_id.clone()),
            Outcome::Rejected { kind, reason } => Some(format!("{}: {reason}", kind.as_str())),
            Outcome::Retry { reason, .. } => Some(reason.clone()),
            Outcome::Duplicate { .. } => None,
        };
        Self {
            outcome: outcome.label(),
            payment_id: outcome.payment_id(),
            detail,
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct ProduceArgs {
    #[command(flatten)]
    pub kafka: KafkaSettings,
    /// JSON-lines file of commands (`-`: standard input); otherwise a generated workload.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Records in a generated workload (without --file).
    #[arg(long, default_value_t = 1000)]
    pub count: usize,
    /// Share of records that repeat an earlier command exactly.
    #[arg(long, default_value_t = 0.25)]
    pub duplicate_ratio: f64,
    /// Share of records that are invalid (each breaks a different rule).
    #[arg(long, default_value_t = 0.05)]
    pub invalid_ratio: f64,
    /// Share of commands whose payment method the simulator declines.
    #[arg(long, default_value_t = 0.05)]
    pub decline_ratio: f64,
    /// Seed of the generated workload (amounts, duplicates, invalid records).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Prefix of generated idempotency keys, which are `PREFIX-000000`,
    /// `PREFIX-000001`, ... Default: `cmd-` and a fresh run id (`cmd-1a2b3c4d`), so
    /// each run's commands are new payments; give the same prefix (and --seed) to
    /// send the same commands again.
    #[arg(long, value_parser = parse_key_prefix)]
    pub key_prefix: Option<String>,
}

/// A prefix is usable when the keys made from it are valid idempotency keys.
fn parse_key_prefix(prefix: &str) -> Result<String, String> {
    crate::token::IdempotencyKey::try_from(format!("{prefix}-bad-000000"))
        .map(|_| prefix.to_owned())
        .map_err(|e| format!("keys made from this prefix would be refused: {e}"))
}

/// The default key prefix: `cmd-` and 8 hex digits new on every run.
fn run_key_prefix() -> String {
    let run_id = Uuid::new_v4().simple().to_string();
    format!("cmd-{}", &run_id[..8])
}

/// Publishes `records` to `topic` and waits for every acknowledgement.
pub async fn publish_records(
    producer: &FutureProducer,
    topic: &str,
    partitions: i32,
    records: &[WorkloadRecord],
) -> anyhow::Result<()> {
    for chunk in records.chunks(500) {
        let sends = chunk.iter().map(|record| {
            let mut out: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic);
            if let Some(key) = &record.key {
                out = out.key(key.as_slice());
            }
            if let Some(value) = &record.value {
                out = out.payload(value.as_slice());
            }
            if let Some(hint) = record.partition_hint {
                out = out.partition((hint % partitions.max(1) as u32) as i32);
            }
            producer.send(out, Timeout::After(Duration::from_secs(30)))
        });
        // Polled together: a send enqueues only when first polled, so awaiting the
        // futures one by one would wait for each acknowledgement before the next.
        for result in futures_util::future::join_all(sends).await {
            result.map_err(|(e, _)| e).context("producing a command")?;
        }
    }
    Ok(())
}

pub fn partition_count(settings: &KafkaSettings, topic: &str) -> anyhow::Result<i32> {
    let consumer: BaseConsumer = base_config(settings).create()?;
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

pub async fn produce(args: ProduceArgs) -> anyhow::Result<()> {
    let mut generated_keys = None;
    let records = match &args.file {
        Some(path) => read_json_lines(path)?,
        None => {
            let prefix = args.key_prefix.clone().unwrap_or_else(run_key_prefix);
            let records = generate(
                &WorkloadSpec {
                    count: args.count,
                    duplicate_ratio: args.duplicate_ratio,
                    invalid_ratio: args.invalid_ratio,
                    decline_ratio: args.decline_ratio,
                    seed: args.seed.unwrap_or_else(rand::random),
                },
                &prefix,
            );
            generated_keys = Some(prefix);
            records
        }
    };
    let producer: FutureProducer = producer_config(&args.kafka).create()?;
    let topic = args.kafka.commands_topic.clone();
    let partitions = {
        let kafka = args.kafka.clone();
        let topic = topic.clone();
        tokio::task::spawn_blocking(move || partition_count(&kafka, &topic)).await??
    };
    publish_records(&producer, &topic, partitions, &records).await?;
    match generated_keys {
        Some(prefix) => println!(
            "produced {} records to {topic} (keys {prefix}-NNNNNN)",
            records.len()
        ),
        None => println!("produced {} records to {topic}", records.len()),
    }
    Ok(())
}

/// Each line is one record value; its `idempotency_key` (when readable) is the key.
fn read_json_lines(path: &PathBuf) -> anyhow::Result<Vec<WorkloadRecord>> {
    let reader: Box<dyn BufRead> = if path.as_os_str() == "-" {
        Box::new(std::io::BufReader::new(std::io::stdin()))
    } else {
        Box::new(std::io::BufReader::new(
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?,
        ))
    };
    let mut records = Vec::new();
    for line in reader.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let key = serde_json::from_str::<serde_json::Value>(&line)
            .ok()
            .and_then(|v| {
                v.get("idempotency_key")
                    .and_then(|k| k.as_str())
                    .map(str::to_owned)
            });
        records.push(WorkloadRecord {
            kind: super::workload::RecordKind::Valid,
            key: key.map(String::into_bytes),
            value: Some(line.into_bytes()),
            partition_hint: None,
        });
    }
    Ok(records)
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["to_beginning", "to_offset"])))]
pub struct ReplayArgs {
    #[command(flatten)]
    pub kafka: KafkaSettings,
    /// The group to rewind (default: --kafka-group-id).
    #[arg(long)]
    pub group: Option<String>,
    /// Rewind every partition to its first offset.
    #[arg(long)]
    pub to_beginning: bool,
    /// Rewind every partition to this offset (clamped to what the topic holds).
    #[arg(long)]
    pub to_offset: Option<i64>,
    /// Report what replaying would do (counts per verdict: would_charge,
    /// would_look_up, duplicate, key_reused, in_flight, token_missing, invalid),
    /// without touching the group or the gateway.
    #[arg(long)]
    pub dry_run: bool,
    /// With --dry-run: print the report as one JSON document.
    #[arg(long, requires = "dry_run")]
    pub json: bool,
    /// With --dry-run: also give each record's verdict (one line, or a `records` list in JSON).
    #[arg(long, requires = "dry_run")]
    pub list: bool,
    /// With --dry-run: examine at most N records, shared evenly between the partitions.
    #[arg(long, value_name = "N", requires = "dry_run")]
    pub limit: Option<usize>,
    /// With --dry-run: the workers' `--gateway-lookup` (`always`: every charge is a look-up first).
    #[arg(
        long = "gateway-lookup",
        env = "GATEWAY_LOOKUP",
        value_enum,
        default_value = "uncertain"
    )]
    pub gateway_lookup: crate::payment::GatewayLookup,
    #[command(flatten)]
    pub stores: StoreSettings,
}

/// Start offsets for a replay: per partition, the target clamped to the low watermark.
fn replay_targets(
    consumer: &BaseConsumer,
    topic: &str,
    partitions: i32,
    to_offset: Option<i64>,
) -> anyhow::Result<Vec<(i32, i64, i64)>> {
    (0..partitions)
        .map(|p| {
            let (low, high) = consumer
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .with_context(|| format!("watermarks of {topic}/{p}"))?;
            let start = to_offset.map_or(low, |o| o.clamp(low, high));
            Ok((p, start, high))
        })
        .collect()
}

pub async fn replay(args: ReplayArgs) -> anyhow::Result<()> {
    let mut kafka = args.kafka.clone();
    if let Some(group) = &args.group {
        kafka.group_id = group.clone();
    }
    if args.dry_run {
        return dry_run(&args, &kafka).await;
    }
    let to_offset = if args.to_beginning {
        None
    } else {
        args.to_offset
    };
    let rewound = tokio::task::spawn_blocking(move || rewind_group(&kafka, to_offset)).await??;
    println!("rewound {rewound} partitions");
    Ok(())
}

async fn dry_run(args: &ReplayArgs, kafka: &KafkaSettings) -> anyhow::Result<()> {
    let (pool, store) = args.stores.open().await?;
    let scope = DryRunScope {
        to_offset: if args.to_beginning {
            None
        } else {
            args.to_offset
        },
        limit: args.limit,
        lookup: args.gateway_lookup,
    };
    let report = dry_run_report(
        kafka,
        &scope,
        &pool,
        store.as_ref(),
        args.stores.tokens.mode,
        args.list,
    )
    .await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.to_text());
    }
    Ok(())
}

/// Joins the group, waits to be assigned every partition (only possible when no
/// other member is alive), commits the start offsets as a member, and leaves.
pub fn rewind_group(kafka: &KafkaSettings, to_offset: Option<i64>) -> anyhow::Result<usize> {
    let topic = kafka.commands_topic.as_str();
    let partitions = partition_count(kafka, topic)?;
    let mut config = consumer_config(kafka);
    config.set("enable.auto.commit", "false");
    let consumer: BaseConsumer = config.create()?;
    consumer.subscribe(&[topic])?;
    let deadline = Instant::now() + kafka.session_timeout * 3 + Duration::from_secs(5);
    loop {
        // Messages fetched meanwhile are dropped at once; nothing is stored.
        if let Some(Err(error)) = consumer.poll(Duration::from_millis(100)) {
            tracing::debug!(%error, "poll while waiting for the assignment");
        }
        let assigned = consumer.assignment()?.count();
        if assigned == partitions as usize {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "group {} still has other live members (got {assigned} of {partitions} partitions); stop the workers first",
            kafka.group_id
        );
    }
    let targets = replay_targets(&consumer, topic, partitions, to_offset)?;
    let mut list = TopicPartitionList::new();
    for (p, start, _) in &targets {
        list.add_partition_offset(topic, *p, Offset::Offset(*start))?;
    }
    consumer
        .commit(&list, CommitMode::Sync)
        .context("committing the replay offsets")?;
    drop(list);
    consumer.unsubscribe();
    let _ = consumer.poll(Duration::from_millis(100));
    drop(consumer);
    Ok(targets.len())
}

/// Where to read one partition: `[from, to)`; `available` is what the partition
/// holds from `from` on (more than `to - from` when a limit cut the range short).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionRange {
    pub partition: i32,
    pub from: i64,
    pub to: i64,
    pub available: i64,
}

/// Reads every partition of `topic` from `start(partition, low watermark)` up to
/// the high watermark, without a consumer group.
pub fn read_partitions(
    kafka: &KafkaSettings,
    topic: &str,
    start: impl Fn(i32, i64) -> i64,
) -> anyhow::Result<Vec<rdkafka::message::OwnedMessage>> {
    let partitions = partition_count(kafka, topic)?;
    let probe: BaseConsumer = base_config(kafka).create()?;
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
    drop(probe);
    read_ranges(kafka, topic, &ranges)
}

/// Reads `[from, to)` of each partition of `topic`, without a consumer group.
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
        .set("enable.partition.eof", "false");
    let consumer: BaseConsumer = config.create()?;
    let mut list = TopicPartitionList::new();
    let mut remaining = 0i64;
    let mut ends = std::collections::HashMap::new();
    for range in ranges.iter().filter(|r| r.to > r.from) {
        list.add_partition_offset(topic, range.partition, Offset::Offset(range.from))?;
        remaining += range.to - range.from;
        ends.insert(range.partition, range.to);
    }
    if remaining == 0 {
        drop(list);
        drop(consumer);
        return Ok(Vec::new());
    }
    consumer.assign(&list)?;
    drop(list);
    let mut out = Vec::new();
    // A fetch retried after an error may deliver a record again: count positions.
    let mut seen = std::collections::HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while out.len() < remaining as usize && Instant::now() < deadline {
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

#[derive(Debug, clap::Args)]
pub struct RedriveArgs {
    #[command(flatten)]
    pub kafka: KafkaSettings,
    /// Only records with this `x-error-kind`. Progress is one offset per partition,
    /// so records of other kinds are passed over for good.
    #[arg(long)]
    pub kind: Option<String>,
    /// Redrive at most this many records.
    #[arg(long)]
    pub max: Option<usize>,
}

/// Puts dead letters back on the commands topic (original key, value and headers),
/// remembering progress in the `<group>.dlq-redrive` group so none is sent twice.
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
    let mut progress: std::collections::HashMap<i32, i64> = next;
    for record in &records {
        if args.max.is_some_and(|m| sent >= m) {
            break;
        }
        let kind = record
            .headers()
            .and_then(|h| super::headers::last_value(h, ERROR_KIND))
            .and_then(|v| String::from_utf8(v.to_vec()).ok());
        progress.insert(record.partition(), record.offset() + 1);
        if args.kind.as_ref().is_some_and(|k| Some(k) != kind.as_ref()) {
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
    Ok(())
}
