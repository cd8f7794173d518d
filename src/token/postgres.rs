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

use super::postgres_purge;
use super::postgres_settle::PgSettle;
use super::postgres_statements::{
    CONFIRM, CONSUME, DELETE_DEAD_PENDING, EXPIRED_LEASES, EXTEND, ISSUE, LOCK_CREATE,
    LOCK_TAKE_OVER, READ, RELEASE, RESERVE_CREATE, RESERVE_IMPLICIT, RESERVE_ISSUED, RESTORE,
    UNSETTLED, WATCH,
};
use super::settle_wait::{SettleWatch, Woken};
use super::{
    Claim, Housekeeping, IdempotencyKey, IssueOutcome, LockOutcome, Predecessor, Reservation,
    SettleInTransaction, TokenError, TokenMode, TokenPolicy, TokenState, TokenStore, TokenView,
    Transition,
};

/// Longest wait for one statement (pool acquisition included) before the store is
/// reported `Unavailable`; the pool's own acquire timeout may be longer.
const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(10);

/// How often `reserve` re-decides when the follow-up read saw the token change between
/// the deciding statement and the read. Each retry needs another writer to have won a
/// race in between, so a handful is plenty.
const RESERVE_ATTEMPTS: usize = 8;

const MAX_MILLIS: u64 = 100 * 365 * 24 * 3600 * 1000;

#[derive(sqlx::FromRow)]
struct TokenRow {
    status: String,
    owner: Option<String>,
    fence: i64,
    payment_id: Option<Uuid>,
    fingerprint: Option<String>,
    live: Option<bool>,
    lease_left_ms: Option<i64>,
    ttl_ms: Option<i64>,
}

/// Tokens in the `idempotency_tokens` table: single statements on one row, time from `now()`.
#[derive(Clone, Debug)]
pub struct PostgresTokenStore {
    pool: PgPool,
    /// Lease renewals and the purge: never the payment pool, whose connections are all
    /// held by payment transactions at peak (a renewal waiting behind the very
    /// transaction it protects would starve it).
    maintenance: PgPool,
    policy: TokenPolicy,
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

    async fn timed<T>(
        &self,
        what: &'static str,
        // A key goes in as itself, never `as_str()`: its Display masks a card number
        // it holds, and these texts reach log lines.
        subject: impl std::fmt::Display,
        op: impl std::future::Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, TokenError> {
        match tokio::time::timeout(self.op_timeout, op).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(classify(e, what, &subject)),
            Err(_) => Err(TokenError::Unavailable(anyhow!(
                "{what} {subject}: no answer from Postgres within {:?}",
                self.op_timeout
            ))),
        }
    }

    /// How long a `processing` row outlives its deadline and lease (see `UNSETTLED`):
    /// issued mode only; implicit mode reserves such a row afresh.
    fn tombstone_ms(&self) -> i64 {
        match self.policy.mode {
            TokenMode::Issued => millis(self.policy.completed_ttl),
            TokenMode::Implicit => 0,
        }
    }

    /// Issued mode, no live token: missing, or the tombstone of one that expired
    /// while an attempt held it.
    async fn missing_or_unsettled(&self, key: &IdempotencyKey) -> Result<Reservation, TokenError> {
        let tombstone = self
            .timed(
                "reserve",
                key,
                sqlx::query_scalar::<_, i64>(UNSETTLED)
                    .bind(key.as_str())
                    .bind(self.tombstone_ms())
                    .fetch_optional(&self.pool),
            )
            .await?;
        Ok(match tombstone {
            Some(_) => Reservation::Unsettled,
            None => Reservation::Missing,
        })
    }

