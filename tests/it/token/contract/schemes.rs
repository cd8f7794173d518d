//! The other two schemes (consume, lock and release) and the expired-lease scan audit
//! relies on.

use std::time::Duration;

use payment_worker::token::{Claim, IdempotencyKey, LockOutcome, TokenMode};
use uuid::Uuid;

use super::backend::*;

/// Scheme 2: SET NX PX, release only by the holder, expiry frees the lock.
pub async fn lock_and_release(backend: &dyn Backend) {
    let store = backend
        .store(policy(TokenMode::Implicit, 30_000, 60_000, 60_000))
        .await;
    let k = key("lock");
    // Long enough that the first four calls fit in it on a loaded machine (300 ms
    // once lapsed between them), short enough to wait out.
    let ttl = Duration::from_millis(1_500);
    assert_eq!(
        store.lock(&k, "a", ttl).await.unwrap(),
        LockOutcome::Acquired
    );
    assert_eq!(store.lock(&k, "b", ttl).await.unwrap(), LockOutcome::Held);
    assert_eq!(
        store.lock(&k, "a", ttl).await.unwrap(),
        LockOutcome::Held,
        "not re-entrant"
    );
    assert!(!store.release(&k, "b").await.unwrap());
    assert_eq!(backend.raw_lock(&k).await.as_deref(), Some("a"));
    assert!(store.release(&k, "a").await.unwrap());
    assert_eq!(backend.raw_lock(&k).await, None);
    assert!(!store.release(&k, "a").await.unwrap());
    assert_eq!(
        store.lock(&k, "b", ttl).await.unwrap(),
        LockOutcome::Acquired
    );
    tokio::time::sleep(Duration::from_millis(1_700)).await;
    assert_eq!(backend.raw_lock(&k).await, None, "the lock expired");
    assert_eq!(
        store.lock(&k, "c", ttl).await.unwrap(),
        LockOutcome::Acquired
    );
    assert!(
        !store.release(&k, "b").await.unwrap(),
        "an expired holder cannot free the new holder's lock"
    );
    assert_eq!(backend.raw_lock(&k).await.as_deref(), Some("c"));
    // The lock is a key of its own: the token of the same key is untouched.
    assert_eq!(backend.raw_token(&k).await, None);
}

/// `expired_leases` reports exactly the processing tokens whose lease lapsed, capped.
pub async fn expired_leases_audit(backend: &dyn Backend) {
    let short = backend
        .store(policy(TokenMode::Implicit, 100, 60_000, 60_000))
        .await;
    let long = backend
        .store(policy(TokenMode::Implicit, 60_000, 60_000, 60_000))
        .await;
    let mut stuck: Vec<IdempotencyKey> = (0..3).map(|_| key("stuck")).collect();
    for k in &stuck {
        short.reserve(k, "crashed").await.unwrap();
    }
    long.reserve(&key("busy"), "alive").await.unwrap();
    let done = key("done");
    let c = Claim {
        owner: "w".into(),
        fence: reserved_fence(short.reserve(&done, "w").await.unwrap()),
    };
    short
        .confirm(&done, &c, Uuid::new_v4(), "fp")
        .await
        .unwrap();
    long.issue(&key("pending"), Duration::from_secs(60))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut found = long.expired_leases(100).await.unwrap();
    found.sort();
    stuck.sort();
    assert_eq!(found, stuck);
    assert_eq!(long.expired_leases(2).await.unwrap().len(), 2);
}
