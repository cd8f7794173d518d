//! A payment command as it arrives on the commands topic (SPEC §4): parsed once,
//! validated completely, and from then on only handled as a [`PaymentCommand`].
//!
//! The payment method is treated as a credential reference. It lives in a private
//! field, `Debug` redacts it, and no error message ever contains it, so a command
//! (or a rejection) can be logged without leaking it. A value that looks like a
//! raw card number (PAN) is rejected outright: storing it would put the whole
//! system in PCI scope.

use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::gateway::ChargeRequest;
use crate::token::{IdempotencyKey, InvalidKey};

/// Longest `account_id` accepted, in characters.
pub const MAX_ACCOUNT_ID_LEN: usize = 64;
/// Smallest amount accepted, in minor units.
pub const MIN_AMOUNT_MINOR: i64 = 1;
/// Largest amount accepted, in minor units (ten billion in a two-decimal currency).
pub const MAX_AMOUNT_MINOR: i64 = 1_000_000_000_000;
/// Longest `payment_method` reference accepted, in characters.
pub const MAX_PAYMENT_METHOD_LEN: usize = 128;
/// Longest `description` accepted, in characters.
pub const MAX_DESCRIPTION_LEN: usize = 512;

/// A payment command that passed every rule of SPEC §4.
#[derive(Clone)]
pub struct PaymentCommand {
    pub idempotency_key: IdempotencyKey,
    pub account_id: String,
    pub amount_minor: i64,
    pub currency: String,
    payment_method: String,
    pub description: Option<String>,
}

impl fmt::Debug for PaymentCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PaymentCommand")
            .field("idempotency_key", &self.idempotency_key)
            .field("account_id", &self.account_id)
            .field("amount_minor", &self.amount_minor)
            .field("currency", &self.currency)
            .field("payment_method", &"<redacted>")
            .field("description", &self.description)
            .finish()
    }
}

/// Lowercase hex SHA-256 of the canonical (account_id, amount_minor, currency,
/// payment_method); see [`PaymentCommand::fingerprint`] for the encoding.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// Wraps a fingerprint read back from storage. Hex is case-insensitive, so the
    /// value is lower-cased to compare equal with a freshly computed one.
    pub fn from_hex(hex: String) -> Self {
        if hex.bytes().any(|b| b.is_ascii_uppercase()) {
            Self(hex.to_ascii_lowercase())
        } else {
            Self(hex)
        }
    }

    /// True for 64 hex digits, i.e. something [`PaymentCommand::fingerprint`] could
    /// have produced (storage may hold anything).
    pub fn is_well_formed(&self) -> bool {
        self.0.len() == 64 && self.0.bytes().all(|b| b.is_ascii_hexdigit())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What is wrong with a free-text field. Never carries the text itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TextProblem {
    #[error("is empty or blank")]
    Empty,
    #[error("is longer than {max} characters ({length})")]
    TooLong { length: usize, max: usize },
    #[error("contains a control character at position {position}")]
    ControlCharacter { position: usize },
}

/// Why a command was refused. `Display` names the field and the rule, and never
/// contains the payment method or anything that looked like a card number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidCommand {
    #[error("payload is empty")]
    EmptyPayload,
    #[error("payload is not valid UTF-8 (first invalid byte at offset {valid_up_to})")]
    NotUtf8 { valid_up_to: usize },
    #[error("payload is not well-formed JSON ({problem} at line {line}, column {column})")]
    MalformedJson {
        problem: &'static str,
        line: usize,
        column: usize,
    },
    #[error("payload must be a JSON object, found {found}")]
    NotAnObject { found: &'static str },
    #[error("field `{field}` appears more than once")]
    DuplicateField { field: &'static str },
    #[error("field `{field}` is missing")]
    MissingField { field: &'static str },
    #[error("field `{field}` is null")]
    NullField { field: &'static str },
    #[error("field `{field}` must be {expected}, found {found}")]
    WrongType {
        field: &'static str,
        expected: &'static str,
        found: &'static str,
    },
    #[error("{0}")]
    InvalidIdempotencyKey(InvalidKey),
    #[error("field `account_id` {0} (1 to {MAX_ACCOUNT_ID_LEN} characters)")]
    InvalidAccountId(TextProblem),
    #[error("field `account_id` contains what looks like a card number; the value was discarded")]
    CardNumberInAccountId,
    #[error(
        "field `amount_minor` must be an integer number of minor units (no fraction, no exponent)"
    )]
    AmountNotInteger,
    #[error("field `amount_minor` must be between {MIN_AMOUNT_MINOR} and {MAX_AMOUNT_MINOR}")]
    AmountOutOfRange,
    #[error("field `currency` must be an ISO-4217 alpha-3 code: exactly three letters A-Z")]
    InvalidCurrencyFormat,
    #[error("field `currency` must be upper case ({currency:?}); ISO-4217 codes are")]
    CurrencyNotUpperCase { currency: String },
    #[error("field `currency` {currency:?} is not an active ISO-4217 currency code")]
    UnknownCurrency { currency: String },
    #[error("field `currency` {currency:?} is an ISO-4217 fund, metal or special code, not a currency a payment can be made in")]
    CurrencyNotPayable { currency: String },
    #[error("field `payment_method` looks like a card number; send a tokenised reference instead (the value was discarded)")]
    CardNumberAsPaymentMethod,
    #[error("field `payment_method` {0} (an opaque reference of 1 to {MAX_PAYMENT_METHOD_LEN} characters)")]
    InvalidPaymentMethod(TextProblem),
    #[error("field `description` is longer than {MAX_DESCRIPTION_LEN} characters ({length})")]
    DescriptionTooLong { length: usize },
    #[error("field `description` contains what looks like a card number; the value was discarded")]
    CardNumberInDescription,
    #[error("field `description` contains a control character at position {position}")]
    DescriptionControlCharacter { position: usize },
}

impl InvalidCommand {
    /// A stable, specific, machine-readable reason (`x-error-reason` prefix).
    pub fn code(&self) -> &'static str {
        match self {
            Self::EmptyPayload => "empty_payload",
            Self::NotUtf8 { .. } => "not_utf8",
            Self::MalformedJson { .. } => "malformed_json",
            Self::NotAnObject { .. } => "not_an_object",
            Self::DuplicateField { .. } => "duplicate_field",
            Self::MissingField { .. } => "missing_field",
            Self::NullField { .. } => "null_field",
            Self::WrongType { .. } => "wrong_type",
            Self::InvalidIdempotencyKey(_) => "invalid_idempotency_key",
            Self::InvalidAccountId(_) => "invalid_account_id",
            Self::CardNumberInAccountId => "card_number_in_account_id",
            Self::AmountNotInteger => "amount_not_integer",
            Self::AmountOutOfRange => "amount_out_of_range",
            Self::InvalidCurrencyFormat => "invalid_currency_format",
            Self::CurrencyNotUpperCase { .. } => "currency_not_upper_case",
            Self::UnknownCurrency { .. } => "unknown_currency",
            Self::CurrencyNotPayable { .. } => "currency_not_payable",
            Self::CardNumberAsPaymentMethod => "card_number_as_payment_method",
            Self::InvalidPaymentMethod(_) => "invalid_payment_method",
            Self::DescriptionTooLong { .. } => "description_too_long",
            Self::CardNumberInDescription => "card_number_in_description",
            Self::DescriptionControlCharacter { .. } => "description_control_character",
        }
    }

    /// Whether the command was refused for carrying a card-number-like value, so
    /// every copy of it (dead letter included) must be masked.
    pub fn holds_card_number(&self) -> bool {
        matches!(
            self,
            Self::CardNumberInAccountId
                | Self::CardNumberAsPaymentMethod
                | Self::CardNumberInDescription
        )
    }

    /// The offending field, when the problem is with one field.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            Self::EmptyPayload
            | Self::NotUtf8 { .. }
            | Self::MalformedJson { .. }
            | Self::NotAnObject { .. } => None,
            Self::DuplicateField { field }
            | Self::MissingField { field }
            | Self::NullField { field }
            | Self::WrongType { field, .. } => Some(*field),
            Self::InvalidIdempotencyKey(_) => Some(IDEMPOTENCY_KEY),
            Self::InvalidAccountId(_) | Self::CardNumberInAccountId => Some(ACCOUNT_ID),
            Self::AmountNotInteger | Self::AmountOutOfRange => Some(AMOUNT_MINOR),
            Self::InvalidCurrencyFormat
            | Self::CurrencyNotUpperCase { .. }
            | Self::UnknownCurrency { .. }
            | Self::CurrencyNotPayable { .. } => Some(CURRENCY),
            Self::CardNumberAsPaymentMethod | Self::InvalidPaymentMethod(_) => Some(PAYMENT_METHOD),
            Self::DescriptionTooLong { .. }
            | Self::CardNumberInDescription
            | Self::DescriptionControlCharacter { .. } => Some(DESCRIPTION),
        }
    }
}

