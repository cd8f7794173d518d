//! `payment-worker produce`: publishes commands from a JSON-lines file or a
//! generated workload to the commands topic.

use std::io::BufRead;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use uuid::Uuid;

use super::topics::partition_count;
use super::workload::{generate, RecordKind, WorkloadRecord, WorkloadSpec};
use crate::configuration::KafkaSettings;
use crate::worker::{create_client, producer_config};

/// `payment-worker produce`: what to publish, and where.
#[derive(Debug, clap::Args)]
pub struct ProduceArgs {
    /// The cluster and the commands topic.
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
    /// Prefix of generated idempotency keys, which are `PREFIX:000000`,
    /// `PREFIX:000001`, ... Default: `cmd-` and a fresh run id (`cmd-1a2b3c4d`), so
    /// each run's commands are new payments; give the same prefix (and --seed) to
    /// send the same commands again.
    #[arg(long, value_parser = parse_key_prefix)]
    pub key_prefix: Option<String>,
}

/// A prefix is usable when the keys made from it are valid idempotency keys, none
/// of them a card number.
fn parse_key_prefix(prefix: &str) -> Result<String, String> {
    if crate::redaction::holds_card_number(prefix.as_bytes()) {
        return Err(
            "the prefix holds a card number: every key made from it would be refused".to_owned(),
        );
    }
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

/// Publishes the file's or the generated workload's records, waits for every acknowledgement and says how many.
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
    let producer: FutureProducer = create_client(&producer_config(&args.kafka))?;
    let topic = args.kafka.commands_topic.clone();
    let partitions = {
        let kafka = args.kafka.clone();
        let topic = topic.clone();
        tokio::task::spawn_blocking(move || partition_count(&kafka, &topic)).await??
    };
    publish_records(&producer, &topic, partitions, &records).await?;
    match generated_keys {
        Some(prefix) => println!(
            "produced {} records to {topic} (keys {prefix}:NNNNNN)",
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
            kind: RecordKind::Valid,
            key: key.map(String::into_bytes),
            value: Some(line.into_bytes()),
            partition_hint: None,
        });
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::operator::numbered_key;
    use crate::redaction::holds_card_number;

    #[test]
    fn a_prefix_that_holds_a_card_number_is_refused() {
        for prefix in [
            "4111111111111111",
            "ord-41111111-11111111",
            "x.4111.1111.1111.1111",
        ] {
            assert!(parse_key_prefix(prefix).is_err(), "{prefix}");
        }
        assert_eq!(parse_key_prefix("ord-2026").as_deref(), Ok("ord-2026"));
        assert!(parse_key_prefix("has space").is_err());
    }

    proptest! {
        #[test]
        fn the_default_prefix_makes_no_card_number(n in 0usize..10_000_000) {
            let prefix = run_key_prefix();
            prop_assert!(parse_key_prefix(&prefix).is_ok(), "{}", prefix);
            let key = numbered_key(&prefix, n, 6);
            prop_assert!(!holds_card_number(key.as_bytes()), "{}", key);
        }
    }
}
