//! The Postgres token store (`--token-store postgres`), for those who run no Redis:
//! every decision is ONE statement on ONE row with `status` and the deadlines checked
//! in its `WHERE`, so concurrent callers are serialised by the row lock and each one
//! re-evaluates the condition on the row as the previous one left it. Time is the
//! database's `now()`, never this host's clock.
//!
//! A row past its deadline is treated exactly like an absent one by every statement;
//! it is only deleted where that is free (consume, restore past the deadline).

use std::time::Duration;

use anyhow::anyhow;
use sqlx::PgPool;
use uuid::Uuid;

use std::sync::Arc;

use super::purge;
use super::rows::{classify, millis, transition, view_of, TokenRow};
use super::settle::PgSettle;
use super::statements::{
    CONFIRM, CONSUME, DELETE_DEAD_PENDING, EXPIRED_LEASES, EXTEND, ISSUE, LOCK_CREATE,
    LOCK_TAKE_OVER, READ, RELEASE, RESTORE, WATCH,
};
use crate::token::settle_wait::{SettleWatch, Woken};
use crate::token::{
    Claim, Housekeeping, IdempotencyKey, IssueOutcome, LockOutcome, Reservation,
    SettleInTransaction, TokenError, TokenMode, TokenPolicy, TokenStore, TokenView, Transition,
};

/// Longest wait for one statement (pool acquisition included) before the store is
/// reported `Unavailable`; the pool's own acquire timeout may be longer.
const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(10);

/// Tokens in the `idempotency_tokens` table: single statements on one row, time from `now()`.
#[derive(Clone, Debug)]
pub struct PostgresTokenStore {
    pub(super) pool: PgPool,
    /// Lease renewals and the purge: never the payment pool, whose connections are all
    /// held by payment transactions at peak (a renewal waiting behind the very
    /// transaction it protects would starve it).
    maintenance: PgPool,
    pub(super) policy: TokenPolicy,
    op_timeout: Duration,
    /// The process's LISTEN connection for settle announcements, shared by clones.
    settle: Arc<PgSettle>,
}

impl PostgresTokenStore {
    /// A store on one pool for everything (tools, tests). A worker gives lease
    /// renewals their own pool with [`Self::with_maintenance_pool`].
    pub fn new(pool: PgPool, policy: TokenPolicy) -> Self {
        Self {
            maintenance: pool.clone(),
            pool,
            policy,
            op_timeout: DEFAULT_OP_TIMEOUT,
            settle: Arc::default(),
        }
    }

    /// Lease renewals (`extend`) and the purge of expired rows use `pool` instead of
    /// the payment pool.
    pub fn with_maintenance_pool(mut self, pool: PgPool) -> Self {
        self.maintenance = pool;
        self
    }

    /// The pool for lease renewals and the purge (the payment pool unless one was given).
    pub fn maintenance_pool(&self) -> &PgPool {
        &self.maintenance
    }

    /// Caps how long one operation may wait for Postgres before it is `Unavailable`.
    pub fn with_op_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = timeout;
        self
    }

    /// The payment pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub(super) async fn timed<T>(
        &self,
        what: &'static str,
        // A key goes in as itself, never `as_str()`: its Display masks a card number
        // it holds, and these texts reach log lines.
        subject: impl std::fmt::Display,
        op: impl std::future::Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, TokenError> {
        match tokio::time::timeout(self.op_timeout, op).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                // A standby's answer: the pool drops the connections opened before it.
                crate::database_errors::note_read_only(&e);
                Err(classify(e, what, &subject))
            }
            Err(_) => Err(TokenError::Unavailable(anyhow!(
                "{what} {subject}: no answer from Postgres within {:?}",
                self.op_timeout
            ))),
        }
    }

    /// How long a `processing` row outlives its deadline and lease (see `UNSETTLED`):
    /// issued mode only; implicit mode reserves such a row afresh.
    pub(super) fn tombstone_ms(&self) -> i64 {
        match self.policy.mode {
            TokenMode::Issued => millis(self.policy.completed_ttl),
            TokenMode::Implicit => 0,
        }
    }

    pub(super) async fn read(&self, key: &IdempotencyKey) -> Result<Option<TokenRow>, TokenError> {
        let row = self
            .timed(
                "read",
                key,
                sqlx::query_as::<_, TokenRow>(READ)
                    .bind(key.as_str())
                    .fetch_optional(&self.pool),
            )
            .await?;
        Ok(row.filter(|r| r.live == Some(true)))
    }

    /// `CONFIRM` on `executor`: the pool for a confirm of its own, the payment's
    /// connection for one inside its transaction.
    async fn run_confirm<'c>(
        &self,
        executor: impl sqlx::PgExecutor<'c>,
        key: &IdempotencyKey,
        claim: &Claim,
        payment_id: Uuid,
        fingerprint: &str,
    ) -> Result<Transition, TokenError> {
        let Some(fence) = Self::fence_param(claim) else {
            return Ok(Transition::Refused);
        };
        let applied = self
            .timed(
                "confirm",
                key,
                sqlx::query_scalar::<_, i64>(CONFIRM)
                    .bind(key.as_str())
                    .bind(&claim.owner)
                    .bind(fence)
                    .bind(payment_id)
                    .bind(fingerprint)
                    .bind(millis(self.policy.completed_ttl))
                    .fetch_optional(executor),
            )
            .await?;
        Ok(transition(applied.is_some()))
    }

    /// The claim's fence as stored; `None` for a fence no row can hold (so: refused).
    fn fence_param(claim: &Claim) -> Option<i64> {
        i64::try_from(claim.fence).ok()
    }
}

