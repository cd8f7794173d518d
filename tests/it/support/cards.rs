//! Card-number detection, independent of the product's own: what the tests search
//! logs, spans, topics and tables with.

use std::time::Duration;

fn luhn(digits: &[u8]) -> bool {
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, d)| {
            let d = u32::from(*d);
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

/// A number within a day of now in Unix ms, µs or ns: a timestamp, not a card.
fn is_current_timestamp(digits: &[u8]) -> bool {
    let value: u128 = digits.iter().fold(0u128, |acc, d| {
        acc.saturating_mul(10).saturating_add(u128::from(*d))
    });
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let day = Duration::from_secs(86_400);
    [
        (now.as_millis(), day.as_millis()),
        (now.as_micros(), day.as_micros()),
        (now.as_nanos(), day.as_nanos()),
    ]
    .iter()
    .any(|(now, day)| value.abs_diff(*now) < *day)
}

/// Card-like numbers in `text`: 13–19 digits passing Luhn, written either as one
/// number or in groups of any sizes joined by single separators (space, dash, dot,
/// slash, underscore: 4-4-4-4, 8-8, 1-15, …). Tokens that mix digits and letters
/// (hex ids, UUIDs) are not numbers, and a longer number is not searched for
/// embedded ones (one in ten 13-digit windows passes Luhn by chance); the literal
/// card numbers are searched as well.
pub(crate) fn card_like_numbers(text: &str) -> Vec<String> {
    let bytes = text.as_bytes();
    // Alphanumeric tokens, each with the byte just before it.
    let mut tokens: Vec<(usize, usize, Option<u8>)> = vec![];
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_alphanumeric() {
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_alphanumeric() {
                i += 1;
            }
            tokens.push((start, i, start.checked_sub(1).map(|p| bytes[p])));
        } else {
            i += 1;
        }
    }
    let is_digits =
        |&(s, e, _): &(usize, usize, Option<u8>)| bytes[s..e].iter().all(u8::is_ascii_digit);
    let digits_of = |&(s, e, _): &(usize, usize, Option<u8>)| {
        bytes[s..e].iter().map(|b| b - b'0').collect::<Vec<u8>>()
    };
    let mut found = vec![];
    let mut t = 0;
    while t < tokens.len() {
        if !is_digits(&tokens[t]) {
            t += 1;
            continue;
        }
        // A run of digit tokens, each joined to the previous by one separator.
        let mut run = vec![tokens[t]];
        let mut u = t + 1;
        while u < tokens.len()
            && is_digits(&tokens[u])
            && matches!(tokens[u].2, Some(b' ' | b'-' | b'.' | b'/' | b'_'))
            && tokens[u].0 == run.last().unwrap().1 + 1
        {
            run.push(tokens[u]);
            u += 1;
        }
        for token in &run {
            let digits = digits_of(token);
            if (13..=19).contains(&digits.len()) && luhn(&digits) && !is_current_timestamp(&digits)
            {
                found.push(String::from_utf8_lossy(&bytes[token.0..token.1]).into_owned());
            }
        }
        if run.len() > 1 {
            for a in 0..run.len() {
                let mut digits = vec![];
                for b in a..run.len() {
                    digits.extend(digits_of(&run[b]));
                    if digits.len() > 19 {
                        break;
                    }
                    if b > a && (13..=19).contains(&digits.len()) && luhn(&digits) {
                        found
                            .push(String::from_utf8_lossy(&bytes[run[a].0..run[b].1]).into_owned());
                    }
                }
            }
        }
        t = u;
    }
    found
}

/// The card-like numbers `value` holds in any reading a consumer might give it:
/// as UTF-8 (lossy), as UTF-16 and UTF-32 of either byte order, and each with JSON
/// `\uXXXX` escapes, percent-encoding or fullwidth digits decoded.
pub(crate) fn hidden_card_numbers(value: &[u8]) -> Vec<String> {
    let units = |big_endian: bool| -> Vec<u16> {
        value
            .chunks_exact(2)
            .map(|pair| {
                if big_endian {
                    u16::from_be_bytes([pair[0], pair[1]])
                } else {
                    u16::from_le_bytes([pair[0], pair[1]])
                }
            })
            .collect()
    };
    let wide = |big_endian: bool| -> String {
        value
            .chunks_exact(4)
            .filter_map(|quad| {
                let quad = [quad[0], quad[1], quad[2], quad[3]];
                char::from_u32(if big_endian {
                    u32::from_be_bytes(quad)
                } else {
                    u32::from_le_bytes(quad)
                })
            })
            .collect()
    };
    let readings = [
        String::from_utf8_lossy(value).into_owned(),
        String::from_utf16_lossy(&units(false)),
        String::from_utf16_lossy(&units(true)),
        wide(false),
        wide(true),
    ];
    let mut found = vec![];
    for text in &readings {
        found.extend(card_like_numbers(text));
        found.extend(card_like_numbers(&decode_json_escapes(text)));
        found.extend(card_like_numbers(&decode_percent(text)));
        found.extend(card_like_numbers(&ascii_digits(text)));
        found.extend(card_like_numbers(&ascii_digits(&as_seen(text))));
    }
    found
}

