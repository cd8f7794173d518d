//! The load generator: commands stamped with the wall-clock time they were
//! produced, sent as fast as the broker takes them (a backlog) or at a fixed rate.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use indicatif::ProgressBar;
use rdkafka::error::KafkaError;
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;

use super::ceiling::command_json;
use payment_worker::operator::{self, RecordKind, RefundExpectation, WorkloadRecord};

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// (partition, offset) of a command record.
pub(super) type Position = (i32, i64);

/// Hands one command to librdkafka, stamped with the current time.
async fn send_command(
    producer: &FutureProducer,
    topic: &str,
    key: &str,
    value: &str,
) -> anyhow::Result<(DeliveryFuture, i64)> {
    send_command_to(producer, topic, None, key, value).await
}

/// [`send_command`] to `partition` (`None`: the partitioner picks by key).
async fn send_command_to(
    producer: &FutureProducer,
    topic: &str,
    partition: Option<i32>,
    key: &str,
    value: &str,
) -> anyhow::Result<(DeliveryFuture, i64)> {
    loop {
        let at = now_ms();
        let record: FutureRecord<'_, str, str> = FutureRecord::to(topic)
            .key(key)
            .payload(value)
            .timestamp(at);
        let record = match partition {
            Some(partition) => record.partition(partition),
            None => record,
        };
        match producer.send_result(record) {
            Ok(delivery) => return Ok((delivery, at)),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err((error, _)) => return Err(error).context("producing a command"),
        }
    }
}

async fn delivered(
    pending: &mut Vec<(DeliveryFuture, i64)>,
    sent: &mut HashMap<Position, i64>,
) -> anyhow::Result<()> {
    for (delivery, at) in pending.drain(..) {
        let delivery = delivery
            .await
            .context("the producer went away")?
            .map_err(|(error, _)| error)
            .context("a command was not delivered")?;
        sent.insert((delivery.partition, delivery.offset), at);
    }
    Ok(())
}

/// Produces `count` commands as fast as the broker takes them.
pub(super) async fn produce_backlog(
    producer: &FutureProducer,
    topic: &str,
    key_prefix: &str,
    count: usize,
    bar: &ProgressBar,
) -> anyhow::Result<HashMap<Position, i64>> {
    let mut sent = HashMap::with_capacity(count);
    let mut pending = Vec::with_capacity(5000);
    for n in 0..count {
        let key = payment_worker::operator::numbered_key(key_prefix, n, 7);
        pending.push(send_command(producer, topic, &key, &command_json(&key, n)).await?);
        if pending.len() == 5000 {
            delivered(&mut pending, &mut sent).await?;
            bar.set_position(n as u64 + 1);
        }
    }
    delivered(&mut pending, &mut sent).await?;
    bar.set_position(count as u64);
    Ok(sent)
}

