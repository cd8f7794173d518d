//! The command type and its validation rules.

use std::fmt;

use super::card::contains_card_number;
use super::currency::validate_currency;
use super::envelope::{
    amount_from_json, optional_str, read_fields, required, required_str, Fields,
};
use super::invalid::{
    ACCOUNT_ID, AMOUNT_MINOR, CURRENCY, DESCRIPTION, IDEMPOTENCY_KEY, PAYMENT_METHOD,
};
use super::{InvalidCommand, TextProblem};
use crate::gateway::ChargeRequest;
use crate::token::IdempotencyKey;

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

/// A payment command that passed every rule of a command.
#[derive(Clone)]
pub struct PaymentCommand {
    /// The key every delivery of this command carries.
    pub idempotency_key: IdempotencyKey,
    /// The account charged.
    pub account_id: String,
    /// Amount in minor units (cents), positive.
    pub amount_minor: i64,
    /// ISO 4217 code, upper case.
    pub currency: String,
    payment_method: String,
    /// Free text for the account holder; not part of the fingerprint.
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

impl PaymentCommand {
    /// Parses a Kafka record value. Unknown fields are ignored; a known field given
    /// twice is refused, since JSON parsers disagree on which copy wins and the
    /// amount charged must not depend on that.
    pub fn parse(payload: &[u8]) -> Result<Self, InvalidCommand> {
        Self::from_fields(&read_fields(payload)?)
    }

    /// The charge the fields of a record value describe.
    pub(super) fn from_fields(fields: &Fields) -> Result<Self, InvalidCommand> {
        let key = required_str(&fields.idempotency_key, IDEMPOTENCY_KEY)?;
        let account_id = required_str(&fields.account_id, ACCOUNT_ID)?;
        let amount_minor = amount_from_json(required(&fields.amount_minor, AMOUNT_MINOR)?)?;
        let currency = required_str(&fields.currency, CURRENCY)?;
        let payment_method = required_str(&fields.payment_method, PAYMENT_METHOD)?;
        let description = optional_str(&fields.description, DESCRIPTION)?;
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
        if crate::redaction::holds_card_number(idempotency_key.as_str().as_bytes()) {
            return Err(InvalidCommand::CardNumberAsKey);
        }
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

    /// The gateway request for this command.
    pub fn charge_request(&self) -> ChargeRequest {
        ChargeRequest {
            amount_minor: self.amount_minor,
            currency: self.currency.clone(),
            payment_method: self.payment_method.clone(),
            payment_id: None,
        }
    }
}

pub(super) fn validate_amount(amount_minor: i64) -> Result<(), InvalidCommand> {
    if (MIN_AMOUNT_MINOR..=MAX_AMOUNT_MINOR).contains(&amount_minor) {
        Ok(())
    } else {
        Err(InvalidCommand::AmountOutOfRange)
    }
}

pub(super) fn check_text(value: &str, max: usize) -> Result<(), TextProblem> {
    if value.trim().is_empty() {
        return Err(TextProblem::Empty);
    }
    let length = value.chars().count();
    if length > max {
        return Err(TextProblem::TooLong { length, max });
    }
    if let Some(position) = value.chars().position(is_control) {
        return Err(TextProblem::ControlCharacter { position });
    }
    // An identifier has no look-alike twin: `acct_42` and `acct\u{200B}_42` would
    // be two accounts that show the same in every log line and console. What shows
    // as nothing is the card detector's set (format and default-ignorable
    // characters, the Hangul fillers, the braille blank): one list for both.
    if let Some(position) = value.chars().position(crate::redaction::is_invisible) {
        return Err(TextProblem::InvisibleCharacter { position });
    }
    Ok(())
}

/// A character no text field may hold: a control character (C0, DEL, C1: Postgres
/// cannot store a NUL, and logs must not carry terminal escapes) or one of Unicode's
/// bidirectional embeddings, overrides and isolates, which reorder how the rest of a
/// line shows in a log or a console ("Trojan Source": `refund \u{202E}0001` reads
/// backwards). The direction marks (U+200E, U+200F, U+061C) reorder nothing beyond
/// themselves and are common in right-to-left text: free text keeps them.
pub(super) fn is_control(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

fn validate_account_id(account_id: &str) -> Result<(), InvalidCommand> {
    // Card check first, as for the payment method: a number hidden behind characters
    // that show as nothing is still named as a card number.
    if contains_card_number(account_id) {
        return Err(InvalidCommand::CardNumberInAccountId);
    }
    check_text(account_id, MAX_ACCOUNT_ID_LEN).map_err(InvalidCommand::InvalidAccountId)
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
    // Free text keeps what shows as nothing (emoji joiners, variation selectors),
    // not what reorders the line.
    if let Some(position) = description.chars().position(is_control) {
        return Err(InvalidCommand::DescriptionControlCharacter { position });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payment::command::fingerprint::FINGERPRINT_DOMAIN;
    use crate::payment::Fingerprint;
    use serde_json::Value;
    use sha2::{Digest, Sha256};

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
            ("account reversed", b(&with("account_id", "\"acct\\u202e24\"")), "invalid_account_id"),
            ("account isolated", b(&with("account_id", "\"\\u2066acct\\u2069\"")), "invalid_account_id"),
            ("account with zero width", b(&with("account_id", "\"acct\\u200b_42\"")), "invalid_account_id"),
            ("account with bom", b(&with("account_id", "\"\\ufeffacct\"")), "invalid_account_id"),
            ("pm with soft hyphen", b(&with("payment_method", "\"pm_card\\u00advisa\"")), "invalid_payment_method"),
            // The card check comes first: a number hidden by zero-width spaces is named.
            ("zero-width pan in account", b(&with("account_id", "\"4111\\u200b1111\\u200b1111\\u200b1111\"")), "card_number_in_account_id"),
            ("isolate in description", b(&with("description", "\"a\\u2067b\\u2069\"")), "description_control_character"),
            ("mark in account", b(&with("account_id", "\"acct\\u200f42\"")), "invalid_account_id"),
            ("hangul filler in account", b(&with("account_id", "\"acct\\u316442\"")), "invalid_account_id"),
            ("reversed description", b(&with("description", "\"refund \\u202e0001 USD\"")), "description_control_character"),
            ("pan in account", b(&with("account_id", "\"acct 4111111111111111\"")), "card_number_in_account_id"),
            ("pan as key", b(&with("idempotency_key", "\"4111111111111111\"")), "card_number_as_key"),
            ("grouped pan as key", b(&with("idempotency_key", "\"4111-1111-1111-1111\"")), "card_number_as_key"),
            ("pan inside a key", b(&with("idempotency_key", "\"ord:378282246310005\"")), "card_number_as_key"),
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
            // Right-to-left text with its direction marks, and emoji with their
            // joiners and variation selectors.
            with(
                "description",
                "\"שלום\\u200f 42 \\u061cمرحبا 👍\\ufe0f\\u200d\"",
            ),
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
        // Well-formed JSON the worker will not read says so, not "syntax error".
        let huge = VALID.replace("1999", "1e400");
        let err = PaymentCommand::parse(huge.as_bytes()).unwrap_err();
        assert_eq!(err.code(), "malformed_json");
        assert!(err.to_string().contains("number out of range"), "{err}");
        let deep = VALID.replace(
            "\"optional\"",
            &format!("{}1{}", "[".repeat(200), "]".repeat(200)),
        );
        let err = PaymentCommand::parse(deep.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("nested more than 128"), "{err}");
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