    async fn read(&self, key: &IdempotencyKey) -> Result<Option<TokenRow>, TokenError> {
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

    /// The reserving statements as `owner`, taking the token from `lost` too when it
    /// holds it.
    async fn reserve_as(
        &self,
        key: &IdempotencyKey,
        owner: &str,
        lost: Option<&str>,
    ) -> Result<Reservation, TokenError> {
        let lease = millis(self.policy.lease);
        let pending_ttl = millis(self.policy.pending_ttl);
        // (statement, whether it takes the implicit token's TTL as $4, whether it
        // takes the lost owner after that)
        let statements: &[(&str, bool, bool)] = match self.policy.mode {
            TokenMode::Implicit => &[
                (RESERVE_CREATE, true, false),
                (RESERVE_IMPLICIT, true, true),
            ],
            TokenMode::Issued => &[(RESERVE_ISSUED, false, true)],
        };
        for _ in 0..RESERVE_ATTEMPTS {
            for &(statement, takes_ttl, takes_lost) in statements {
                let query = sqlx::query_as::<_, (i64, Option<String>)>(statement)
                    .bind(key.as_str())
                    .bind(owner)
                    .bind(lease);
                let query = if takes_ttl {
                    query.bind(pending_ttl)
                } else {
                    query
                };
                let query = if takes_lost { query.bind(lost) } else { query };
                let reserved = self
                    .timed("reserve", key, query.fetch_optional(&self.pool))
                    .await?;
                if let Some((fence, previous_owner)) = reserved {
                    let fence = fence_of(key, fence)?;
                    return Ok(Reservation::Reserved {
                        fence,
                        predecessor: predecessor(fence, previous_owner),
                    });
                }
            }
            // The statements decided "not yours"; this read only tells the caller why.
            // If it sees a reservable token, the token changed in between: decide again.
            match self.read(key).await? {
                None if self.policy.mode == TokenMode::Issued => {
                    return self.missing_or_unsettled(key).await
                }
                None => continue,
                Some(row) => match TokenState::parse(&row.status) {
                    Some(TokenState::Completed) => {
                        let payment_id = row.payment_id.ok_or_else(|| {
                            TokenError::Corrupt(format!("completed token {key} has no payment id"))
                        })?;
                        return Ok(Reservation::Completed {
                            payment_id,
                            fingerprint: row.fingerprint,
                        });
                    }
                    Some(TokenState::Processing) => {
                        let left = row.lease_left_ms.unwrap_or(0);
                        if left > 0 {
                            return Ok(Reservation::InFlight {
                                lease_left: Duration::from_millis(left.unsigned_abs()),
                            });
                        }
                    }
                    Some(TokenState::Pending) => {}
                    None => {
                        return Err(TokenError::Corrupt(format!(
                            "token {key} has status {:?}",
                            row.status
                        )))
                    }
                },
            }
        }
        Err(TokenError::Unavailable(anyhow!(
            "reserve {key}: the token kept changing for {RESERVE_ATTEMPTS} attempts"
        )))
    }
}

fn millis(duration: Duration) -> i64 {
    let ms = u64::try_from(duration.as_millis())
        .unwrap_or(MAX_MILLIS)
        .clamp(1, MAX_MILLIS);
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// Who held the token before a reservation under `fence`, from the `previous_owner`
/// the reserve statement returned: none kept means nobody for a first reservation and
/// somebody unknown after that (a completed token's tombstone ran out, or a row
/// restored before the column existed).
fn predecessor(fence: u64, previous_owner: Option<String>) -> Predecessor {
    match previous_owner {
        Some(owner) => Predecessor::Holder(owner),
        None if fence <= 1 => Predecessor::Nobody,
        None => Predecessor::Unknown,
    }
}

fn fence_of(key: &IdempotencyKey, fence: i64) -> Result<u64, TokenError> {
    u64::try_from(fence)
        .map_err(|_| TokenError::Corrupt(format!("token {key} has a negative fence {fence}")))
}

/// Connection trouble, timeouts and transient server states are worth retrying; values
/// this code cannot decode, or that violate the table's constraints, are not.
fn classify(err: sqlx::Error, what: &'static str, subject: &dyn std::fmt::Display) -> TokenError {
    let data_problem = match &err {
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|code| code.starts_with("22") || code.starts_with("23")),
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::TypeNotFound { .. } => true,
        _ => false,
    };
    if data_problem {
        TokenError::Corrupt(format!("{what} {subject}: {err}"))
    } else {
        TokenError::Unavailable(anyhow::Error::new(err).context(format!("{what} {subject}")))
    }
}

fn transition(applied: bool) -> Transition {
    if applied {
        Transition::Applied
    } else {
        Transition::Refused
    }
}

fn view_of(key: &IdempotencyKey, row: TokenRow) -> Result<TokenView, TokenError> {
    let state = TokenState::parse(&row.status)
        .ok_or_else(|| TokenError::Corrupt(format!("token {key} has status {:?}", row.status)))?;
    let lease_left = match state {
        TokenState::Processing => Some(Duration::from_millis(
            row.lease_left_ms
                .and_then(|ms| u64::try_from(ms).ok())
                .unwrap_or(0),
        )),
        _ => None,
    };
    Ok(TokenView {
        state,
        owner: row.owner,
        fence: fence_of(key, row.fence)?,
        lease_left,
        ttl: row
            .ttl_ms
            .and_then(|ms| u64::try_from(ms).ok())
            .map(Duration::from_millis),
        payment_id: row.payment_id,
    })
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
            postgres_purge::purge_batch(&self.maintenance, batch, self.tombstone_ms()),
        )
        .await
    }

    async fn housekeeping(&self) -> Result<Option<Housekeeping>, TokenError> {
        self.timed(
            "housekeeping",
            "token table",
            postgres_purge::housekeeping(&self.pool),
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

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;

    /// A first reservation follows nobody; a later one without a kept holder follows
    /// somebody unknown (a row restored before `previous_owner` existed), which the
    /// processor treats as a takeover: look up first.
    #[test]
    fn a_reservation_names_its_predecessor_from_the_kept_owner_and_the_fence() {
        assert_eq!(predecessor(1, None), Predecessor::Nobody);
        assert_eq!(predecessor(0, None), Predecessor::Nobody);
        assert_eq!(predecessor(2, None), Predecessor::Unknown);
        assert_eq!(predecessor(7, None), Predecessor::Unknown);
        assert_eq!(
            predecessor(2, Some("w-1".to_owned())),
            Predecessor::Holder("w-1".to_owned())
        );
        assert_eq!(
            predecessor(1, Some("w-1".to_owned())),
            Predecessor::Holder("w-1".to_owned())
        );
    }

    /// A server error with only an SQLSTATE, as Postgres would send it.
    #[derive(Debug)]
    struct ServerError(&'static str);

    impl std::fmt::Display for ServerError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "SQLSTATE {}", self.0)
        }
    }

    impl std::error::Error for ServerError {}

    impl sqlx::error::DatabaseError for ServerError {
        fn message(&self) -> &str {
            "server error"
        }
        fn code(&self) -> Option<Cow<'_, str>> {
            Some(Cow::Borrowed(self.0))
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    #[test]
    fn a_store_error_masks_a_card_number_in_its_key() {
        let card = IdempotencyKey::try_from("4111111111111111").expect("a valid key");
        for error in [
            sqlx::Error::ColumnNotFound("status".into()),
            sqlx::Error::PoolTimedOut,
        ] {
            let text = format!(
                "{:#}",
                anyhow::Error::new(classify(error, "confirm", &card))
            );
            assert!(text.contains("confirm"), "{text}");
            assert!(!text.contains("4111111111111111"), "{text}");
        }
    }

    fn retried(error: sqlx::Error) -> bool {
        let key = IdempotencyKey::try_from("k").expect("a valid key");
        classify(error, "reserve", &key).is_retryable()
    }

    /// What the processor retries: a retry cannot fix bad data (SQLSTATE classes 22
    /// and 23, values that do not decode), while the server going away, a serialization
    /// failure or a cancelled statement pass.
    #[test]
    fn only_failures_that_pass_are_retryable() {
        let server = |code| sqlx::Error::Database(Box::new(ServerError(code)));
        assert!(!retried(server("22003")), "numeric value out of range");
        assert!(!retried(server("23514")), "check violation");
        assert!(retried(server("40001")), "serialization failure");
        assert!(retried(server("57014")), "statement cancelled");
        assert!(!retried(sqlx::Error::ColumnNotFound("fence".into())));
        assert!(!retried(sqlx::Error::Decode("bad".into())));
        assert!(retried(sqlx::Error::PoolTimedOut));
        assert!(retried(sqlx::Error::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset
        ))));
    }
}
