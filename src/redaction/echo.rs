//! The one card-number detector, for every field that may leave the worker —
//! keys, idempotency keys, headers (trace context included), values, command
//! fields, panic messages — in any reading a receiver may give its bytes (UTF-8,
//! UTF-16, UTF-32, JSON escapes, percent-encoding), and what of such bytes may be
//! echoed instead.

use super::card_numbers::{mask_card_numbers, written_card_number};
use super::readings::{readings, triage, Triage};

/// Whether any reading of `bytes` holds a card number. A field with fewer than 13
/// digits and nothing another reading could decode is told clean in one pass,
/// without allocating.
pub fn holds_card_number(bytes: &[u8]) -> bool {
    match triage(bytes) {
        Triage::Clean => false,
        Triage::OneReading(text) => written_card_number(text),
        Triage::Every => readings(bytes).iter().any(|text| written_card_number(text)),
    }
}

/// Whether `text` holds a card number, in any reading ([`holds_card_number`]).
pub fn contains_card_number(text: &str) -> bool {
    holds_card_number(text.as_bytes())
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

/// `text` as it may go out in a log line, a span or a panic message: as it is when
/// it holds no card number, else masked ([`masked_for_echo`]), or a placeholder
/// when no masking clears it.
pub fn masked_text(text: &str) -> std::borrow::Cow<'_, str> {
    if !holds_card_number(text.as_bytes()) {
        return std::borrow::Cow::Borrowed(text);
    }
    std::borrow::Cow::Owned(
        masked_for_echo(text.as_bytes())
            .unwrap_or_else(|| "<removed: it held a card number>".to_owned()),
    )
}

/// `text` masked, cut to at most `max_chars` characters, and masked again: a card
/// number the cut falls in is masked before it can lose its last digits (13 of them
/// fail the Luhn check nine times in ten, and would be kept), and what the cut makes
/// of a longer run (its first 16 digits can be a card number) is masked after. The
/// placeholder when the masked text would no longer fit.
pub fn masked_within(text: &str, max_chars: usize) -> String {
    let cut: String = masked_text(text).chars().take(max_chars).collect();
    let masked = masked_text(&cut);
    if masked.chars().count() <= max_chars {
        return masked.into_owned();
    }
    "<removed: it held a card number>"
        .chars()
        .take(max_chars)
        .collect()
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
            br#"4111\/1111\/1111\/1111"#.to_vec(),
            b"%34%31%31%31%31%31%31%31%31%31%31%31%31%31%31%31".to_vec(),
            b"4111+1111+1111+1111".to_vec(),
            "４１１１１１１１１１１１１１１１".as_bytes().to_vec(),
            utf16le("card 4111111111111111"),
            utf16le("४१११११११११११११११"),
            [b"\xff".as_slice(), b"4111111111111111"].concat(),
        ] {
            assert!(holds_card_number(&bytes), "{bytes:?}");
            let masked = masked_for_echo(&bytes).expect("maskable");
            assert!(masked.contains("****"), "{masked}");
            assert!(!holds_card_number(masked.as_bytes()), "{masked}");
        }
        for bytes in [
            b"ord-2026-000123".as_slice(),
            b"pm_card_visa",
            b"4111111111111112",
            b"plain value",
            b"100% of 12 items",
        ] {
            assert!(!holds_card_number(bytes), "{bytes:?}");
            assert_eq!(
                masked_text(&String::from_utf8_lossy(bytes)),
                String::from_utf8_lossy(bytes)
            );
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
    fn one_detector_judges_keys_as_every_other_field() {
        // Two groups of eight digits whose sixteen pass Luhn: a card number, even in
        // the shape of an order number (the contract's one rule for every field).
        assert!(holds_card_number(b"ord-20260115-00000008"));
        for key in [
            "41111111-11111111",
            "4-111111111111111",
            "4111111111-111111",
            "4111.1111.1111.1111",
            "4111_1111_1111_1111",
            "ord-5500000000000004",
            "pay-3782-822463-10005",
        ] {
            assert!(holds_card_number(key.as_bytes()), "{key}");
        }
        assert!(!holds_card_number(b"cmd-1a2b3c4d:000001"));
    }

    #[test]
    fn text_for_logs_and_panics_is_masked_in_any_reading() {
        assert_eq!(
            masked_text("boom at 4111-1111-1111-1111"),
            "boom at ****-****-****-1111"
        );
        assert_eq!(
            masked_text("key 4111+1111+1111+1111"),
            "key **** **** **** 1111"
        );
        assert_eq!(masked_text("nothing here"), "nothing here");
    }

    #[test]
    fn a_text_is_masked_before_and_after_it_is_cut() {
        // One run of 20 digits is no card; its first 16 are one.
        let long = format!("{}41111111111111111111", "a".repeat(486));
        assert!(!holds_card_number(long.as_bytes()));
        let kept = masked_within(&long, 502);
        assert_eq!(kept.chars().count(), 502);
        assert!(!holds_card_number(kept.as_bytes()), "{kept}");
        assert!(kept.ends_with("1111"), "masked, not dropped: {kept}");
        // A card the cut falls in: masked before it loses its last digits.
        let straddling = format!("{}4111111111111111", "a".repeat(498));
        let kept = masked_within(&straddling, 510);
        assert!(!kept.contains("411111111111"), "{kept}");
        assert_eq!(masked_within("plain", 3), "pla");
    }
}
