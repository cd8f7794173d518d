//! The token store and the payments database together, as `StoreSettings` say:
//! opened, checked against the server's connection limit, and purged.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sqlx::PgPool;

use super::database::{connect_with_size, open_database};
use crate::configuration::{
    MigrateMode, RedisSettings, StoreSettings, TokenSettings, TokenStoreKind, TokenTableSettings,
};
use crate::redaction::redact_url;
use crate::telemetry::events::TokensPurged;
use crate::token::{PostgresTokenStore, RedisTokenStore, TokenStore};

/// The Redis nodes to connect to, as `REDIS_URL` (or its file), `REDIS_CLUSTER`,
/// `REDIS_CA_CERT` and `REDIS_CLIENT_CERT`/`REDIS_CLIENT_KEY` say (the TLS files are
/// read here: configuration stays data).
fn redis_target(redis: &RedisSettings) -> anyhow::Result<crate::token::RedisTarget> {
    let read = crate::configuration::read_named_setting_file;
    let ca_pem = redis
        .ca_cert
        .as_deref()
        .map(|path| read("REDIS_CA_CERT", path))
        .transpose()?;
    let identity = match (&redis.client_cert, &redis.client_key) {
        (Some(cert), Some(key)) => Some(crate::token::ClientIdentity {
            cert_pem: read("REDIS_CLIENT_CERT", cert)?,
            key_pem: read("REDIS_CLIENT_KEY", key)?,
        }),
        (None, None) => None,
        _ => anyhow::bail!("REDIS_CLIENT_CERT and REDIS_CLIENT_KEY go together"),
    };
    let url = redis.url();
    Ok(crate::token::RedisTarget::parse(url, redis.cluster)
        .with_context(|| format!("invalid REDIS_URL {}", redact_url(url)))?
        .with_ca_pem(ca_pem)
        .with_client_identity(identity))
}

/// The token store `settings.store` names: Redis (connected here) or the
/// `idempotency_tokens` table behind `pool`.
pub async fn token_store(
    settings: &TokenSettings,
    redis: &RedisSettings,
    pool: &PgPool,
) -> anyhow::Result<Arc<dyn TokenStore>> {
    Ok(match settings.store {
        TokenStoreKind::Redis => Arc::new(
            RedisTokenStore::connect_to(
                &redis_target(redis)?,
                redis.key_prefix.clone(),
                settings.policy(),
            )
            .await
            .context("connecting to Redis")?,
        ),
        TokenStoreKind::Postgres => {
            Arc::new(PostgresTokenStore::new(pool.clone(), settings.policy()))
        }
    })
}

/// The migrated payments database and the configured token store. The Postgres
/// token store gets its own small pool for lease renewals and the purge.
pub async fn open_stores(
    settings: &StoreSettings,
) -> anyhow::Result<(PgPool, Arc<dyn TokenStore>)> {
    let pool = open_database(&settings.database, settings.migrate).await?;
    let tokens: Arc<dyn TokenStore> = match settings.tokens.store {
        TokenStoreKind::Redis => token_store(&settings.tokens, &settings.redis, &pool).await?,
        TokenStoreKind::Postgres => {
            let lease_pool =
                connect_with_size(&settings.database, settings.token_table.lease_connections)
                    .await?;
            Arc::new(
                PostgresTokenStore::new(pool.clone(), settings.tokens.policy())
                    .with_maintenance_pool(lease_pool),
            )
        }
    };
    Ok((pool, tokens))
}

/// [`open_stores`] as they are, for the commands that look at them (`audit`, a
/// replay's dry run, `tokens show`): never creates or migrates the database,
/// whatever `--migrate` says. A newer binary run from a laptop must not move
/// production's schema ahead of its rollout, and a misspelt database name must not
/// come back as a new, empty database reported as "nothing charged yet".
pub async fn open_existing_stores(
    settings: &StoreSettings,
) -> anyhow::Result<(PgPool, Arc<dyn TokenStore>)> {
    open_stores(&StoreSettings {
        migrate: MigrateMode::Skip,
        ..settings.clone()
    })
    .await
}

