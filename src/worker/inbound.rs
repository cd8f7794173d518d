//! A command record as the worker reads it, decoded once: where it came from, its
//! key, and the command or why it is not one. Everything after this reads the
//! `Inbound`, not the record's bytes.

use rdkafka::message::{Message, OwnedMessage};

use crate::payment::{ChargeEvidence, Command, InvalidCommand, SourcePosition};

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
    pub command: Result<Command, Undecodable>,
    /// What the record itself says of an earlier charge ([`charge_flag`]).
    pub flagged: ChargeEvidence,
}

impl Inbound {
    /// Reads `message`. Total: any key, value and headers end as a command or a
    /// reason; of the headers only `x-charge-unknown` is read.
    pub fn read(message: &OwnedMessage) -> Self {
        let command = decode(message);
        let key = match &command {
            Ok(command) => Some(command.idempotency_key().as_str().to_owned()),
            Err(_) => record_key(message),
        };
        Self {
            source: source_of(message),
            key,
            command,
            flagged: charge_flag(message),
        }
    }
}

/// What a record says of an earlier charge: `x-charge-unknown: true` (a dead letter
/// redriven by `dlq redrive`, which keeps the flag) means an earlier delivery ended
/// while a charge may exist. When `unresolved_charges` could not be written during
/// the very outage that left the outcome unknown, this flag is the only memory of it,
/// so it counts as evidence: the charge is looked up before any POST, and the flag
/// stays on the answer unless one is booked. A producer setting it costs only a
/// look-up.
pub fn charge_flag(message: &OwnedMessage) -> ChargeEvidence {
    let flagged = message
        .headers()
        .and_then(|headers| {
            crate::kafka_headers::last_value(headers, super::messages::CHARGE_UNKNOWN)
        })
        .is_some_and(|value| value == b"true");
    ChargeEvidence::from_unknown(flagged)
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
fn decode(message: &OwnedMessage) -> Result<Command, Undecodable> {
    // First: whatever else is wrong with the record, its key is echoed on its
    // answer, and one that holds a card number is refused for that.
    if message
        .key()
        .is_some_and(crate::redaction::holds_card_number)
    {
        return Err(Undecodable::Command(InvalidCommand::CardNumberAsKey));
    }
    let command =
        Command::parse(message.payload().unwrap_or_default()).map_err(Undecodable::Command)?;
    if let Some(key) = message.key() {
        // A refund may be keyed by its payment's key, so that it shares the
        // payment's partition and follows its charge (the recommended keying).
        let keyed_by_payment = match &command {
            Command::Refund(refund) => key == refund.payment_key.as_str().as_bytes(),
            Command::Charge(_) => false,
        };
        if key != command.idempotency_key().as_str().as_bytes() && !keyed_by_payment {
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
