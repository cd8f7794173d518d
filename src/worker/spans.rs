//! The worker's spans (OpenTelemetry messaging conventions): one consumer span per
//! command, one producer span per record sent.

use rdkafka::message::{Message, OwnedMessage};
use tracing::field::Empty;

use super::inbound::record_key;

/// The consumer span of one command, a child of the record's `traceparent` when it
/// carries one.
pub fn command_span(message: &OwnedMessage, group_id: &str) -> tracing::Span {
    let span = tracing::info_span!(
        crate::telemetry::COMMAND_SPAN,
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
        token.woken_by = Empty,
        payment.outcome = Empty,
        payment.rejection = Empty,
        trace_id = Empty,
        span_id = Empty,
    );
    crate::telemetry::adopt_remote_parent(&span, message.headers());
    if let Some(key) = record_key(message) {
        // Masked like `IdempotencyKey`'s Display: no card number in a span.
        span.record(
            "payment.idempotency_key",
            crate::redaction::mask_card_numbers(&key).as_ref(),
        );
    }
    if let Some((trace_id, span_id)) = crate::telemetry::trace_ids(&span) {
        // Puts the trace and span ids on every JSON log line of this command.
        span.record("trace_id", trace_id);
        span.record("span_id", span_id);
    }
    span
}

/// The producer span of one record sent to `topic`.
pub(super) fn produce_span(topic: &str) -> tracing::Span {
    tracing::info_span!(
        "send",
        otel.name = format!("{topic} send"),
        otel.kind = "producer",
        messaging.system = "kafka",
        messaging.operation.type = "send",
        messaging.destination.name = topic,
    )
}
