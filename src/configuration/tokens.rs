//! The token store chosen and the lifetimes of its tokens; the Postgres store's pool and purge.

use std::time::Duration;

use super::parse_duration;
use crate::token::{TokenMode, TokenPolicy};

/// Which store keeps the idempotency tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TokenStoreKind {
    /// Redis (the fast path): one hash per key, every transition a Lua script.
    // The flag's help describes the values; a help per value would switch `--help`
    // to its long layout. The doc comments are for the library.
    #[value(help = None::<&str>)]
    Redis,
    /// The `idempotency_tokens` table in the payments database.
    #[value(help = None::<&str>)]
    Postgres,
}

/// The token store and the lifetimes of its tokens.
#[derive(Debug, Clone, clap::Args)]
pub struct TokenSettings {
    /// Where tokens live: Redis (fast path) or the payments database.
    #[arg(
        long = "token-store",
        env = "TOKEN_STORE",
        value_enum,
        default_value = "redis"
    )]
    pub store: TokenStoreKind,
    /// `implicit`: a command's first reservation creates its token; `issued`: only
    /// tokens minted beforehand (`tokens issue`) may be reserved.
    #[arg(
        long = "token-mode",
        env = "TOKEN_MODE",
        value_enum,
        default_value = "implicit"
    )]
    pub mode: TokenMode,
    /// How long a reservation stays exclusive without being extended.
    #[arg(long = "lease", env = "LEASE", default_value = "30s", value_parser = parse_duration)]
    pub lease: Duration,
    /// TTL of a token created implicitly, kept when it is restored.
    #[arg(long = "token-ttl", env = "TOKEN_TTL", default_value = "24h", value_parser = parse_duration)]
    pub pending_ttl: Duration,
    /// TTL of a `completed` tombstone.
    #[arg(long = "completed-ttl", env = "COMPLETED_TTL", default_value = "24h", value_parser = parse_duration)]
    pub completed_ttl: Duration,
}

impl TokenSettings {
    /// The lifetimes and mode these settings give every token.
    pub fn policy(&self) -> TokenPolicy {
        TokenPolicy {
            mode: self.mode,
            lease: self.lease,
            pending_ttl: self.pending_ttl,
            completed_ttl: self.completed_ttl,
        }
    }
}

/// The Postgres token store's own pool and the purge of its expired rows (unused
/// with the Redis store, whose keys expire by themselves).
#[derive(Debug, Clone, clap::Args)]
pub struct TokenTableSettings {
    /// Postgres token store: connections of its own pool for lease renewals and the
    /// purge, apart from the payment pool (whose connections payments hold).
    #[arg(
        long = "token-lease-connections",
        env = "TOKEN_LEASE_CONNECTIONS",
        default_value_t = 4,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub lease_connections: u32,
    /// Postgres token store: how often a worker deletes expired token rows.
    #[arg(long = "token-purge-interval", env = "TOKEN_PURGE_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub purge_interval: Duration,
    /// Postgres token store: rows deleted per statement by the purge.
    #[arg(
        long = "token-purge-batch",
        env = "TOKEN_PURGE_BATCH",
        default_value_t = 1000
    )]
    pub purge_batch: usize,
}

impl Default for TokenTableSettings {
    fn default() -> Self {
        Self {
            lease_connections: 4,
            purge_interval: Duration::from_secs(30),
            purge_batch: 1000,
        }
    }
}
