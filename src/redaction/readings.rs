//! The texts a run of bytes may be read as by whoever receives it: a card number
//! must not hide in any of them.
//!
//! The readings: the bytes as UTF-8; as UTF-16 (both byte orders, from the first
//! and from the second byte) and UTF-32 (both byte orders) when they hold a zero
//! byte, a control byte or are not UTF-8 (how those encodings write digits, ASCII
//! or of other scripts); and each of those with JSON string escapes decoded
//! (`\u0034`, `\/`) and with percent-encoding decoded as URLs and forms decode it
//! (`%34`, `+` for a space: W3C baggage values and query strings are written so).

use std::borrow::Cow;

/// `payload` read as UTF-16 (both byte orders, from its first and from its second
/// byte) and as UTF-32 (both byte orders); what does not decode reads as U+FFFD.
pub(crate) fn wide_readings(payload: &[u8]) -> Vec<String> {
    let mut readings = Vec::with_capacity(6);
    for skip in [0, 1] {
        let pairs = payload[skip.min(payload.len())..].chunks_exact(2);
        for from_bytes in [u16::from_le_bytes, u16::from_be_bytes] {
            let units = pairs.clone().map(|pair| from_bytes([pair[0], pair[1]]));
            readings.push(
                char::decode_utf16(units)
                    .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
                    .collect(),
            );
        }
    }
    for from_bytes in [u32::from_le_bytes, u32::from_be_bytes] {
        readings.push(
            payload
                .chunks_exact(4)
                .map(|quad| {
                    char::from_u32(from_bytes([quad[0], quad[1], quad[2], quad[3]]))
                        .unwrap_or(char::REPLACEMENT_CHARACTER)
                })
                .collect(),
        );
    }
    readings
}

/// The four hex digits at the start of `text` as a UTF-16 unit.
fn hex_unit(text: &str) -> Option<u16> {
    let hex = text.get(..4)?;
    if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u16::from_str_radix(hex, 16).ok()
}

