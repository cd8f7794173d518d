//! The keyed hash that lets operators find a record whose key the worker echoes
//! masked (it held a card number) or leaves out (too large for a result):
//! `x-key-hmac-sha256`, the hex HMAC-SHA256 of the key as it came under a secret
//! only the operators hold (PCI DSS 4.0 §3.5.1.1: a hash of a card number must be
//! keyed). A plain SHA-256 of a key that shows its last four digits could be
//! reversed by trying the few billion numbers left.

use std::sync::OnceLock;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::Secret;

/// Where a [`KeyHasher`]'s secret comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySecretSource {
    /// The operators' secret (`KEY_HASH_SECRET_FILE`): the same in every process
    /// given it, so a key's hash can be computed again (`payment-worker key-hash`).
    Configured,
    /// A random secret made when the process started and never shown: the hashes of
    /// one process match each other only, and nobody can compute them again.
    RandomPerProcess,
}

/// The secret is empty: a keyed hash under no key is a plain hash.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("KEY_HASH_SECRET_FILE holds an empty secret")]
pub struct EmptyKeySecret;

/// Computes `x-key-hmac-sha256`. `Debug` names the secret's source, never the secret.
#[derive(Clone)]
pub struct KeyHasher {
    keyed: Hmac<Sha256>,
    source: KeySecretSource,
}

impl KeyHasher {
    /// The hasher under the operators' secret.
    pub fn configured(secret: &Secret) -> Result<Self, EmptyKeySecret> {
        Self::keyed(secret.expose().as_bytes(), KeySecretSource::Configured)
    }

    /// The hasher under this process's random secret, made on first use. The
    /// caller says at start that the hashes cannot be computed again.
    pub fn for_this_process() -> Self {
        static RANDOM: OnceLock<KeyHasher> = OnceLock::new();
        RANDOM
            .get_or_init(|| {
                let secret: [u8; 32] = rand::random();
                // 32 bytes are never empty.
                Self::keyed(&secret, KeySecretSource::RandomPerProcess)
                    .unwrap_or_else(|_| unreachable!("a 32-byte secret is not empty"))
            })
            .clone()
    }

    fn keyed(secret: &[u8], source: KeySecretSource) -> Result<Self, EmptyKeySecret> {
        if secret.is_empty() {
            return Err(EmptyKeySecret);
        }
        // HMAC takes a key of any length (a long one is hashed first).
        let keyed = <Hmac<Sha256> as Mac>::new_from_slice(secret).map_err(|_| EmptyKeySecret)?;
        Ok(Self { keyed, source })
    }

    /// Where the secret comes from.
    pub fn source(&self) -> KeySecretSource {
        self.source
    }

    /// The hex HMAC-SHA256 of `key`, the bytes as they came.
    pub fn hex(&self, key: &[u8]) -> String {
        let mut mac = self.keyed.clone();
        mac.update(key);
        hex::encode(mac.finalize().into_bytes())
    }
}

impl std::fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyHasher")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_rfc_4231_hmac_sha256_under_the_secret() {
        // RFC 4231, test case 2.
        let hasher = KeyHasher::configured(&Secret::from("Jefe")).expect("a secret");
        assert_eq!(
            hasher.hex(b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(hasher.source(), KeySecretSource::Configured);
        assert!(!format!("{hasher:?}").contains("Jefe"));
        // Another secret, another hash: no plain SHA-256 of the key.
        let other = KeyHasher::configured(&Secret::from("Jeff")).expect("a secret");
        assert_ne!(
            other.hex(b"4111111111111111"),
            hasher.hex(b"4111111111111111")
        );
        assert_eq!(
            KeyHasher::configured(&Secret::from("")).map(|h| h.hex(b"k")),
            Err(EmptyKeySecret)
        );
    }

    #[test]
    fn the_random_secret_is_one_per_process() {
        let one = KeyHasher::for_this_process();
        let again = KeyHasher::for_this_process();
        assert_eq!(one.source(), KeySecretSource::RandomPerProcess);
        assert_eq!(one.hex(b"4111111111111111"), again.hex(b"4111111111111111"));
        // Not the plain SHA-256 a secretless hash would be.
        assert_ne!(
            one.hex(b"4111111111111111"),
            "9bbef19476623ca56c17da75fd57734dbf82530686043a6e491c6d71befe8f6e"
        );
    }
}