impl PaymentCommand {
    /// Parses a Kafka record value. Unknown fields are ignored; a known field given
    /// twice is refused, since JSON parsers disagree on which copy wins and the
    /// amount charged must not depend on that.
    pub fn parse(payload: &[u8]) -> Result<Self, InvalidCommand> {
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
        if let Some(field) = fields.duplicate {
            return Err(InvalidCommand::DuplicateField { field });
        }

        let key = required_str(&fields.idempotency_key, IDEMPOTENCY_KEY)?;
        let account_id = required_str(&fields.account_id, ACCOUNT_ID)?;
        let amount_minor = amount_from_json(required(&fields.amount_minor, AMOUNT_MINOR)?)?;
        let currency = required_str(&fields.currency, CURRENCY)?;
        let payment_method = required_str(&fields.payment_method, PAYMENT_METHOD)?;
        // Optional means absent or null.
        let description = match &fields.description {
            Slot::Absent | Slot::Present(Value::Null) => None,
            Slot::Present(Value::String(s)) => Some(s.as_str()),
            Slot::Present(other) => {
                return Err(InvalidCommand::WrongType {
                    field: DESCRIPTION,
                    expected: "a string",
                    found: json_kind(other),
                })
            }
        };
        Self::new(
            key,
            account_id,
            amount_minor,
            currency,
            payment_method,
            description,
        )
    }

    /// Builds a command from its parts with the same rules as [`Self::parse`]
    /// (workload generators use it so they cannot publish what a worker refuses).
    pub fn new(
        idempotency_key: &str,
        account_id: &str,
        amount_minor: i64,
        currency: &str,
        payment_method: &str,
        description: Option<&str>,
    ) -> Result<Self, InvalidCommand> {
        let idempotency_key = IdempotencyKey::try_from(idempotency_key)
            .map_err(InvalidCommand::InvalidIdempotencyKey)?;
        validate_account_id(account_id)?;
        validate_amount(amount_minor)?;
        validate_currency(currency)?;
        validate_payment_method(payment_method)?;
        if let Some(description) = description {
            validate_description(description)?;
        }
        Ok(Self {
            idempotency_key,
            account_id: account_id.to_owned(),
            amount_minor,
            currency: currency.to_owned(),
            payment_method: payment_method.to_owned(),
            description: description.map(str::to_owned),
        })
    }

    /// The opaque payment-method reference. Pass it to the gateway; never log it.
    pub fn payment_method(&self) -> &str {
        &self.payment_method
    }

