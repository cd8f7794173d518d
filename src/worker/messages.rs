//! The wire formats of SPEC §4: decoding a command record, and the result and
//! dead-letter records that answer it.

use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
use uuid::Uuid;

use crate::payment::{InvalidCommand, Outcome, PaymentCommand, RejectionKind, SourcePosition};

pub fn source_of(message: &OwnedMessage) -> SourcePosition {
    SourcePosition {
        topic: message.topic().to_owned(),
        partition: message.partition(),
        offset: message.offset(),
    }
}

/// Parses the record value and checks it against the record key.
pub fn decode(message: &OwnedMessage) -> Result<PaymentCommand, String> {
    let command = PaymentCommand::parse(message.payload().unwrap_or_default())
        .map_err(|e: InvalidCommand| format!("{}: {e}", e.code()))?;
    if let Some(key) = message.key() {
        if key != command.idempotency_key.as_str().as_bytes() {
            return Err("kafka_key_mismatch: the record key differs from idempotency_key".into());
        }
    }
    Ok(command)
}

/// The idempotency key of a record, when it can be told without trusting the payload.
pub fn record_key(message: &OwnedMessage) -> Option<String> {
    message
        .key()
        .and_then(|k| std::str::from_utf8(k).ok())
        .filter(|k| crate::token::IdempotencyKey::try_from(*k).is_ok())
        .map(str::to_owned)
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResultRecord {
    pub idempotency_key: Option<String>,
    pub payment_id: Option<Uuid>,
    pub outcome: String,
    pub gateway_transaction_id: Option<String>,
    pub reason: Option<String>,
    pub source: SourcePosition,
}

impl ResultRecord {
    pub fn new(key: Option<String>, outcome: &Outcome, source: SourcePosition) -> Self {
        let (transaction, reason) = match outcome {
            Outcome::Succeeded { transaction_id, .. } => (Some(transaction_id.clone()), None),
            Outcome::Declined { transaction_id, .. } => (
                Some(transaction_id.clone()),
                Some("declined by gateway".to_owned()),
            ),
            Outcome::Duplicate { .. } => (None, None),
            Outcome::Rejected { kind, reason } => {
                (None, Some(format!("{}: {reason}", kind.as_str())))
            }
            Outcome::Retry { reason, .. } => (None, Some(reason.clone())),
        };
        Self {
            idempotency_key: key,
            payment_id: outcome.payment_id(),
            outcome: outcome.label().to_owned(),
            gateway_transaction_id: transaction,
            reason,
            source,
        }
    }
}

pub const ERROR_KIND: &str = "x-error-kind";
pub const ERROR_REASON: &str = "x-error-reason";
pub const SOURCE_TOPIC: &str = "x-source-topic";
pub const SOURCE_PARTITION: &str = "x-source-partition";
pub const SOURCE_OFFSET: &str = "x-source-offset";
pub const ATTEMPTS: &str = "x-attempts";
/// `true` on a `retries_exhausted` dead letter when an earlier attempt may have
/// charged and no look-up resolved it (absent otherwise).
pub const CHARGE_UNKNOWN: &str = "x-charge-unknown";

/// The original headers plus the dead-letter headers of SPEC §4. Headers from an
/// earlier dead-lettering are replaced, so a redriven record does not carry stale ones.
pub fn dead_letter_headers(
    message: &OwnedMessage,
    kind: RejectionKind,
    reason: &str,
    attempts: u32,
    charge_unknown: bool,
) -> OwnedHeaders {
    let ours = [
        ERROR_KIND,
        ERROR_REASON,
        SOURCE_TOPIC,
        SOURCE_PARTITION,
        SOURCE_OFFSET,
        ATTEMPTS,
        CHARGE_UNKNOWN,
    ];
    let mut headers = OwnedHeaders::new();
    if let Some(original) = message.headers() {
        for header in original.iter().filter(|h| !ours.contains(&h.key)) {
            headers = headers.insert(Header {
                key: header.key,
                value: header.value,
            });
        }
    }
    let partition = message.partition().to_string();
    let offset = message.offset().to_string();
    let attempts = attempts.to_string();
    for (key, value) in [
        (ERROR_KIND, kind.as_str()),
        (ERROR_REASON, reason),
        (SOURCE_TOPIC, message.topic()),
        (SOURCE_PARTITION, partition.as_str()),
        (SOURCE_OFFSET, offset.as_str()),
        (ATTEMPTS, attempts.as_str()),
    ] {
        headers = headers.insert(Header {
            key,
            value: Some(value),
        });
    }
    if charge_unknown {
        headers = headers.insert(Header {
            key: CHARGE_UNKNOWN,
            value: Some("true"),
        });
    }
    headers
}

/// Headers of a dead-lettered record with the dead-letter headers removed (redrive).
pub fn without_dead_letter_headers(message: &OwnedMessage) -> Option<OwnedHeaders> {
    let original = message.headers()?;
    let ours = [
        ERROR_KIND,
        ERROR_REASON,
        SOURCE_TOPIC,
        SOURCE_PARTITION,
        SOURCE_OFFSET,
        ATTEMPTS,
        CHARGE_UNKNOWN,
    ];
    let mut headers = OwnedHeaders::new();
    for header in original.iter().filter(|h| !ours.contains(&h.key)) {
        headers = headers.insert(Header {
            key: header.key,
            value: header.value,
        });
    }
    Some(headers)
}
