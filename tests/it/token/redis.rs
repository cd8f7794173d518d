//! The Redis token store against a real Redis: the shared contract, the key layout, the
//! scripts' behaviour on foreign data, and failure when Redis is unreachable.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use payment_worker::token::{
    IdempotencyKey, RedisTokenStore, Reservation, TokenError, TokenMode, TokenPolicy, TokenState,
    TokenStore,
};
use redis::aio::ConnectionManager;
use redis::AsyncCommands;

use crate::support::helpers::{patient_connection, silent_server, TestRedis, REDIS_URL};
use crate::support::tokens::{redis_token_hash, redis_token_key};
use crate::token::contract::{self as contract, key, policy, Backend, RawToken, RACE_ROUNDS};

struct RedisBackend {
    prefix: String,
    client: redis::Client,
    conn: ConnectionManager,
}

impl RedisBackend {
    async fn new() -> Self {
        let redis = TestRedis::new().await;
        Self {
            prefix: redis.prefix,
            client: redis::Client::open(REDIS_URL).unwrap(),
            conn: redis.conn,
        }
    }

    fn token_key(&self, key: &IdempotencyKey) -> String {
        redis_token_key(&self.prefix, key.as_str())
    }

    fn lock_key(&self, key: &IdempotencyKey) -> String {
        format!("{}:lock:{{{}}}", self.prefix, key.as_str())
    }

    async fn hash(&self, key: &IdempotencyKey) -> HashMap<String, String> {
        redis_token_hash(&mut self.conn.clone(), &self.prefix, key.as_str()).await
    }
}

#[async_trait::async_trait]
impl Backend for RedisBackend {
    async fn store(&self, policy: TokenPolicy) -> Arc<dyn TokenStore> {
        // The contract asserts who wins, not how fast: with redis-rs's default
        // half-second answer timeout, a racer on a loaded machine failed for the
        // machine's sake (and the others waited for it at the round's barrier).
        let conn = patient_connection(self.client.clone(), Duration::from_secs(30)).await;
        // Settles announced as a worker's store (`connect_to`) has them.
        Arc::new(
            RedisTokenStore::new(conn, self.prefix.clone(), policy)
                .with_settle_notifications(self.client.clone()),
        )
    }

    async fn raw_token(&self, key: &IdempotencyKey) -> Option<RawToken> {
        let redis_key = self.token_key(key);
        let (fields, pttl, (secs, micros)): (HashMap<String, String>, i64, (i64, i64)) =
            redis::pipe()
                .atomic()
                .hgetall(&redis_key)
                .pttl(&redis_key)
                .cmd("TIME")
                .query_async(&mut self.conn.clone())
                .await
                .unwrap();
        RawToken::from_redis_hash(&fields, pttl, secs * 1000 + micros / 1000)
    }

