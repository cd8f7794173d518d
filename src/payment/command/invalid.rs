//! Why a command is refused: one variant per rule, each with a stable code.

use super::{
    MAX_ACCOUNT_ID_LEN, MAX_AMOUNT_MINOR, MAX_DESCRIPTION_LEN, MAX_PAYMENT_METHOD_LEN,
    MIN_AMOUNT_MINOR,
};
use crate::token::InvalidKey;

pub(super) const IDEMPOTENCY_KEY: &str = "idempotency_key";
pub(super) const ACCOUNT_ID: &str = "account_id";
pub(super) const AMOUNT_MINOR: &str = "amount_minor";
pub(super) const CURRENCY: &str = "currency";
pub(super) const PAYMENT_METHOD: &str = "payment_method";
pub(super) const DESCRIPTION: &str = "description";
pub(super) const TYPE: &str = "type";
pub(super) const PAYMENT_IDEMPOTENCY_KEY: &str = "payment_idempotency_key";
pub(super) const REASON: &str = "reason";

/// What is wrong with a free-text field. Never carries the text itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TextProblem {
    #[error("is empty or blank")]
    Empty,
    #[error("is longer than {max} characters ({length})")]
    TooLong { length: usize, max: usize },
    #[error("contains a control character at position {position}")]
    ControlCharacter { position: usize },
    #[error("contains a character that shows as nothing at position {position}")]
    InvisibleCharacter { position: usize },
}

