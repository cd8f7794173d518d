//! Builds the records that answer a command (the result, and for a rejection the
//! dead letter, whose headers `dead_letter.rs` assembles), produces them, and waits
//! until the broker acknowledged them (or, exactly-once, until they are in the open
//! transaction: the `AnswerSink` decides). The only place outbound records are made.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use backon::{ExponentialBuilder, Retryable};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::util::Timeout;
use tracing::Instrument;

use super::answer_sink::AnswerSink;
use super::dead_letter::{DeadLetter, Letter};
use super::messages::{ResultRecord, KEY_HMAC_SHA256};
use super::oversized::LetterForm;
use super::record_echo::{EchoedKey, KeyScan};
use super::spans::{produce_span, produce_span_name};
use super::transactions::Transactions;
use crate::configuration::{KafkaSettings, ResultsMode, WorkerSettings};
use crate::payment::{dead_letter_redaction, Outcome, SourcePosition};
use crate::redaction::KeyHasher;

fn is_too_large(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::MessageBatchTooLarge
        )
    )
}

/// Whether the brokers refuse a produced record for good: no retry, no abort and
/// redo can get it accepted (its size aside, which a smaller form answers). The
/// refusals of authorisation and of a fenced producer, and a broker's record
/// validation: a record it calls invalid (a key missing on a compacted topic, a
/// timestamp outside its window, a policy), or a format or compression it does not
/// take. Retried, each would stall the worker forever while it looked healthy.
fn is_refused_for_good(error: &KafkaError) -> bool {
    super::supervision::is_fatal_broker_error(error)
        || matches!(
            error.rdkafka_error_code(),
            Some(
                RDKafkaErrorCode::InvalidRecord
                    | RDKafkaErrorCode::InvalidTimestamp
                    | RDKafkaErrorCode::InvalidRequiredAcks
                    | RDKafkaErrorCode::InvalidTopic
                    | RDKafkaErrorCode::PolicyViolation
                    | RDKafkaErrorCode::UnsupportedForMessageFormat
                    | RDKafkaErrorCode::UnsupportedCompressionType
            )
        )
}

/// A command's final outcome and what its answer needs besides the original record.
#[derive(Debug, Clone)]
pub(super) struct Verdict {
    /// The idempotency key the result carries, when there is a readable one.
    pub key: Option<String>,
    /// The outcome to publish.
    pub outcome: Outcome,
    /// Attempts made (`x-attempts` on a dead letter).
    pub attempts: u32,
    /// An earlier attempt may have charged and no look-up resolved it.
    pub charge_unknown: bool,
    /// Whether the record key holds a card number, as `Inbound::read` found it.
    pub key_scan: KeyScan,
}

/// The result record of `outcome` for the command at `source`.
fn result_record(
    key: Option<String>,
    outcome: &Outcome,
    source: SourcePosition,
    charge_unknown: bool,
) -> ResultRecord {
    let transaction = outcome.transaction_id().map(str::to_owned);
    let reason = match outcome {
        Outcome::Declined { .. } => Some("declined by gateway".to_owned()),
        Outcome::RefundDeclined { .. } => Some("refund declined by gateway".to_owned()),
        Outcome::Rejected { kind, reason } => Some(format!("{}: {reason}", kind.as_str())),
        Outcome::Succeeded { .. } | Outcome::Refunded { .. } | Outcome::Duplicate { .. } => None,
    };
    let original = match outcome {
        Outcome::Duplicate { original, .. } => original.as_deref().cloned(),
        _ => None,
    };
    ResultRecord {
        idempotency_key: key,
        original,
        payment_id: outcome.payment_id(),
        refund_id: outcome.refund_id(),
        outcome: outcome.label().to_owned(),
        gateway_transaction_id: transaction,
        reason,
        source,
        charge_unknown,
    }
}

