//! One command record, from bytes to an acknowledged result: decode, process with
//! retries (SPEC §5), publish the result and any dead letter.

use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::Retryable;
use opentelemetry::KeyValue;
use rdkafka::message::{Message, OwnedMessage};
use tokio_util::sync::CancellationToken;
use tracing::field::Empty;

use super::messages::{decode, record_key, source_of, ResultRecord};
use super::publisher::Publisher;
use crate::payment::{
    CommandContext, Outcome, PaymentCommand, Processor, RejectionKind, SourcePosition,
};
use crate::retry::RetryPolicy;

pub struct Handler {
    processor: Arc<Processor>,
    publisher: Publisher,
    retry: RetryPolicy,
}

/// A not-yet-final outcome, as an error so backon drives the retries.
#[derive(Debug)]
struct NotYet {
    after: Duration,
    reason: String,
}

impl Handler {
    pub fn new(processor: Arc<Processor>, publisher: Publisher, retry: RetryPolicy) -> Self {
        Self {
            processor,
            publisher,
            retry,
        }
    }

    pub fn processor(&self) -> &Arc<Processor> {
        &self.processor
    }

    /// Returns once the outcome is final and every record about it is acknowledged,
    /// or `None` when `draining` stopped the retries first: then nothing was
    /// published and the command's offset must stay uncommitted.
    pub async fn handle(
        &self,
        message: &OwnedMessage,
        draining: &CancellationToken,
    ) -> Option<Outcome> {
        let started = Instant::now();
        let source = source_of(message);
        let (outcome, key, attempts) = match decode(message) {
            Ok(command) => {
                let key = command.idempotency_key.as_str().to_owned();
                let (outcome, attempts) = self
                    .process_with_retries(&command, &source, draining)
                    .await?;
                (outcome, Some(key), attempts)
            }
            Err(reason) => (
                Outcome::Rejected {
                    kind: RejectionKind::Invalid,
                    reason,
                },
                record_key(message),
                1,
            ),
        };
        let span = tracing::Span::current();
        span.record("payment.outcome", outcome.label());
        if let Outcome::Rejected { kind, reason } = &outcome {
            span.record("payment.rejection", kind.as_str());
            tracing::info!(kind = kind.as_str(), %reason, partition = source.partition, offset = source.offset, "dead-lettering");
            self.publisher
                .dead_letter(message, *kind, reason, attempts)
                .await;
            crate::telemetry::metrics()
                .dead_letters
                .add(1, &[KeyValue::new("kind", kind.as_str())]);
        }
        let result = ResultRecord::new(key, &outcome, source);
        self.publisher.publish_result(message.key(), &result).await;
        let labels = [KeyValue::new("outcome", outcome.label())];
        let metrics = crate::telemetry::metrics();
        metrics.commands.add(1, &labels);
        metrics
            .processing_duration
            .record(started.elapsed().as_secs_f64(), &labels);
        Some(outcome)
    }

    async fn process_with_retries(
        &self,
        command: &PaymentCommand,
        source: &SourcePosition,
        draining: &CancellationToken,
    ) -> Option<(Outcome, u32)> {
        let started = Instant::now();
        let budget = self.retry.budget;
        let mut attempts = 0u32;
        let context = CommandContext {
            source: Some(source),
            trace_id: None,
        };
        let attempt = || {
            attempts += 1;
            async {
                match self
                    .processor
                    .process_unless(command, &context, draining)
                    .await
                {
                    Some(Outcome::Retry { after, reason }) => Err(NotYet { after, reason }),
                    Some(outcome) => Ok(outcome),
                    // Still queued for a payment slot when the drain began: not started.
                    None => Err(NotYet {
                        after: Duration::ZERO,
                        reason: "draining before the attempt started".to_owned(),
                    }),
                }
            }
        };
        let result = attempt
            .retry(self.retry.backoff())
            .when(|_| started.elapsed() < budget && !draining.is_cancelled())
            // A drain cuts the backoff short; the attempt after it is the last.
            .sleep({
                let draining = draining.clone();
                move |delay| {
                    let draining = draining.clone();
                    async move {
                        tokio::select! {
                            _ = tokio::time::sleep(delay) => {}
                            _ = draining.cancelled() => {}
                        }
                    }
                }
            })
            // Another worker's lease tells us when to look again; do not sleep past it.
            .adjust(|not_yet: &NotYet, delay| {
                delay.map(|d| {
                    if not_yet.after.is_zero() {
                        d
                    } else {
                        d.min(not_yet.after + Duration::from_millis(5))
                    }
                })
            })
            .notify(|not_yet, after| {
                crate::telemetry::metrics().retries.add(1, &[]);
                tracing::debug!(reason = %not_yet.reason, ?after, "retrying command");
            })
            .await;
        match result {
            Ok(outcome) => Some((outcome, attempts)),
            // Not exhausted, interrupted: the partition's next owner takes it over.
            Err(_) if draining.is_cancelled() => None,
            Err(last) => Some((
                Outcome::Rejected {
                    kind: RejectionKind::RetriesExhausted,
                    reason: format!(
                        "retries_exhausted after {attempts} attempts: {}",
                        last.reason
                    ),
                },
                attempts,
            )),
        }
    }
}

/// The consumer span of one command (OpenTelemetry messaging conventions), a child
/// of the record's `traceparent` when it carries one.
pub fn command_span(message: &OwnedMessage, group_id: &str) -> tracing::Span {
    let span = tracing::info_span!(
        "process",
        otel.name = format!("{} process", message.topic()),
        otel.kind = "consumer",
        messaging.system = "kafka",
        messaging.operation.type = "process",
        messaging.operation.name = "process",
        messaging.destination.name = message.topic(),
        messaging.destination.partition.id = message.partition().to_string(),
        messaging.kafka.offset = message.offset(),
        messaging.consumer.group.name = group_id,
        payment.idempotency_key = Empty,
        token.verdict = Empty,
        payment.outcome = Empty,
        payment.rejection = Empty,
        trace_id = Empty,
        span_id = Empty,
    );
    crate::telemetry::adopt_remote_parent(&span, message.headers());
    if let Some(key) = super::messages::record_key(message) {
        span.record("payment.idempotency_key", key);
    }
    if let Some((trace_id, span_id)) = crate::telemetry::trace_ids(&span) {
        // Puts the trace and span ids on every JSON log line of this command.
        span.record("trace_id", trace_id);
        span.record("span_id", span_id);
    }
    span
}

/// The partition-local serialisation key of a record: its Kafka key.
pub fn lane_of(message: &OwnedMessage) -> Option<Vec<u8>> {
    message.key().map(<[u8]>::to_vec)
}