/// `text` with every JSON string escape replaced by what it stands for (`\u0034`
/// → `4`, a surrogate pair → its character, `\/` → `/`, `\n` → a line feed); an
/// escape that names nothing is kept as written. A digit or a separator written so
/// is one to whoever decodes the JSON.
pub(crate) fn decode_json_escapes(text: &str) -> Cow<'_, str> {
    if !text.contains('\\') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let simple = match after.as_bytes().first() {
            Some(b'"') => Some('"'),
            Some(b'\\') => Some('\\'),
            Some(b'/') => Some('/'),
            Some(b'b') => Some('\u{8}'),
            Some(b'f') => Some('\u{c}'),
            Some(b'n') => Some('\n'),
            Some(b'r') => Some('\r'),
            Some(b't') => Some('\t'),
            _ => None,
        };
        if let Some(c) = simple {
            out.push(c);
            rest = &after[1..];
            continue;
        }
        let unit = after.strip_prefix('u').and_then(hex_unit);
        let low = after
            .get(5..)
            .and_then(|next| next.strip_prefix("\\u"))
            .and_then(hex_unit);
        let decoded = match (unit, low) {
            (Some(high), Some(low)) if (0xD800..0xDC00).contains(&high) => {
                char::decode_utf16([high, low])
                    .next()
                    .and_then(Result::ok)
                    .map(|c| (c, 11))
            }
            (Some(unit), _) => char::from_u32(u32::from(unit)).map(|c| (c, 5)),
            (None, _) => None,
        };
        match decoded {
            Some((c, length)) => {
                out.push(c);
                rest = &after[length..];
            }
            None => {
                out.push('\\');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// `text` with percent-encoding decoded as URLs and forms decode it: `%XX` as the
/// byte it names, `+` as a space; the bytes then read as UTF-8 (lossy).
pub(crate) fn decode_percent(text: &str) -> Cow<'_, str> {
    if !text.contains(['%', '+']) {
        return Cow::Borrowed(text);
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let byte = bytes[at];
        let escaped = (byte == b'%')
            .then(|| text.get(at + 1..at + 3))
            .flatten()
            .filter(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match (escaped, byte) {
            (Some(decoded), _) => {
                out.push(decoded);
                at += 3;
            }
            (None, b'+') => {
                out.push(b' ');
                at += 1;
            }
            (None, other) => {
                out.push(other);
                at += 1;
            }
        }
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

/// How many readings a run of bytes needs, told in one pass over them.
pub(crate) enum Triage<'a> {
    /// Plain text with fewer digits than a card number has, in every reading.
    Clean,
    /// UTF-8 that no other reading differs from: the text is its only reading.
    OneReading(&'a str),
    /// Every reading must be searched.
    Every,
}

/// A byte that is an ASCII digit.
const DIGIT: u8 = 1;
/// A byte another reading may decode: what the wider encodings (a zero or control
/// byte), JSON escapes (`\\`) and percent-encoding (`%`, `+`) write, and any byte
/// outside ASCII (other scripts' digits, or not UTF-8).
const DECODABLE: u8 = 2;

/// Every byte's class, so the common pass over a clean field is one table look-up
/// per byte without a branch (as fast as the plain digit count it replaced).
const CLASS: [u8; 256] = {
    let mut class = [0u8; 256];
    let mut byte = 0;
    while byte < 256 {
        let b = byte as u8;
        class[byte] = if b.is_ascii_digit() {
            DIGIT
        } else if b < 0x20 || b >= 0x7f || b == b'\\' || b == b'%' || b == b'+' {
            DECODABLE
        } else {
            0
        };
        byte += 1;
    }
    class
};

/// Whether `byte` makes the wider encodings, JSON escapes or percent-encoding worth
/// reading.
fn opens_another_reading(byte: u8) -> bool {
    byte < 0x20 || byte == 0x7f || byte == b'\\' || byte == b'%' || byte == b'+'
}

/// Sorts `bytes` by the readings they need, in one pass without allocating: most
/// keys, headers and references end here as [`Triage::Clean`].
pub(crate) fn triage(bytes: &[u8]) -> Triage<'_> {
    let mut digits = 0usize;
    let mut seen = 0u8;
    for &byte in bytes {
        let class = CLASS[usize::from(byte)];
        digits += usize::from(class & DIGIT);
        seen |= class;
    }
    if seen & DECODABLE == 0 {
        if digits < 13 {
            return Triage::Clean;
        }
        // Plain ASCII (so UTF-8), which no other reading changes.
        return match std::str::from_utf8(bytes) {
            Ok(text) => Triage::OneReading(text),
            Err(_) => Triage::Every,
        };
    }
    if bytes.iter().copied().any(opens_another_reading) {
        return Triage::Every;
    }
    // Bytes outside ASCII: one reading when they are UTF-8 (its digits of other
    // scripts are counted by the detector itself), unless they may as well be UTF-16
    // digits of a card number's length (`may_hold_utf16_digits_as_utf8`).
    match std::str::from_utf8(bytes) {
        Ok(_) if may_hold_utf16_digits_as_utf8(bytes) => Triage::Every,
        Ok(text) => Triage::OneReading(text),
        Err(_) => Triage::Every,
    }
}

/// Whether valid UTF-8 `bytes` may also be UTF-16 holding a card number in digits
/// whose code units are valid UTF-8 too: of all decimal digits only Saurashtra's
/// (U+A8D0–A8D9) and Javanese (U+A9D0–A9D9) are, in little-endian order (the four,
/// U+A8D4, is `D4 A8`: the Cyrillic U+0528 in UTF-8), so a number written in them has
/// no zero or control byte to tell it by. At least 13 such units; any other text,
/// Cyrillic included, keeps its one reading.
fn may_hold_utf16_digits_as_utf8(bytes: &[u8]) -> bool {
    bytes
        .windows(2)
        .filter(|pair| (0xD0..=0xD9).contains(&pair[0]) && (0xA8..=0xA9).contains(&pair[1]))
        .count()
        >= 13
}

/// Every reading of `bytes` (see the module's documentation).
pub(crate) fn readings(bytes: &[u8]) -> Vec<String> {
    let utf8 = String::from_utf8_lossy(bytes);
    // UTF-16 and UTF-32 write ASCII digits beside a zero byte, and the digits of
    // other scripts beside a control byte (U+0966 is 09 66) or as bytes UTF-8 has no
    // use for.
    let wide = std::str::from_utf8(bytes).is_err()
        || bytes.iter().any(u8::is_ascii_control)
        || may_hold_utf16_digits_as_utf8(bytes);
    let mut texts = vec![utf8.into_owned()];
    if wide {
        texts.extend(wide_readings(bytes));
    }
    let mut decoded = Vec::new();
    for text in &texts {
        let json = decode_json_escapes(text);
        let percent = decode_percent(text);
        // Either layer may wrap the other.
        let both = [
            decode_percent(&json).into_owned(),
            decode_json_escapes(&percent).into_owned(),
        ];
        let layers = [json, percent]
            .into_iter()
            .filter_map(|reading| match reading {
                Cow::Owned(reading) => Some(reading),
                Cow::Borrowed(_) => None,
            });
        for reading in layers.chain(both) {
            if !decoded.contains(&reading) && !texts.contains(&reading) {
                decoded.push(reading);
            }
        }
    }
    texts.extend(decoded);
    texts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_escapes_decode_as_a_json_reader_decodes_them() {
        assert_eq!(decode_json_escapes(r"\u0034111"), "4111");
        assert_eq!(decode_json_escapes(r"4111\/1111"), "4111/1111");
        assert_eq!(decode_json_escapes(r#"a\"b\\c\nd\te"#), "a\"b\\c\nd\te");
        assert_eq!(decode_json_escapes(r"a\bb\fc\rd"), "a\u{8}b\u{c}c\rd");
        // A surrogate pair is one character (mathematical bold digit one).
        assert_eq!(decode_json_escapes(r"\ud835\udfcf"), "\u{1D7CF}");
        // What names nothing stays as written.
        assert_eq!(decode_json_escapes(r"\uZZZZ \x \u12"), r"\uZZZZ \x \u12");
        assert_eq!(decode_json_escapes(r"\ud835"), r"\ud835");
        assert!(matches!(decode_json_escapes("plain"), Cow::Borrowed(_)));
    }

    #[test]
    fn percent_encoding_decodes_as_urls_and_forms_decode_it() {
        assert_eq!(decode_percent("%34%31%31%31"), "4111");
        assert_eq!(decode_percent("4111+1111"), "4111 1111");
        assert_eq!(decode_percent("%EF%BC%94"), "４");
        assert_eq!(decode_percent("100% sure %zz"), "100% sure %zz");
        assert!(matches!(decode_percent("plain"), Cow::Borrowed(_)));
    }

    #[test]
    fn triage_sends_only_what_another_reading_could_change_to_the_slow_path() {
        assert!(matches!(triage(b"ord-2026-000123"), Triage::Clean));
        assert!(matches!(triage(b""), Triage::Clean));
        assert!(matches!(
            triage(b"4111111111111111"),
            Triage::OneReading("4111111111111111")
        ));
        assert!(matches!(triage("é".as_bytes()), Triage::OneReading(_)));
        // Spaces (the commonest byte of a description) and `~` open no other reading.
        assert!(matches!(triage(b"card on file, 2026 ~ 12"), Triage::Clean));
        assert!(matches!(
            triage(b"4111 1111 1111 1111"),
            Triage::OneReading(_)
        ));
        assert!(matches!(triage("é 4111".as_bytes()), Triage::OneReading(_)));
        for every in [
            b"a\0b".as_slice(),
            b"%34",
            b"\\u0034",
            b"4+1",
            b"tab\there",
            b"\xff",
        ] {
            assert!(matches!(triage(every), Triage::Every), "{every:?}");
        }
    }

    #[test]
    fn utf16_digits_whose_bytes_are_valid_utf8_are_read_as_utf16_too() {
        for zero in [0xA8D0u32, 0xA9D0] {
            let digits: String = "4111111111111111"
                .bytes()
                .filter_map(|d| char::from_u32(zero + u32::from(d - b'0')))
                .collect();
            let bytes: Vec<u8> = digits.encode_utf16().flat_map(u16::to_le_bytes).collect();
            assert!(
                std::str::from_utf8(&bytes).is_ok(),
                "{zero:x}: valid UTF-8 as well"
            );
            assert!(crate::redaction::holds_card_number(&bytes), "{zero:x}");
            // Behind ASCII text too.
            let prefixed = [b"ref ".as_slice(), &bytes].concat();
            assert!(crate::redaction::holds_card_number(&prefixed), "{zero:x}");
        }
        // Long text of another script, without spaces, stays on the one-reading path.
        let cjk = "支付已完成请稍候再试谢谢您的耐心等待支付已完成";
        assert!(cjk.len() >= 26 && !cjk.is_ascii());
        assert!(matches!(triage(cjk.as_bytes()), Triage::OneReading(_)));
        let cyrillic = "Оплата заказа прошла успешно, спасибо";
        assert!(matches!(triage(cyrillic.as_bytes()), Triage::OneReading(_)));
    }

    #[test]
    fn readings_include_both_layers_in_either_order() {
        let all = readings(br"%5Cu0034 \u0025 x");
        assert!(all.iter().any(|r| r.starts_with("4 ")), "{all:?}");
        let all = readings(b"4\x001\x00");
        assert!(all.iter().any(|r| r == "41"), "{all:?}");
    }

    #[test]
    fn each_reading_is_searched_once() {
        // Percent-decoded, then JSON-decoded or not: the same text three ways.
        let all = readings(b"%41");
        let mut unique = all.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(all.len(), unique.len(), "{all:?}");
    }
}
