//! The request fingerprint: what makes two commands with one key the same request.

use std::fmt;

use sha2::{Digest, Sha256};

use super::PaymentCommand;

pub(super) const FINGERPRINT_DOMAIN: &str = "payment-worker/fingerprint/v1";

/// Lowercase hex SHA-256 of the canonical (account_id, amount_minor, currency,
/// payment_method); see [`PaymentCommand::fingerprint`] for the encoding.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// Wraps a fingerprint read back from storage. Hex is case-insensitive, so the
    /// value is lower-cased to compare equal with a freshly computed one.
    pub fn from_hex(hex: String) -> Self {
        if hex.bytes().any(|b| b.is_ascii_uppercase()) {
            Self(hex.to_ascii_lowercase())
        } else {
            Self(hex)
        }
    }

    /// True for 64 hex digits, i.e. something [`PaymentCommand::fingerprint`] could
    /// have produced (storage may hold anything).
    pub fn is_well_formed(&self) -> bool {
        self.0.len() == 64 && self.0.bytes().all(|b| b.is_ascii_hexdigit())
    }

    /// The fingerprint as 64 hex digits.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PaymentCommand {
    /// SHA-256 over a canonical encoding of what is charged: who, how much, in
    /// which currency, with what. The description is deliberately left out, so a
    /// redelivery with an edited description is still recognised as the same
    /// request.
    ///
    /// Encoding (version 1): the domain tag `payment-worker/fingerprint/v1`, then
    /// account_id, amount_minor (as its decimal ASCII digits), currency and
    /// payment_method, each preceded by its UTF-8 byte length as a 4-byte
    /// big-endian integer. The length prefixes make the encoding injective: no two
    /// different tuples produce the same bytes (unlike plain concatenation, where
    /// ("ab","c") and ("a","bc") would collide). Changing it changes every stored
    /// fingerprint, so a new encoding needs a new version tag and a migration.
    pub fn fingerprint(&self) -> Fingerprint {
        let mut hasher = Sha256::new();
        let amount = self.amount_minor.to_string();
        for part in [
            FINGERPRINT_DOMAIN,
            self.account_id.as_str(),
            amount.as_str(),
            self.currency.as_str(),
            self.payment_method(),
        ] {
            // Every part is bounded far below u32::MAX by validation.
            let length = u32::try_from(part.len()).unwrap_or(u32::MAX);
            hasher.update(length.to_be_bytes());
            hasher.update(part.as_bytes());
        }
        Fingerprint(hex::encode(hasher.finalize()))
    }
}
