//! A refund command: give back (part of) a booked charge, under a key of its own.

use std::fmt;

use sha2::{Digest, Sha256};

use super::card::contains_card_number;
use super::currency::validate_currency;
use super::envelope::{amount_from_json, optional_str, required, required_str, Fields};
use super::invalid::{AMOUNT_MINOR, CURRENCY, IDEMPOTENCY_KEY, PAYMENT_IDEMPOTENCY_KEY, REASON};
use super::payment_command::validate_amount;
use super::{Fingerprint, InvalidCommand, MAX_DESCRIPTION_LEN};
use crate::token::IdempotencyKey;

/// Domain tag of a refund's fingerprint: never equal to a charge's, so a refund
/// under a charge's key (or the reverse) is always a reused key.
const REFUND_FINGERPRINT_DOMAIN: &str = "payment-worker/refund-fingerprint/v1";

/// A refund that passed every rule of a command: `amount_minor` of the payment
/// booked under `payment_key` goes back, under the refund's own `idempotency_key`.
#[derive(Clone, PartialEq, Eq)]
pub struct RefundCommand {
    /// The refund's own key: every delivery of this refund carries it.
    pub idempotency_key: IdempotencyKey,
    /// The key of the payment refunded (`payment_idempotency_key`).
    pub payment_key: IdempotencyKey,
    /// Amount refunded, in minor units (at most what is left of the charge).
    pub amount_minor: i64,
    /// ISO 4217 code: must be the payment's.
    pub currency: String,
    /// Why, for the account holder; not part of the fingerprint.
    pub reason: Option<String>,
}

impl fmt::Debug for RefundCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RefundCommand")
            .field("idempotency_key", &self.idempotency_key)
            .field("payment_key", &self.payment_key)
            .field("amount_minor", &self.amount_minor)
            .field("currency", &self.currency)
            .finish_non_exhaustive()
    }
}

impl RefundCommand {
    /// The refund the fields of a record value describe.
    pub(super) fn from_fields(fields: &Fields) -> Result<Self, InvalidCommand> {
        let key = required_str(&fields.idempotency_key, IDEMPOTENCY_KEY)?;
        let payment_key = required_str(&fields.payment_idempotency_key, PAYMENT_IDEMPOTENCY_KEY)?;
        let amount_minor = amount_from_json(required(&fields.amount_minor, AMOUNT_MINOR)?)?;
        let currency = required_str(&fields.currency, CURRENCY)?;
        let reason = optional_str(&fields.reason, REASON)?;
        Self::new(key, payment_key, amount_minor, currency, reason)
    }

    /// Builds a refund from its parts with the same rules as a record's (workload
    /// generators use it so they cannot publish what a worker refuses).
    pub fn new(
        idempotency_key: &str,
        payment_key: &str,
        amount_minor: i64,
        currency: &str,
        reason: Option<&str>,
    ) -> Result<Self, InvalidCommand> {
        let idempotency_key = IdempotencyKey::try_from(idempotency_key)
            .map_err(InvalidCommand::InvalidIdempotencyKey)?;
        if crate::redaction::holds_card_number(idempotency_key.as_str().as_bytes()) {
            return Err(InvalidCommand::CardNumberAsKey);
        }
        let payment_key =
            IdempotencyKey::try_from(payment_key).map_err(InvalidCommand::InvalidPaymentKey)?;
        if crate::redaction::holds_card_number(payment_key.as_str().as_bytes()) {
            return Err(InvalidCommand::CardNumberAsPaymentKey);
        }
        if payment_key == idempotency_key {
            return Err(InvalidCommand::RefundOfItself);
        }
        validate_amount(amount_minor)?;
        validate_currency(currency)?;
        if let Some(reason) = reason {
            validate_reason(reason)?;
        }
        Ok(Self {
            idempotency_key,
            payment_key,
            amount_minor,
            currency: currency.to_owned(),
            reason: reason.map(str::to_owned),
        })
    }

    /// SHA-256 over what is refunded: which payment, how much, in which currency,
    /// each part preceded by its byte length (4 bytes, big-endian) after a domain
    /// tag of its own. The reason is left out, like a charge's description.
    pub fn fingerprint(&self) -> Fingerprint {
        let mut hasher = Sha256::new();
        let amount = self.amount_minor.to_string();
        for part in [
            REFUND_FINGERPRINT_DOMAIN,
            self.payment_key.as_str(),
            amount.as_str(),
            self.currency.as_str(),
        ] {
            // Every part is bounded far below u32::MAX by validation.
            let length = u32::try_from(part.len()).unwrap_or(u32::MAX);
            hasher.update(length.to_be_bytes());
            hasher.update(part.as_bytes());
        }
        Fingerprint::from_hex(hex::encode(hasher.finalize()))
    }
}