/// Why a command was refused. `Display` names the field and the rule, and never
/// contains the payment method or anything that looked like a card number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidCommand {
    /// The record has no value.
    #[error("payload is empty")]
    EmptyPayload,
    /// The value is not UTF-8.
    #[error("payload is not valid UTF-8 (first invalid byte at offset {valid_up_to})")]
    NotUtf8 {
        /// Bytes before the first invalid one.
        valid_up_to: usize,
    },
    /// The value is not JSON.
    #[error("payload is not well-formed JSON ({problem} at line {line}, column {column})")]
    MalformedJson {
        /// serde_json's category of the problem.
        problem: &'static str,
        /// Line of the problem (1-based).
        line: usize,
        /// Column of the problem (1-based).
        column: usize,
    },
    /// The value is JSON but not an object.
    #[error("payload must be a JSON object, found {found}")]
    NotAnObject {
        /// The JSON type found instead.
        found: &'static str,
    },
    /// A field appears twice.
    #[error("field `{field}` appears more than once")]
    DuplicateField {
        /// The field.
        field: &'static str,
    },
    /// A required field is absent.
    #[error("field `{field}` is missing")]
    MissingField {
        /// The field.
        field: &'static str,
    },
    /// A field is `null`.
    #[error("field `{field}` is null")]
    NullField {
        /// The field.
        field: &'static str,
    },
    /// A field has the wrong JSON type.
    #[error("field `{field}` must be {expected}, found {found}")]
    WrongType {
        /// The field.
        field: &'static str,
        /// The type it must have.
        expected: &'static str,
        /// The type it has.
        found: &'static str,
    },
    /// `idempotency_key` is not a valid key.
    #[error("{0}")]
    InvalidIdempotencyKey(InvalidKey),
    /// The record key or `idempotency_key` holds what looks like a card number: a
    /// key is echoed on every answer, logged and stored, so it may not be one.
    #[error("the key looks like a card number; it is only echoed masked, with x-key-hmac-sha256 (use an order or request id as the key)")]
    CardNumberAsKey,
    /// `account_id` is empty, too long or not printable.
    #[error("field `account_id` {0} (1 to {MAX_ACCOUNT_ID_LEN} characters)")]
    InvalidAccountId(TextProblem),
    /// `account_id` holds what looks like a card number.
    #[error("field `account_id` contains what looks like a card number; the value was discarded")]
    CardNumberInAccountId,
    /// `amount_minor` has a fraction or an exponent.
    #[error(
        "field `amount_minor` must be an integer number of minor units (no fraction, no exponent)"
    )]
    AmountNotInteger,
    /// `amount_minor` is outside the accepted range.
    #[error("field `amount_minor` must be between {MIN_AMOUNT_MINOR} and {MAX_AMOUNT_MINOR}")]
    AmountOutOfRange,
    /// `currency` is not three letters.
    #[error("field `currency` must be an ISO-4217 alpha-3 code: exactly three letters A-Z")]
    InvalidCurrencyFormat,
    /// `currency` is in lower case.
    #[error("field `currency` must be upper case ({currency:?}); ISO-4217 codes are")]
    CurrencyNotUpperCase {
        /// The code as sent.
        currency: String,
    },
    /// `currency` is no active ISO 4217 code.
    #[error("field `currency` {currency:?} is not an active ISO-4217 currency code")]
    UnknownCurrency {
        /// The code as sent.
        currency: String,
    },
    /// `currency` is a fund, metal or special code.
    #[error("field `currency` {currency:?} is an ISO-4217 fund, metal or special code, not a currency a payment can be made in")]
    CurrencyNotPayable {
        /// The code as sent.
        currency: String,
    },
    /// `payment_method` looks like a card number.
    #[error("field `payment_method` looks like a card number; send a tokenised reference instead (the value was discarded)")]
    CardNumberAsPaymentMethod,
    /// `payment_method` is empty, too long or not printable.
    #[error("field `payment_method` {0} (an opaque reference of 1 to {MAX_PAYMENT_METHOD_LEN} characters)")]
    InvalidPaymentMethod(TextProblem),
    /// `description` is too long.
    #[error("field `description` is longer than {MAX_DESCRIPTION_LEN} characters ({length})")]
    DescriptionTooLong {
        /// Its length in characters.
        length: usize,
    },
    /// `description` holds what looks like a card number.
    #[error("field `description` contains what looks like a card number; the value was discarded")]
    CardNumberInDescription,
    /// `description` holds a control character.
    #[error("field `description` contains a control character at position {position}")]
    DescriptionControlCharacter {
        /// Where (characters from the start).
        position: usize,
    },
    /// `type` names no command (the value is not echoed: it could be anything).
    #[error("field `type` must be \"charge\" or \"refund\" (absent: a charge)")]
    UnknownCommandType,
    /// A refund's `payment_idempotency_key` is not a valid key.
    #[error("field `payment_idempotency_key`: {0}")]
    InvalidPaymentKey(InvalidKey),
    /// A refund's `payment_idempotency_key` looks like a card number.
    #[error("field `payment_idempotency_key` looks like a card number; the value was discarded")]
    CardNumberAsPaymentKey,
    /// A refund names its own key as the payment it refunds.
    #[error(
        "field `payment_idempotency_key` must name the payment refunded, not the refund's own key"
    )]
    RefundOfItself,
    /// A refund's `reason` is too long.
    #[error("field `reason` is longer than {MAX_DESCRIPTION_LEN} characters ({length})")]
    ReasonTooLong {
        /// Its length in characters.
        length: usize,
    },
    /// A refund's `reason` holds what looks like a card number.
    #[error("field `reason` contains what looks like a card number; the value was discarded")]
    CardNumberInReason,
    /// A refund's `reason` holds a control character.
    #[error("field `reason` contains a control character at position {position}")]
    ReasonControlCharacter {
        /// Where (characters from the start).
        position: usize,
    },
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
            Self::CardNumberAsKey => "card_number_as_key",
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
            Self::UnknownCommandType => "unknown_command_type",
            Self::InvalidPaymentKey(_) => "invalid_payment_idempotency_key",
            Self::CardNumberAsPaymentKey => "card_number_as_payment_key",
            Self::RefundOfItself => "refund_of_itself",
            Self::ReasonTooLong { .. } => "reason_too_long",
            Self::CardNumberInReason => "card_number_in_reason",
            Self::ReasonControlCharacter { .. } => "reason_control_character",
        }
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
            Self::InvalidIdempotencyKey(_) | Self::CardNumberAsKey => Some(IDEMPOTENCY_KEY),
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
            Self::UnknownCommandType => Some(TYPE),
            Self::InvalidPaymentKey(_) | Self::CardNumberAsPaymentKey | Self::RefundOfItself => {
                Some(PAYMENT_IDEMPOTENCY_KEY)
            }
            Self::ReasonTooLong { .. }
            | Self::CardNumberInReason
            | Self::ReasonControlCharacter { .. } => Some(REASON),
        }
    }
}
