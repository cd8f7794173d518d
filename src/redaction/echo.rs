//! Card numbers in the bytes a record brings that the worker echoes — its key and
//! its headers — in any reading a receiver may give them (UTF-8, UTF-16, UTF-32,
//! JSON escapes), and what of them may be echoed instead.

use super::card_numbers::{contains_card_number, contains_printed_card_number, mask_card_numbers};
use super::readings::readings;

/// Whether any reading of `bytes` holds a card number by the broad rule (any run of
/// digit groups): for bytes the worker only ever echoes, never acts on.
pub fn holds_card_number(bytes: &[u8]) -> bool {
    readings(bytes)
        .iter()
        .any(|text| contains_card_number(text))
}

/// Whether a record key (or a command's `idempotency_key`) is refused as a card
/// number (`card_number_as_key`). A key of the idempotency-key alphabet
/// (`[A-Za-z0-9._:-]`, no spaces, no zero bytes, so no wider encoding) is judged by
/// the identifier rule of [`super::mask_printed_card_numbers`], so that order
/// numbers with long digit groups stay keys; any other key by the broad rule in
/// every reading, as it is refused anyway and only its echo is at stake.
pub fn key_holds_card_number(key: &[u8]) -> bool {
    match std::str::from_utf8(key) {
        Ok(text) if is_key_alphabet(text) => contains_printed_card_number(text),
        _ => holds_card_number(key),
    }
}

fn is_key_alphabet(text: &str) -> bool {
    text.bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// What may be echoed of `bytes` that hold a card number: the first reading in
/// which masking (all but the last four digits of each number) leaves no card
/// number in any reading, as UTF-8; `None` when none does.
pub fn masked_for_echo(bytes: &[u8]) -> Option<String> {
    readings(bytes).into_iter().find_map(|text| {
        let masked = mask_card_numbers(&text);
        let changed = masked != text.as_str();
        (changed && !holds_card_number(masked.as_bytes())).then(|| masked.into_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utf16le(text: &str) -> Vec<u8> {
        text.encode_utf16().flat_map(u16::to_le_bytes).collect()
    }

    #[test]
    fn card_numbers_are_found_in_every_reading_of_echoed_bytes() {
        for bytes in [
            b"4111111111111111".to_vec(),
            b"4111-1111-1111-1111".to_vec(),
            b"note: card 4111 1111 1111 1111".to_vec(),
            b"x-card-4111111111111111".to_vec(),
            br#"\u0034111111111111111"#.to_vec(),
            utf16le("card 4111111111111111"),
            [b"\xff".as_slice(), b"4111111111111111"].concat(),
        ] {
            assert!(holds_card_number(&bytes), "{bytes:?}");
            assert!(key_holds_card_number(&bytes), "{bytes:?}");
            let masked = masked_for_echo(&bytes).expect("maskable");
            assert!(masked.ends_with("1111"), "{masked}");
            assert!(!holds_card_number(masked.as_bytes()), "{masked}");
        }
        for bytes in [
            b"ord-2026-000123".as_slice(),
            b"pm_card_visa",
            b"4111111111111112",
            b"plain value",
        ] {
            assert!(!holds_card_number(bytes), "{bytes:?}");
            assert!(!key_holds_card_number(bytes), "{bytes:?}");
        }
    }

    #[test]
    fn an_echo_holds_no_card_number_in_any_reading_even_when_one_reading_masks_another_number() {
        // One number in ASCII, another in UTF-16 after it: masking the first reading
        // changes the ASCII one and may leave the wide one whole; that is no echo.
        for wide in [" 5500000000000004", "  5500000000000004"] {
            let bytes = [b"4111111111111111".as_slice(), &utf16le(wide)].concat();
            assert!(holds_card_number(&bytes));
            if let Some(masked) = masked_for_echo(&bytes) {
                assert!(!holds_card_number(masked.as_bytes()), "{masked:?}");
            }
        }
    }

    #[test]
    fn keys_of_the_key_alphabet_are_judged_by_the_identifier_rule() {
        // Two groups of eight digits: an order number, whatever Luhn says of its
        // sixteen digits together (the broad rule would refuse it).
        assert!(holds_card_number(b"ord-20260115-00000008"));
        assert!(!key_holds_card_number(b"ord-20260115-00000008"));
        for key in [
            "ord-5500000000000004",
            "5500-0000-0000-0004",
            "pay-3782-822463-10005",
        ] {
            assert!(key_holds_card_number(key.as_bytes()), "{key}");
        }
        // Not of the alphabet (a space): the broad rule.
        assert!(key_holds_card_number(b"ord 20260115 00000008"));
    }
}