    /// SHA-256 over a canonical encoding of what is charged: who, how much, in
    /// which currency, with what. The description is deliberately left out, so a
    /// redelivery with an edited description is still recognised as the same
    /// request.
    ///
    /// Encoding (version 1): the domain tag `payment-worker/fingerprint/v1`, then
    /// account_id, amount_minor (as its decimal ASCII digits), currency and
    /// payment_method, each preceded by its UTF-8 byte length as a 4-byte
    /// big-endian integer. The length prefixes make the encoding injective: no two
    /// different tuples produce the same bytes (unlike plain concatenation, where
    /// ("ab","c") and ("a","bc") would collide). Changing it changes every stored
    /// fingerprint, so a new encoding needs a new version tag and a migration.
    pub fn fingerprint(&self) -> Fingerprint {
        let mut hasher = Sha256::new();
        let amount = self.amount_minor.to_string();
        for part in [
            FINGERPRINT_DOMAIN,
            self.account_id.as_str(),
            amount.as_str(),
            self.currency.as_str(),
            self.payment_method.as_str(),
        ] {
            // Every part is bounded far below u32::MAX by validation.
            let length = u32::try_from(part.len()).unwrap_or(u32::MAX);
            hasher.update(length.to_be_bytes());
            hasher.update(part.as_bytes());
        }
        Fingerprint(hex::encode(hasher.finalize()))
    }

    pub fn charge_request(&self) -> ChargeRequest {
        ChargeRequest {
            amount_minor: self.amount_minor,
            currency: self.currency.clone(),
            payment_method: self.payment_method.clone(),
        }
    }
}

const FINGERPRINT_DOMAIN: &str = "payment-worker/fingerprint/v1";

const IDEMPOTENCY_KEY: &str = "idempotency_key";
const ACCOUNT_ID: &str = "account_id";
const AMOUNT_MINOR: &str = "amount_minor";
const CURRENCY: &str = "currency";
const PAYMENT_METHOD: &str = "payment_method";
const DESCRIPTION: &str = "description";

// ---------------------------------------------------------------------------
// JSON envelope: one pass that tells "not an object", missing, null, wrong type
// and duplicated fields apart, and skips unknown fields without building them.

#[derive(Default)]
enum Slot {
    #[default]
    Absent,
    Present(Value),
}

#[derive(Default)]
struct Fields {
    idempotency_key: Slot,
    account_id: Slot,
    amount_minor: Slot,
    currency: Slot,
    payment_method: Slot,
    description: Slot,
    duplicate: Option<&'static str>,
}

