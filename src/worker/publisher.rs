//! Produces results and dead letters, and waits until the broker acknowledged them.

use std::time::Duration;

use anyhow::Context;
use backon::{ExponentialBuilder, Retryable};
use rdkafka::message::{Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

use super::messages::{dead_letter_headers, ResultRecord};
use crate::configuration::KafkaSettings;
use crate::payment::RejectionKind;
use tracing::Instrument;

fn produce_span(topic: &str) -> tracing::Span {
    tracing::info_span!(
        "send",
        otel.name = format!("{topic} send"),
        otel.kind = "producer",
        messaging.system = "kafka",
        messaging.operation.type = "send",
        messaging.destination.name = topic,
    )
}

#[derive(Clone)]
pub struct Publisher {
    producer: FutureProducer,
    results_topic: String,
    dlq_topic: String,
}

impl Publisher {
    pub fn new(settings: &KafkaSettings) -> anyhow::Result<Self> {
        let producer = super::kafka::producer_config(settings)
            .create()
            .context("creating the Kafka producer")?;
        Ok(Self {
            producer,
            results_topic: settings.results_topic.clone(),
            dlq_topic: settings.dlq_topic.clone(),
        })
    }

    pub fn producer(&self) -> &FutureProducer {
        &self.producer
    }

    /// Sends one record and waits for the broker's acknowledgement. librdkafka retries
    /// within `message.timeout.ms`; past that we retry forever, because the offset of
    /// this command must not move until the record is durable (SPEC I3). A revoke or
    /// shutdown ends the wait by cancelling the task.
    pub async fn send(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        payload: Option<&[u8]>,
        headers: Option<OwnedHeaders>,
    ) {
        let attempt = || async {
            let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic);
            if let Some(key) = key {
                record = record.key(key);
            }
            if let Some(payload) = payload {
                record = record.payload(payload);
            }
            if let Some(headers) = headers.clone() {
                record = record.headers(headers);
            }
            self.producer
                .send(record, Timeout::Never)
                .await
                .map(|_| ())
                .map_err(|(error, _)| error)
        };
        let _ = attempt
            .retry(
                ExponentialBuilder::default()
                    .with_min_delay(Duration::from_millis(100))
                    .with_max_delay(Duration::from_secs(5))
                    .without_max_times()
                    .with_jitter(),
            )
            .notify(|error, after| {
                tracing::warn!(%error, topic, ?after, "produce failed; retrying");
            })
            .await;
    }

    pub async fn publish_result(&self, key: Option<&[u8]>, result: &ResultRecord) {
        // Serialising our own struct cannot fail; an empty payload would still be visible.
        let payload = serde_json::to_vec(result).unwrap_or_default();
        let span = produce_span(&self.results_topic);
        let headers = span.in_scope(|| crate::telemetry::with_trace_headers(OwnedHeaders::new()));
        self.send(&self.results_topic, key, Some(&payload), Some(headers))
            .instrument(span)
            .await;
    }

    /// The original key, value and headers, plus the dead-letter headers.
    pub async fn dead_letter(
        &self,
        original: &OwnedMessage,
        kind: RejectionKind,
        reason: &str,
        attempts: u32,
    ) {
        let headers = dead_letter_headers(original, kind, reason, attempts);
        self.send(&self.dlq_topic, original.key(), original.payload(), Some(headers))
            .instrument(produce_span(&self.dlq_topic))
            .await;
    }
}
