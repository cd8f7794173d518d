//! The Redis token store behind Sentinel (`redis+sentinel://s1,s2,s3/<master>`), on
//! a private master, replica and three sentinels started by the test. Tokens are
//! issued and reserved, the sentinels are told to fail over (`SENTINEL FAILOVER`),
//! and the same store, without being told, goes on with the new master: the tokens
//! Redis kept (replicated before the failover) are all there, its scripts work on
//! the new master, and `audit`, given only the sentinels' addresses, reads the new
//! master once the old one is gone. Over TLS (`rediss+sentinel://`), the sentinel
//! and the master are both reached with the CA the store is given, and another CA
//! is refused.

use std::time::Duration;

use payment_worker::token::{
    Claim, IdempotencyKey, RedisTarget, RedisTokenStore, Reservation, TokenError, TokenMode,
    TokenPolicy, TokenState, TokenStore, Transition,
};

use crate::support::helpers::unique;
use crate::support::pki::TestPki;
use crate::support::redis_servers::{PrivateSentinels, TlsRedis, TlsSentinel};
use crate::token::contract::{key, policy};
use crate::token::redis_topologies::audit_stuck_tokens;

/// Retries an operation the way the worker's own retry policy would: an
/// `Unavailable` answer (the connection Sentinel closed during the failover) is
/// tried again, a bounded number of times; anything else is the answer.
async fn retried<T, F, Fut>(what: &str, mut operation: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, TokenError>>,
{
    let mut last = None;
    for _ in 0..40 {
        match operation().await {
            Ok(value) => return value,
            Err(error) if error.is_retryable() => {
                last = Some(error);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(error) => panic!("{what}: {error}"),
        }
    }
    panic!("{what}: still unavailable: {last:?}");
}

async fn issue_all(store: &RedisTokenStore, keys: &[IdempotencyKey]) {
    for k in keys {
        retried("issue", || store.issue(k, Duration::from_secs(3600))).await;
    }
}

/// Reserves and confirms `key` (what a payment does with its token).
async fn pay(store: &RedisTokenStore, k: &IdempotencyKey) {
    let owner = format!("sentinel-test:{}", uuid::Uuid::new_v4().simple());
    let fence = match retried("reserve", || store.reserve(k, &owner)).await {
        Reservation::Reserved { fence, .. } => fence,
        other => panic!("{k}: {other:?}"),
    };
    let claim = Claim { owner, fence };
    let confirmed = retried("confirm", || {
        store.confirm(k, &claim, uuid::Uuid::new_v4(), "fingerprint")
    })
    .await;
    assert_eq!(confirmed, Transition::Applied, "{k}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_survive_a_sentinel_failover_and_the_store_follows_the_master() {
    let mut group = PrivateSentinels::start().await;
    let first_master = group.master_port().await;
    let target = RedisTarget::parse(&group.url(), false).unwrap();
    let prefix = unique("pwsent");
    let store = RedisTokenStore::connect_to(
        &target,
        prefix.clone(),
        policy(TokenMode::Issued, 30_000, 3_600_000, 3_600_000),
    )
    .await
    .unwrap();

    let before: Vec<IdempotencyKey> = (0..40).map(|_| key("before")).collect();
    issue_all(&store, &before).await;
    for k in &before[..10] {
        pay(&store, k).await;
    }
    // What Redis keeps across a failover is what reached the replica.
    let mut master = PrivateSentinels::connection(first_master).await;
    let acknowledged: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(10_000)
        .query_async(&mut master)
        .await
        .unwrap();
    assert_eq!(acknowledged, 1, "the replica has every write");

    let new_master = group.failover().await;
    assert_ne!(new_master, first_master);

    // The same store, never told: its next scripts go to the new master.
    let after: Vec<IdempotencyKey> = (0..40).map(|_| key("after")).collect();
    issue_all(&store, &after).await;
    for k in before[10..20].iter().chain(&after[..10]) {
        pay(&store, k).await;
    }

    // Nothing Redis kept was lost: every token is there, in the state it was left.
    for (n, k) in before.iter().chain(&after).enumerate() {
        let view = retried("show", || store.show(k))
            .await
            .unwrap_or_else(|| panic!("{k} was lost in the failover"));
        let paid = n < 20 || (40..50).contains(&n);
        let expected = if paid {
            TokenState::Completed
        } else {
            TokenState::Pending
        };
        assert_eq!(view.state, expected, "{k}");
    }
    // ... and on the new master itself.
    let mut on_new_master = PrivateSentinels::connection(new_master).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:token:*"))
        .query_async(&mut on_new_master)
        .await
        .unwrap();
    assert_eq!(keys.len(), 80);
    let role: Vec<redis::Value> = redis::cmd("ROLE")
        .query_async(&mut on_new_master)
        .await
        .unwrap();
    assert!(matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master"));

    // `audit`, given only the sentinels, reports stuck tokens that live on the new
    // master, with the old one gone.
    let stuck_prefix = unique("pwsentstuck");
    let short = RedisTokenStore::connect_to(
        &target,
        stuck_prefix.clone(),
        policy(TokenMode::Implicit, 50, 60_000, 60_000),
    )
    .await
    .unwrap();
    for _ in 0..5 {
        let k = key("stuck");
        retried("reserve", || short.reserve(&k, "crashed")).await;
    }
    group.kill_node(first_master);
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(audit_stuck_tokens(&group.url(), &stuck_prefix).await, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_the_store_asks_the_sentinel_and_pays_on_the_master_it_names() {
    let pki = TestPki::new();
    let master = TlsRedis::start(&pki, false).await;
    let sentinel = TlsSentinel::start(&pki, master.port).await;
    let ca = std::fs::read(pki.ca()).unwrap();
    let target = RedisTarget::parse(&sentinel.url(), false)
        .unwrap()
        .with_ca_pem(Some(ca.clone()));
    let prefix = unique("pwsenttls");
    let store = RedisTokenStore::connect_to(
        &target,
        prefix.clone(),
        policy(TokenMode::Issued, 30_000, 3_600_000, 3_600_000),
    )
    .await
    .unwrap();
    let keys: Vec<IdempotencyKey> = (0..10).map(|_| key("tls")).collect();
    issue_all(&store, &keys).await;
    for k in &keys[..5] {
        pay(&store, k).await;
    }
    for (n, k) in keys.iter().enumerate() {
        let state = retried("show", || store.show(k)).await.map(|v| v.state);
        let expected = if n < 5 {
            TokenState::Completed
        } else {
            TokenState::Pending
        };
        assert_eq!(state, Some(expected), "{k}");
    }

    // The tokens are on the master the sentinel named, read over TLS directly.
    let direct = RedisTarget::parse(&master.url(), false)
        .unwrap()
        .with_ca_pem(Some(ca));
    let mut connection = direct.connect().await.unwrap();
    let on_master: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:token:*"))
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(on_master.len(), 10);

    // Another CA: neither the sentinel nor the master is trusted.
    let wrong = RedisTarget::parse(&sentinel.url(), false)
        .unwrap()
        .with_ca_pem(Some(std::fs::read(pki.wrong_ca()).unwrap()));
    let error = RedisTokenStore::connect_to(&wrong, "x", TokenPolicy::default())
        .await
        .expect_err("a sentinel signed by another CA must be refused");
    let shown = format!("{error:#}");
    assert!(
        shown.contains("certificate") || shown.contains("UnknownIssuer"),
        "{shown}"
    );
}