enum Envelope {
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
fn malformed(error: &serde_json::Error) -> InvalidCommand {
    let problem = match error.classify() {
        serde_json::error::Category::Eof => "unexpected end of input",
        serde_json::error::Category::Syntax => "syntax error",
        serde_json::error::Category::Data => "unreadable value",
        serde_json::error::Category::Io => "read error",
    };
    InvalidCommand::MalformedJson {
        problem,
        line: error.line(),
        column: error.column(),
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn required<'a>(slot: &'a Slot, field: &'static str) -> Result<&'a Value, InvalidCommand> {
    match slot {
        Slot::Absent => Err(InvalidCommand::MissingField { field }),
        Slot::Present(Value::Null) => Err(InvalidCommand::NullField { field }),
        Slot::Present(value) => Ok(value),
    }
}

fn required_str<'a>(slot: &'a Slot, field: &'static str) -> Result<&'a str, InvalidCommand> {
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

fn amount_from_json(value: &Value) -> Result<i64, InvalidCommand> {
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

fn validate_amount(amount_minor: i64) -> Result<(), InvalidCommand> {
    if (MIN_AMOUNT_MINOR..=MAX_AMOUNT_MINOR).contains(&amount_minor) {
        Ok(())
    } else {
        Err(InvalidCommand::AmountOutOfRange)
    }
}

fn check_text(value: &str, max: usize) -> Result<(), TextProblem> {
    if value.trim().is_empty() {
        return Err(TextProblem::Empty);
    }
    let length = value.chars().count();
    if length > max {
        return Err(TextProblem::TooLong { length, max });
    }
    if let Some(position) = value.chars().position(char::is_control) {
        return Err(TextProblem::ControlCharacter { position });
    }
    Ok(())
}

fn validate_account_id(account_id: &str) -> Result<(), InvalidCommand> {
    check_text(account_id, MAX_ACCOUNT_ID_LEN).map_err(InvalidCommand::InvalidAccountId)?;
    if contains_card_number(account_id) {
        return Err(InvalidCommand::CardNumberInAccountId);
    }
    Ok(())
}

fn validate_currency(currency: &str) -> Result<(), InvalidCommand> {
    let bytes = currency.as_bytes();
    if bytes.len() != 3 || !bytes.iter().all(u8::is_ascii_alphabetic) {
        return Err(InvalidCommand::InvalidCurrencyFormat);
    }
    if !bytes.iter().all(u8::is_ascii_uppercase) {
        return Err(InvalidCommand::CurrencyNotUpperCase {
            currency: currency.to_owned(),
        });
    }
    if ISO_4217_CURRENCIES.binary_search(&currency).is_ok() {
        return Ok(());
    }
    if ISO_4217_NOT_PAYABLE.binary_search(&currency).is_ok() {
        return Err(InvalidCommand::CurrencyNotPayable {
            currency: currency.to_owned(),
        });
    }
    Err(InvalidCommand::UnknownCurrency {
        currency: currency.to_owned(),
    })
}

fn validate_payment_method(payment_method: &str) -> Result<(), InvalidCommand> {
    // Card check first: whatever else is wrong, a PAN must be named as such so the
    // producer learns to stop sending it.
    if contains_card_number(payment_method) {
        return Err(InvalidCommand::CardNumberAsPaymentMethod);
    }
    check_text(payment_method, MAX_PAYMENT_METHOD_LEN).map_err(InvalidCommand::InvalidPaymentMethod)
}

fn validate_description(description: &str) -> Result<(), InvalidCommand> {
    let length = description.chars().count();
    if length > MAX_DESCRIPTION_LEN {
        return Err(InvalidCommand::DescriptionTooLong { length });
    }
    if contains_card_number(description) {
        return Err(InvalidCommand::CardNumberInDescription);
    }
    // Postgres cannot store a NUL, and logs must not carry terminal escapes.
    if let Some(position) = description.chars().position(char::is_control) {
        return Err(InvalidCommand::DescriptionControlCharacter { position });
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Card numbers (PANs): 13–19 digits passing the Luhn check, written either as one
// run of digits or in groups separated by single spaces or dashes
// ("4111 1111 1111 1111", "4111-1111-1111-1111"), alone or inside a longer value
// ("card:4111111111111111"). Any run of consecutive groups is tried, so a PAN
// followed by more digits ("4111 1111 1111 1111 123") is still caught. A single
// unbroken run longer than 19 digits is not a PAN (it is some other identifier).

/// Luhn mod-10 check over ASCII digit values (0–9).
fn luhn_valid(digits: &[u8]) -> bool {
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &d)| {
            let d = u32::from(d);
            if i % 2 == 1 {
                let doubled = d * 2;
                if doubled > 9 {
                    doubled - 9
                } else {
                    doubled
                }
            } else {
                d
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

/// One stretch of digit groups; `groups` holds the end offset of each group in
/// `digits`.
#[derive(Default)]
struct DigitRun {
    digits: Vec<u8>,
    groups: Vec<usize>,
}

impl DigitRun {
    fn looks_like_card(&self) -> bool {
        let starts = std::iter::once(0).chain(self.groups.iter().copied());
        for (first, start) in starts.enumerate().take(self.groups.len()) {
            for &end in &self.groups[first..] {
                let length = end - start;
                if length > 19 {
                    break;
                }
                if length >= 13 && luhn_valid(&self.digits[start..end]) {
                    return true;
                }
            }
        }
        false
    }

    fn clear(&mut self) {
        self.digits.clear();
        self.groups.clear();
    }
}

fn contains_card_number(value: &str) -> bool {
    // Cheap exit: most references hold far fewer than 13 digits.
    if value.bytes().filter(u8::is_ascii_digit).count() < 13 {
        return false;
    }
    let mut run = DigitRun::default();
    let mut after_separator = false;
    for c in value.chars() {
        if c.is_ascii_digit() {
            run.digits.push(c as u8 - b'0');
            after_separator = false;
            continue;
        }
        let is_separator = c == ' ' || c == '-';
        if !run.digits.is_empty() && !after_separator {
            // The group that just ended.
            run.groups.push(run.digits.len());
        }
        if is_separator && !run.digits.is_empty() && !after_separator {
            after_separator = true;
            continue;
        }
        if run.looks_like_card() {
            return true;
        }
        run.clear();
        after_separator = false;
    }
    if !run.digits.is_empty() && !after_separator {
        run.groups.push(run.digits.len());
    }
    run.looks_like_card()
}

/// `value` with the digits of every card-number-like run replaced by `*`, all but
/// the last four (separators kept): "4111 1111 1111 1111" → "**** **** **** 1111".
/// Runs are found exactly as [`contains_card_number`] finds them.
pub fn mask_card_numbers(value: &str) -> std::borrow::Cow<'_, str> {
    if !contains_card_number(value) {
        return std::borrow::Cow::Borrowed(value);
    }
    fn flush(out: &mut String, pending: &str, run: &DigitRun) {
        if !run.looks_like_card() {
            out.push_str(pending);
            return;
        }
        let keep_from = run.digits.len().saturating_sub(4);
        let mut seen = 0;
        for c in pending.chars() {
            if c.is_ascii_digit() {
                out.push(if seen < keep_from { '*' } else { c });
                seen += 1;
            } else {
                out.push(c);
            }
        }
    }
    let mut out = String::with_capacity(value.len());
    let mut pending = String::new();
    let mut run = DigitRun::default();
    let mut after_separator = false;
    for c in value.chars() {
        if c.is_ascii_digit() {
            run.digits.push(c as u8 - b'0');
            pending.push(c);
            after_separator = false;
            continue;
        }
        let is_separator = c == ' ' || c == '-';
        if !run.digits.is_empty() && !after_separator {
            run.groups.push(run.digits.len());
        }
        if is_separator && !run.digits.is_empty() && !after_separator {
            after_separator = true;
            pending.push(c);
            continue;
        }
        flush(&mut out, &pending, &run);
        pending.clear();
        run.clear();
        after_separator = false;
        out.push(c);
    }
    if !run.digits.is_empty() && !after_separator {
        run.groups.push(run.digits.len());
    }
    flush(&mut out, &pending, &run);
    std::borrow::Cow::Owned(out)
}

/// What may be kept of a record value refused for holding a card number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedactedPayload {
    /// The value with every card-number-like run masked.
    Masked(Vec<u8>),
    /// The value hid a card number where masking the text cannot reach it (JSON
    /// `\u` escapes, or not UTF-8): nothing of it may be kept.
    Dropped,
}

/// Masks the card numbers in a record value, and checks that none survives in
/// the JSON strings it decodes to.
pub fn redact_payload(payload: &[u8]) -> RedactedPayload {
    let Ok(text) = std::str::from_utf8(payload) else {
        return RedactedPayload::Dropped;
    };
    let masked = mask_card_numbers(text).into_owned();
    let still_there = serde_json::from_str::<Value>(&masked)
        .map(|value| json_strings_hold_card(&value))
        .unwrap_or(false);
    if still_there {
        RedactedPayload::Dropped
    } else {
        RedactedPayload::Masked(masked.into_bytes())
    }
}

fn json_strings_hold_card(value: &Value) -> bool {
    match value {
        Value::String(text) => contains_card_number(text),
        Value::Array(items) => items.iter().any(json_strings_hold_card),
        Value::Object(fields) => fields
            .iter()
            .any(|(name, item)| contains_card_number(name) || json_strings_hold_card(item)),
        _ => false,
    }
}

// ---------------------------------------------------------------------------
// ISO 4217 list one (current codes), kept sorted for binary search. Withdrawn codes
// (HRK, SLL, ZWL, VEF, MRO, STD, BYR, LTL, LVL, …) are not in it; codes in a
// published transition period (ANG → XCG, BGN) are. Update with each ISO 4217
// amendment.

/// Currencies a payment can be made in.
const ISO_4217_CURRENCIES: &[&str] = &[
    "AED", "AFN", "ALL", "AMD", "ANG", "AOA", "ARS", "AUD", "AWG", "AZN", "BAM", "BBD", "BDT",
    "BGN", "BHD", "BIF", "BMD", "BND", "BOB", "BRL", "BSD", "BTN", "BWP", "BYN", "BZD", "CAD",
    "CDF", "CHF", "CLP", "CNY", "COP", "CRC", "CUC", "CUP", "CVE", "CZK", "DJF", "DKK", "DOP",
    "DZD", "EGP", "ERN", "ETB", "EUR", "FJD", "FKP", "GBP", "GEL", "GHS", "GIP", "GMD", "GNF",
    "GTQ", "GYD", "HKD", "HNL", "HTG", "HUF", "IDR", "ILS", "INR", "IQD", "IRR", "ISK", "JMD",
    "JOD", "JPY", "KES", "KGS", "KHR", "KMF", "KPW", "KRW", "KWD", "KYD", "KZT", "LAK", "LBP",
    "LKR", "LRD", "LSL", "LYD", "MAD", "MDL", "MGA", "MKD", "MMK", "MNT", "MOP", "MRU", "MUR",
    "MVR", "MWK", "MXN", "MYR", "MZN", "NAD", "NGN", "NIO", "NOK", "NPR", "NZD", "OMR", "PAB",
    "PEN", "PGK", "PHP", "PKR", "PLN", "PYG", "QAR", "RON", "RSD", "RUB", "RWF", "SAR", "SBD",
    "SCR", "SDG", "SEK", "SGD", "SHP", "SLE", "SOS", "SRD", "SSP", "STN", "SVC", "SYP", "SZL",
    "THB", "TJS", "TMT", "TND", "TOP", "TRY", "TTD", "TWD", "TZS", "UAH", "UGX", "USD", "UYU",
    "UZS", "VED", "VES", "VND", "VUV", "WST", "XAF", "XCD", "XCG", "XOF", "XPF", "YER", "ZAR",
    "ZMW", "ZWG",
];

/// Active list-one codes that are not money a customer pays in: funds (BOV, CHE,
/// CHW, CLF, COU, MXV, USN, UYI, UYW), precious metals, bond-market units, SDR,
/// SUCRE, ADB unit, the testing code XTS and "no currency" XXX.
const ISO_4217_NOT_PAYABLE: &[&str] = &[
    "BOV", "CHE", "CHW", "CLF", "COU", "MXV", "USN", "UYI", "UYW", "XAG", "XAU", "XBA", "XBB",
    "XBC", "XBD", "XDR", "XPD", "XPT", "XSU", "XTS", "XUA", "XXX",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masking_keeps_the_last_four_digits_of_each_card_number_and_nothing_else() {
        assert_eq!(
            mask_card_numbers("paid with 4111-1111-1111-1111 ok"),
            "paid with ****-****-****-1111 ok"
        );
        assert_eq!(mask_card_numbers("4111111111111111"), "************1111");
        assert_eq!(
            mask_card_numbers("a 5555 5555 5555 4444 b 4012888888881881"),
            "a **** **** **** 4444 b ************1881"
        );
        // Not a card: fewer digits, or a Luhn failure.
        assert_eq!(
            mask_card_numbers("order 12345 of 2026"),
            "order 12345 of 2026"
        );
        assert_eq!(mask_card_numbers("4111111111111112"), "4111111111111112");
    }

    #[test]
    fn a_redacted_payload_holds_no_card_number_even_behind_json_escapes() {
        let plain = br#"{"payment_method":"4111111111111111","amount_minor":5}"#;
        let RedactedPayload::Masked(masked) = redact_payload(plain) else {
            panic!("plain digits can be masked");
        };
        assert_eq!(
            masked,
            br#"{"payment_method":"************1111","amount_minor":5}"#.to_vec()
        );
        let escaped = br#"{"payment_method":"\u0034111111111111111"}"#;
        assert_eq!(redact_payload(escaped), RedactedPayload::Dropped);
        assert_eq!(
            redact_payload(b"\xff4111111111111111"),
            RedactedPayload::Dropped
        );
    }

    const VALID: &str = r#"{"idempotency_key":"ord-2026-000123","account_id":"acct_42","amount_minor":1999,"currency":"USD","payment_method":"pm_card_visa","description":"optional"}"#;

    fn with(field: &str, raw_value: &str) -> String {
        let mut map: serde_json::Map<String, Value> = serde_json::from_str(VALID).unwrap();
        map.insert(field.to_owned(), serde_json::from_str(raw_value).unwrap());
        serde_json::to_string(&map).unwrap()
    }

    fn without(field: &str) -> String {
        let mut map: serde_json::Map<String, Value> = serde_json::from_str(VALID).unwrap();
        map.remove(field);
        serde_json::to_string(&map).unwrap()
    }

    fn valid_with_amount(raw: &str) -> String {
        VALID.replace("1999", raw)
    }

    #[test]
    fn currency_tables_are_sorted_and_disjoint() {
        for table in [ISO_4217_CURRENCIES, ISO_4217_NOT_PAYABLE] {
            assert!(table.windows(2).all(|w| w[0] < w[1]), "table not sorted");
            assert!(table
                .iter()
                .all(|c| c.len() == 3 && c.bytes().all(|b| b.is_ascii_uppercase())));
        }
        for code in ISO_4217_NOT_PAYABLE {
            assert!(ISO_4217_CURRENCIES.binary_search(code).is_err(), "{code}");
        }
    }

    #[test]
    fn invalid_payloads_have_exact_codes() {
        let long_key = "k".repeat(129);
        let long_account = "a".repeat(65);
        let long_pm = "p".repeat(129);
        let long_description = "d".repeat(513);
        let b = |s: &dyn AsRef<[u8]>| s.as_ref().to_vec();
        #[rustfmt::skip]
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("empty", b(b""), "empty_payload"),
            ("whitespace only", b(b" \n\t "), "empty_payload"),
            ("latin-1 byte", b(b"{\"a\":\"\xe9\"}"), "not_utf8"),
            ("truncated utf-8", b(b"{\"a\":\"\xe2\x82\"}"), "not_utf8"),
            ("truncated json", b(b"{\"idempotency_key\":"), "malformed_json"),
            ("trailing garbage", b(&format!("{VALID}x")), "malformed_json"),
            ("two objects", b(&format!("{VALID}{VALID}")), "malformed_json"),
            ("single quotes", b(b"{'a':1}"), "malformed_json"),
            ("trailing comma", b(b"{\"a\":1,}"), "malformed_json"),
            ("utf-8 bom", b(&format!("\u{feff}{VALID}")), "malformed_json"),
            ("array", b(b"[1,2]"), "not_an_object"),
            ("string", b(b"\"hello\""), "not_an_object"),
            ("number", b(b"42"), "not_an_object"),
            ("null", b(b"null"), "not_an_object"),
            ("boolean", b(b"true"), "not_an_object"),
            ("empty object", b(b"{}"), "missing_field"),
            ("duplicate amount", b(&VALID.replace("\"amount_minor\":1999", "\"amount_minor\":1,\"amount_minor\":1999")), "duplicate_field"),
            ("missing key", b(&without("idempotency_key")), "missing_field"),
            ("missing account", b(&without("account_id")), "missing_field"),
            ("missing amount", b(&without("amount_minor")), "missing_field"),
            ("missing currency", b(&without("currency")), "missing_field"),
            ("missing pm", b(&without("payment_method")), "missing_field"),
            ("null key", b(&with("idempotency_key", "null")), "null_field"),
            ("null amount", b(&with("amount_minor", "null")), "null_field"),
            ("null pm", b(&with("payment_method", "null")), "null_field"),
            ("numeric key", b(&with("idempotency_key", "123")), "wrong_type"),
            ("object account", b(&with("account_id", "{}")), "wrong_type"),
            ("string amount", b(&with("amount_minor", "\"1999\"")), "wrong_type"),
            ("bool amount", b(&with("amount_minor", "true")), "wrong_type"),
            ("array currency", b(&with("currency", "[\"USD\"]")), "wrong_type"),
            ("numeric pm", b(&with("payment_method", "4111")), "wrong_type"),
            ("numeric description", b(&with("description", "7")), "wrong_type"),
            ("empty key", b(&with("idempotency_key", "\"\"")), "invalid_idempotency_key"),
            ("key with space", b(&with("idempotency_key", "\"a b\"")), "invalid_idempotency_key"),
            ("key with hash tag", b(&with("idempotency_key", "\"{x}\"")), "invalid_idempotency_key"),
            ("key too long", b(&with("idempotency_key", &format!("\"{long_key}\""))), "invalid_idempotency_key"),
            ("empty account", b(&with("account_id", "\"\"")), "invalid_account_id"),
            ("blank account", b(&with("account_id", "\"   \"")), "invalid_account_id"),
            ("account too long", b(&with("account_id", &format!("\"{long_account}\""))), "invalid_account_id"),
            ("account with newline", b(&with("account_id", "\"a\\nb\"")), "invalid_account_id"),
            ("pan in account", b(&with("account_id", "\"acct 4111111111111111\"")), "card_number_in_account_id"),
            ("float amount", b(&valid_with_amount("19.99")), "amount_not_integer"),
            ("exponent amount", b(&valid_with_amount("1e3")), "amount_not_integer"),
            ("integral float amount", b(&valid_with_amount("1000.0")), "amount_not_integer"),
            ("negative fraction", b(&valid_with_amount("-0.5")), "amount_not_integer"),
            ("zero amount", b(&valid_with_amount("0")), "amount_out_of_range"),
            ("negative amount", b(&valid_with_amount("-5")), "amount_out_of_range"),
            ("amount over max", b(&valid_with_amount("1000000000001")), "amount_out_of_range"),
            ("amount over i64", b(&valid_with_amount("9223372036854775808")), "amount_out_of_range"),
            ("amount over u64", b(&valid_with_amount("100000000000000000000000")), "amount_out_of_range"),
            ("amount under i64", b(&valid_with_amount("-100000000000000000000000")), "amount_out_of_range"),
            ("lower-case currency", b(&with("currency", "\"usd\"")), "currency_not_upper_case"),
            ("mixed-case currency", b(&with("currency", "\"Usd\"")), "currency_not_upper_case"),
            ("unknown currency", b(&with("currency", "\"XYZ\"")), "unknown_currency"),
            ("withdrawn currency", b(&with("currency", "\"HRK\"")), "unknown_currency"),
            ("two-letter currency", b(&with("currency", "\"US\"")), "invalid_currency_format"),
            ("four-letter currency", b(&with("currency", "\"USDT\"")), "invalid_currency_format"),
            ("numeric currency code", b(&with("currency", "\"840\"")), "invalid_currency_format"),
            ("empty currency", b(&with("currency", "\"\"")), "invalid_currency_format"),
            ("gold", b(&with("currency", "\"XAU\"")), "currency_not_payable"),
            ("testing code", b(&with("currency", "\"XTS\"")), "currency_not_payable"),
            ("pan", b(&with("payment_method", "\"4111111111111111\"")), "card_number_as_payment_method"),
            ("pan with spaces", b(&with("payment_method", "\"4111 1111 1111 1111\"")), "card_number_as_payment_method"),
            ("pan with dashes", b(&with("payment_method", "\"5500-0000-0000-0004\"")), "card_number_as_payment_method"),
            ("amex pan", b(&with("payment_method", "\"378282246310005\"")), "card_number_as_payment_method"),
            ("19-digit pan", b(&with("payment_method", "\"6222020000000000000\"")), "card_number_as_payment_method"),
            ("embedded pan", b(&with("payment_method", "\"card:4242424242424242\"")), "card_number_as_payment_method"),
            ("pan plus cvv", b(&with("payment_method", "\"4242 4242 4242 4242 123\"")), "card_number_as_payment_method"),
            ("empty pm", b(&with("payment_method", "\"\"")), "invalid_payment_method"),
            ("pm too long", b(&with("payment_method", &format!("\"{long_pm}\""))), "invalid_payment_method"),
            ("pm with tab", b(&with("payment_method", "\"pm\\tcard\"")), "invalid_payment_method"),
            ("description too long", b(&with("description", &format!("\"{long_description}\""))), "description_too_long"),
            ("pan in description", b(&with("description", "\"paid with 4111-1111-1111-1111\"")), "card_number_in_description"),
        ];
        assert!(cases.len() >= 30);
        let mut seen = std::collections::HashSet::new();
        for (name, payload, code) in &cases {
            assert!(
                seen.insert(payload.clone()),
                "duplicate payload in case {name}"
            );
            match PaymentCommand::parse(payload) {
                Ok(_) => panic!("case {name}: accepted, expected {code}"),
                Err(e) => {
                    assert_eq!(e.code(), *code, "case {name}: {e}");
                    assert!(!e.to_string().is_empty());
                }
            }
        }
    }

    #[test]
    fn valid_payloads_are_accepted() {
        let cmd = PaymentCommand::parse(VALID.as_bytes()).unwrap();
        assert_eq!(cmd.idempotency_key.as_str(), "ord-2026-000123");
        assert_eq!(cmd.account_id, "acct_42");
        assert_eq!(cmd.amount_minor, 1999);
        assert_eq!(cmd.currency, "USD");
        assert_eq!(cmd.payment_method(), "pm_card_visa");
        assert_eq!(cmd.description.as_deref(), Some("optional"));

        let max = "1".repeat(128);
        let accepted = [
            without("description"),
            with("description", "null"),
            with("description", "\"\""),
            with("description", &format!("\"{}\"", "é".repeat(512))),
            with("unknown_field", "{\"nested\":[1,2,3]}"),
            with("amount_minor", "1"),
            with("amount_minor", "1000000000000"),
            with("currency", "\"JPY\""),
            with("currency", "\"XCG\""),
            with("account_id", &format!("\"{}\"", "ü".repeat(64))),
            with("payment_method", &format!("\"{}\"", "p".repeat(128))),
            with("idempotency_key", &format!("\"{max}\"")),
            // Digits that are not a PAN: too short, failing Luhn, or one long run.
            with("payment_method", "\"pm_123456789012\""),
            with("payment_method", "\"4111111111111112\""),
            with("payment_method", "\"tok_41111111111111111111111\""),
            format!("  {VALID}\n"),
        ];
        for payload in &accepted {
            if let Err(e) = PaymentCommand::parse(payload.as_bytes()) {
                panic!("{payload}: rejected with {}: {e}", e.code());
            }
        }
        let no_description = PaymentCommand::parse(without("description").as_bytes()).unwrap();
        assert_eq!(no_description.description, None);
    }

    #[test]
    fn new_applies_the_same_rules() {
        let ok = PaymentCommand::new("k-1", "acct", 100, "EUR", "pm_x", None).unwrap();
        assert_eq!(ok.payment_method(), "pm_x");
        let cases = [
            (
                PaymentCommand::new("", "acct", 100, "EUR", "pm_x", None),
                "invalid_idempotency_key",
            ),
            (
                PaymentCommand::new("k", "", 100, "EUR", "pm_x", None),
                "invalid_account_id",
            ),
            (
                PaymentCommand::new("k", "acct", 0, "EUR", "pm_x", None),
                "amount_out_of_range",
            ),
            (
                PaymentCommand::new("k", "acct", 100, "eur", "pm_x", None),
                "currency_not_upper_case",
            ),
            (
                PaymentCommand::new("k", "acct", 100, "XYZ", "pm_x", None),
                "unknown_currency",
            ),
            (
                PaymentCommand::new("k", "acct", 100, "EUR", "4111111111111111", None),
                "card_number_as_payment_method",
            ),
            (
                PaymentCommand::new("k", "acct", 100, "EUR", "pm", Some(&"x".repeat(513))),
                "description_too_long",
            ),
        ];
        for (result, code) in cases {
            assert_eq!(result.unwrap_err().code(), code);
        }
    }

    #[test]
    fn fingerprint_is_stable_and_covers_what_is_charged() {
        let base = PaymentCommand::new("k", "acct_42", 1999, "USD", "pm_card_visa", None).unwrap();
        let fp = base.fingerprint();
        assert_eq!(fp.as_str().len(), 64);
        assert!(fp.is_well_formed());
        assert!(fp
            .as_str()
            .bytes()
            .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase()));
        let again = PaymentCommand::new(
            "other-key",
            "acct_42",
            1999,
            "USD",
            "pm_card_visa",
            Some("x"),
        )
        .unwrap();
        assert_eq!(
            again.fingerprint(),
            fp,
            "key and description are not part of it"
        );
        let parsed = PaymentCommand::parse(VALID.as_bytes()).unwrap();
        assert_eq!(parsed.fingerprint(), fp);

        let variants = [
            PaymentCommand::new("k", "acct_43", 1999, "USD", "pm_card_visa", None).unwrap(),
            PaymentCommand::new("k", "acct_42", 2000, "USD", "pm_card_visa", None).unwrap(),
            PaymentCommand::new("k", "acct_42", 1999, "EUR", "pm_card_visa", None).unwrap(),
            PaymentCommand::new("k", "acct_42", 1999, "USD", "pm_card_mastercard", None).unwrap(),
            // Moving characters across a field boundary must not collide.
            PaymentCommand::new("k", "acct_4", 21999, "USD", "pm_card_visa", None).unwrap(),
            PaymentCommand::new("k", "acct_42", 1999, "USD", "pm_card_vis", None).unwrap(),
        ];
        let mut all = std::collections::HashSet::from([fp.clone()]);
        for variant in &variants {
            assert!(
                all.insert(variant.fingerprint()),
                "collision for {variant:?}"
            );
        }

        assert_eq!(Fingerprint::from_hex(fp.as_str().to_ascii_uppercase()), fp);
        assert!(!Fingerprint::from_hex("nope".into()).is_well_formed());
    }

    #[test]
    fn fingerprint_encoding_is_pinned() {
        let cmd = PaymentCommand::new("k", "a", 1, "USD", "p", None).unwrap();
        let mut bytes = Vec::new();
        for part in [FINGERPRINT_DOMAIN, "a", "1", "USD", "p"] {
            bytes.extend_from_slice(&(part.len() as u32).to_be_bytes());
            bytes.extend_from_slice(part.as_bytes());
        }
        assert_eq!(
            cmd.fingerprint().as_str(),
            hex::encode(Sha256::digest(&bytes))
        );
        // A literal, so that a change to the encoding (which would orphan every stored
        // fingerprint) cannot pass unnoticed.
        let sample = PaymentCommand::parse(VALID.as_bytes()).unwrap();
        assert_eq!(
            sample.fingerprint().as_str(),
            "d3df2c615938cfa3f48237a037f83b77d375ef2a3701296b22f087bc6a3bb491"
        );
    }

    #[test]
    fn card_numbers_never_appear_in_errors_or_debug() {
        let pans = [
            "4111111111111111",
            "4111 1111 1111 1111",
            "5500-0000-0000-0004",
            "378282246310005",
        ];
        for pan in pans {
            for field in ["payment_method", "account_id", "description"] {
                let payload = with(field, &serde_json::to_string(&format!("x {pan}")).unwrap());
                let err = PaymentCommand::parse(payload.as_bytes()).unwrap_err();
                let text = format!("{err} {err:?}");
                let digits_only: String = pan.chars().filter(char::is_ascii_digit).collect();
                assert!(!text.contains(pan), "{field}: {text}");
                assert!(!text.contains(&digits_only), "{field}: {text}");
                assert!(!text.contains("1111"), "{field}: {text}");
            }
        }
        // A PAN inside malformed JSON is not quoted back either.
        let broken = br#"{"payment_method":"4111111111111111" "#;
        let err = PaymentCommand::parse(broken).unwrap_err();
        assert_eq!(err.code(), "malformed_json");
        assert!(!format!("{err} {err:?}").contains("4111"));
        // Nor is an ordinary payment method.
        let cmd = PaymentCommand::parse(VALID.as_bytes()).unwrap();
        assert!(!format!("{cmd:?}").contains("pm_card_visa"));
        assert!(!format!("{:?}", cmd.charge_request()).contains("pm_card_visa"));
        let err = PaymentCommand::parse(with("payment_method", "\"pm\\u0000secret\"").as_bytes())
            .unwrap_err();
        assert!(!format!("{err} {err:?}").contains("secret"));
    }

    #[test]
    fn luhn_and_card_detection() {
        assert!(luhn_valid(&[
            4, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1
        ]));
        assert!(!luhn_valid(&[
            4, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2
        ]));
        assert!(contains_card_number("4111111111111111"));
        assert!(contains_card_number(
            "4111  1111 1111 1111 x 4111 1111 1111 1111"
        ));
        assert!(contains_card_number("x-4111-1111-1111-1111-"));
        assert!(
            !contains_card_number("4111  1111  1111  1111"),
            "double spaces break groups"
        );
        assert!(!contains_card_number("411111111111"), "12 digits");
        assert!(!contains_card_number("pm_card_visa"));
        assert!(!contains_card_number("ord-2026-000123"));
    }

    #[test]
    fn error_messages_name_the_field_and_rule() {
        let err = PaymentCommand::parse(with("currency", "\"usd\"").as_bytes()).unwrap_err();
        assert!(err.to_string().contains("currency") && err.to_string().contains("upper case"));
        let err = PaymentCommand::parse(with("currency", "\"XYZ\"").as_bytes()).unwrap_err();
        assert!(err.to_string().contains("XYZ") && err.to_string().contains("ISO-4217"));
        assert_eq!(err.field(), Some("currency"));
        let err = PaymentCommand::parse(without("amount_minor").as_bytes()).unwrap_err();
        assert_eq!(err.to_string(), "field `amount_minor` is missing");
        let err = PaymentCommand::parse(with("amount_minor", "\"5\"").as_bytes()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "field `amount_minor` must be an integer, found a string"
        );
    }
}
