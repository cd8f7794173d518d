//! What every command that touches payments and tokens needs: the stores, and with the
//! gateway, what one command needs besides Kafka.

use super::{
    DatabaseSettings, GatewaySettings, MigrateMode, RedisSettings, TokenSettings, TokenStoreKind,
    TokenTableSettings,
};

/// Where payments and tokens live: what every command that touches them needs.
#[derive(Debug, Clone, clap::Args)]
pub struct StoreSettings {
    /// `auto` creates and migrates the database at start (owner role); `skip`
    /// leaves that to the `migrate` command, so a DML-only role is enough. `audit`,
    /// `replay --dry-run` and `tokens show` never migrate.
    #[arg(long = "migrate", env = "MIGRATE", value_enum, default_value = "auto")]
    pub migrate: MigrateMode,
    /// The payments database.
    #[command(flatten)]
    pub database: DatabaseSettings,
    /// The Redis token store (unused with `--token-store postgres`).
    #[command(flatten)]
    pub redis: RedisSettings,
    /// Which token store, and the tokens' lifetimes.
    #[command(flatten)]
    pub tokens: TokenSettings,
    /// The Postgres token store's own pool and purge.
    #[command(flatten)]
    pub token_table: TokenTableSettings,
}

impl StoreSettings {
    /// Connections this process opens to Postgres at most.
    pub fn connections_needed(&self) -> u32 {
        let lease_pool = match self.tokens.store {
            TokenStoreKind::Redis => 0,
            // And the one connection that LISTENs for settle announcements.
            TokenStoreKind::Postgres => self.token_table.lease_connections.saturating_add(1),
        };
        self.database.max_connections.saturating_add(lease_pool)
    }
}

/// Everything one command needs besides Kafka.
#[derive(Debug, Clone, clap::Args)]
pub struct ProcessorSettings {
    /// Where payments and tokens live.
    #[command(flatten)]
    pub stores: StoreSettings,
    /// The payment gateway.
    #[command(flatten)]
    pub gateway: GatewaySettings,
}
