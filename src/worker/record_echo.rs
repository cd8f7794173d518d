//! What an answer echoes of the record it answers: the record key and the
//! producer's headers, never with a card number in them. A key that holds one is
//! echoed masked (its last four digits kept) with `x-key-hmac-sha256`, the keyed
//! hash of the key as it came, so operators holding the secret can still find the
//! record; a header that holds one in its name or value is masked, and a trace
//! context header is copied as strictly as the worker read it (entries invalid or
//! holding a card number dropped); either is named in `x-headers-redacted`.

use rdkafka::message::{Header, OwnedHeaders};

use super::messages::HEADERS_REDACTED;
use crate::kafka_headers::{self, RawHeader};
use crate::redaction::{holds_card_number, masked_for_echo, KeyHasher};
use crate::telemetry::{
    remote_context, sanitize_baggage, sanitize_tracestate, BAGGAGE, TRACEPARENT, TRACESTATE,
};

/// Whether a record key holds a card number, found once per record
/// ([`super::Inbound`]) and reused by the answer's echo of the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyScan {
    /// No card number in it, or no key.
    Clean,
    /// It holds one: refused (`card_number_as_key`), echoed masked.
    HoldsCardNumber,
}

impl KeyScan {
    /// Scans `key`.
    pub fn of(key: &[u8]) -> Self {
        if holds_card_number(key) {
            Self::HoldsCardNumber
        } else {
            Self::Clean
        }
    }

    /// Scans the key of a record that may have none.
    pub fn of_record(key: Option<&[u8]>) -> Self {
        key.map_or(Self::Clean, Self::of)
    }
}

/// The record key as an answer echoes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct EchoedKey {
    /// The key to send: the record's, or its masked form (`None` when the record
    /// had none, or when no masking of it leaves no card number).
    pub key: Option<Vec<u8>>,
    /// `x-key-hmac-sha256`, set when `key` is not the record's own.
    pub hmac: Option<String>,
}

impl EchoedKey {
    /// The echo of `key`, scanned here: the tests' shorthand (the worker scans a
    /// record key once, as it reads the record).
    #[cfg(test)]
    pub(super) fn of(key: Option<&[u8]>, hasher: &KeyHasher) -> Self {
        Self::scanned(key, KeyScan::of_record(key), hasher)
    }

    /// The echo of `key`, whose scan (`KeyScan::of_record(key)`) is `scan`.
    pub(super) fn scanned(key: Option<&[u8]>, scan: KeyScan, hasher: &KeyHasher) -> Self {
        // The verdict comes from the parse for a key the command holds: a key that
        // escaped it would be echoed as it came. The debug builds (every test) check.
        debug_assert_eq!(scan, KeyScan::of_record(key), "a record key's scan");
        match key {
            Some(key) if scan == KeyScan::HoldsCardNumber => Self {
                key: masked_for_echo(key).map(String::into_bytes),
                hmac: Some(hasher.hex(key)),
            },
            key => Self {
                key: key.map(<[u8]>::to_vec),
                hmac: None,
            },
        }
    }

