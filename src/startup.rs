//! Wiring: builds stores, gateway, processor and handler from settings.

use std::sync::Arc;

use anyhow::Context;
use sqlx::PgPool;

use crate::configuration::{
    GatewaySettings, KafkaSettings, RedisSettings, StoreSettings, TokenSettings, TokenStoreKind,
    WorkerSettings,
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
    /// The migrated payments database and the configured token store.
    pub async fn open(&self) -> anyhow::Result<(PgPool, Arc<dyn TokenStore>)> {
        let pool = self.database.open(self.migrate).await?;
        let tokens = token_store(&self.tokens, &self.redis, &pool).await?;
        Ok((pool, tokens))
    }
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
        Publisher::new(kafka)?,
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
