//! What an answer echoes of the record it answers: the record key and the
//! producer's headers, never with a card number in them. A key that holds one is
//! echoed masked (its last four digits kept) with `x-key-sha256`, the hex SHA-256
//! of the key as it came, so operators can still find the record; a header that
//! holds one in its name or value is masked and named in `x-headers-redacted`.

use rdkafka::message::{Header, OwnedHeaders};
use sha2::{Digest, Sha256};

use super::messages::HEADERS_REDACTED;
use crate::kafka_headers;
use crate::redaction::{holds_card_number, key_holds_card_number, masked_for_echo};

/// The record key as an answer echoes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct EchoedKey {
    /// The key to send: the record's, or its masked form (`None` when the record
    /// had none, or when no masking of it leaves no card number).
    pub key: Option<Vec<u8>>,
    /// `x-key-sha256`, set when `key` is not the record's own.
    pub sha256: Option<String>,
}

impl EchoedKey {
    /// The echo of `key`: as it came, unless it holds a card number.
    pub(super) fn of(key: Option<&[u8]>) -> Self {
        match key {
            Some(key) if key_holds_card_number(key) => Self {
                key: masked_for_echo(key).map(String::into_bytes),
                sha256: Some(key_sha256(key)),
            },
            key => Self {
                key: key.map(<[u8]>::to_vec),
                sha256: None,
            },
        }
    }

    /// Whether the key is echoed masked.
    pub(super) fn is_masked(&self) -> bool {
        self.sha256.is_some()
    }

    /// The masked key as text, for the result's `idempotency_key`.
    pub(super) fn masked_text(&self) -> Option<String> {
        self.is_masked()
            .then(|| {
                self.key
                    .as_deref()
                    .map(|k| String::from_utf8_lossy(k).into_owned())
            })
            .flatten()
    }
}

/// The hex SHA-256 of a record key as it came (`x-key-sha256`).
pub(super) fn key_sha256(key: &[u8]) -> String {
    hex::encode(Sha256::digest(key))
}

/// `headers` (a producer's own, names as raw bytes) with every header that holds a
/// card number, in its name or its value, masked, and `x-headers-redacted` naming
/// them (masked names, comma-separated) when there is one. A name or value no
/// masking can clear is replaced by `redacted` / left without a value.
pub(super) fn redact_headers(headers: &OwnedHeaders) -> OwnedHeaders {
    let mut redacted: Vec<String> = Vec::new();
    let mut copy = OwnedHeaders::new_with_capacity(8);
    for header in kafka_headers::raw(headers) {
        let name_holds = holds_card_number(header.name);
        let value_holds = header.value.is_some_and(holds_card_number);
        if !name_holds && !value_holds {
            copy = kafka_headers::append_raw(copy, header.name, header.value);
            continue;
        }
        let name = if name_holds {
            masked_for_echo(header.name).unwrap_or_else(|| "redacted".to_owned())
        } else {
            String::from_utf8_lossy(header.name).into_owned()
        };
        let value = if value_holds {
            header
                .value
                .and_then(masked_for_echo)
                .map(String::into_bytes)
        } else {
            header.value.map(<[u8]>::to_vec)
        };
        copy = kafka_headers::append_raw(copy, name.as_bytes(), value.as_deref());
        redacted.push(name);
    }
    if redacted.is_empty() {
        return copy;
    }
    copy.insert(Header {
        key: HEADERS_REDACTED,
        value: Some(&redacted.join(",")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_that_holds_a_card_number_is_echoed_masked_with_its_hash() {
        let echoed = EchoedKey::of(Some(b"4111111111111111"));
        assert_eq!(echoed.key.as_deref(), Some(b"************1111".as_slice()));
        assert_eq!(
            echoed.sha256.as_deref(),
            Some("9bbef19476623ca56c17da75fd57734dbf82530686043a6e491c6d71befe8f6e")
        );
        assert_eq!(echoed.masked_text().as_deref(), Some("************1111"));
        let plain = EchoedKey::of(Some(b"ord-2026-000123"));
        assert_eq!(plain.key.as_deref(), Some(b"ord-2026-000123".as_slice()));
        assert!(!plain.is_masked());
        assert_eq!(plain.masked_text(), None);
        assert_eq!(EchoedKey::of(None).key, None);
    }

    #[test]
    fn headers_with_card_numbers_are_masked_and_named() {
        let wide: Vec<u8> = "4111111111111111"
            .encode_utf16()
            .flat_map(u16::to_le_bytes)
            .collect();
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "note",
                value: Some("card 4111-1111-1111-1111"),
            })
            .insert(Header {
                key: "x-card-4111111111111111",
                value: Some("v"),
            })
            .insert(Header {
                key: "x-wide",
                value: Some(wide.as_slice()),
            })
            .insert(Header {
                key: "traceparent",
                value: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            });
        let copy = redact_headers(&headers);
        let pairs: Vec<(String, Option<String>)> = kafka_headers::raw(&copy)
            .iter()
            .map(|h| {
                (
                    String::from_utf8_lossy(h.name).into_owned(),
                    h.value.map(|v| String::from_utf8_lossy(v).into_owned()),
                )
            })
            .collect();
        let expected = [
            ("note", "card ****-****-****-1111"),
            ("x-card-************1111", "v"),
            ("x-wide", "************1111"),
            (
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
            ("x-headers-redacted", "note,x-card-************1111,x-wide"),
        ]
        .map(|(name, value)| (name.to_owned(), Some(value.to_owned())));
        assert_eq!(pairs, expected);
        // Nothing to hide: copied as it came, nothing added.
        let clean = OwnedHeaders::new().insert(Header {
            key: "x-kept",
            value: Some("plain value"),
        });
        assert_eq!(kafka_headers::raw(&redact_headers(&clean)).len(), 1);
    }
}
