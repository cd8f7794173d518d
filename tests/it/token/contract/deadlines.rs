//! Deadlines: restore keeps the original TTL, tombstones expire, missing and expired
//! tokens answer as such.

use std::time::Duration;

use payment_worker::token::{
    Claim, IssueOutcome, Predecessor, Reservation, TokenMode, TokenState, Transition,
};
use uuid::Uuid;

use super::backend::*;

/// A long deadline is kept whole: durations are only capped where `now + ttl` would
/// stop being exact (a century), never at some shorter bound. Two years, to the day.
pub async fn long_deadlines_are_kept_whole(backend: &dyn Backend) {
    const TWO_YEARS_MS: i64 = 2 * 365 * 24 * 3600 * 1000;
    let store = backend
        .store(policy(TokenMode::Issued, 10_000, 60_000, 60_000))
        .await;
    let k = key("two-years");
    let ttl = Duration::from_millis(TWO_YEARS_MS.unsigned_abs());
    assert_eq!(store.issue(&k, ttl).await.unwrap(), IssueOutcome::Created);
    let stored = live(backend, &k).await.unwrap();
    assert!(
        stored.expires_in_ms > TWO_YEARS_MS - 60_000 && stored.expires_in_ms <= TWO_YEARS_MS,
        "a two-year token must expire in two years: {stored:?}"
    );
}

/// Restore brings back the token's ORIGINAL deadline, for issued and implicit tokens.
pub async fn restore_keeps_original_ttl(backend: &dyn Backend) {
    // Issued: 3 s token, lease far longer, pending_ttl different again: after 1 s the
    // restored token must have ~2 s left, neither 3 s, nor the lease, nor pending_ttl.
    let issued = backend
        .store(policy(TokenMode::Issued, 10_000, 60_000, 60_000))
        .await;
    let implicit = backend
        .store(policy(TokenMode::Implicit, 10_000, 3_000, 60_000))
        .await;
    let k1 = key("restore-issued");
    issued
        .issue(&k1, Duration::from_millis(3_000))
        .await
        .unwrap();
    let k2 = key("restore-implicit");
    let c1 = Claim {
        owner: "w".into(),
        fence: reserved_fence(issued.reserve(&k1, "w").await.unwrap()),
    };
    let c2 = Claim {
        owner: "w".into(),
        fence: reserved_fence(implicit.reserve(&k2, "w").await.unwrap()),
    };
    for k in [&k1, &k2] {
        let processing = live(backend, k).await.unwrap();
        assert!(
            processing.ttl_ms > 9_000,
            "the key must outlive the lease: {processing:?}"
        );
    }
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(issued.restore(&k1, &c1).await.unwrap(), Transition::Applied);
    assert_eq!(
        implicit.restore(&k2, &c2).await.unwrap(),
        Transition::Applied
    );
    for k in [&k1, &k2] {
        let stored = live(backend, k).await.unwrap();
        assert_eq!(
            (
                stored.status.as_str(),
                stored.owner.as_deref(),
                stored.lease_left_ms
            ),
            ("pending", None, None)
        );
        assert!(
            stored.ttl_ms > 1_500 && stored.ttl_ms <= 2_050,
            "restore must keep the original deadline (~2000 ms left), got {stored:?}"
        );
        let view = backend
            .store(policy(TokenMode::Issued, 10_000, 60_000, 60_000))
            .await
            .show(k)
            .await
            .unwrap()
            .unwrap();
        assert!(
            view.ttl.unwrap() <= Duration::from_millis(2_050),
            "{view:?}"
        );
    }
    // ... and reserving again keeps it too.
    assert_eq!(
        issued.reserve(&k1, "w2").await.unwrap(),
        Reservation::Reserved {
            fence: 2,
            predecessor: Predecessor::Holder("w".into())
        }
    );
    let again = live(backend, &k1).await.unwrap();
    assert!(again.expires_in_ms <= 2_050, "{again:?}");
}

