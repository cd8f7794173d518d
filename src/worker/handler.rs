//! One command record, from bytes to an acknowledged result: decode, process with
//! retries (SPEC §5), publish the result and any dead letter.

use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::Retryable;
use rdkafka::message::{Message, OwnedMessage};
use tokio_util::sync::CancellationToken;

use super::messages::{decode, record_key, source_of, ResultRecord};
use super::publisher::Publisher;
use crate::payment::{CommandContext, Outcome, PaymentCommand, Processor, RejectionKind, SourcePosition};
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
    pub async fn handle(&self, message: &OwnedMessage, draining: &CancellationToken) -> Option<Outcome> {
        let source = source_of(message);
        let (outcome, key, attempts) = match decode(message) {
            Ok(command) => {
                let key = command.idempotency_key.as_str().to_owned();
                let (outcome, attempts) = self.process_with_retries(&command, &source, draining).await?;
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
        if let Outcome::Rejected { kind, reason } = &outcome {
            tracing::info!(kind = kind.as_str(), %reason, partition = source.partition, offset = source.offset, "dead-lettering");
            self.publisher.dead_letter(message, *kind, reason, attempts).await;
        }
        let result = ResultRecord::new(key, &outcome, source);
        self.publisher.publish_result(message.key(), &result).await;
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
                match self.processor.process(command, &context).await {
                    Outcome::Retry { after, reason } => Err(NotYet { after, reason }),
                    outcome => Ok(outcome),
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
                    reason: format!("retries_exhausted after {attempts} attempts: {}", last.reason),
                },
                attempts,
            )),
        }
    }
}

/// The partition-local serialisation key of a record: its Kafka key.
pub fn lane_of(message: &OwnedMessage) -> Option<Vec<u8>> {
    message.key().map(<[u8]>::to_vec)
}
