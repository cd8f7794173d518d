//! The worker's spans (OpenTelemetry messaging conventions): one consumer span per
//! command, one producer span per record sent.

use rdkafka::message::{Message, OwnedMessage};
use tracing::field::Empty;

use crate::token::IdempotencyKey;

/// What the spans of one partition's commands name it by, formatted once when its
/// task starts rather than for every command and every offset stored.
#[derive(Debug, Clone)]
pub struct PartitionNames {
    /// `otel.name` of a command span: `<topic> process`.
    process: String,
    /// `messaging.destination.partition.id` (a string in the messaging conventions).
    partition_id: String,
}

impl PartitionNames {
    /// The names of `partition` of `topic`.
    pub fn new(topic: &str, partition: i32) -> Self {
        Self {
            process: format!("{topic} process"),
            partition_id: partition.to_string(),
        }
    }

    /// The partition's id as its spans carry it.
    pub fn partition_id(&self) -> &str {
        &self.partition_id
    }
}

/// The consumer span of one command, a child of the record's `traceparent` when it
/// carries one.
pub fn command_span(message: &OwnedMessage, group_id: &str) -> tracing::Span {
    let names = PartitionNames::new(message.topic(), message.partition());
    command_span_named(message, group_id, &names)
}

/// [`command_span`] of a record of the partition `names` names (formatted once by
/// its partition task).
pub fn command_span_named(
    message: &OwnedMessage,
    group_id: &str,
    names: &PartitionNames,
) -> tracing::Span {
    let span = tracing::info_span!(
        crate::telemetry::COMMAND_SPAN,
        otel.name = names.process.as_str(),
        otel.kind = "consumer",
        messaging.system = "kafka",
        messaging.operation.type = "process",
        messaging.operation.name = "process",
        messaging.destination.name = message.topic(),
        messaging.destination.partition.id = names.partition_id.as_str(),
        messaging.kafka.offset = message.offset(),
        messaging.consumer.group.name = group_id,
        payment.idempotency_key = Empty,
        token.verdict = Empty,
        token.woken_by = Empty,
        payment.outcome = Empty,
        payment.rejection = Empty,
        trace_id = Empty,
        span_id = Empty,
    );
    if span.is_disabled() {
        // Nothing records it: no key to mask, no parent to read.
        return span;
    }
    crate::telemetry::adopt_remote_parent(&span, message.headers());
    // The record key when it is a valid idempotency key (as `inbound::record_key`
    // tells it), borrowed: the span copies what it records.
    let key = message
        .key()
        .and_then(|k| std::str::from_utf8(k).ok())
        .filter(|k| IdempotencyKey::check(k).is_ok());
    if let Some(key) = key {
        // Masked like `IdempotencyKey`'s Display: no card number in a span.
        span.record(
            "payment.idempotency_key",
            crate::redaction::mask_card_numbers(key).as_ref(),
        );
    }
    if let Some((trace_id, span_id)) = crate::telemetry::trace_ids(&span) {
        // Puts the trace and span ids on every JSON log line of this command.
        span.record("trace_id", trace_id);
        span.record("span_id", span_id);
    }
    span
}

/// The `otel.name` of the producer span of records sent to `topic`: formatted once
/// by the publisher, which sends to the same two topics all its life.
pub(super) fn produce_span_name(topic: &str) -> String {
    format!("{topic} send")
}

/// The producer span of one record sent to `topic`, named `name`
/// ([`produce_span_name`]).
pub(super) fn produce_span(topic: &str, name: &str) -> tracing::Span {
    tracing::info_span!(
        "send",
        otel.name = name,
        otel.kind = "producer",
        messaging.system = "kafka",
        messaging.operation.type = "send",
        messaging.destination.name = topic,
    )
}
