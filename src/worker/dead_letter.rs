//! A dead letter as it goes out: the one place its headers are assembled, whatever
//! dead-lettered the record (a rejection, an undecodable record, the third panic)
//! and in whichever form it fits the brokers (`oversized.rs`). The header names
//! are `messages.rs`'s constants; the producer's own headers are echoed through
//! `record_echo.rs`, which masks every card number in them. Kept in one place so
//! that every path writes the same headers in the same order: `dlq redrive` and
//! the contract (docs/CONTRACT.md) read them back byte for byte.

use rdkafka::message::{Header, Message, OwnedHeaders, OwnedMessage};

use super::messages::{
    without_dead_letter_headers, ATTEMPTS, CHARGE_UNKNOWN, ERROR_KIND, ERROR_REASON,
    KEY_HMAC_SHA256, ORIGINAL_DROPPED, ORIGINAL_SIZE, PAYLOAD_DROPPED, PAYLOAD_REDACTED,
    SOURCE_OFFSET, SOURCE_PARTITION, SOURCE_TOPIC,
};
use super::oversized::LetterForm;
use super::record_echo::{redact_headers, EchoedKey};
use crate::payment::{RedactedPayload, RejectionKind};

/// Why a record is dead-lettered, and what of it may be kept.
#[derive(Debug, Clone)]
pub struct DeadLetter<'a> {
    /// The rejection's kind.
    pub kind: RejectionKind,
    /// The reason, in words.
    pub reason: &'a str,
    /// Attempts made.
    pub attempts: u32,
    /// An earlier attempt may have charged and no look-up resolved it.
    pub charge_unknown: bool,
    /// The value to send instead of the original (a card number masked).
    pub redacted: Option<RedactedPayload>,
    /// `x-key-hmac-sha256`, when the record key is not echoed as it came.
    pub key_hmac: Option<&'a str>,
}

/// One dead letter ready to produce: key, value and its complete header set.
pub(super) struct Letter<'m> {
    pub key: Option<&'m [u8]>,
    pub value: Option<&'m [u8]>,
    pub headers: OwnedHeaders,
}

impl DeadLetter<'_> {
    /// The value the whole letter carries: the original's, or its redacted form
    /// (none when no masking could keep it).
    fn value<'m>(&'m self, original: &'m OwnedMessage) -> Option<&'m [u8]> {
        match &self.redacted {
            None => original.payload(),
            Some(RedactedPayload::Masked(masked)) => Some(masked.as_slice()),
            Some(RedactedPayload::Dropped) => None,
        }
    }

    /// The dead letter of `original` in `form`, its key echoed as `echoed` (masked
    /// when it holds a card number). The smaller forms say what they left out, and
    /// how large the value was, so an operator can tell it from a record sent so.
    pub(super) fn in_form<'m>(
        &'m self,
        original: &'m OwnedMessage,
        echoed: &'m EchoedKey,
        form: LetterForm,
    ) -> Letter<'m> {
        let value = self.value(original);
        let size = value.map_or(0, <[u8]>::len).to_string();
        match form {
            LetterForm::Whole => Letter {
                key: echoed.key.as_deref(),
                value,
                headers: dead_letter_headers(original, self),
            },
            LetterForm::WithoutValue => Letter {
                key: echoed.key.as_deref(),
                value: None,
                headers: value_dropped(dead_letter_headers(original, self), &size),
            },
            LetterForm::Bare => Letter {
                key: None,
                value: None,
                headers: value_dropped(with_marks(OwnedHeaders::new(), original, self), &size)
                    .insert(Header {
                        key: ORIGINAL_DROPPED,
                        value: Some("key,headers"),
                    }),
            },
        }
    }
}

/// The complete headers of the whole dead letter: the original headers plus the
/// dead-letter headers. Headers from an earlier dead-lettering are replaced, so a
/// redriven record does not carry stale ones; a header that holds a card number is
/// masked and named in `x-headers-redacted`; a value masked (or dropped) for a card
/// number is marked `x-payload-redacted` (and `x-payload-dropped`).
pub fn dead_letter_headers(message: &OwnedMessage, letter: &DeadLetter<'_>) -> OwnedHeaders {
    let mut headers = with_marks(
        redact_headers(&without_dead_letter_headers(message).unwrap_or_default()),
        message,
        letter,
    );
    if let Some(redacted) = &letter.redacted {
        headers = headers.insert(Header {
            key: PAYLOAD_REDACTED,
            value: Some("card_number"),
        });
        if *redacted == RedactedPayload::Dropped {
            headers = headers.insert(Header {
                key: PAYLOAD_DROPPED,
                value: Some("card_number"),
            });
        }
    }
    headers
}