#[async_trait::async_trait]
impl TokenStore for PostgresTokenStore {
    fn policy(&self) -> &TokenPolicy {
        &self.policy
    }

    async fn issue(&self, key: &IdempotencyKey, ttl: Duration) -> Result<IssueOutcome, TokenError> {
        let created = self
            .timed(
                "issue",
                key,
                sqlx::query_scalar::<_, i64>(ISSUE)
                    .bind(key.as_str())
                    .bind(millis(ttl))
                    .fetch_optional(&self.pool),
            )
            .await?;
        Ok(match created {
            Some(_) => IssueOutcome::Created,
            None => IssueOutcome::AlreadyExists,
        })
    }

    async fn consume(&self, key: &IdempotencyKey) -> Result<bool, TokenError> {
        let consumed = self
            .timed(
                "consume",
                key,
                sqlx::query_scalar::<_, i64>(CONSUME)
                    .bind(key.as_str())
                    .fetch_optional(&self.pool),
            )
            .await?;
        Ok(consumed.is_some())
    }

    async fn lock(
        &self,
        key: &IdempotencyKey,
        owner: &str,
        ttl: Duration,
    ) -> Result<LockOutcome, TokenError> {
        let ttl = millis(ttl);
        for statement in [LOCK_CREATE, LOCK_TAKE_OVER] {
            let acquired = self
                .timed(
                    "lock",
                    key,
                    sqlx::query_scalar::<_, String>(statement)
                        .bind(key.as_str())
                        .bind(owner)
                        .bind(ttl)
                        .fetch_optional(&self.pool),
                )
                .await?;
            if acquired.is_some() {
                return Ok(LockOutcome::Acquired);
            }
        }
        Ok(LockOutcome::Held)
    }

    async fn release(&self, key: &IdempotencyKey, owner: &str) -> Result<bool, TokenError> {
        let released = self
            .timed(
                "release",
                key,
                sqlx::query_scalar::<_, String>(RELEASE)
                    .bind(key.as_str())
                    .bind(owner)
                    .fetch_optional(&self.pool),
            )
            .await?;
        Ok(released.is_some())
    }

    async fn reserve(&self, key: &IdempotencyKey, owner: &str) -> Result<Reservation, TokenError> {
        self.reserve_as(key, owner, None).await
    }

    async fn reserve_reclaiming(
        &self,
        key: &IdempotencyKey,
        owner: &str,
        lost: &str,
    ) -> Result<Reservation, TokenError> {
        self.reserve_as(key, owner, Some(lost)).await
    }

    async fn confirm(
        &self,
        key: &IdempotencyKey,
        claim: &Claim,
        payment_id: Uuid,
        fingerprint: &str,
    ) -> Result<Transition, TokenError> {
        self.run_confirm(&self.pool, key, claim, payment_id, fingerprint)
            .await
    }

