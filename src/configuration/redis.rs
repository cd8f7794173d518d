//! The Redis token store: where it is, how its keys are named, how long a call may take.

use super::{SecretFile, SecretFileParser};
use crate::redaction::redact_url;

/// `REDIS_URL` when none is given: a local Redis.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";

/// Where the Redis token store is and how its keys are named.
#[derive(Clone, clap::Args)]
pub struct RedisSettings {
    /// Redis URL: `redis://` or `rediss://` (TLS) for one node; `redis+cluster://h1:p1,h2:p2`
    /// (or `rediss+cluster://`) for a Redis Cluster; `redis+sentinel://h1:p1,h2:p2,h3:p3/<master>`
    /// (or `rediss+sentinel://`) for the master a group of Sentinels names.
    // Read it through `RedisSettings::url`, which takes REDIS_URL_FILE into account.
    #[arg(id = "redis_url", long = "redis-url", env = "REDIS_URL", default_value = DEFAULT_REDIS_URL, hide_env_values = true)]
    pub url: String,
    /// File holding the Redis URL, read once at start (a trailing line break is
    /// ignored); instead of REDIS_URL.
    #[arg(
        id = "redis_url_file",
        long = "redis-url-file",
        env = "REDIS_URL_FILE",
        value_name = "PATH",
        value_parser = SecretFileParser::new("REDIS_URL"),
        conflicts_with = "redis_url",
        hide_env_values = true
    )]
    pub url_file: Option<SecretFile>,
    /// Treat a comma-separated REDIS_URL (`redis://h1:p1,redis://h2:p2`) as the seed
    /// nodes of a Redis Cluster.
    #[arg(id = "redis_cluster", long = "redis-cluster", env = "REDIS_CLUSTER")]
    pub cluster: bool,
    /// PEM file of the CA that signs the Redis servers' TLS certificates (default: the
    /// system roots).
    #[arg(id = "redis_ca_cert", long = "redis-ca-cert", env = "REDIS_CA_CERT")]
    pub ca_cert: Option<std::path::PathBuf>,
    /// PEM certificate (chain) this worker presents to Redis (`rediss://`, mutual TLS).
    #[arg(
        id = "redis_client_cert",
        long = "redis-client-cert",
        env = "REDIS_CLIENT_CERT",
        value_name = "PATH",
        requires = "redis_client_key"
    )]
    pub client_cert: Option<std::path::PathBuf>,
    /// PEM private key of REDIS_CLIENT_CERT.
    #[arg(
        id = "redis_client_key",
        long = "redis-client-key",
        env = "REDIS_CLIENT_KEY",
        value_name = "PATH",
        requires = "redis_client_cert"
    )]
    pub client_key: Option<std::path::PathBuf>,
    /// Key prefix, 1–64 of [A-Za-z0-9._:-]; each key is `<prefix>:token:{<idempotency key>}` (hash-tagged for Redis Cluster).
    #[arg(
        id = "redis_key_prefix",
        long = "redis-key-prefix",
        env = "REDIS_KEY_PREFIX",
        default_value = "pw",
        value_parser = super::names::parse_name
    )]
    pub key_prefix: String,
}

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettings")
            .field("url", &redact_url(self.url()))
            .field("url_file", &self.url_file.as_ref().map(SecretFile::path))
            .field("cluster", &self.cluster)
            .field("ca_cert", &self.ca_cert)
            .field("client_cert", &self.client_cert)
            .field("client_key", &self.client_key)
            .field("key_prefix", &self.key_prefix)
            .finish()
    }
}

impl RedisSettings {
    /// Settings for the Redis at `url`: no TLS files, keys under `key_prefix`.
    pub fn with_url(url: impl Into<String>, key_prefix: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            url_file: None,
            cluster: false,
            ca_cert: None,
            client_cert: None,
            client_key: None,
            key_prefix: key_prefix.into(),
        }
    }

    /// The Redis URL: REDIS_URL_FILE's contents when given, else REDIS_URL.
    pub fn url(&self) -> &str {
        match &self.url_file {
            Some(file) => file.contents().expose(),
            None => &self.url,
        }
    }
}