/// Produces results and dead letters: acknowledged one by one (at-least-once) or
/// inside the open transaction (exactly-once).
#[derive(Clone)]
pub struct Publisher {
    producer: FutureProducer,
    results_topic: String,
    dlq_topic: String,
    /// The `otel.name`s of the producer spans of the two topics, formatted once.
    results_span_name: String,
    dlq_span_name: String,
    /// Where answers go, chosen once at start: acknowledged one by one, or into
    /// the open transaction.
    sink: AnswerSink,
    /// Why the brokers refuse this producer's records for good (no write permission
    /// on a topic), once one was refused so.
    refused_for_good: Arc<OnceLock<String>>,
    /// Computes `x-key-hmac-sha256` of a key not echoed as it came.
    key_hasher: KeyHasher,
}

impl Publisher {
    /// The producer's fatal error, if librdkafka raised one. Its sends are retried
    /// without limit (an answer must be acknowledged before its offset moves), so
    /// only the poll loop, by asking this, can end a worker whose answers can no
    /// longer leave it.
    /// A record the brokers refuse for good (an authorisation error) counts the same:
    /// librdkafka does not call it fatal, but retrying cannot fix it either.
    pub(super) fn fatal_error(&self) -> Option<String> {
        self.producer
            .client()
            .fatal_error()
            .map(|(code, reason)| format!("results producer: {code:?}: {reason}"))
            .or_else(|| self.refused_for_good.get().cloned())
    }

    /// Remembers an error no retry can fix, for [`Publisher::fatal_error`].
    fn note_refusal(&self, topic: &str, error: &KafkaError) {
        if is_refused_for_good(error) {
            let _ = self
                .refused_for_good
                .set(format!("results producer: {topic}: {error}"));
        }
    }

    /// An at-least-once publisher: each record is acknowledged on its own; keys are
    /// hashed under this process's random secret.
    pub fn new(settings: &KafkaSettings) -> anyhow::Result<Self> {
        Self::at_least_once(settings, KeyHasher::for_this_process())
    }

    fn at_least_once(settings: &KafkaSettings, key_hasher: KeyHasher) -> anyhow::Result<Self> {
        settings.check_passthrough()?;
        let producer = super::kafka::create_client(&super::kafka::producer_config(settings))
            .context("creating the Kafka producer")?;
        Ok(Self {
            producer,
            results_topic: settings.results_topic.clone(),
            dlq_topic: settings.dlq_topic.clone(),
            results_span_name: produce_span_name(&settings.results_topic),
            dlq_span_name: produce_span_name(&settings.dlq_topic),
            sink: AnswerSink::AtLeastOnce,
            refused_for_good: Arc::default(),
            key_hasher,
        })
    }

    /// The publisher of `worker.results`; in `exactly-once` mode this creates the
    /// process's transactional producer (blocking for its first broker round trips).
    pub fn for_mode(settings: &KafkaSettings, worker: &WorkerSettings) -> anyhow::Result<Self> {
        let key_hasher = worker.key_hash.hasher()?;
        match worker.results {
            ResultsMode::AtLeastOnce => Self::at_least_once(settings, key_hasher),
            ResultsMode::ExactlyOnce => {
                settings.check_passthrough()?;
                let transactions = Transactions::start(settings, worker)?;
                Ok(Self {
                    producer: transactions.producer().clone(),
                    results_topic: settings.results_topic.clone(),
                    dlq_topic: settings.dlq_topic.clone(),
                    results_span_name: produce_span_name(&settings.results_topic),
                    dlq_span_name: produce_span_name(&settings.dlq_topic),
                    sink: AnswerSink::Transactional(transactions),
                    refused_for_good: Arc::default(),
                    key_hasher,
                })
            }
        }
    }

    /// The underlying producer.
    pub fn producer(&self) -> &FutureProducer {
        &self.producer
    }

    /// Where this publisher's answers go (and so the offsets past them).
    pub(super) fn sink(&self) -> &AnswerSink {
        &self.sink
    }