/// `text` as a reader sees it: other spaces as a space, other dashes as a hyphen,
/// fullwidth and small dots, slashes and underscores as ASCII ones, and what shows as
/// nothing (soft hyphen, zero-width characters, word joiner, byte order mark) left
/// out. ASCII control characters stay: in binary bodies (OTLP) they are bytes, not
/// separators.
fn as_seen(text: &str) -> String {
    text.chars()
        .filter_map(|c| match c {
            '\u{AD}' | '\u{200B}'..='\u{200F}' | '\u{2060}'..='\u{2064}' | '\u{FEFF}' => None,
            c if !c.is_ascii() && c.is_whitespace() => Some(' '),
            '\u{2010}'..='\u{2015}' | '\u{2212}' | '\u{FE58}' | '\u{FE63}' | '\u{FF0D}' => {
                Some('-')
            }
            '\u{FF0E}' | '\u{FE52}' => Some('.'),
            '\u{FF0F}' | '\u{2215}' => Some('/'),
            '\u{FF3F}' => Some('_'),
            c => Some(c),
        })
        .collect()
}

/// `text` with `%XX` decoded (and `+` read as a space), as URLs and forms are.
fn decode_percent(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = text
            .get(i + 1..i + 3)
            .filter(|_| bytes[i] == b'%')
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (hex, bytes[i]) {
            (Some(byte), _) => {
                out.push(byte);
                i += 3;
            }
            (None, b'+') => {
                out.push(b' ');
                i += 1;
            }
            (None, other) => {
                out.push(other);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `text` with fullwidth digits (U+FF10–FF19) written as ASCII ones, as NFKC does.
fn ascii_digits(text: &str) -> String {
    text.chars()
        .map(|c| match u32::from(c) {
            code @ 0xFF10..=0xFF19 => char::from(b'0' + (code - 0xFF10) as u8),
            _ => c,
        })
        .collect()
}

/// `text` with every `\uXXXX` escape replaced by its character (an escape that
/// names no character is kept as written).
fn decode_json_escapes(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("\\u") {
        out.push_str(&rest[..at]);
        let decoded = rest
            .get(at + 2..at + 6)
            .and_then(|hex| u32::from_str_radix(hex, 16).ok())
            .and_then(char::from_u32);
        match decoded {
            Some(c) => {
                out.push(c);
                rest = &rest[at + 6..];
            }
            None => {
                out.push_str("\\u");
                rest = &rest[at + 2..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[test]
fn the_card_number_detector_finds_cards_and_ignores_ids() {
    for card in [
        "4111111111111111",
        "x 4111 1111 1111 1111 y",
        "5500-0000-0000-0004",
        "378282246310005",
        "\"pm\":\"3782 822463 10005\"",
        "41111111-11111111",
        "4-111111111111111",
        "4111111111-111111",
        "4111.1111.1111.1111",
        "4111/1111/1111/1111",
        "4111_1111_1111_1111",
    ] {
        assert!(!card_like_numbers(card).is_empty(), "{card}");
    }
    for other in [
        "4111111111111112",
        "2026-11-29T10:33:13.349890Z",
        "0195a3b2-4111-1111-1111-111111111111",
        "trace 4bf92f3577b34da6a3ce929d0e0e4736",
        "offset 1234 partition 0",
        &format!(
            "at {}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis()
        ),
    ] {
        assert!(
            card_like_numbers(other).is_empty(),
            "{other}: {:?}",
            card_like_numbers(other)
        );
    }
}

#[test]
fn hidden_card_numbers_are_found_behind_escapes_and_zero_bytes() {
    let escaped = br#"{"payment_method":"\u0034111111111111111"}"#;
    assert!(card_like_numbers(&String::from_utf8_lossy(escaped)).is_empty());
    assert!(!hidden_card_numbers(escaped).is_empty());
    let wide: Vec<u8> = "pm 4111 1111 1111 1111"
        .encode_utf16()
        .flat_map(u16::to_le_bytes)
        .collect();
    assert!(!hidden_card_numbers(&wide).is_empty());
    assert!(hidden_card_numbers(br#"{"pm":"\u0070m_card_visa","x":"\uZZZZ"}"#).is_empty());
    // Fields padded with zero bytes are not one number.
    assert!(hidden_card_numbers(b"4000123\x00456789017\x00").is_empty());
    assert!(!hidden_card_numbers(b"%34%31%31%31%31%31%31%31%31%31%31%31%31%31%31%31").is_empty());
    // Grouped by no-break spaces, or joined by zero-width spaces.
    assert!(!hidden_card_numbers("4111\u{A0}1111\u{A0}1111\u{A0}1111".as_bytes()).is_empty());
    assert!(!hidden_card_numbers("4111\u{200B}1111\u{200B}1111\u{200B}1111".as_bytes()).is_empty());
    assert!(!hidden_card_numbers("\u{FF14}111111111111111".as_bytes()).is_empty());
    let utf32: Vec<u8> = "4111111111111111"
        .chars()
        .flat_map(|c| u32::from(c).to_be_bytes())
        .collect();
    assert!(!hidden_card_numbers(&utf32).is_empty());
}
