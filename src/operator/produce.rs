//! `payment-worker produce`: publishes commands from a JSON-lines file or a
//! generated workload to the commands topic.

use std::io::BufRead;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use uuid::Uuid;

use super::refund_workload::refunds_for;
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
    // Generated in memory before they are sent: ten million is about 3 GB already.
    #[arg(long, default_value_t = 1000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=10_000_000), conflicts_with = "file")]
    pub count: usize,
    /// Share of records that repeat an earlier command exactly.
    #[arg(long, default_value_t = 0.25, value_parser = parse_share, conflicts_with = "file")]
    pub duplicate_ratio: f64,
    /// Share of records that are invalid (each breaks a different rule).
    #[arg(long, default_value_t = 0.05, value_parser = parse_share, conflicts_with = "file")]
    pub invalid_ratio: f64,
    /// Share of commands whose payment method the simulator declines.
    #[arg(long, default_value_t = 0.05, value_parser = parse_share, conflicts_with = "file")]
    pub decline_ratio: f64,
    /// Share (0 to 1) of the generated workload's valid, approved charges that are
    /// also refunded: refund commands keyed by the payment's key, sent after the
    /// charges (mostly half the amount, some all of it, a few pairs that exceed the
    /// charge, some sent twice).
    #[arg(long, default_value_t = 0.0, value_parser = parse_share, conflicts_with = "file")]
    pub refund_share: f64,
    /// Seed of the generated workload (amounts, duplicates, invalid records).
    #[arg(long, conflicts_with = "file")]
    pub seed: Option<u64>,
    /// Prefix of generated idempotency keys, which are `PREFIX:000000`,
    /// `PREFIX:000001`, ... Default: `cmd-` and a fresh run id (`cmd-1a2b3c4d`), so
    /// each run's commands are new payments; give the same prefix (and --seed) to
    /// send the same commands again.
    #[arg(long, value_parser = parse_key_prefix, conflicts_with = "file")]
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

/// A share is a number from 0 to 1.
fn parse_share(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(share) if (0.0..=1.0).contains(&share) => Ok(share),
        _ => Err(format!("{text:?} is not a share from 0 to 1")),
    }
}

/// The generated workload of `args` under `prefix`: the commands, then the
/// refunds of `--refund-share` of their charges (after them, so each follows its
/// charge on the charge's partition).
fn generated_records(args: &ProduceArgs, prefix: &str, seed: u64) -> Vec<WorkloadRecord> {
    let mut records = generate(
        &WorkloadSpec {
            count: args.count,
            duplicate_ratio: args.duplicate_ratio,
            invalid_ratio: args.invalid_ratio,
            decline_ratio: args.decline_ratio,
            seed,
        },
        prefix,
    );
    if args.refund_share > 0.0 {
        let refunds = refunds_for(&records, args.refund_share, seed, prefix);
        records.extend(refunds);
    }
    records
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
    // As for `run`: a passed-through setting the worker owns would quietly override
    // a flag (`KAFKA_CONFIG_BOOTSTRAP_SERVERS`: another cluster than the one named).
    args.kafka.check_passthrough()?;
    let mut generated_keys = None;
    let records = match &args.file {
        Some(path) => read_json_lines(path)?,
        None => {
            let prefix = args.key_prefix.clone().unwrap_or_else(run_key_prefix);
            let seed = args.seed.unwrap_or_else(rand::random);
            let records = generated_records(&args, &prefix, seed);
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

/// The record key of a command: a refund's payment key, so the refund travels on
/// its charge's partition and follows it; any other command's own key.
fn record_key(command: &serde_json::Value) -> Option<String> {
    let field = if command.get("type").and_then(|t| t.as_str()) == Some("refund") {
        "payment_idempotency_key"
    } else {
        "idempotency_key"
    };
    command.get(field)?.as_str().map(str::to_owned)
}

/// Each line is one record value; its key (when readable) is [`record_key`]'s.
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
            .and_then(|v| record_key(&v));
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

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        produce: ProduceArgs,
    }

    fn args(extra: &[&str]) -> Result<ProduceArgs, clap::Error> {
        use clap::Parser as _;
        Cli::try_parse_from(["produce"].iter().chain(extra)).map(|cli| cli.produce)
    }

    #[test]
    fn every_ratio_is_a_share_from_0_to_1_and_the_count_is_bounded() {
        for bad in [
            "--decline-ratio=NaN",
            "--duplicate-ratio=1.5",
            "--invalid-ratio=-0.1",
            "--refund-share=inf",
        ] {
            let error = args(&[bad]).expect_err(bad).to_string();
            assert!(error.contains("not a share from 0 to 1"), "{bad}: {error}");
        }
        for bad in ["--count=18446744073709551615", "--count=10000001"] {
            let error = args(&[bad]).expect_err(bad).to_string();
            assert!(error.contains("0..=10000000"), "{bad}: {error}");
        }
        let edges = args(&["--duplicate-ratio=0", "--decline-ratio=1"]).unwrap();
        assert_eq!((edges.duplicate_ratio, edges.decline_ratio), (0.0, 1.0));
    }

    #[test]
    fn refunds_are_generated_only_when_asked_and_after_the_charges() {
        let plain = args(&["--count", "400"]).unwrap();
        assert_eq!(plain.refund_share, 0.0);
        let records = generated_records(&plain, "ord-2026", 4);
        assert_eq!(records.len(), 400);
        assert!(records.iter().all(|r| r.kind != RecordKind::Refund));

        let mixed = args(&["--count", "400", "--refund-share", "0.5"]).unwrap();
        let records = generated_records(&mixed, "ord-2026", 4);
        let refunds = &records[400..];
        assert!(refunds.iter().any(|r| r.kind == RecordKind::Refund));
        assert!(records[..400].iter().all(|r| r.kind != RecordKind::Refund));
        assert_eq!(
            records[..400].iter().map(|r| &r.value).collect::<Vec<_>>(),
            generated_records(&plain, "ord-2026", 4)
                .iter()
                .map(|r| &r.value)
                .collect::<Vec<_>>(),
            "the charges are the same with or without refunds"
        );
        for refund in refunds {
            let value = refund.value.as_deref().unwrap_or_default();
            assert!(matches!(
                crate::payment::Command::parse(value),
                Ok(crate::payment::Command::Refund(_))
            ));
        }
    }

    #[test]
    fn a_refund_from_a_file_is_keyed_by_its_payment() {
        let refund = serde_json::json!({"type": "refund", "idempotency_key": "rf-1",
            "payment_idempotency_key": "ord-1", "amount_minor": 5, "currency": "USD"});
        assert_eq!(record_key(&refund).as_deref(), Some("ord-1"));
        let charge = serde_json::json!({"idempotency_key": "ord-1", "amount_minor": 5});
        assert_eq!(record_key(&charge).as_deref(), Some("ord-1"));
        let typed = serde_json::json!({"type": "charge", "idempotency_key": "ord-2"});
        assert_eq!(record_key(&typed).as_deref(), Some("ord-2"));
        assert_eq!(record_key(&serde_json::json!({"type": "refund"})), None);
    }

    #[test]
    fn a_refund_share_is_from_0_to_1_and_only_for_generated_workloads() {
        for bad in ["1.5", "-0.1", "x", "NaN"] {
            assert!(args(&["--refund-share", bad]).is_err(), "{bad}");
        }
        assert!(args(&["--refund-share", "0.1", "--file", "-"]).is_err());
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
