//! Reading a record value as JSON: every field taken once, typed, and no value
//! ever copied into an error.

use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::invalid::{
    ACCOUNT_ID, AMOUNT_MINOR, CURRENCY, DESCRIPTION, IDEMPOTENCY_KEY, PAYMENT_IDEMPOTENCY_KEY,
    PAYMENT_METHOD, REASON, TYPE,
};
use super::InvalidCommand;

// JSON envelope: one pass that tells "not an object", missing, null, wrong type
// and duplicated fields apart, and skips unknown fields without building them.

#[derive(Default)]
pub(super) enum Slot {
    #[default]
    Absent,
    Present(Value),
}

#[derive(Default)]
pub(super) struct Fields {
    pub(super) idempotency_key: Slot,
    pub(super) account_id: Slot,
    pub(super) amount_minor: Slot,
    pub(super) currency: Slot,
    pub(super) payment_method: Slot,
    pub(super) description: Slot,
    /// `type`: absent (or `"charge"`) for a charge, `"refund"` for a refund.
    pub(super) kind: Slot,
    pub(super) payment_idempotency_key: Slot,
    pub(super) reason: Slot,
    pub(super) duplicate: Option<&'static str>,
}

// Built once per record on the stack and taken apart at once: boxing the fields
// would add an allocation to every command for nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum Envelope {
    Object(Fields),
    Other(&'static str),
}

impl<'de> serde::Deserialize<'de> for Envelope {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(EnvelopeVisitor)
    }
}

struct EnvelopeVisitor;

impl<'de> Visitor<'de> for EnvelopeVisitor {
    type Value = Envelope;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Envelope, A::Error> {
        let mut fields = Fields::default();
        while let Some(name) = map.next_key::<String>()? {
            let (slot, field) = match name.as_ref() {
                IDEMPOTENCY_KEY => (&mut fields.idempotency_key, IDEMPOTENCY_KEY),
                ACCOUNT_ID => (&mut fields.account_id, ACCOUNT_ID),
                AMOUNT_MINOR => (&mut fields.amount_minor, AMOUNT_MINOR),
                CURRENCY => (&mut fields.currency, CURRENCY),
                PAYMENT_METHOD => (&mut fields.payment_method, PAYMENT_METHOD),
                DESCRIPTION => (&mut fields.description, DESCRIPTION),
                TYPE => (&mut fields.kind, TYPE),
                PAYMENT_IDEMPOTENCY_KEY => {
                    (&mut fields.payment_idempotency_key, PAYMENT_IDEMPOTENCY_KEY)
                }
                REASON => (&mut fields.reason, REASON),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            let value = map.next_value::<Value>()?;
            match slot {
                Slot::Absent => *slot = Slot::Present(value),
                Slot::Present(_) => {
                    fields.duplicate.get_or_insert(field);
                }
            }
        }
        Ok(Envelope::Object(fields))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Envelope, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Envelope::Other("an array"))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Envelope, E> {
        Ok(Envelope::Other("a boolean"))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Envelope, E> {
        Ok(Envelope::Other("a number"))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Envelope, E> {
        Ok(Envelope::Other("a number"))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Envelope, E> {
        Ok(Envelope::Other("a number"))
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Envelope, E> {
        Ok(Envelope::Other("a string"))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Envelope, E> {
        Ok(Envelope::Other("null"))
    }
}

/// Describes a JSON syntax error by position only: serde_json's own message could
/// quote part of the payload, which may hold a card number.
pub(super) fn malformed(error: &serde_json::Error) -> InvalidCommand {
    let problem = match error.classify() {
        serde_json::error::Category::Eof => "unexpected end of input",
        // Two of serde_json's syntax errors are about well-formed JSON the worker
        // will not read; their messages are fixed texts, quoting nothing.
        serde_json::error::Category::Syntax => {
            let message = error.to_string();
            if message.starts_with("number out of range") {
                "number out of range"
            } else if message.starts_with("recursion limit exceeded") {
                "nested more than 128 levels deep"
            } else {
                "syntax error"
            }
        }
        serde_json::error::Category::Data => "unreadable value",
        serde_json::error::Category::Io => "read error",
    };
    InvalidCommand::MalformedJson {
        problem,
        line: error.line(),
        column: error.column(),
    }
}

pub(super) fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub(super) fn required<'a>(
    slot: &'a Slot,
    field: &'static str,
) -> Result<&'a Value, InvalidCommand> {
    match slot {
        Slot::Absent => Err(InvalidCommand::MissingField { field }),
        Slot::Present(Value::Null) => Err(InvalidCommand::NullField { field }),
        Slot::Present(value) => Ok(value),
    }
}

pub(super) fn required_str<'a>(
    slot: &'a Slot,
    field: &'static str,
) -> Result<&'a str, InvalidCommand> {
    match required(slot, field)? {
        Value::String(s) => Ok(s.as_str()),
        other => Err(InvalidCommand::WrongType {
            field,
            expected: "a string",
            found: json_kind(other),
        }),
    }
}

/// serde_json (without `arbitrary_precision`) hands over an integer literal beyond
/// the u64/i64 range as an f64, the same as `19.99` or `1e3`. Such an integral
/// f64 of magnitude ≥ 2^63 can only be an overflowing integer (or a huge float),
/// so it is out of range; every other f64 had a fraction or an exponent.
const TWO_POW_63: f64 = 9_223_372_036_854_775_808_f64;

pub(super) fn amount_from_json(value: &Value) -> Result<i64, InvalidCommand> {
    let Value::Number(number) = value else {
        return Err(InvalidCommand::WrongType {
            field: AMOUNT_MINOR,
            expected: "an integer",
            found: json_kind(value),
        });
    };
    if let Some(amount) = number.as_i64() {
        return Ok(amount);
    }
    if number.as_u64().is_some() {
        return Err(InvalidCommand::AmountOutOfRange);
    }
    match number.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() >= TWO_POW_63 => {
            Err(InvalidCommand::AmountOutOfRange)
        }
        _ => Err(InvalidCommand::AmountNotInteger),
    }
}

/// The fields of a record value read once: every known field taken once and typed,
/// a known field given twice refused (JSON parsers disagree on which copy wins, and
/// what is charged or refunded must not depend on that).
pub(super) fn read_fields(payload: &[u8]) -> Result<Fields, InvalidCommand> {
    if payload.iter().all(u8::is_ascii_whitespace) {
        return Err(InvalidCommand::EmptyPayload);
    }
    let text = std::str::from_utf8(payload).map_err(|e| InvalidCommand::NotUtf8 {
        valid_up_to: e.valid_up_to(),
    })?;
    let fields = match serde_json::from_str::<Envelope>(text) {
        Ok(Envelope::Object(fields)) => fields,
        Ok(Envelope::Other(found)) => return Err(InvalidCommand::NotAnObject { found }),
        Err(e) => return Err(malformed(&e)),
    };
    match fields.duplicate {
        Some(field) => Err(InvalidCommand::DuplicateField { field }),
        None => Ok(fields),
    }
}

/// An optional string field: absent or `null` is `None`.
pub(super) fn optional_str<'a>(
    slot: &'a Slot,
    field: &'static str,
) -> Result<Option<&'a str>, InvalidCommand> {
    match slot {
        Slot::Absent | Slot::Present(Value::Null) => Ok(None),
        Slot::Present(Value::String(s)) => Ok(Some(s.as_str())),
        Slot::Present(other) => Err(InvalidCommand::WrongType {
            field,
            expected: "a string",
            found: json_kind(other),
        }),
    }
}