/// `headers` plus the marks of a dead letter sent without its value of `size` bytes.
fn value_dropped(headers: OwnedHeaders, size: &str) -> OwnedHeaders {
    headers
        .insert(Header {
            key: PAYLOAD_DROPPED,
            value: Some("message_too_large"),
        })
        .insert(Header {
            key: ORIGINAL_SIZE,
            value: Some(size),
        })
}

/// `headers` plus the headers that say why `message` was dead-lettered and where it
/// came from, in every form (the bare one too: they are what a redrive needs).
fn with_marks(
    mut headers: OwnedHeaders,
    message: &OwnedMessage,
    letter: &DeadLetter<'_>,
) -> OwnedHeaders {
    let DeadLetter {
        kind,
        reason,
        attempts,
        charge_unknown,
        key_hmac,
        ..
    } = *letter;
    let partition = message.partition().to_string();
    let offset = message.offset().to_string();
    let attempts = attempts.to_string();
    for (key, value) in [
        (ERROR_KIND, kind.as_str()),
        (ERROR_REASON, reason),
        (SOURCE_TOPIC, message.topic()),
        (SOURCE_PARTITION, partition.as_str()),
        (SOURCE_OFFSET, offset.as_str()),
        (ATTEMPTS, attempts.as_str()),
    ] {
        headers = headers.insert(Header {
            key,
            value: Some(value),
        });
    }
    if charge_unknown {
        headers = headers.insert(Header {
            key: CHARGE_UNKNOWN,
            value: Some("true"),
        });
    }
    if let Some(hmac) = key_hmac {
        headers = headers.insert(Header {
            key: KEY_HMAC_SHA256,
            value: Some(hmac),
        });
    }
    headers
}

#[cfg(test)]
mod tests {
    use rdkafka::message::{Headers, Timestamp};

    use super::*;
    use crate::redaction::{KeyHasher, Secret};

    fn pairs(headers: &OwnedHeaders) -> Vec<(String, String)> {
        headers
            .iter()
            .map(|h| {
                let value = h.value.map(String::from_utf8_lossy).unwrap_or_default();
                (h.key.to_owned(), value.into_owned())
            })
            .collect()
    }

    /// Every form carries the marks a redrive reads, in the same order; the smaller
    /// ones say what they left out.
    #[test]
    fn each_form_carries_the_marks_and_says_what_it_left_out() {
        let original = OwnedMessage::new(
            Some(b"{\"card\":\"4111 1111 1111 1111\"}".to_vec()),
            Some(b"4111111111111111".to_vec()),
            "payments.commands".into(),
            Timestamp::now(),
            2,
            7,
            Some(OwnedHeaders::new().insert(Header {
                key: "client",
                value: Some("a"),
            })),
        );
        let hasher = KeyHasher::configured(&Secret::from("test-secret")).expect("a secret");
        let echoed = EchoedKey::of(original.key(), &hasher);
        let letter = DeadLetter {
            kind: RejectionKind::Invalid,
            reason: "card_number_as_key: a card number",
            attempts: 1,
            charge_unknown: true,
            redacted: Some(RedactedPayload::Masked(b"{\"card\":\"1111\"}".to_vec())),
            key_hmac: echoed.hmac.as_deref(),
        };
        let marks = |hmac: &str| {
            vec![
                ("x-error-kind", "invalid"),
                ("x-error-reason", "card_number_as_key: a card number"),
                ("x-source-topic", "payments.commands"),
                ("x-source-partition", "2"),
                ("x-source-offset", "7"),
                ("x-attempts", "1"),
                ("x-charge-unknown", "true"),
                ("x-key-hmac-sha256", hmac),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect::<Vec<_>>()
        };
        let hmac = echoed.hmac.clone().expect("a masked key has its hash");
        let whole = letter.in_form(&original, &echoed, LetterForm::Whole);
        let mut expected = vec![("client".to_owned(), "a".to_owned())];
        expected.extend(marks(&hmac));
        expected.push(("x-payload-redacted".into(), "card_number".into()));
        assert_eq!(pairs(&whole.headers), expected);
        assert_eq!(whole.value, Some(&b"{\"card\":\"1111\"}"[..]));
        assert_eq!(whole.key, echoed.key.as_deref());

        let without = letter.in_form(&original, &echoed, LetterForm::WithoutValue);
        expected.push(("x-payload-dropped".into(), "message_too_large".into()));
        expected.push(("x-original-size".into(), "15".into()));
        assert_eq!(pairs(&without.headers), expected);
        assert_eq!(without.value, None);

        let bare = letter.in_form(&original, &echoed, LetterForm::Bare);
        let mut expected = marks(&hmac);
        expected.push(("x-payload-dropped".into(), "message_too_large".into()));
        expected.push(("x-original-size".into(), "15".into()));
        expected.push(("x-original-dropped".into(), "key,headers".into()));
        assert_eq!(pairs(&bare.headers), expected);
        assert_eq!((bare.key, bare.value), (None, None));
    }
}
