//! The secret of `x-key-hmac-sha256` (`KEY_HASH_SECRET_FILE`): the keyed hash a
//! worker puts on an answer whose record key it echoes masked or leaves out.

use super::secrets::{SecretFile, SecretFileParser};
use crate::redaction::{KeyHasher, KeySecretSource};

/// Where the key hash's secret comes from.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct KeyHashSettings {
    /// File holding the secret of `x-key-hmac-sha256`, the keyed hash (HMAC-SHA256)
    /// of a record key an answer echoes masked; read once at start. Without it each
    /// process makes a random secret, and nobody can compute a key's hash again.
    #[arg(
        long = "key-hash-secret-file",
        env = "KEY_HASH_SECRET_FILE",
        value_name = "PATH",
        value_parser = SecretFileParser::new("KEY_HASH_SECRET"),
        hide_env_values = true
    )]
    pub secret_file: Option<SecretFile>,
}

impl KeyHashSettings {
    /// The hasher: under the file's secret, else under this process's random one,
    /// which is said once at start.
    pub fn hasher(&self) -> anyhow::Result<KeyHasher> {
        match &self.secret_file {
            Some(file) => Ok(KeyHasher::configured(file.contents())?),
            None => {
                let hasher = KeyHasher::for_this_process();
                warn_random_secret_once(&hasher);
                Ok(hasher)
            }
        }
    }
}

/// The warning that answers carry hashes no one can compute again.
fn warn_random_secret_once(hasher: &KeyHasher) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    if hasher.source() == KeySecretSource::RandomPerProcess {
        WARNED.call_once(|| {
            crate::telemetry::warn_at_start(
                "KEY_HASH_SECRET_FILE is not set: x-key-hmac-sha256 on answers whose key \
                 is masked is keyed with a random secret of this process, so no one can \
                 compute a key's hash again to find its record (set it for `payment-worker \
                 key-hash`)"
                    .to_owned(),
            );
        });
    }
}
