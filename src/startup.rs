//! Wiring: builds stores, gateway, processor and handler from settings.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sqlx::PgPool;

use crate::configuration::{
    redact_url, GatewaySettings, KafkaSettings, RedisSettings, StoreSettings, TokenSettings,
    TokenStoreKind, TokenTableSettings, WorkerSettings,
};
use crate::gateway::{HttpGateway, PaymentGateway};
use crate::payment::Processor;
use crate::retry::RetryPolicy;
use crate::token::{PostgresTokenStore, RedisTokenStore, TokenStore};
use crate::worker::{Handler, Publisher};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Applies `migrations/`. Safe to run concurrently from several processes.
pub async fn migrate(pool: &PgPool) -> anyhow::Result<()> {
    MIGRATOR
        .run(pool)
        .await
        .context("applying migrations failed")
}

pub async fn token_store(
    settings: &TokenSettings,
    redis: &RedisSettings,
    pool: &PgPool,
) -> anyhow::Result<Arc<dyn TokenStore>> {
    Ok(match settings.store {
        TokenStoreKind::Redis => Arc::new(
            RedisTokenStore::connect_to(
                &redis.target()?,
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

pub fn gateway(settings: &GatewaySettings) -> anyhow::Result<Arc<dyn PaymentGateway>> {
    Ok(Arc::new(HttpGateway::new(
        &settings.url,
        settings.timeout,
        settings.connect_timeout,
    )?))
}

impl StoreSettings {
    /// The migrated payments database and the configured token store. The Postgres
    /// token store gets its own small pool for lease renewals and the purge.
    pub async fn open(&self) -> anyhow::Result<(PgPool, Arc<dyn TokenStore>)> {
        let pool = self.database.open(self.migrate).await?;
        let tokens: Arc<dyn TokenStore> = match self.tokens.store {
            TokenStoreKind::Redis => token_store(&self.tokens, &self.redis, &pool).await?,
            TokenStoreKind::Postgres => {
                let lease_pool = self
                    .database
                    .connect_with_size(self.token_table.lease_connections)
                    .await?;
                Arc::new(
                    PostgresTokenStore::new(pool.clone(), self.tokens.policy())
                        .with_maintenance_pool(lease_pool),
                )
            }
        };
        Ok((pool, tokens))
    }

    /// Connections this process opens to Postgres at most.
    pub fn connections_needed(&self) -> u32 {
        let lease_pool = match self.tokens.store {
            TokenStoreKind::Redis => 0,
            TokenStoreKind::Postgres => self.token_table.lease_connections,
        };
        self.database.max_connections.saturating_add(lease_pool)
    }

    /// Start-up check: the server must accept every connection this process's pools
    /// may open, or payments would fail on "too many clients" under load instead of
    /// waiting for their turn (see `Processor`: one running attempt per payment-pool
    /// connection, everything else queues before reserving its token).
    pub async fn check_connection_budget(&self, pool: &PgPool) -> anyhow::Result<()> {
        let (max, reserved): (String, String) = sqlx::query_as(
            "SELECT current_setting('max_connections'), current_setting('superuser_reserved_connections')",
        )
        .fetch_one(pool)
        .await
        .context("reading the server's max_connections")?;
        let usable = max
            .parse::<u32>()
            .unwrap_or(u32::MAX)
            .saturating_sub(reserved.parse::<u32>().unwrap_or(0));
        let needed = self.connections_needed();
        let lease_part = match self.tokens.store {
            TokenStoreKind::Redis => String::new(),
            TokenStoreKind::Postgres => format!(
                " + TOKEN_LEASE_CONNECTIONS {} (the Postgres token store's lease-renewal pool)",
                self.token_table.lease_connections
            ),
        };
        anyhow::ensure!(
            needed <= usable,
            "the worker needs {needed} Postgres connections: DATABASE_MAX_CONNECTIONS {} \
             (one per payment running at once){lease_part}; the server at {} accepts {usable} \
             (max_connections {max} - superuser_reserved_connections {reserved}) for all its \
             clients together. Lower DATABASE_MAX_CONNECTIONS (payments beyond it wait their \
             turn before reserving their token) or raise the server's max_connections",
            self.database.max_connections,
            redact_url(&self.database.url),
        );
        Ok(())
    }
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
                crate::telemetry::metrics().tokens_purged.add(rows, &[]);
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

/// Everything one command needs besides Kafka.
#[derive(Debug, Clone, clap::Args)]
pub struct ProcessorSettings {
    #[command(flatten)]
    pub stores: StoreSettings,
    #[command(flatten)]
    pub gateway: GatewaySettings,
}

impl ProcessorSettings {
    pub async fn build(&self, worker_id: &str) -> anyhow::Result<Processor> {
        let (pool, tokens) = self.stores.open().await?;
        self.stores.check_connection_budget(&pool).await?;
        let gateway = gateway(&self.gateway)?;
        Ok(Processor::new(
            tokens,
            gateway,
            pool,
            self.gateway.lookup,
            worker_id,
        ))
    }
}

pub fn handler(
    processor: Arc<Processor>,
    kafka: &KafkaSettings,
    worker: &WorkerSettings,
) -> anyhow::Result<Arc<Handler>> {
    let retry = RetryPolicy {
        budget: worker.retry_budget,
        ..RetryPolicy::default()
    };
    Ok(Arc::new(Handler::new(
        processor,
        Publisher::for_mode(kafka, worker)?,
        retry,
    )))
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(error) => {
                    tracing::warn!(%error, "cannot listen for SIGTERM; Ctrl-C only");
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
