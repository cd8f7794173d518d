//! The wire formats of the topics (docs/CONTRACT.md, "Messages"): decoding a command record, and the result and
//! dead-letter records that answer it.

use rdkafka::message::{Header, Message, OwnedHeaders, OwnedMessage};
use uuid::Uuid;

use crate::payment::{
    InvalidCommand, OriginalAnswer, Outcome, PaymentCommand, RedactedPayload, RejectionKind,
    SourcePosition,
};

pub fn source_of(message: &OwnedMessage) -> SourcePosition {
    SourcePosition {
        topic: message.topic().to_owned(),
        partition: message.partition(),
        offset: message.offset(),
    }
}

/// Why a record is not a payment command. `Display` is `code: explanation`, the
/// `x-error-reason` of its dead letter; neither part repeats the record's content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Undecodable {
    /// The value is not a valid command.
    #[error("{code}: {0}", code = .0.code())]
    Command(InvalidCommand),
    /// The record key is not the command's `idempotency_key`.
    #[error("kafka_key_mismatch: the record key differs from idempotency_key")]
    KeyMismatch,
}

impl Undecodable {
    /// The stable reason code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Command(invalid) => invalid.code(),
            Self::KeyMismatch => "kafka_key_mismatch",
        }
    }

    /// Whether the value held a card number, so its dead letter must be masked.
    pub fn holds_card_number(&self) -> bool {
        matches!(self, Self::Command(invalid) if invalid.holds_card_number())
    }
}

/// Parses the record value and checks it against the record key. Total: any key,
/// value and headers end as a command or a reason; headers are not read.
pub fn decode(message: &OwnedMessage) -> Result<PaymentCommand, Undecodable> {
    let command = PaymentCommand::parse(message.payload().unwrap_or_default())
        .map_err(Undecodable::Command)?;
    if let Some(key) = message.key() {
        if key != command.idempotency_key.as_str().as_bytes() {
            return Err(Undecodable::KeyMismatch);
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

/// One record on the results topic: a command's outcome.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResultRecord {
    /// The command's key, when it had a readable one.
    pub idempotency_key: Option<String>,
    /// The payment's id, when there is one.
    pub payment_id: Option<Uuid>,
    /// `succeeded`, `declined`, `duplicate` or `rejected`.
    pub outcome: String,
    /// The gateway's transaction id, when charged or declined.
    pub gateway_transaction_id: Option<String>,
    /// Why it was rejected.
    pub reason: Option<String>,
    /// The command record this answers.
    pub source: SourcePosition,
    /// On a `duplicate`: the first answer, like a cached response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original: Option<OriginalAnswer>,
}

impl ResultRecord {
    /// The result of `outcome` for the command at `source`.
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
        let original = match outcome {
            Outcome::Duplicate { original, .. } => original.clone(),
            _ => None,
        };
        Self {
            idempotency_key: key,
            original,
            payment_id: outcome.payment_id(),
            outcome: outcome.label().to_owned(),
            gateway_transaction_id: transaction,
            reason,
            source,
        }
    }
}

/// Dead-letter header: the rejection's code.
pub const ERROR_KIND: &str = "x-error-kind";
/// Dead-letter header: the reason, in words.
pub const ERROR_REASON: &str = "x-error-reason";
pub const SOURCE_TOPIC: &str = "x-source-topic";
pub const SOURCE_PARTITION: &str = "x-source-partition";
pub const SOURCE_OFFSET: &str = "x-source-offset";
/// Dead-letter header: attempts made.
pub const ATTEMPTS: &str = "x-attempts";
/// `true` on a `retries_exhausted` dead letter when an earlier attempt may have
/// charged and no look-up resolved it (absent otherwise).
pub const CHARGE_UNKNOWN: &str = "x-charge-unknown";
/// On a dead letter whose value was masked: what was masked (`card_number`).
pub const PAYLOAD_REDACTED: &str = "x-payload-redacted";

/// The headers this worker writes on a dead letter; a redrive strips them again.
const DEAD_LETTER_HEADERS: [&str; 8] = [
    ERROR_KIND,
    ERROR_REASON,
    SOURCE_TOPIC,
    SOURCE_PARTITION,
    SOURCE_OFFSET,
    ATTEMPTS,
    CHARGE_UNKNOWN,
    PAYLOAD_REDACTED,
];

/// Why a record is dead-lettered, and what of it may be kept.
#[derive(Debug, Clone)]
pub struct DeadLetter<'a> {
    /// The rejection's kind.
    pub kind: RejectionKind,
    /// The reason, in words.
    pub reason: &'a str,
    /// Attempts made.
    pub attempts: u32,
    /// An earlier attempt may have charged and no look-up resolved it.
    pub charge_unknown: bool,
    /// The value to send instead of the original (a card number masked).
    pub redacted: Option<RedactedPayload>,
}

/// The original headers plus the dead-letter headers. Headers from an earlier
/// dead-lettering are replaced, so a redriven record does not carry stale ones.
pub fn dead_letter_headers(message: &OwnedMessage, letter: &DeadLetter<'_>) -> OwnedHeaders {
    let DeadLetter {
        kind,
        reason,
        attempts,
        charge_unknown,
        ..
    } = *letter;
    let mut headers = without_dead_letter_headers(message).unwrap_or_default();
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

/// A record's headers, names kept as raw bytes, without the dead-letter headers
/// (for a dead letter of a redriven record, and for the redrive itself).
pub fn without_dead_letter_headers(message: &OwnedMessage) -> Option<OwnedHeaders> {
    let original = message.headers()?;
    Some(crate::kafka_headers::copy_without(
        original,
        &DEAD_LETTER_HEADERS,
    ))
}
