//! The texts a run of bytes may be read as by whoever receives it: a card number
//! must not hide in any of them.

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

/// `text` with every JSON `\uXXXX` escape replaced by its character (one that
/// names no character is kept as written): a digit written `\u0034` is a digit
/// to whoever decodes the JSON.
pub(crate) fn decode_json_escapes(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains("\\u") {
        return std::borrow::Cow::Borrowed(text);
    }
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
    std::borrow::Cow::Owned(out)
}

/// Every reading of `bytes`: as UTF-8 (lossy), and when it holds zero bytes, as
/// UTF-16 and UTF-32; each also with its JSON escapes decoded.
pub(crate) fn readings(bytes: &[u8]) -> Vec<String> {
    let mut texts = vec![String::from_utf8_lossy(bytes).into_owned()];
    if bytes.contains(&0) {
        texts.extend(wide_readings(bytes));
    }
    let decoded: Vec<String> = texts
        .iter()
        .filter_map(|text| match decode_json_escapes(text) {
            std::borrow::Cow::Owned(decoded) => Some(decoded),
            std::borrow::Cow::Borrowed(_) => None,
        })
        .collect();
    texts.extend(decoded);
    texts
}