/// A restore after the token's own deadline passed (only the lease kept it) removes it.
pub async fn restore_after_deadline_removes(backend: &dyn Backend) {
    let store = backend
        .store(policy(TokenMode::Issued, 1_500, 60_000, 60_000))
        .await;
    let k = key("restore-late");
    store.issue(&k, Duration::from_millis(300)).await.unwrap();
    let claim = Claim {
        owner: "w".into(),
        fence: reserved_fence(store.reserve(&k, "w").await.unwrap()),
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = live(backend, &k).await.expect("the lease keeps the token");
    assert!(
        held.expires_in_ms <= 0 && held.lease_left_ms.unwrap() > 0,
        "{held:?}"
    );
    assert_eq!(
        store.restore(&k, &claim).await.unwrap(),
        Transition::Applied
    );
    assert_eq!(
        backend.raw_token(&k).await,
        None,
        "an expired token is removed, not made pending"
    );
    assert_eq!(store.show(&k).await.unwrap(), None);
    assert_eq!(store.reserve(&k, "w").await.unwrap(), Reservation::Missing);
}

/// Completed tombstones answer duplicates until their TTL, then are gone.
pub async fn tombstone_expires(backend: &dyn Backend) {
    let implicit = backend
        .store(policy(TokenMode::Implicit, 30_000, 60_000, 300))
        .await;
    let issued = backend
        .store(policy(TokenMode::Issued, 30_000, 60_000, 300))
        .await;
    let k = key("tombstone");
    let claim = Claim {
        owner: "w".into(),
        fence: reserved_fence(implicit.reserve(&k, "w").await.unwrap()),
    };
    let pid = Uuid::new_v4();
    assert_eq!(
        implicit.confirm(&k, &claim, pid, "fp").await.unwrap(),
        Transition::Applied
    );
    let stored = live(backend, &k).await.unwrap();
    assert!(
        stored.ttl_ms > 0 && stored.ttl_ms <= 300,
        "tombstone TTL is completed_ttl: {stored:?}"
    );
    let view = implicit.show(&k).await.unwrap().unwrap();
    assert_eq!(
        (view.state, view.payment_id, view.lease_left),
        (TokenState::Completed, Some(pid), None)
    );
    for store in [&implicit, &issued] {
        assert_eq!(
            store.reserve(&k, "dup").await.unwrap(),
            Reservation::Completed {
                payment_id: pid,
                fingerprint: Some("fp".into())
            }
        );
    }
    assert!(
        !implicit.consume(&k).await.unwrap(),
        "a completed token cannot be consumed"
    );
    assert_eq!(
        implicit.issue(&k, Duration::from_secs(60)).await.unwrap(),
        IssueOutcome::AlreadyExists
    );
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(live(backend, &k).await, None);
    assert_eq!(implicit.show(&k).await.unwrap(), None);
    assert_eq!(
        issued.reserve(&k, "late").await.unwrap(),
        Reservation::Missing
    );
    assert!(matches!(
        implicit.reserve(&k, "late").await.unwrap(),
        Reservation::Reserved { .. }
    ));
}

/// Missing covers never issued, expired and consumed.
pub async fn missing_expired_consumed(backend: &dyn Backend) {
    let store = backend
        .store(policy(TokenMode::Issued, 30_000, 60_000, 60_000))
        .await;
    let expired = key("expired");
    assert_eq!(
        store
            .issue(&expired, Duration::from_millis(200))
            .await
            .unwrap(),
        IssueOutcome::Created
    );
    let consumed = key("consumed");
    store
        .issue(&consumed, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(store.consume(&consumed).await.unwrap());
    assert_eq!(
        backend.raw_token(&consumed).await,
        None,
        "consume removes the token"
    );
    assert!(!store.consume(&consumed).await.unwrap(), "only once");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(live(backend, &expired).await, None);
    for k in [&expired, &consumed, &key("never")] {
        assert_eq!(
            store.reserve(k, "w").await.unwrap(),
            Reservation::Missing,
            "{k}"
        );
        assert!(!store.consume(k).await.unwrap(), "{k}");
        assert_eq!(store.show(k).await.unwrap(), None, "{k}");
    }
    // An expired token can be issued afresh.
    assert_eq!(
        store
            .issue(&expired, Duration::from_secs(60))
            .await
            .unwrap(),
        IssueOutcome::Created
    );
    assert_eq!(
        store.reserve(&expired, "w").await.unwrap(),
        Reservation::Reserved {
            fence: 1,
            predecessor: Predecessor::Nobody
        }
    );
}

/// Issued mode: a token whose deadline passes while an attempt holds it, and whose
/// lease then runs out, stays as a tombstone for the completed-token TTL. Its
/// holder may have charged, or its request may still land: reserve answers
/// `Unsettled` (never `Missing`) and takes nothing, a purge keeps it, and only
/// after the tombstone's time is it missing. One token is renewed by `extend`
/// before it lapses, one is not: each script that sets the key's life keeps it.
pub async fn a_token_expired_while_held_is_unsettled_not_missing(backend: &dyn Backend) {
    let store = backend
        .store(policy(TokenMode::Issued, 300, 60_000, 2_000))
        .await;
    let renewed = key("unsettled-renewed");
    let plain = key("unsettled-plain");
    for k in [&renewed, &plain] {
        store.issue(k, Duration::from_millis(200)).await.unwrap();
    }
    let claim = Claim {
        owner: "w".into(),
        fence: reserved_fence(store.reserve(&renewed, "w").await.unwrap()),
    };
    reserved_fence(store.reserve(&plain, "w").await.unwrap());
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        store.extend(&renewed, &claim).await.unwrap(),
        Transition::Applied
    );
    // Deadline (200 ms) and lease (300 ms after the last renewal) both passed.
    tokio::time::sleep(Duration::from_millis(700)).await;
    store.purge_expired(1_000).await.unwrap();
    for k in [&renewed, &plain] {
        assert_eq!(
            store.reserve(k, "w2").await.unwrap(),
            Reservation::Unsettled,
            "{k}: expired while held, its charge is unknown"
        );
        assert_eq!(
            store.reserve(k, "w3").await.unwrap(),
            Reservation::Unsettled,
            "{k}: nothing was taken"
        );
    }
    // The tombstone's time (2 s after deadline and lease) runs out.
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    for k in [&renewed, &plain] {
        assert_eq!(
            store.reserve(k, "w4").await.unwrap(),
            Reservation::Missing,
            "{k}"
        );
    }
}

/// Consume takes only a live pending token.
pub async fn consume_only_pending(backend: &dyn Backend) {
    let store = backend
        .store(policy(TokenMode::Implicit, 30_000, 60_000, 60_000))
        .await;
    let k = key("consume");
    store.reserve(&k, "w").await.unwrap();
    assert!(
        !store.consume(&k).await.unwrap(),
        "a processing token is not consumable"
    );
    assert_eq!(live(backend, &k).await.unwrap().status, "processing");
}