    /// Sends one record and waits for the broker's acknowledgement. librdkafka retries
    /// within `message.timeout.ms`; past that we retry forever, because the offset of
    /// this command must not move until the record is durable (invariant I3). A revoke or
    /// shutdown ends the wait by cancelling the task. Only a record that can never be
    /// accepted (too large) comes back as an error.
    pub async fn send(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        payload: Option<&[u8]>,
        headers: Option<OwnedHeaders>,
    ) -> Result<(), KafkaError> {
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
        if let AnswerSink::Transactional(transactions) = &self.sink {
            // Inside a transaction a failed record leaves it abortable: retrying here
            // would only fail again. The commit aborts instead, and the command is
            // redone from the last committed offset.
            return match attempt().await {
                Err(error) if !is_too_large(&error) => {
                    tracing::warn!(%error, topic, "produce failed; the transaction will abort");
                    self.note_refusal(topic, &error);
                    transactions.mark_broken();
                    Ok(())
                }
                other => other,
            };
        }
        attempt
            .retry(
                ExponentialBuilder::default()
                    .with_min_delay(Duration::from_millis(100))
                    .with_max_delay(Duration::from_secs(5))
                    .without_max_times()
                    .with_jitter(),
            )
            .when(|error| !is_too_large(error))
            .notify(|error, after| {
                // Retried all the same: the poll loop ends the worker on a refusal
                // for good, and until then the answer must not be given up.
                self.note_refusal(topic, error);
                tracing::warn!(%error, topic, ?after, "produce failed; retrying");
            })
            .await
    }

    /// Publishes the answer to `original` (read from `source`): for a rejection its
    /// dead letter first, then the result; returns once the broker acknowledged both
    /// (in exactly-once mode, once both are in the open transaction).
    pub(super) async fn publish_answer(
        &self,
        original: &OwnedMessage,
        source: SourcePosition,
        verdict: Verdict,
    ) {
        let Verdict {
            key,
            outcome,
            attempts,
            charge_unknown,
            key_scan,
        } = verdict;
        // The record key as every answer echoes it; a masked one also replaces the
        // result's `idempotency_key`.
        let echoed = EchoedKey::scanned(original.key(), key_scan, &self.key_hasher);
        let key = if echoed.is_masked() {
            echoed.masked_text()
        } else {
            key
        };
        if let Outcome::Rejected { kind, reason } = &outcome {
            // Every dead letter's value is looked at, whatever refused it: parsing
            // stops at the first broken rule, the rules read only the fields they
            // know, and a panic may come from anywhere in the value; a card number
            // in any of them must not reach the topic.
            let letter = DeadLetter {
                kind: *kind,
                reason,
                attempts,
                charge_unknown,
                redacted: dead_letter_redaction(original.payload().unwrap_or_default()),
                key_hmac: echoed.hmac.as_deref(),
            };
            self.dead_letter(original, &echoed, &source, letter).await;
        }
        let result = result_record(key, &outcome, source.clone(), charge_unknown);
        self.publish_result(&echoed, &source, &result).await;
    }

    /// Publishes one result record and waits until the broker acknowledged it.
    async fn publish_result(
        &self,
        echoed: &EchoedKey,
        source: &SourcePosition,
        result: &ResultRecord,
    ) {
        // Serialising our own struct cannot fail; an empty payload would still be visible.
        let payload = serde_json::to_vec(result).unwrap_or_default();
        let span = produce_span(&self.results_topic, &self.results_span_name);
        let mut headers =
            span.in_scope(|| crate::telemetry::with_trace_headers(OwnedHeaders::new()));
        if let Some(hmac) = &echoed.hmac {
            headers = headers.insert(Header {
                key: KEY_HMAC_SHA256,
                value: Some(hmac),
            });
        }
        // Exactly-once only: results an aborted transaction learnt go unkeyed.
        let refusals = self.sink.oversized();
        let key = echoed
            .key
            .as_deref()
            .filter(|_| !refusals.is_some_and(|known| known.result_unkeyed(source)));
        if let Some(key) = key {
            let sent = self
                .send(
                    &self.results_topic,
                    Some(key),
                    Some(&payload),
                    Some(headers.clone()),
                )
                .instrument(span.clone())
                .await;
            let Err(error) = sent else {
                return;
            };
            // A result is small; a key too large for the broker leaves it unkeyed.
            tracing::warn!(%error, "result too large with its key; sending it unkeyed");
            // In exactly-once mode the broker's refusal leaves the transaction
            // abortable and the unkeyed result fails with it; the redo after the
            // abort starts unkeyed instead of meeting the same refusal forever.
            if let Some(known) = refusals {
                known.remember_result_unkeyed(source);
            }
        }
        if echoed.hmac.is_none() {
            if let Some(original) = &echoed.key {
                headers = headers.insert(Header {
                    key: KEY_HMAC_SHA256,
                    value: Some(&self.key_hasher.hex(original)),
                });
            }
        }
        let _ = self
            .send(&self.results_topic, None, Some(&payload), Some(headers))
            .instrument(span)
            .await;
    }

