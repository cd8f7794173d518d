//! A command record as the worker reads it, decoded once: where it came from, its
//! key, and the command or why it is not one. Everything after this reads the
//! `Inbound`, not the record's bytes.

use rdkafka::message::{Message, OwnedMessage};

use crate::payment::{InvalidCommand, PaymentCommand, SourcePosition};

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
}

/// One command record, decoded.
#[derive(Debug, Clone)]
pub struct Inbound {
    /// The record's topic, partition and offset.
    pub source: SourcePosition,
    /// The idempotency key its answer carries: the command's, or for a record that
    /// is not a command the record key when it is a valid key.
    pub key: Option<String>,
    /// The command, or why the record is not one.
    pub command: Result<PaymentCommand, Undecodable>,
}

impl Inbound {
    /// Reads `message`. Total: any key, value and headers end as a command or a
    /// reason; headers are not read.
    pub fn read(message: &OwnedMessage) -> Self {
        let command = decode(message);
        let key = match &command {
            Ok(command) => Some(command.idempotency_key.as_str().to_owned()),
            Err(_) => record_key(message),
        };
        Self {
            source: source_of(message),
            key,
            command,
        }
    }
}

/// Where `message` sits on its topic.
pub fn source_of(message: &OwnedMessage) -> SourcePosition {
    SourcePosition {
        topic: message.topic().to_owned(),
        partition: message.partition(),
        offset: message.offset(),
    }
}

/// Parses the record value and checks it against the record key.
fn decode(message: &OwnedMessage) -> Result<PaymentCommand, Undecodable> {
    // First: whatever else is wrong with the record, its key is echoed on its
    // answer, and one that holds a card number is refused for that.
    if message
        .key()
        .is_some_and(crate::redaction::holds_card_number)
    {
        return Err(Undecodable::Command(InvalidCommand::CardNumberAsKey));
    }
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
