//! Generated card numbers for the property tests: valid-Luhn numbers of 13–19
//! digits, in every grouping (random group sizes, any form of the five separators),
//! inside random text, in every encoding a receiver may read bytes in. Shared by
//! the detector's properties here and those of the output paths (`worker/record_echo.rs`).

use proptest::prelude::*;

/// The check digit that makes `body` pass Luhn.
fn check_digit(body: &[u8]) -> u8 {
    let sum: u32 = body
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &d)| {
            let d = u32::from(d);
            // The check digit will sit right of `body`: its last digit is doubled.
            if i % 2 == 0 {
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
    ((10 - sum % 10) % 10) as u8
}

/// The digits of a card number: 13–19, passing Luhn.
pub(crate) fn card_digits() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(0u8..10, 12..=18).prop_map(|mut body| {
        let check = check_digit(&body);
        body.push(check);
        body
    })
}

/// Separators: the five, and forms a reader shows as one of them (a no-break and an
/// ideographic space, a tab, a line break, the Unicode hyphen, a minus sign, the fullwidth
/// hyphen, dot, slash and underscore).
const SEPARATORS: [char; 15] = [
    ' ', '-', '.', '/', '_', '\u{A0}', '\u{3000}', '\t', '\n', '\u{2010}', '\u{2212}', '\u{FF0D}',
    '\u{FF0E}', '\u{FF0F}', '\u{FF3F}',
];

/// Characters that show as nothing: a soft hyphen, a zero-width space, a word
/// joiner, a byte order mark, a Hangul filler, the braille blank, a musical symbol
/// format control (outside the Basic Multilingual Plane), an Arabic number sign, a
/// Khmer inherent vowel, the halfwidth Hangul filler.
const INVISIBLE: [char; 10] = [
    '\u{AD}',
    '\u{200B}',
    '\u{2060}',
    '\u{FEFF}',
    '\u{3164}',
    '\u{2800}',
    '\u{1D173}',
    '\u{0600}',
    '\u{17B4}',
    '\u{FFA0}',
];

/// The digits written in groups of random sizes, each join one separator (the same
/// one throughout, or mixed), with now and then a character that shows as nothing
/// between two digits or beside a separator.
pub(crate) fn grouped(digits: Vec<u8>) -> impl Strategy<Value = String> {
    let joins = digits.len().saturating_sub(1);
    let invisible = proptest::option::weighted(0.1, proptest::sample::select(INVISIBLE.to_vec()));
    (
        proptest::collection::vec(proptest::bool::weighted(0.3), joins),
        proptest::sample::select(SEPARATORS.to_vec()),
        proptest::collection::vec(proptest::sample::select(SEPARATORS.to_vec()), joins),
        any::<bool>(),
        proptest::collection::vec(invisible, joins),
    )
        .prop_map(move |(cuts, one, mixed, mix, hidden)| {
            let mut text = String::new();
            for (at, digit) in digits.iter().enumerate() {
                if at > 0 && cuts[at - 1] {
                    text.push(if mix { mixed[at - 1] } else { one });
                }
                if let Some(hidden) = at.checked_sub(1).and_then(|gap| hidden[gap]) {
                    text.push(hidden);
                }
                text.push(char::from(b'0' + digit));
            }
            text
        })
}

/// A card number in any grouping, inside text that ends where the number begins
/// and begins where it ends with a character that is neither a digit nor a
/// separator (a number is made of whole groups).
pub(crate) fn card_in_text() -> impl Strategy<Value = String> {
    let around = "([a-zA-Z0-9:;,=#]{0,10}[a-zA-Z:;,=#])?";
    (
        around,
        card_digits().prop_flat_map(grouped),
        around.prop_map(|text| text.chars().rev().collect::<String>()),
    )
        .prop_map(|(before, card, after)| format!("{before}{card}{after}"))
}

/// How `text` is written to bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Encoding {
    Utf8,
    Utf16Le,
    Utf16Be,
    Utf32Le,
    Utf32Be,
    /// Every digit as a JSON `\u00XX` escape.
    JsonEscaped,
    /// Every byte as `%XX`.
    Percent,
    /// Every ASCII digit as its fullwidth form (U+FF10–FF19).
    Fullwidth,
}

/// Every encoding.
pub(crate) fn encoding() -> impl Strategy<Value = Encoding> {
    proptest::sample::select(vec![
        Encoding::Utf8,
        Encoding::Utf16Le,
        Encoding::Utf16Be,
        Encoding::Utf32Le,
        Encoding::Utf32Be,
        Encoding::JsonEscaped,
        Encoding::Percent,
        Encoding::Fullwidth,
    ])
}

/// `text` written in `encoding`.
pub(crate) fn encode(text: &str, encoding: Encoding) -> Vec<u8> {
    match encoding {
        Encoding::Utf8 => text.as_bytes().to_vec(),
        Encoding::Utf16Le => text.encode_utf16().flat_map(u16::to_le_bytes).collect(),
        Encoding::Utf16Be => text.encode_utf16().flat_map(u16::to_be_bytes).collect(),
        Encoding::Utf32Le => text
            .chars()
            .flat_map(|c| u32::from(c).to_le_bytes())
            .collect(),
        Encoding::Utf32Be => text
            .chars()
            .flat_map(|c| u32::from(c).to_be_bytes())
            .collect(),
        Encoding::JsonEscaped => text
            .chars()
            .map(|c| {
                if c.is_ascii_digit() {
                    format!("\\u{:04x}", u32::from(c))
                } else {
                    c.to_string()
                }
            })
            .collect::<String>()
            .into_bytes(),
        Encoding::Percent => text
            .bytes()
            .map(|b| format!("%{b:02X}"))
            .collect::<String>()
            .into_bytes(),
        Encoding::Fullwidth => text
            .chars()
            .map(|c| match c.to_digit(10) {
                Some(d) => char::from_u32(0xFF10 + d).unwrap_or(c),
                None => c,
            })
            .collect::<String>()
            .into_bytes(),
    }
}
