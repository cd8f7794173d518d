//! The Postgres token store against a real Postgres: the shared contract, the rows it
//! leaves behind, and failure when Postgres is unreachable.

use std::sync::Arc;
use std::time::{Duration, Instant};

use payment_worker::token::{
    Claim, IdempotencyKey, PostgresTokenStore, Predecessor, Reservation, TokenError, TokenMode,
    TokenPolicy, TokenStore, Transition,
};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::helpers::{silent_server, TestDb};
use crate::token::contract::{
    self as contract, key, policy, Backend, RawToken, RACERS, RACE_ROUNDS,
};

/// The races open `RACERS` connections each; one at a time keeps the server (100
/// connections by default) usable for every other test running alongside.
static RACE_SLOT: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct PgBackend {
    pool: PgPool,
    /// The races' database, made by the harness: `#[sqlx::test]`'s pools share 20
    /// connections among all of a process's tests, fewer than the racers.
    _db: Option<TestDb>,
}

impl PgBackend {
    /// Over the database `#[sqlx::test]` made for the test.
    fn over(pool: PgPool) -> Self {
        Self { pool, _db: None }
    }

    /// A pool with one connection per racer, all opened before the race starts, so the
    /// racers' statements really reach the server together.
    async fn for_race() -> Self {
        let db = TestDb::new().await;
        db.pool.close().await;
        let pool = PgPoolOptions::new()
            .max_connections(RACERS as u32)
            .acquire_timeout(Duration::from_secs(30))
            .connect(&db.url)
            .await
            .unwrap();
        let mut held = Vec::new();
        for _ in 0..RACERS {
            held.push(pool.acquire().await.unwrap());
        }
        drop(held);
        Self {
            pool,
            _db: Some(db),
        }
    }
}

#[async_trait::async_trait]
impl Backend for PgBackend {
    async fn store(&self, policy: TokenPolicy) -> Arc<dyn TokenStore> {
        Arc::new(PostgresTokenStore::new(self.pool.clone(), policy))
    }

    async fn raw_token(&self, key: &IdempotencyKey) -> Option<RawToken> {
        let row: Option<(String, Option<String>, i64, Option<String>, Option<String>, i64, i64, Option<i64>)> =
            sqlx::query_as(
                "SELECT status, owner, fence, payment_id::text, fingerprint,
                        (EXTRACT(EPOCH FROM GREATEST(expires_at, lease_expires_at) - now()) * 1000)::bigint,
                        (EXTRACT(EPOCH FROM expires_at - now()) * 1000)::bigint,
                        (EXTRACT(EPOCH FROM lease_expires_at - now()) * 1000)::bigint
                   FROM idempotency_tokens WHERE key = $1",
            )
            .bind(key.as_str())
            .fetch_optional(&self.pool)
            .await
            .unwrap();
        row.map(
            |(
                status,
                owner,
                fence,
                payment_id,
                fingerprint,
                ttl_ms,
                expires_in_ms,
                lease_left_ms,
            )| RawToken {
                status,
                owner,
                fence: fence.try_into().unwrap(),
                payment_id,
                fingerprint,
                ttl_ms,
                expires_in_ms,
                lease_left_ms,
            },
        )
    }