    /// Whether the key is echoed masked.
    pub(super) fn is_masked(&self) -> bool {
        self.hmac.is_some()
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

/// What a dead letter copies of one producer's header.
enum HeaderCopy {
    /// The header as it came.
    AsItCame,
    /// Another value (masked, or trace context entries dropped), under this name.
    Changed(Vec<u8>, Option<Vec<u8>>),
    /// Nothing: a trace context header of which nothing may be kept.
    Dropped,
}

/// How a trace context header (`traceparent`, `tracestate`, `baggage`) is copied:
/// as the worker read it, `None` for another header. `parented` says whether the
/// record has the one valid `traceparent` a `tracestate` belongs to.
fn trace_context_copy(header: &RawHeader<'_>, parented: bool) -> Option<HeaderCopy> {
    let is = |name: &str| header.name.eq_ignore_ascii_case(name.as_bytes());
    let kept = if is(TRACEPARENT) {
        // The record's one valid traceparent, or nothing.
        parented.then(|| header.value.map(<[u8]>::to_vec)).flatten()
    } else if is(TRACESTATE) {
        header
            .value
            .filter(|_| parented)
            .and_then(|value| sanitize_tracestate(&[value]))
            .map(String::into_bytes)
    } else if is(BAGGAGE) {
        header
            .value
            .and_then(|value| sanitize_baggage(&[value]))
            .map(String::into_bytes)
    } else {
        return None;
    };
    Some(match kept {
        Some(value) if Some(value.as_slice()) == header.value => HeaderCopy::AsItCame,
        Some(value) => HeaderCopy::Changed(header.name.to_vec(), Some(value)),
        None => HeaderCopy::Dropped,
    })
}

/// How any other header is copied: as it came, or masked where it holds a card
/// number (a name or value no masking can clear becomes `redacted` / no value).
fn card_number_copy(header: &RawHeader<'_>) -> HeaderCopy {
    let name_holds = holds_card_number(header.name);
    let value_holds = header.value.is_some_and(holds_card_number);
    if !name_holds && !value_holds {
        return HeaderCopy::AsItCame;
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
    HeaderCopy::Changed(name.into_bytes(), value)
}

/// `headers` (a producer's own, names as raw bytes) with every header that holds a
/// card number, in its name or its value, masked, the trace context headers copied
/// as the worker read them, and `x-headers-redacted` naming the headers not copied
/// as they came (masked names, comma-separated) when there is one.
pub(super) fn redact_headers(headers: &OwnedHeaders) -> OwnedHeaders {
    let raw = kafka_headers::raw(headers);
    let parented = remote_context(&raw).is_some();
    let mut redacted: Vec<String> = Vec::new();
    let mut copy = OwnedHeaders::new_with_capacity(8);
    for header in &raw {
        let how = trace_context_copy(header, parented).unwrap_or_else(|| card_number_copy(header));
        match how {
            HeaderCopy::AsItCame => {
                copy = kafka_headers::append_raw(copy, header.name, header.value)
            }
            HeaderCopy::Changed(name, value) => {
                copy = kafka_headers::append_raw(copy, &name, value.as_deref());
                redacted.push(String::from_utf8_lossy(&name).into_owned());
            }
            HeaderCopy::Dropped => redacted.push(String::from_utf8_lossy(header.name).into_owned()),
        }
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
    use crate::redaction::Secret;

    fn hasher() -> KeyHasher {
        KeyHasher::configured(&Secret::from("test-secret")).expect("a secret")
    }

    fn pairs(headers: &OwnedHeaders) -> Vec<(String, Option<String>)> {
        kafka_headers::raw(headers)
            .iter()
            .map(|h| {
                (
                    String::from_utf8_lossy(h.name).into_owned(),
                    h.value.map(|v| String::from_utf8_lossy(v).into_owned()),
                )
            })
            .collect()
    }

    fn expect(list: &[(&str, &str)]) -> Vec<(String, Option<String>)> {
        list.iter()
            .map(|(name, value)| ((*name).to_owned(), Some((*value).to_owned())))
            .collect()
    }

    #[test]
    fn a_key_that_holds_a_card_number_is_echoed_masked_with_its_keyed_hash() {
        let echoed = EchoedKey::of(Some(b"4111111111111111"), &hasher());
        assert_eq!(echoed.key.as_deref(), Some(b"************1111".as_slice()));
        // HMAC-SHA256 under "test-secret", not the plain SHA-256 of the key
        // (9bbef194…), which anyone could compute from the last four digits.
        assert_eq!(
            echoed.hmac.as_deref(),
            Some("15e0d54329ac7909503c74553f815c417d2c9f5c0d1302213953524dd01972e3")
        );
        assert_eq!(echoed.masked_text().as_deref(), Some("************1111"));
        for grouped in [
            "41111111-11111111",
            "4-111111111111111",
            "4111.1111.1111.1111",
        ] {
            let echoed = EchoedKey::of(Some(grouped.as_bytes()), &hasher());
            let masked = echoed.masked_text().expect("masked");
            assert!(masked.ends_with("1111") && masked.contains('*'), "{masked}");
            assert!(echoed.is_masked());
        }
        let plain = EchoedKey::of(Some(b"ord-2026-000123"), &hasher());
        assert_eq!(plain.key.as_deref(), Some(b"ord-2026-000123".as_slice()));
        assert!(!plain.is_masked());
        assert_eq!(plain.masked_text(), None);
        assert_eq!(EchoedKey::of(None, &hasher()).key, None);
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
                key: "x-slash",
                value: Some("4111/1111/1111/1111"),
            })
            .insert(Header {
                key: "traceparent",
                value: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            });
        let copy = redact_headers(&headers);
        let expected = expect(&[
            ("note", "card ****-****-****-1111"),
            ("x-card-************1111", "v"),
            ("x-wide", "************1111"),
            ("x-slash", "****/****/****/1111"),
            (
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
            (
                "x-headers-redacted",
                "note,x-card-************1111,x-wide,x-slash",
            ),
        ]);
        assert_eq!(pairs(&copy), expected);
        // Nothing to hide: copied as it came, nothing added.
        let clean = OwnedHeaders::new().insert(Header {
            key: "x-kept",
            value: Some("plain value"),
        });
        assert_eq!(kafka_headers::raw(&redact_headers(&clean)).len(), 1);
    }

    #[test]
    fn trace_context_is_copied_as_strictly_as_it_is_read() {
        let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "traceparent",
                value: Some(parent),
            })
            .insert(Header {
                key: "tracestate",
                value: Some("pan=4111111111111111,vendor=ok"),
            })
            .insert(Header {
                key: "baggage",
                value: Some("user=a,card=4111%201111%201111%201111"),
            })
            .insert(Header {
                key: "Baggage",
                value: Some("ok=1"),
            });
        assert_eq!(
            pairs(&redact_headers(&headers)),
            expect(&[
                ("traceparent", parent),
                ("tracestate", "vendor=ok"),
                ("baggage", "user=a"),
                ("Baggage", "ok=1"),
                ("x-headers-redacted", "tracestate,baggage"),
            ])
        );
        // Without a valid traceparent a tracestate means nothing: neither is kept.
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "traceparent",
                value: Some("00-4111111111111111aaaaaaaaaaaaaaaa-b7ad6b7169203331-01"),
            })
            .insert(Header {
                key: "tracestate",
                value: Some("vendor=ok"),
            });
        assert_eq!(
            pairs(&redact_headers(&headers)),
            expect(&[("x-headers-redacted", "traceparent,tracestate")])
        );
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;
        use crate::redaction::card_cases::{card_digits, card_in_text, encode, encoding, grouped};