    async fn restore(&self, key: &IdempotencyKey, claim: &Claim) -> Result<Transition, TokenError> {
        let Some(fence) = Self::fence_param(claim) else {
            return Ok(Transition::Refused);
        };
        let restored = self
            .timed(
                "restore",
                key,
                sqlx::query_scalar::<_, bool>(RESTORE)
                    .bind(key.as_str())
                    .bind(&claim.owner)
                    .bind(fence)
                    .fetch_optional(&self.pool),
            )
            .await?;
        if restored == Some(true) {
            let cleanup = self
                .timed(
                    "restore",
                    key,
                    sqlx::query(DELETE_DEAD_PENDING)
                        .bind(key.as_str())
                        .execute(&self.pool),
                )
                .await;
            // The token is already dead by its deadline; a failed cleanup changes nothing.
            if let Err(e) = cleanup {
                tracing::debug!(%key, error = %e, "could not delete an expired token after restore");
            }
        }
        Ok(transition(restored.is_some()))
    }

    async fn extend(&self, key: &IdempotencyKey, claim: &Claim) -> Result<Transition, TokenError> {
        let Some(fence) = Self::fence_param(claim) else {
            return Ok(Transition::Refused);
        };
        let applied = self
            .timed(
                "extend",
                key,
                sqlx::query_scalar::<_, i64>(EXTEND)
                    .bind(key.as_str())
                    .bind(&claim.owner)
                    .bind(fence)
                    .bind(millis(self.policy.lease))
                    .fetch_optional(&self.maintenance),
            )
            .await?;
        Ok(transition(applied.is_some()))
    }

    async fn watch_settle(&self, key: &IdempotencyKey) -> Option<SettleWatch> {
        let watch = self.settle.watch(&self.maintenance, key.as_str()).await?;
        // Registered and listening first, then the row is marked: its settle is
        // announced from now on. No row marked: nothing (left) to wait for.
        let marked = self
            .timed(
                "watch",
                key,
                sqlx::query_scalar::<_, i64>(WATCH)
                    .bind(key.as_str())
                    .fetch_optional(&self.pool),
            )
            .await;
        match marked {
            Ok(Some(_)) => Some(watch),
            Ok(None) => Some(SettleWatch::ready(Woken::AlreadySettled)),
            // Unmarked, the settle would not be announced: back off as before.
            Err(_) => None,
        }
    }

    async fn show(&self, key: &IdempotencyKey) -> Result<Option<TokenView>, TokenError> {
        match self.read(key).await? {
            Some(row) => view_of(key, row).map(Some),
            None => Ok(None),
        }
    }

    fn in_transaction(&self) -> Option<&dyn SettleInTransaction> {
        Some(self)
    }

    async fn purge_expired(&self, batch: usize) -> Result<u64, TokenError> {
        self.timed(
            "purge",
            "expired tokens",
            purge::purge_batch(&self.maintenance, batch, self.tombstone_ms()),
        )
        .await
    }

    async fn housekeeping(&self) -> Result<Option<Housekeeping>, TokenError> {
        self.timed(
            "housekeeping",
            "token table",
            purge::housekeeping(&self.pool),
        )
        .await
        .map(Some)
    }

    async fn expired_leases(&self, limit: usize) -> Result<Vec<IdempotencyKey>, TokenError> {
        let keys = self
            .timed(
                "expired_leases",
                "scan",
                sqlx::query_scalar::<_, String>(EXPIRED_LEASES)
                    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                    .fetch_all(&self.pool),
            )
            .await?;
        keys.into_iter()
            .map(|raw| {
                IdempotencyKey::try_from(raw.as_str()).map_err(|e| {
                    TokenError::Corrupt(format!("token table holds an invalid key {raw:?}: {e}"))
                })
            })
            .collect()
    }
}

#[async_trait::async_trait]
impl SettleInTransaction for PostgresTokenStore {
    async fn confirm_in(
        &self,
        conn: &mut sqlx::PgConnection,
        key: &IdempotencyKey,
        claim: &Claim,
        payment_id: Uuid,
        fingerprint: &str,
    ) -> Result<Transition, TokenError> {
        // The same statement as `confirm`: its WHERE is the fence check (owner, fence,
        // status), and the row lock the UPDATE takes is held until COMMIT, so no
        // reservation can slip in between the check and the commit.
        self.run_confirm(conn, key, claim, payment_id, fingerprint)
            .await
    }
}
