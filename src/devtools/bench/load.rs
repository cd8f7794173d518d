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
    loop {
        let at = now_ms();
        let record: FutureRecord<'_, str, str> = FutureRecord::to(topic)
            .key(key)
            .payload(value)
            .timestamp(at);
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
        let key = format!("{key_prefix}-{n:07}");
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
            let key = format!("{key_prefix}-{n:07}");
            pending.push(send_command(producer, topic, &key, &command_json(&key, n)).await?);
            n += 1;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    delivered(&mut pending, &mut sent).await?;
    Ok(sent)
}