    async fn raw_lock(&self, key: &IdempotencyKey) -> Option<String> {
        sqlx::query_scalar(
            "SELECT owner FROM idempotency_locks WHERE key = $1 AND expires_at > now()",
        )
        .bind(key.as_str())
        .fetch_optional(&self.pool)
        .await
        .unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn race_reserve_implicit() {
    let _slot = RACE_SLOT.lock().await;
    contract::race_reserve(
        &PgBackend::for_race().await,
        TokenMode::Implicit,
        RACE_ROUNDS,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn race_reserve_issued() {
    let _slot = RACE_SLOT.lock().await;
    contract::race_reserve(&PgBackend::for_race().await, TokenMode::Issued, RACE_ROUNDS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn race_takeover_of_lapsed_leases() {
    let _slot = RACE_SLOT.lock().await;
    contract::race_takeover(&PgBackend::for_race().await, RACE_ROUNDS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn race_consume() {
    let _slot = RACE_SLOT.lock().await;
    contract::race_consume(&PgBackend::for_race().await, RACE_ROUNDS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn race_lock() {
    let _slot = RACE_SLOT.lock().await;
    contract::race_lock(&PgBackend::for_race().await, RACE_ROUNDS).await;
}

#[sqlx::test]
async fn fencing(pool: PgPool) {
    contract::fencing(&PgBackend::over(pool)).await;
}

#[sqlx::test]
async fn confirm_wakes_a_waiting_reservation(pool: PgPool) {
    contract::confirm_wakes_a_waiting_reservation(&PgBackend::over(pool)).await;
}

#[sqlx::test]
async fn restore_wakes_a_waiting_reservation(pool: PgPool) {
    contract::restore_wakes_a_waiting_reservation(&PgBackend::over(pool)).await;
}

#[sqlx::test]
async fn a_settle_before_the_watch_is_not_missed(pool: PgPool) {
    contract::a_settle_before_the_watch_is_not_missed(&PgBackend::over(pool)).await;
}

#[sqlx::test]
async fn race_settle_against_watch(pool: PgPool) {
    contract::race_settle_against_watch(&PgBackend::over(pool), 200).await;
}

#[sqlx::test]
async fn late_confirm_without_takeover(pool: PgPool) {
    contract::late_confirm_without_takeover(&PgBackend::over(pool)).await;
}

#[sqlx::test]
async fn modes(pool: PgPool) {
    contract::modes(&PgBackend::over(pool)).await;
}

#[sqlx::test]
async fn a_lost_reservation_is_reclaimed_by_the_attempt_that_names_it_only(pool: PgPool) {
    contract::a_lost_reservation_is_reclaimed_by_the_attempt_that_names_it_only(&PgBackend::over(
        pool,
    ))
    .await;
}

#[sqlx::test]
async fn lapsed_lease_is_reservable(pool: PgPool) {
    contract::lapsed_lease_is_reservable(&PgBackend::over(pool)).await;
}

#[sqlx::test]
async fn reservations_name_the_previous_holder(pool: PgPool) {
    contract::reservations_name_the_previous_holder(&PgBackend::over(pool)).await;
}

#[sqlx::test]
async fn long_deadlines_are_kept_whole(pool: PgPool) {
    contract::long_deadlines_are_kept_whole(&PgBackend::over(pool)).await;
}

#[sqlx::test]
async fn restore_keeps_original_ttl(pool: PgPool) {
    contract::restore_keeps_original_ttl(&PgBackend::over(pool)).await;
}

#[sqlx::test]
async fn restore_after_deadline_removes(pool: PgPool) {
    contract::restore_after_deadline_removes(&PgBackend::over(pool)).await;
}

#[sqlx::test]
async fn tombstone_expires(pool: PgPool) {
    contract::tombstone_expires(&PgBackend::over(pool)).await;
}

#[sqlx::test]
async fn missing_expired_consumed(pool: PgPool) {
    contract::missing_expired_consumed(&PgBackend::over(pool)).await;
}

#[sqlx::test]
async fn a_token_expired_while_held_is_unsettled_not_missing(pool: PgPool) {
    contract::a_token_expired_while_held_is_unsettled_not_missing(&PgBackend::over(pool)).await;
}

#[sqlx::test]
async fn consume_only_pending(pool: PgPool) {
    contract::consume_only_pending(&PgBackend::over(pool)).await;
}

#[sqlx::test]
async fn lock_and_release(pool: PgPool) {
    contract::lock_and_release(&PgBackend::over(pool)).await;
}

#[sqlx::test]
async fn expired_leases_audit(pool: PgPool) {
    contract::expired_leases_audit(&PgBackend::over(pool)).await;
}

/// The table refuses states the store never writes, whatever writes them.
#[sqlx::test]
async fn schema_rejects_impossible_rows(pool: PgPool) {
    let backend = PgBackend::over(pool);
    for (label, sql) in [
        ("unknown status", "INSERT INTO idempotency_tokens (key, status, expires_at) VALUES ('a', 'done', now())"),
        ("unowned processing", "INSERT INTO idempotency_tokens (key, status, expires_at) VALUES ('b', 'processing', now())"),
        ("completed without payment", "INSERT INTO idempotency_tokens (key, status, expires_at) VALUES ('c', 'completed', now())"),
        ("negative fence", "INSERT INTO idempotency_tokens (key, status, fence, expires_at) VALUES ('d', 'pending', -1, now())"),
        ("empty key", "INSERT INTO idempotency_tokens (key, status, expires_at) VALUES ('', 'pending', now())"),
    ] {
        let err = sqlx::query(sql).execute(&backend.pool).await.expect_err(label);
        let code = err.as_database_error().and_then(|e| e.code()).map(|c| c.into_owned());
        assert_eq!(code.as_deref(), Some("23514"), "{label}: {err}");
    }
}

/// A row left past its deadline (nobody deletes rows on time in Postgres) is treated as
/// absent by every operation, and replaced by issue/reserve with the fence still growing.
#[sqlx::test]
async fn dead_rows_count_as_absent(pool: PgPool) {
    let backend = PgBackend::over(pool);
    let implicit = backend
        .store(policy(TokenMode::Implicit, 30_000, 60_000, 60_000))
        .await;
    let issued = backend
        .store(policy(TokenMode::Issued, 30_000, 60_000, 60_000))
        .await;
    let k = key("dead");
    sqlx::query(
        "INSERT INTO idempotency_tokens (key, status, owner, fence, lease_expires_at, expires_at)
         VALUES ($1, 'processing', 'ghost', 7, now() - interval '1 second', now() - interval '1 second')",
    )
    .bind(k.as_str())
    .execute(&backend.pool)
    .await
    .unwrap();
    assert_eq!(implicit.show(&k).await.unwrap(), None);
    assert!(implicit.expired_leases(10).await.unwrap().is_empty());
    // Its last owner cannot act on it either: in Redis the key would be gone.
    let ghost = Claim {
        owner: "ghost".into(),
        fence: 7,
    };
    let before = backend.raw_token(&k).await;
    assert_eq!(
        implicit
            .confirm(&k, &ghost, Uuid::new_v4(), "fp")
            .await
            .unwrap(),
        Transition::Refused
    );
    assert_eq!(
        implicit.restore(&k, &ghost).await.unwrap(),
        Transition::Refused
    );
    assert_eq!(
        implicit.extend(&k, &ghost).await.unwrap(),
        Transition::Refused
    );
    assert_eq!(
        backend
            .raw_token(&k)
            .await
            .map(|t| (t.status, t.owner, t.fence)),
        before.map(|t| (t.status, t.owner, t.fence)),
        "refused operations change nothing"
    );
    // In issued mode a row that died while held is a tombstone for the completed
    // TTL (its holder's charge may still land); once that has passed too, absent.
    assert_eq!(
        issued.reserve(&k, "w").await.unwrap(),
        Reservation::Unsettled
    );
    sqlx::query(
        "UPDATE idempotency_tokens
            SET lease_expires_at = now() - interval '61 seconds',
                expires_at = now() - interval '61 seconds'
          WHERE key = $1",
    )
    .bind(k.as_str())
    .execute(&backend.pool)
    .await
    .unwrap();
    assert_eq!(issued.reserve(&k, "w").await.unwrap(), Reservation::Missing);
    assert_eq!(
        implicit.reserve(&k, "w").await.unwrap(),
        Reservation::Reserved {
            fence: 8,
            predecessor: Predecessor::Holder("ghost".into())
        }
    );
    let row = backend.raw_token(&k).await.unwrap();
    assert_eq!(
        (row.status.as_str(), row.owner.as_deref(), row.fence),
        ("processing", Some("w"), 8)
    );
    assert!(
        row.expires_in_ms > 59_000,
        "a revived token gets a fresh deadline: {row:?}"
    );
}

fn assert_unavailable<T: std::fmt::Debug>(result: Result<T, TokenError>, started: Instant) {
    match result {
        Err(e @ TokenError::Unavailable(_)) => assert!(e.is_retryable(), "{e}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn unreachable_postgres_is_unavailable_promptly() {
    let pool = PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy("postgres://postgres@127.0.0.1:1/payments")
        .unwrap();
    let store = PostgresTokenStore::new(pool, TokenPolicy::default());
    let k = key("down");
    let started = Instant::now();
    let (reserve, issue, show, leases) = tokio::join!(
        store.reserve(&k, "w"),
        store.issue(&k, Duration::from_secs(1)),
        store.show(&k),
        store.expired_leases(10),
    );
    assert_unavailable(reserve, started);
    assert_unavailable(issue, started);
    assert_unavailable(show, started);
    assert_unavailable(leases, started);
}

/// A server that accepts connections but never answers must not hang the caller, even
/// with a pool that would wait far longer.
#[tokio::test]
async fn silent_postgres_is_unavailable_promptly() {
    let (addr, held) = silent_server().await;
    let pool = PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(60))
        .connect_lazy(&format!("postgres://postgres@{addr}/payments"))
        .unwrap();
    let store = PostgresTokenStore::new(pool, TokenPolicy::default())
        .with_op_timeout(Duration::from_secs(1));
    let started = Instant::now();
    assert_unavailable(store.reserve(&key("silent"), "w").await, started);
    held.abort();
}
