use std::fmt;

/// Longest idempotency key accepted (docs/CONTRACT.md, "Messages").
pub const MAX_KEY_LEN: usize = 128;

/// Where (in characters) `value` first leaves the keys' alphabet `[A-Za-z0-9._:-]`,
/// or `None`: the alphabet of every name the worker writes into a store's keys.
pub fn outside_key_alphabet(value: &str) -> Option<usize> {
    value
        .chars()
        .position(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')))
}

/// An idempotency key that passed the command rules: 1–128 characters of `[A-Za-z0-9._:-]`.
///
/// Parsed once at the edge; everything inside the worker takes this type, so a
/// key can never smuggle a Redis hash tag (`{`/`}`) or a wildcard into a store.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(transparent)]
pub struct IdempotencyKey(String);

/// Why a string is not an idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidKey {
    /// The key is empty.
    #[error("idempotency_key is empty")]
    Empty,
    /// The key is longer than allowed (its length in characters).
    #[error("idempotency_key is longer than {MAX_KEY_LEN} characters ({0})")]
    TooLong(usize),
    /// The key holds a character outside `[A-Za-z0-9._:-]`.
    #[error("idempotency_key contains a character outside [A-Za-z0-9._:-] at position {position}")]
    IllegalCharacter {
        /// Where, from the start of the key.
        position: usize,
    },
}

impl IdempotencyKey {
    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `value` is a valid key, without making one (no copy of it): the
    /// rules [`IdempotencyKey::try_from`] applies.
    pub fn check(value: &str) -> Result<(), InvalidKey> {
        if value.is_empty() {
            return Err(InvalidKey::Empty);
        }
        let length = value.chars().count();
        if length > MAX_KEY_LEN {
            return Err(InvalidKey::TooLong(length));
        }
        if let Some(position) = outside_key_alphabet(value) {
            return Err(InvalidKey::IllegalCharacter { position });
        }
        Ok(())
    }

    /// A fresh random key, `<label>-` and 128 random bits written as 32 letters
    /// (`a`–`p`, hex with letters for digits): it holds no digit of its own, so
    /// it never reads as a card number (which every worker refuses as a key),
    /// whatever label of few digits comes before it.
    pub fn random(label: &str) -> Result<Self, InvalidKey> {
        let bits: u128 = rand::random();
        let letters: String = (0..32)
            .rev()
            // Each nibble (0–15) is one letter; the cast keeps it (< 16).
            .map(|at| char::from(b'a' + ((bits >> (at * 4)) & 0xf) as u8))
            .collect();
        Self::try_from(format!("{label}-{letters}"))
    }
}

impl TryFrom<&str> for IdempotencyKey {
    type Error = InvalidKey;

    fn try_from(value: &str) -> Result<Self, Self::Error> {
        Self::check(value)?;
        Ok(Self(value.to_owned()))
    }
}

impl TryFrom<String> for IdempotencyKey {
    type Error = InvalidKey;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        // The string itself becomes the key: no second copy.
        Self::check(&value)?;
        Ok(Self(value))
    }
}

impl std::str::FromStr for IdempotencyKey {
    type Err = InvalidKey;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::try_from(s)
    }
}

impl AsRef<str> for IdempotencyKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// For log lines, spans and error messages: a key that holds a card number (an
/// upstream that keyed its commands by card) shows it masked. The stores, the
/// gateway and the result records take the key as it is ([`IdempotencyKey::as_str`]).
impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::redaction::mask_card_numbers(&self.0))
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_validated_by_length_and_charset() {
        let long_ok = "a".repeat(128);
        let too_long = "a".repeat(129);
        let cases: &[(&str, Result<(), InvalidKey>)] = &[
            ("ord-2026-000123", Ok(())),
            ("a", Ok(())),
            ("A.b_c:d-e", Ok(())),
            ("0123456789", Ok(())),
            (long_ok.as_str(), Ok(())),
            ("", Err(InvalidKey::Empty)),
            (too_long.as_str(), Err(InvalidKey::TooLong(129))),
            (
                "has space",
                Err(InvalidKey::IllegalCharacter { position: 3 }),
            ),
            ("{tag}", Err(InvalidKey::IllegalCharacter { position: 0 })),
            ("a*", Err(InvalidKey::IllegalCharacter { position: 1 })),
            ("a/b", Err(InvalidKey::IllegalCharacter { position: 1 })),
            ("é", Err(InvalidKey::IllegalCharacter { position: 0 })),
            ("ключ", Err(InvalidKey::IllegalCharacter { position: 0 })),
            ("a\nb", Err(InvalidKey::IllegalCharacter { position: 1 })),
            ("a\0", Err(InvalidKey::IllegalCharacter { position: 1 })),
        ];
        for (input, expected) in cases {
            let got = IdempotencyKey::try_from(*input).map(|_| ());
            assert_eq!(&got, expected, "input {input:?}");
        }
    }

    /// The stores build their Redis keys and SQL parameters from these views: each one
    /// must give back exactly the key that was validated.
    #[test]
    fn a_valid_key_reads_back_unchanged_every_way() {
        let key = IdempotencyKey::try_from("ord-2026-000123").unwrap();
        assert_eq!(key.as_str(), "ord-2026-000123");
        assert_eq!(AsRef::<str>::as_ref(&key), "ord-2026-000123");
        assert_eq!(key.to_string(), "ord-2026-000123");
        assert_eq!(format!("{key:?}"), "IdempotencyKey(ord-2026-000123)");
    }

    #[test]
    fn random_keys_are_fresh_and_never_card_numbers() {
        let one = IdempotencyKey::random("tok").expect("a key");
        let other = IdempotencyKey::random("tok").expect("a key");
        assert_ne!(one, other);
        assert!(
            one.as_str().starts_with("tok-") && one.as_str().len() == 36,
            "{one}"
        );
        assert!(
            !one.as_str()[4..].bytes().any(|b| b.is_ascii_digit()),
            "{one}"
        );
        assert!(IdempotencyKey::random("no space").is_err());
    }

    proptest::proptest! {
        #[test]
        fn a_random_key_after_a_label_of_few_digits_is_no_card(label in "[a-z][a-z0-9_.-]{0,10}") {
            let key = IdempotencyKey::random(&label).expect("a key");
            proptest::prop_assert!(!crate::redaction::holds_card_number(key.as_str().as_bytes()));
        }
    }

    #[test]
    fn a_key_holding_a_card_number_shows_it_masked_and_keeps_it() {
        let key = IdempotencyKey::try_from("ord-4111111111111111").unwrap();
        assert_eq!(key.as_str(), "ord-4111111111111111");
        assert_eq!(key.to_string(), "ord-************1111");
        assert_eq!(format!("{key:?}"), "IdempotencyKey(ord-************1111)");
        let owned = IdempotencyKey::try_from(String::from("ord-1")).unwrap();
        assert_eq!(owned.as_str(), "ord-1");
        assert_eq!("ord-2".parse::<IdempotencyKey>().unwrap().as_str(), "ord-2");
        assert_eq!(
            IdempotencyKey::try_from(String::from("{x}")),
            Err(InvalidKey::IllegalCharacter { position: 0 })
        );
        assert_eq!("".parse::<IdempotencyKey>(), Err(InvalidKey::Empty));
    }
}