/// Start-up check: the server must accept every connection this process's pools
/// may open, or payments would fail on "too many clients" under load instead of
/// waiting for their turn (see `Processor`: one running attempt per payment-pool
/// connection, everything else queues before reserving its token).
pub async fn check_connection_budget(
    settings: &StoreSettings,
    pool: &PgPool,
    gateway_connections: u32,
) -> anyhow::Result<()> {
    // `!`: a setting every server has is never NULL; Postgres cannot tell of a call.
    let settings_read = sqlx::query!(
        r#"SELECT current_setting('max_connections') AS "max!",
                  current_setting('superuser_reserved_connections') AS "reserved!""#
    )
    .fetch_one(pool)
    .await
    .context("reading the server's max_connections")?;
    let (max, reserved) = (settings_read.max, settings_read.reserved);
    let usable = max
        .parse::<u32>()
        .unwrap_or(u32::MAX)
        .saturating_sub(reserved.parse::<u32>().unwrap_or(0));
    let needed = settings
        .connections_needed()
        .saturating_add(gateway_connections);
    let mut lease_part = match settings.tokens.store {
        TokenStoreKind::Redis => String::new(),
        TokenStoreKind::Postgres => format!(
            " + TOKEN_LEASE_CONNECTIONS {} (the Postgres token store's lease-renewal pool) \
             + 1 (its LISTEN connection for settle announcements)",
            settings.token_table.lease_connections
        ),
    };
    if gateway_connections > 0 {
        lease_part.push_str(&format!(
            " + STRIPE_RECORD_CONNECTIONS {gateway_connections} (the Stripe gateway's records)"
        ));
    }
    anyhow::ensure!(
        needed <= usable,
        "the worker needs {needed} Postgres connections: DATABASE_MAX_CONNECTIONS {} \
         (one per payment running at once){lease_part}; the server at {} accepts {usable} \
         (max_connections {max} - superuser_reserved_connections {reserved}) for all its \
         clients together. Lower DATABASE_MAX_CONNECTIONS (payments beyond it wait their \
         turn before reserving their token) or raise the server's max_connections",
        settings.database.max_connections,
        redact_url(settings.database.url()),
    );
    Ok(())
}

/// `run`: the Postgres token store's expired rows are deleted every
/// `settings.purge_interval`, in statements of `settings.purge_batch` rows, at most
/// [`PURGE_BATCHES_PER_ROUND`] statements per round so one round stays short; every
/// worker purges, and `SKIP LOCKED` lets them share the work without waiting on one
/// another. A no-op for stores whose keys expire by themselves.
pub fn spawn_token_purge(
    tokens: Arc<dyn TokenStore>,
    settings: &TokenTableSettings,
) -> tokio::task::JoinHandle<()> {
    let settings = settings.clone();
    tokio::spawn(async move {
        let mut ticker =
            tokio::time::interval(settings.purge_interval.max(Duration::from_millis(10)));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            purge_round(tokens.as_ref(), settings.purge_batch).await;
        }
    })
}

/// Most purge statements in one round; what is left waits for the next round.
pub const PURGE_BATCHES_PER_ROUND: usize = 20;

/// One round of the purge; returns the rows deleted.
pub async fn purge_round(tokens: &dyn TokenStore, batch: usize) -> u64 {
    let mut purged = 0;
    for _ in 0..PURGE_BATCHES_PER_ROUND {
        match tokens.purge_expired(batch).await {
            Ok(0) => break,
            Ok(rows) => {
                purged += rows;
                crate::telemetry::emit(TokensPurged { count: rows });
                if rows < batch as u64 {
                    break;
                }
                // Leave room for the payments between two statements.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(error) => {
                tracing::warn!(%error, "purging expired tokens failed; next round tries again");
                break;
            }
        }
    }
    if purged > 0 {
        tracing::debug!(purged, "expired tokens purged");
    }
    purged
}