        fn all_clean(headers: &OwnedHeaders) -> bool {
            kafka_headers::raw(headers)
                .iter()
                .all(|h| !holds_card_number(h.name) && !h.value.is_some_and(holds_card_number))
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            #[test]
            fn a_card_number_key_is_never_echoed(text in card_in_text(), encoding in encoding()) {
                let key = encode(&text, encoding);
                let echoed = EchoedKey::of(Some(&key), &hasher());
                prop_assert!(echoed.is_masked());
                prop_assert_eq!(echoed.hmac.clone(), Some(hasher().hex(&key)));
                prop_assert!(!echoed.key.as_deref().is_some_and(holds_card_number));
                prop_assert!(!echoed.masked_text().is_some_and(|k| holds_card_number(k.as_bytes())));
            }

            #[test]
            fn no_header_of_a_dead_letter_holds_a_card(
                text in card_in_text(),
                encoding in encoding(),
                in_name in any::<bool>(),
            ) {
                let card = encode(&text, encoding);
                let headers = if in_name {
                    kafka_headers::append_raw(OwnedHeaders::new(), &card, Some(b"v"))
                } else {
                    kafka_headers::append_raw(OwnedHeaders::new(), b"x-note", Some(&card))
                };
                let copy = redact_headers(&headers);
                prop_assert!(all_clean(&copy));
                // (A name is cut at its first zero byte, as librdkafka stores it: a
                // wide name may hold no card once stored.)
                if !in_name {
                    prop_assert!(kafka_headers::last_value(&copy, "x-headers-redacted").is_some());
                }
            }

            #[test]
            fn trace_context_never_carries_a_card(
                card in card_digits().prop_flat_map(grouped),
                before in "x[a-z]{0,5}=[a-z0-9]{1,6}",
            ) {
                let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
                // The card as a W3C-valid tracestate value where its separators allow.
                let state = format!("{before},pan={},k=v", card.replace(' ', "_"));
                let baggage = format!("pan={},k=v", card.replace(' ', "%20"));
                let headers = OwnedHeaders::new()
                    .insert(Header { key: "traceparent", value: Some(parent) })
                    .insert(Header { key: "tracestate", value: Some(&state) })
                    .insert(Header { key: "baggage", value: Some(&baggage) });
                let copy = redact_headers(&headers);
                prop_assert!(all_clean(&copy));
                let kept = format!("{before},k=v");
                prop_assert_eq!(kafka_headers::last_value(&copy, "tracestate"), Some(kept.as_bytes()));
                prop_assert_eq!(kafka_headers::last_value(&copy, "baggage"), Some(b"k=v".as_slice()));
                let raw = kafka_headers::raw(&headers);
                let remote = remote_context(&raw).expect("parented");
                prop_assert_eq!(remote.state, Some(kept));
            }
        }
    }
}