    /// The dead letter (`dead_letter.rs` assembles it): the original key, value and
    /// headers, none holding a card number, plus the dead-letter headers. A dead
    /// letter too large for the brokers goes out smaller (`LetterForm`) rather than
    /// stall its partition forever.
    async fn dead_letter(
        &self,
        original: &OwnedMessage,
        echoed: &EchoedKey,
        source: &SourcePosition,
        letter: DeadLetter<'_>,
    ) {
        let span = produce_span(&self.dlq_topic, &self.dlq_span_name);
        // Exactly-once only: what an aborted transaction learnt (see `oversized.rs`).
        let refusals = self.sink.oversized();
        let mut form = refusals.map_or(LetterForm::Whole, |known| known.first_form(source));
        loop {
            let Letter {
                key,
                value,
                headers,
            } = letter.in_form(original, echoed, form);
            let sent = self
                .send(&self.dlq_topic, key, value, Some(headers))
                .instrument(span.clone())
                .await;
            let Err(error) = sent else {
                return;
            };
            let Some(smaller) = form.smaller() else {
                tracing::error!(%error, "the dead letter could not be produced at all");
                return;
            };
            if smaller == LetterForm::WithoutValue {
                tracing::warn!(%error, "dead letter too large; dropping its value");
            } else {
                tracing::error!(
                    %error,
                    "dead letter too large without its value; dropping its key and headers too"
                );
            }
            // In exactly-once mode a refusal by the broker (not by this producer's
            // own size check) leaves the transaction abortable: the smaller form
            // fails with it, and the redo after the abort starts from the smaller one.
            if let Some(known) = refusals {
                known.remember(source, smaller);
            }
            form = smaller;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_no_retry_can_fix_is_told_from_one_a_smaller_record_answers() {
        for code in [
            RDKafkaErrorCode::InvalidRecord,
            RDKafkaErrorCode::InvalidTimestamp,
            RDKafkaErrorCode::PolicyViolation,
            RDKafkaErrorCode::UnsupportedCompressionType,
            RDKafkaErrorCode::TopicAuthorizationFailed,
        ] {
            let error = KafkaError::MessageProduction(code);
            assert!(is_refused_for_good(&error), "{code:?}");
            assert!(!is_too_large(&error), "{code:?}");
        }
        for code in [
            RDKafkaErrorCode::MessageSizeTooLarge,
            RDKafkaErrorCode::MessageBatchTooLarge,
        ] {
            let error = KafkaError::MessageProduction(code);
            assert!(is_too_large(&error), "{code:?}");
            assert!(!is_refused_for_good(&error), "{code:?}");
        }
        for code in [
            RDKafkaErrorCode::NotLeaderForPartition,
            RDKafkaErrorCode::RequestTimedOut,
            RDKafkaErrorCode::BrokerTransportFailure,
        ] {
            let error = KafkaError::MessageProduction(code);
            assert!(!is_refused_for_good(&error), "{code:?}");
        }
    }
}
