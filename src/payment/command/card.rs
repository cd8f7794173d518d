//! A record value that holds a card number, as a dead letter may carry it.

use serde_json::Value;

pub(super) use crate::redaction::contains_card_number;
pub use crate::redaction::mask_card_numbers;
use crate::redaction::{holds_card_number, wide_readings};

/// What may be kept of a record value refused for holding a card number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedactedPayload {
    /// The value with every card-number-like run masked.
    Masked(Vec<u8>),
    /// The value hid a card number where masking the text cannot reach it (JSON
    /// `\u` escapes, a text encoding wider than UTF-8, or not UTF-8): nothing of it
    /// may be kept.
    Dropped,
}

/// Masks the card numbers in a record value, and checks that none survives in
/// the JSON strings it decodes to, nor in any other reading of it.
pub fn redact_payload(payload: &[u8]) -> RedactedPayload {
    if holds_wide_card_number(payload) {
        return RedactedPayload::Dropped;
    }
    let Ok(text) = std::str::from_utf8(payload) else {
        return RedactedPayload::Dropped;
    };
    let masked = mask_card_numbers(text).into_owned();
    if survives_masking(text, &masked) || holds_card_number(masked.as_bytes()) {
        RedactedPayload::Dropped
    } else {
        RedactedPayload::Masked(masked.into_bytes())
    }
}

/// Whether a card number of `text` is still in `masked`, the text with its
/// card-number-like runs masked: in a JSON string, behind a `\u` escape.
fn survives_masking(text: &str, masked: &str) -> bool {
    match serde_json::from_str::<Value>(masked) {
        Ok(value) => json_strings_hold_card(&value),
        // Not JSON (any more: masking a card written as a bare number breaks the
        // text), so its strings cannot be decoded and checked. Only a `\u` escape
        // can hide a digit from the masking: a value with one is not kept.
        Err(_) => text.contains("\\u"),
    }
}

/// What a dead letter carries instead of this payload: `None` when it holds no card
/// number (it goes as it came), else the payload with card numbers masked, or nothing
/// when they cannot be masked (not UTF-8, or still there after masking).
pub fn dead_letter_redaction(payload: &[u8]) -> Option<RedactedPayload> {
    // The one detector, over every reading: a value that holds no card number in
    // any of them goes as it came, UTF-8 or not.
    if !holds_card_number(payload) {
        return None;
    }
    Some(redact_payload(payload))
}

/// Whether `payload` holds a card number written in UTF-16 or UTF-32 (either byte
/// order, with or without a byte-order mark), plain or behind a JSON escape. Those
/// encodings write an ASCII digit next to zero bytes, which no scan of the bytes as
/// UTF-8 sees as a run of digits (and zero bytes are valid UTF-8, so such a payload
/// passes as text). Decoded unit by unit, the digits run together again; digits of
/// unrelated binary fields, which taking the zero bytes out would join, do not.
fn holds_wide_card_number(payload: &[u8]) -> bool {
    if !payload.contains(&0) {
        return false;
    }
    wide_readings(payload).iter().any(|text| {
        let masked = mask_card_numbers(text);
        masked != text.as_str() || survives_masking(text, &masked)
    })
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

#[cfg(test)]
mod tests {
    use super::*;

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
        // Masking the bare number breaks the JSON; the escaped card is still found.
        let both = br#"{"payment_method":"\u0034111111111111111","x":4242424242424242}"#;
        assert_eq!(redact_payload(both), RedactedPayload::Dropped);
        let bare = br#"{"payment_method":"pm_card_visa","x":4242424242424242}"#;
        assert_eq!(
            redact_payload(bare),
            RedactedPayload::Masked(
                br#"{"payment_method":"pm_card_visa","x":************4242}"#.to_vec()
            )
        );
        let cut = br#"{"payment_method":"\u0034111111111111111"#;
        assert_eq!(redact_payload(cut), RedactedPayload::Dropped);
        assert_eq!(
            redact_payload(b"\xff4111111111111111"),
            RedactedPayload::Dropped
        );
    }

    fn utf16(text: &str, big_endian: bool) -> Vec<u8> {
        text.encode_utf16()
            .flat_map(|unit| {
                if big_endian {
                    unit.to_be_bytes()
                } else {
                    unit.to_le_bytes()
                }
            })
            .collect()
    }

    #[test]
    fn a_card_number_in_utf16_or_utf32_is_never_kept_on_a_dead_letter() {
        let with_card = r#"{"payment_method":"4111 1111 1111 1111"}"#;
        let without = r#"{"payment_method":"pm_card_visa","amount_minor":1999}"#;
        for big_endian in [false, true] {
            let plain = utf16(with_card, big_endian);
            // Without a byte-order mark every byte is valid UTF-8.
            assert!(std::str::from_utf8(&plain).is_ok());
            // The byte-order mark, U+FEFF, comes out as FF FE or FE FF.
            let marked = utf16(&format!("\u{feff}{with_card}"), big_endian);
            for payload in [plain, marked] {
                assert_eq!(redact_payload(&payload), RedactedPayload::Dropped);
                assert_eq!(
                    dead_letter_redaction(&payload),
                    Some(RedactedPayload::Dropped)
                );
            }
            // Nothing to hide: the value goes as it came.
            assert_eq!(dead_letter_redaction(&utf16(without, big_endian)), None);
        }
        let utf32: Vec<u8> = with_card
            .chars()
            .flat_map(|c| u32::from(c).to_be_bytes())
            .collect();
        assert_eq!(
            dead_letter_redaction(&utf32),
            Some(RedactedPayload::Dropped)
        );
        // Behind a JSON escape as well as in UTF-16.
        let escaped = utf16(r#"{"payment_method":"\u0034111111111111111"}"#, false);
        assert_eq!(
            dead_letter_redaction(&escaped),
            Some(RedactedPayload::Dropped)
        );
        // One byte in front: the units start at the second byte.
        let shifted = [b"#".as_slice(), &utf16(with_card, true)].concat();
        assert_eq!(
            dead_letter_redaction(&shifted),
            Some(RedactedPayload::Dropped)
        );
    }

    #[test]
    fn digits_of_binary_fields_padded_with_zero_bytes_are_not_read_as_one_number() {
        // "4000123" and "456789017" in zero-padded fields: joined without the zero
        // bytes they would be 4000123456789017, which passes the Luhn check.
        assert!(contains_card_number("4000123456789017"));
        let fields = b"4000123\x00456789017\x00";
        assert_eq!(dead_letter_redaction(fields), None);
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;
        use crate::redaction::card_cases::{card_in_text, encode, encoding};

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            #[test]
            fn a_dead_letter_value_keeps_no_card_in_any_encoding(
                text in card_in_text(),
                encoding in encoding(),
            ) {
                let value = format!(r#"{{"payment_method":"{text}","amount_minor":100}}"#);
                let payload = encode(&value, encoding);
                match dead_letter_redaction(&payload) {
                    None => prop_assert!(false, "not redacted: {:?} {:?}", value, encoding),
                    Some(RedactedPayload::Masked(masked)) => {
                        prop_assert!(!holds_card_number(&masked), "{:?}", String::from_utf8_lossy(&masked));
                    }
                    Some(RedactedPayload::Dropped) => {}
                }
            }
        }
    }
}