fn validate_reason(reason: &str) -> Result<(), InvalidCommand> {
    let length = reason.chars().count();
    if length > MAX_DESCRIPTION_LEN {
        return Err(InvalidCommand::ReasonTooLong { length });
    }
    if contains_card_number(reason) {
        return Err(InvalidCommand::CardNumberInReason);
    }
    if let Some(position) = reason.chars().position(super::payment_command::is_control) {
        return Err(InvalidCommand::ReasonControlCharacter { position });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::Command;
    use super::*;

    const REFUND: &str = r#"{"type":"refund","idempotency_key":"rf-1","payment_idempotency_key":"ord-1","amount_minor":500,"currency":"USD","reason":"returned"}"#;

    fn parsed(payload: &str) -> Result<Command, InvalidCommand> {
        Command::parse(payload.as_bytes())
    }

    #[test]
    fn a_refund_is_read_with_its_payment_key_amount_and_reason() {
        let Ok(Command::Refund(refund)) = parsed(REFUND) else {
            panic!("not a refund");
        };
        assert_eq!(refund.idempotency_key.as_str(), "rf-1");
        assert_eq!(refund.payment_key.as_str(), "ord-1");
        assert_eq!(refund.amount_minor, 500);
        assert_eq!(refund.currency, "USD");
        assert_eq!(refund.reason.as_deref(), Some("returned"));
    }

    #[test]
    fn a_command_without_type_or_typed_charge_is_a_charge() {
        let charge = r#"{"idempotency_key":"k","account_id":"a","amount_minor":1,"currency":"USD","payment_method":"pm_card_visa"}"#;
        assert!(matches!(parsed(charge), Ok(Command::Charge(_))));
        let typed = charge.replacen('{', r#"{"type":"charge","#, 1);
        assert!(matches!(parsed(&typed), Ok(Command::Charge(_))));
        let null = charge.replacen('{', r#"{"type":null,"#, 1);
        assert!(matches!(parsed(&null), Ok(Command::Charge(_))));
    }

    #[test]
    fn refund_rules_have_exact_codes() {
        let cases = [
            (
                REFUND.replace(r#""refund""#, r#""Refund""#),
                "unknown_command_type",
            ),
            (REFUND.replace(r#""refund""#, "7"), "wrong_type"),
            (
                REFUND.replace(r#""ord-1""#, r#""rf-1""#),
                "refund_of_itself",
            ),
            (
                REFUND.replace(r#""ord-1""#, r#""bad key""#),
                "invalid_payment_idempotency_key",
            ),
            (
                REFUND.replace(r#""ord-1""#, r#""4111111111111111""#),
                "card_number_as_payment_key",
            ),
            (
                REFUND.replace(r#""payment_idempotency_key":"ord-1","#, ""),
                "missing_field",
            ),
            (REFUND.replace("500", "0"), "amount_out_of_range"),
            (REFUND.replace("500", "5.5"), "amount_not_integer"),
            (
                REFUND.replace(r#""USD""#, r#""usd""#),
                "currency_not_upper_case",
            ),
            (
                REFUND.replace("returned", "card 4111 1111 1111 1111"),
                "card_number_in_reason",
            ),
            (
                REFUND.replace("returned", r"a\u0007b"),
                "reason_control_character",
            ),
            (
                REFUND.replace("returned", r"re\u202eturned"),
                "reason_control_character",
            ),
            (
                REFUND.replace("returned", &"r".repeat(513)),
                "reason_too_long",
            ),
            (
                REFUND.replacen('{', r#"{"amount_minor":1,"#, 1),
                "duplicate_field",
            ),
        ];
        for (payload, code) in cases {
            match parsed(&payload) {
                Err(error) => {
                    assert_eq!(error.code(), code, "{payload}");
                    assert!(!error.to_string().contains("4111"), "{error}");
                }
                Ok(command) => panic!("accepted {payload}: {command:?}"),
            }
        }
    }

    #[test]
    fn the_fingerprint_covers_what_is_refunded_and_never_equals_a_charges() {
        let base = RefundCommand::new("rf-1", "ord-1", 500, "USD", None).unwrap();
        let same = RefundCommand::new("rf-2", "ord-1", 500, "USD", Some("x")).unwrap();
        assert_eq!(base.fingerprint(), same.fingerprint());
        for other in [
            RefundCommand::new("rf-1", "ord-2", 500, "USD", None).unwrap(),
            RefundCommand::new("rf-1", "ord-1", 501, "USD", None).unwrap(),
            RefundCommand::new("rf-1", "ord-1", 500, "EUR", None).unwrap(),
        ] {
            assert_ne!(other.fingerprint(), base.fingerprint());
        }
        assert!(base.fingerprint().is_well_formed());
    }
}