    async fn raw_lock(&self, key: &IdempotencyKey) -> Option<String> {
        self.conn.clone().get(self.lock_key(key)).await.unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn race_reserve_implicit() {
    contract::race_reserve(&RedisBackend::new().await, TokenMode::Implicit, RACE_ROUNDS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn race_reserve_issued() {
    contract::race_reserve(&RedisBackend::new().await, TokenMode::Issued, RACE_ROUNDS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn race_takeover_of_lapsed_leases() {
    contract::race_takeover(&RedisBackend::new().await, RACE_ROUNDS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn race_consume() {
    contract::race_consume(&RedisBackend::new().await, RACE_ROUNDS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn race_lock() {
    contract::race_lock(&RedisBackend::new().await, RACE_ROUNDS).await;
}

#[tokio::test]
async fn fencing() {
    contract::fencing(&RedisBackend::new().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_wakes_a_waiting_reservation() {
    contract::confirm_wakes_a_waiting_reservation(&RedisBackend::new().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_wakes_a_waiting_reservation() {
    contract::restore_wakes_a_waiting_reservation(&RedisBackend::new().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_before_the_watch_is_not_missed() {
    contract::a_settle_before_the_watch_is_not_missed(&RedisBackend::new().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn race_settle_against_watch() {
    contract::race_settle_against_watch(&RedisBackend::new().await, 200).await;
}

#[tokio::test]
async fn late_confirm_without_takeover() {
    contract::late_confirm_without_takeover(&RedisBackend::new().await).await;
}

#[tokio::test]
async fn modes() {
    contract::modes(&RedisBackend::new().await).await;
}

#[tokio::test]
async fn a_lost_reservation_is_reclaimed_by_the_attempt_that_names_it_only() {
    contract::a_lost_reservation_is_reclaimed_by_the_attempt_that_names_it_only(
        &RedisBackend::new().await,
    )
    .await;
}

#[tokio::test]
async fn lapsed_lease_is_reservable() {
    contract::lapsed_lease_is_reservable(&RedisBackend::new().await).await;
}

#[tokio::test]
async fn reservations_name_the_previous_holder() {
    contract::reservations_name_the_previous_holder(&RedisBackend::new().await).await;
}

#[tokio::test]
async fn long_deadlines_are_kept_whole() {
    contract::long_deadlines_are_kept_whole(&RedisBackend::new().await).await;
}

#[tokio::test]
async fn restore_keeps_original_ttl() {
    contract::restore_keeps_original_ttl(&RedisBackend::new().await).await;
}

#[tokio::test]
async fn restore_after_deadline_removes() {
    contract::restore_after_deadline_removes(&RedisBackend::new().await).await;
}

#[tokio::test]
async fn tombstone_expires() {
    contract::tombstone_expires(&RedisBackend::new().await).await;
}

#[tokio::test]
async fn missing_expired_consumed() {
    contract::missing_expired_consumed(&RedisBackend::new().await).await;
}

#[tokio::test]
async fn a_token_expired_while_held_is_unsettled_not_missing() {
    contract::a_token_expired_while_held_is_unsettled_not_missing(&RedisBackend::new().await).await;
}

#[tokio::test]
async fn consume_only_pending() {
    contract::consume_only_pending(&RedisBackend::new().await).await;
}

#[tokio::test]
async fn lock_and_release() {
    contract::lock_and_release(&RedisBackend::new().await).await;
}

#[tokio::test]
async fn expired_leases_audit() {
    contract::expired_leases_audit(&RedisBackend::new().await).await;
}

/// One hash per token under `<prefix>:token:{<key>}`, its PEXPIREAT following the
/// lifecycle; the scheme-2 lock is a separate string key with the owner as value.
#[tokio::test]
async fn key_layout_and_expiry() {
    let backend = RedisBackend::new().await;
    let store = backend
        .store(policy(TokenMode::Implicit, 5_000, 60_000, 30_000))
        .await;
    let k = key("layout");
    store.reserve(&k, "w").await.unwrap();
    let mut conn = backend.conn.clone();
    let keys: Vec<String> = conn.keys(format!("{}:*", backend.prefix)).await.unwrap();
    assert_eq!(keys, vec![backend.token_key(&k)]);
    let hash = backend.hash(&k).await;
    let mut fields: Vec<&str> = hash.keys().map(String::as_str).collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            "expires_at_ms",
            "fence",
            "lease_until_ms",
            "owner",
            "status"
        ]
    );
    let expire_at: i64 = redis::cmd("PEXPIRETIME")
        .arg(backend.token_key(&k))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        expire_at.to_string(),
        hash["expires_at_ms"],
        "the key dies with the token, which outlives this lease"
    );

    store.lock(&k, "w", Duration::from_secs(10)).await.unwrap();
    let kind: String = redis::cmd("TYPE")
        .arg(backend.lock_key(&k))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(kind, "string");
    let lock_ttl: i64 = conn.pttl(backend.lock_key(&k)).await.unwrap();
    assert!(lock_ttl > 9_000 && lock_ttl <= 10_000, "{lock_ttl}");

    // A lease longer than the token's life keeps the key alive until the lease ends.
    let long_lease = backend
        .store(policy(TokenMode::Implicit, 20_000, 1_000, 30_000))
        .await;
    let k2 = key("long-lease");
    long_lease.reserve(&k2, "w").await.unwrap();
    let hash = backend.hash(&k2).await;
    let expire_at: i64 = redis::cmd("PEXPIRETIME")
        .arg(backend.token_key(&k2))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(expire_at.to_string(), hash["lease_until_ms"]);
    assert!(hash["expires_at_ms"] < hash["lease_until_ms"]);
}

/// EVALSHA reloads a script the server forgot (restart, SCRIPT FLUSH, failover).
#[tokio::test]
async fn scripts_survive_a_script_flush() {
    let backend = RedisBackend::new().await;
    let store = backend.store(TokenPolicy::default()).await;
    let k = key("flush");
    assert_eq!(
        store.reserve(&k, "w").await.unwrap(),
        Reservation::Reserved {
            fence: 1,
            predecessor: payment_worker::token::Predecessor::Nobody
        }
    );
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut backend.conn.clone())
        .await
        .unwrap();
    assert!(matches!(
        store.reserve(&k, "other").await.unwrap(),
        Reservation::InFlight { .. }
    ));
    assert_eq!(
        store.show(&k).await.unwrap().unwrap().state,
        TokenState::Processing
    );
}

/// Data this code never writes is reported, not trusted and not panicked on.
#[tokio::test]
async fn foreign_data_is_corrupt() {
    let backend = RedisBackend::new().await;
    let store = backend.store(TokenPolicy::default()).await;
    let mut conn = backend.conn.clone();

    let as_string = key("string");
    let _: () = conn.set(backend.token_key(&as_string), "x").await.unwrap();
    let no_status = key("no-status");
    let _: () = conn
        .hset(backend.token_key(&no_status), "fence", "3")
        .await
        .unwrap();
    let bad_status = key("bad-status");
    let _: () = conn
        .hset_multiple(
            backend.token_key(&bad_status),
            &[("status", "weird"), ("fence", "1"), ("expires_at_ms", "1")],
        )
        .await
        .unwrap();
    let no_lease = key("no-lease");
    let _: () = conn
        .hset_multiple(
            backend.token_key(&no_lease),
            &[
                ("status", "processing"),
                ("fence", "1"),
                ("expires_at_ms", "99999999999999"),
            ],
        )
        .await
        .unwrap();
    let bad_payment = key("bad-payment");
    let _: () = conn
        .hset_multiple(
            backend.token_key(&bad_payment),
            &[
                ("status", "completed"),
                ("fence", "1"),
                ("payment_id", "nope"),
            ],
        )
        .await
        .unwrap();

    for k in [&as_string, &no_status, &bad_status, &no_lease, &bad_payment] {
        match store.reserve(k, "w").await {
            Err(e @ TokenError::Corrupt(_)) => assert!(!e.is_retryable()),
            other => panic!("{k}: expected Corrupt, got {other:?}"),
        }
    }
    for k in [&as_string, &no_status, &bad_status, &no_lease, &bad_payment] {
        assert!(
            matches!(store.show(k).await, Err(TokenError::Corrupt(_))),
            "{k}"
        );
    }
    // Nothing was overwritten.
    let kept: String = conn.get(backend.token_key(&as_string)).await.unwrap();
    assert_eq!(kept, "x");
    assert_eq!(backend.hash(&no_lease).await.get("owner"), None);
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
async fn unreachable_redis_is_unavailable_promptly() {
    let started = Instant::now();
    assert_unavailable(
        RedisTokenStore::connect("redis://127.0.0.1:1", "pw", TokenPolicy::default()).await,
        started,
    );

    // A store whose connection was set up lazily fails each call, promptly.
    let client = redis::Client::open("redis://127.0.0.1:1").unwrap();
    let conn =
        ConnectionManager::new_lazy_with_config(client, RedisTokenStore::connection_config())
            .unwrap();
    let store = RedisTokenStore::new(conn, "pw", TokenPolicy::default());
    let k = key("down");
    let started = Instant::now();
    assert_unavailable(store.reserve(&k, "w").await, started);
    let started = Instant::now();
    assert_unavailable(store.issue(&k, Duration::from_secs(1)).await, started);
    let started = Instant::now();
    assert_unavailable(store.show(&k).await, started);
    let started = Instant::now();
    assert_unavailable(store.expired_leases(10).await, started);
}

/// A server that accepts connections but never answers must not hang the caller.
#[tokio::test]
async fn silent_redis_is_unavailable_promptly() {
    let (addr, held) = silent_server().await;
    let url = format!("redis://{addr}");
    let started = Instant::now();
    assert_unavailable(
        RedisTokenStore::connect(&url, "pw", TokenPolicy::default()).await,
        started,
    );

    let client = redis::Client::open(url).unwrap();
    let conn = ConnectionManager::new_lazy_with_config(
        client,
        redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(None)
            .set_response_timeout(None),
    )
    .unwrap();
    // Even a connection without timeouts of its own is bounded by the store.
    let store = RedisTokenStore::new(conn, "pw", TokenPolicy::default())
        .with_op_timeout(Duration::from_secs(1));
    let started = Instant::now();
    assert_unavailable(store.reserve(&key("silent"), "w").await, started);
    held.abort();
}
