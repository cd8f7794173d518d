//! A command record as the worker reads it, decoded once: where it came from, its
//! key, and the command or why it is not one. Everything after this reads the
//! `Inbound`, not the record's bytes.

use rdkafka::message::{Message, OwnedMessage};

use super::record_echo::KeyScan;
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
    /// Whether the record key holds a card number: found once here, and reused by
    /// the answer's echo of the key.
    pub key_scan: KeyScan,
}

impl Inbound {
    /// Reads `message`. Total: any key, value and headers end as a command or a
    /// reason; of the headers only `x-charge-unknown` is read.
    pub fn read(message: &OwnedMessage) -> Self {
        let (command, key_scan) = decode(message);
        let key = match &command {
            Ok(command) => Some(command.idempotency_key().as_str().to_owned()),
            Err(_) => record_key(message),
        };
        Self {
            source: source_of(message),
            key,
            command,
            flagged: charge_flag(message),
            key_scan,
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
    // Any `true` counts: a later copy of the header cannot take the evidence back.
    let flagged = message.headers().is_some_and(|headers| {
        crate::kafka_headers::any_value_is(headers, super::messages::CHARGE_UNKNOWN, b"true")
    });
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

/// Parses the record value and checks it against the record key; says whether the
/// record key holds a card number.
fn decode(message: &OwnedMessage) -> (Result<Command, Undecodable>, KeyScan) {
    let key = message.key();
    let command = Command::parse(message.payload().unwrap_or_default());
    // What the record key is to the command, when both are there.
    let role = match (&command, key) {
        (Ok(command), Some(key)) => Some(key_of_command(command, key)),
        _ => None,
    };
    // A record key equal to a key the command holds was scanned by the parse, which
    // refuses a command whose key holds a card number: it is not scanned again (the
    // keys of the usual record, scanned once instead of twice).
    let scan = match (key, role) {
        (None, _) => KeyScan::Clean,
        (Some(_), Some(KeyRole::Own | KeyRole::Payment)) => KeyScan::Clean,
        (Some(key), _) => KeyScan::of(key),
    };
    // Whatever else is wrong with the record, its key is echoed on its answer, and
    // one that holds a card number is refused for that.
    if scan == KeyScan::HoldsCardNumber {
        return (
            Err(Undecodable::Command(InvalidCommand::CardNumberAsKey)),
            scan,
        );
    }
    let checked = match (command, role) {
        (Err(invalid), _) => Err(Undecodable::Command(invalid)),
        (Ok(_), Some(KeyRole::Foreign)) => Err(Undecodable::KeyMismatch),
        (Ok(command), _) => Ok(command),
    };
    (checked, scan)
}

/// What a record key is to the command it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyRole {
    /// The command's own `idempotency_key`.
    Own,
    /// A refund's `payment_idempotency_key`: a refund may be keyed by its payment's
    /// key, so that it shares the payment's partition and follows its charge (the
    /// recommended keying).
    Payment,
    /// Neither: the record is refused (`kafka_key_mismatch`).
    Foreign,
}

fn key_of_command(command: &Command, key: &[u8]) -> KeyRole {
    if key == command.idempotency_key().as_str().as_bytes() {
        return KeyRole::Own;
    }
    match command {
        Command::Refund(refund) if key == refund.payment_key.as_str().as_bytes() => {
            KeyRole::Payment
        }
        _ => KeyRole::Foreign,
    }
}

/// The idempotency key of a record, when it can be told without trusting the payload.
pub fn record_key(message: &OwnedMessage) -> Option<String> {
    message
        .key()
        .and_then(|k| std::str::from_utf8(k).ok())
        .filter(|k| crate::token::IdempotencyKey::try_from(*k).is_ok())
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use rdkafka::Timestamp;

    use super::*;

    const CARD: &str = "4111111111111111";

    fn charge(key: &str) -> Vec<u8> {
        format!(
            r#"{{"idempotency_key":"{key}","account_id":"acct_1","amount_minor":100,"currency":"USD","payment_method":"pm_card_visa"}}"#
        )
        .into_bytes()
    }

    fn refund(key: &str, payment_key: &str) -> Vec<u8> {
        format!(
            r#"{{"type":"refund","idempotency_key":"{key}","payment_idempotency_key":"{payment_key}","amount_minor":50,"currency":"USD","reason":"returned"}}"#
        )
        .into_bytes()
    }

    fn read(key: Option<&str>, value: Vec<u8>) -> Inbound {
        let message = OwnedMessage::new(
            Some(value),
            key.map(|key| key.as_bytes().to_vec()),
            "payments.commands".into(),
            Timestamp::now(),
            0,
            7,
            None,
        );
        Inbound::read(&message)
    }

    fn code(inbound: &Inbound) -> Option<&'static str> {
        inbound.command.as_ref().err().map(Undecodable::code)
    }

    /// The record key is scanned once, by the parse when it is a key the command
    /// holds, and by itself otherwise; the verdict reaches the echo either way.
    #[test]
    fn a_record_key_with_a_card_number_is_refused_and_marked_for_masking() {
        let cases = [
            // The command's own key: refused by the parse.
            (read(Some(CARD), charge(CARD)), Some("card_number_as_key")),
            // Another key than the command's: refused before the mismatch.
            (
                read(Some(CARD), charge("ord-1")),
                Some("card_number_as_key"),
            ),
            // A value that is no command at all.
            (
                read(Some(CARD), b"not json".to_vec()),
                Some("card_number_as_key"),
            ),
            // A refund keyed by its payment's key.
            (
                read(Some(CARD), refund("ref-1", CARD)),
                Some("card_number_as_key"),
            ),
        ];
        for (inbound, expected) in cases {
            assert_eq!(code(&inbound), expected);
            assert_eq!(inbound.key_scan, KeyScan::HoldsCardNumber);
        }
    }

    #[test]
    fn a_clean_record_key_is_its_commands_or_refused_as_a_mismatch() {
        let own = read(Some("ord-1"), charge("ord-1"));
        assert_eq!(code(&own), None);
        let by_payment = read(Some("ord-1"), refund("ref-1", "ord-1"));
        assert_eq!(code(&by_payment), None);
        let refunds_own = read(Some("ref-1"), refund("ref-1", "ord-1"));
        assert_eq!(code(&refunds_own), None);
        let foreign = read(Some("ord-2"), charge("ord-1"));
        assert_eq!(code(&foreign), Some("kafka_key_mismatch"));
        let keyless = read(None, charge("ord-1"));
        assert_eq!(code(&keyless), None);
        for inbound in [own, by_payment, refunds_own, foreign, keyless] {
            assert_eq!(inbound.key_scan, KeyScan::Clean);
        }
    }
}