/// Produces `count` commands at `rate` per second, evenly spaced from the start.
pub(super) async fn produce_paced(
    producer: &FutureProducer,
    topic: &str,
    key_prefix: &str,
    count: usize,
    rate: f64,
) -> anyhow::Result<HashMap<Position, i64>> {
    let mut sent = HashMap::with_capacity(count);
    let mut pending = Vec::with_capacity(count);
    let started = Instant::now();
    let mut n = 0usize;
    while n < count {
        let due = ((started.elapsed().as_secs_f64() * rate) as usize + 1).min(count);
        while n < due {
            let key = payment_worker::operator::numbered_key(key_prefix, n, 7);
            pending.push(send_command(producer, topic, &key, &command_json(&key, n)).await?);
            n += 1;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    delivered(&mut pending, &mut sent).await?;
    Ok(sent)
}

/// Seed of the mixed backlog's refunds: every run refunds the same charges.
const MIXED_SEED: u64 = 36;

/// A backlog of `count` commands: charges, then refunds of `refund_share` of them
/// (`operator::refunds_for`: keyed by the payment, so each follows its charge on
/// its partition; partial, full, exceeding pairs and repeats), the refunds taking
/// the places of the last charges. Returns when each was sent, and what the
/// refunds should be answered.
pub(super) async fn produce_mixed_backlog(
    producer: &FutureProducer,
    topic: &str,
    key_prefix: &str,
    count: usize,
    refund_share: f64,
    bar: &ProgressBar,
) -> anyhow::Result<(HashMap<Position, i64>, RefundExpectation)> {
    let charges: Vec<WorkloadRecord> = (0..count)
        .map(|n| {
            let key = operator::numbered_key(key_prefix, n, 7);
            WorkloadRecord {
                kind: RecordKind::Valid,
                value: Some(command_json(&key, n).into_bytes()),
                key: Some(key.into_bytes()),
                partition_hint: None,
            }
        })
        .collect();
    let refunds = operator::refunds_for(&charges, refund_share, MIXED_SEED, key_prefix);
    let records = operator::fit_refunds(&charges, &refunds, count);
    let first_refund = records
        .iter()
        .position(|r| r.kind == RecordKind::Refund)
        .unwrap_or(records.len());
    let expected = operator::expected_refunds(&records, &records[first_refund..]);
    let mut sent = HashMap::with_capacity(records.len());
    let mut pending = Vec::with_capacity(5000);
    for (n, record) in records.iter().enumerate() {
        let text = |bytes: &Option<Vec<u8>>| {
            std::str::from_utf8(bytes.as_deref().unwrap_or_default())
                .map(str::to_owned)
                .context("a generated command is not UTF-8")
        };
        let (key, value) = (text(&record.key)?, text(&record.value)?);
        pending.push(send_command(producer, topic, &key, &value).await?);
        if pending.len() == 5000 {
            delivered(&mut pending, &mut sent).await?;
            bar.set_position(n as u64 + 1);
        }
    }
    delivered(&mut pending, &mut sent).await?;
    bar.set_position(records.len() as u64);
    Ok((sent, expected))
}

/// Every fourth command of a [`produce_duplicated_backlog`] repeats a recent one.
const DUPLICATE_EVERY: usize = 4;
/// A duplicate repeats one of the last this many originals: close enough behind it
/// that, on another partition, both are being processed at the same time.
const DUPLICATE_REACH: usize = 24;

/// A backlog as users send it: `count` commands, a quarter of them repeating a
/// recent command exactly (same key, same request), half of those on another
/// partition than their original, where only the token stops them. Originals go
/// round the partitions. Returns when each was sent, and the positions of every key
/// that was sent more than once (the original first).
pub(super) async fn produce_duplicated_backlog(
    producer: &FutureProducer,
    topic: &str,
    key_prefix: &str,
    count: usize,
    partitions: i32,
    bar: &ProgressBar,
) -> anyhow::Result<(HashMap<Position, i64>, Vec<Vec<Position>>)> {
    use rand::{Rng, SeedableRng};
    let partitions = partitions.max(1);
    let mut rng = rand::rngs::StdRng::seed_from_u64(35);
    let mut sent = HashMap::with_capacity(count);
    // (key, n of the original, partition of the original)
    let mut originals: Vec<(String, usize, i32)> = Vec::with_capacity(count);
    let mut pending: Vec<(DeliveryFuture, i64, usize)> = Vec::with_capacity(count);
    for n in 0..count {
        let duplicate = n % DUPLICATE_EVERY == DUPLICATE_EVERY - 1 && !originals.is_empty();
        let (key, original_n, partition, index) = if duplicate {
            let reach = originals.len().min(DUPLICATE_REACH);
            let index = originals.len() - 1 - rng.random_range(0..reach);
            let (key, original_n, original_partition) = originals[index].clone();
            let partition = if rng.random_bool(0.5) {
                original_partition
            } else {
                (original_partition + 1 + rng.random_range(0..(partitions - 1).max(1))) % partitions
            };
            (key, original_n, partition, index)
        } else {
            let key = payment_worker::operator::numbered_key(key_prefix, n, 7);
            let partition = (originals.len() % partitions as usize) as i32;
            originals.push((key.clone(), n, partition));
            (key, n, partition, originals.len() - 1)
        };
        let value = command_json(&key, original_n);
        let (delivery, at) =
            send_command_to(producer, topic, Some(partition), &key, &value).await?;
        pending.push((delivery, at, index));
        if pending.len() == 5000 || n + 1 == count {
            bar.set_position(n as u64 + 1);
        }
    }
    let mut by_key: Vec<Vec<Position>> = vec![Vec::new(); originals.len()];
    for (delivery, at, index) in pending {
        let delivery = delivery
            .await
            .context("the producer went away")?
            .map_err(|(error, _)| error)
            .context("a command was not delivered")?;
        let position = (delivery.partition, delivery.offset);
        sent.insert(position, at);
        by_key[index].push(position);
    }
    bar.set_position(count as u64);
    let repeated = by_key.into_iter().filter(|p| p.len() > 1).collect();
    Ok((sent, repeated))
}
