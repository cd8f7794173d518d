//! Properties of the one detector and of what it masks: every generated card
//! number, in every grouping and encoding, is found and leaves nothing readable
//! behind; text with fewer than 13 digits is never refused. (A dead letter's value:
//! `payment/command/card.rs`.)

use proptest::prelude::*;

use super::card_cases::{card_digits, card_in_text, encode, encoding, grouped};
use super::{holds_card_number, masked_for_echo, masked_text, panic_message};

/// A character that no reading turns into a digit or an escape.
fn inert_char() -> impl Strategy<Value = char> {
    any::<char>().prop_filter("no digit, escape or control character", |&c| {
        !c.is_control() && !matches!(c, '%' | '\\' | '+') && super::digits::digit_value(c).is_none()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_card_in_every_grouping_and_encoding_is_found_and_masked_away(
        text in card_in_text(),
        encoding in encoding(),
    ) {
        let bytes = encode(&text, encoding);
        prop_assert!(holds_card_number(&bytes), "{:?} {:?}", text, encoding);
        let echoed = masked_for_echo(&bytes);
        prop_assert!(echoed.is_some(), "{:?} {:?}", text, encoding);
        let echoed = echoed.unwrap_or_default();
        prop_assert!(!holds_card_number(echoed.as_bytes()), "{:?}", echoed);
        // All but the last four of at least 13 digits.
        prop_assert!(echoed.matches('*').count() >= 9, "{:?}", echoed);
    }

    #[test]
    fn log_text_and_panic_messages_never_carry_a_card(text in card_in_text()) {
        prop_assert!(!holds_card_number(masked_text(&text).as_bytes()));
        // The payload a `panic!` with a formatted message carries.
        let payload: Box<dyn std::any::Any + Send> = Box::new(format!("handling {text} failed"));
        let shown = panic_message(payload.as_ref());
        prop_assert!(!holds_card_number(shown.as_bytes()), "{:?}", shown);
        prop_assert!(shown.starts_with("handling "), "{:?}", shown);
    }

    #[test]
    fn text_with_fewer_than_13_digits_is_never_refused(
        parts in proptest::collection::vec(
            prop_oneof![3 => inert_char(), 1 => proptest::char::range('0', '9')],
            0..80,
        ),
    ) {
        let text: String = parts.into_iter().collect();
        prop_assume!(text.bytes().filter(u8::is_ascii_digit).count() < 13);
        prop_assert!(!holds_card_number(text.as_bytes()), "{:?}", text);
        prop_assert_eq!(masked_text(&text), text.as_str());
    }

    #[test]
    fn one_run_of_digits_failing_luhn_is_no_card(digits in card_digits(), bump in 1u8..10) {
        let mut digits = digits;
        if let Some(last) = digits.last_mut() {
            *last = (*last + bump) % 10;
        }
        let text: String = digits.iter().map(|d| char::from(b'0' + d)).collect();
        prop_assert!(!holds_card_number(format!("ref {text} ok").as_bytes()), "{}", text);
    }

    #[test]
    fn a_grouped_card_is_found_whatever_its_groups(text in card_digits().prop_flat_map(grouped)) {
        prop_assert!(holds_card_number(text.as_bytes()), "{}", text);
    }
}
