//! The lifecycle: fencing of every transition, late confirms, the two token modes, a
//! lapsed lease.

use std::time::Duration;

use payment_worker::token::{
    Claim, IssueOutcome, Predecessor, Reservation, TokenMode, TokenState, Transition,
};
use uuid::Uuid;

use super::backend::*;

/// I5: once A's lease lapsed and B reserved, nothing A does lands; B's operations do.
pub async fn fencing(backend: &dyn Backend) {
    let store = backend
        // A lease long enough that A's and B's first calls fit in it on a loaded
        // machine (200 ms once lapsed between them), short enough to wait out.
        .store(policy(TokenMode::Implicit, 1_500, 60_000, 60_000))
        .await;
    let k = key("fencing");
    let a = Claim {
        owner: "worker-a".into(),
        fence: reserved_fence(store.reserve(&k, "worker-a").await.unwrap()),
    };
    assert_eq!(a.fence, 1);
    assert!(matches!(
        store.reserve(&k, "worker-b").await.unwrap(),
        Reservation::InFlight { .. }
    ));

    tokio::time::sleep(Duration::from_millis(1_700)).await;
    let lapsed = live(backend, &k)
        .await
        .expect("the token outlives the lease");
    assert_eq!(
        (lapsed.status.as_str(), lapsed.owner.as_deref()),
        ("processing", Some("worker-a"))
    );
    assert!(lapsed.lease_left_ms.unwrap() <= 0, "{lapsed:?}");

    let b = Claim {
        owner: "worker-b".into(),
        fence: reserved_fence(store.reserve(&k, "worker-b").await.unwrap()),
    };
    assert_eq!(b.fence, 2, "a takeover raises the fence");
    let pid_a = Uuid::new_v4();
    assert_eq!(
        store.confirm(&k, &a, pid_a, "fp-a").await.unwrap(),
        Transition::Refused
    );
    assert_eq!(store.restore(&k, &a).await.unwrap(), Transition::Refused);
    assert_eq!(store.extend(&k, &a).await.unwrap(), Transition::Refused);
    // Owner and fence decide together: a claim that matches the holder in only one of
    // them is just as stale (B's name under the old fence; B's fence under A's name, as
    // when a restarted fence meets a stale owner).
    for half_right in [
        Claim {
            owner: "worker-b".into(),
            fence: 1,
        },
        Claim {
            owner: "worker-a".into(),
            fence: 2,
        },
    ] {
        assert_eq!(
            store.extend(&k, &half_right).await.unwrap(),
            Transition::Refused,
            "extend {half_right:?}"
        );
        assert_eq!(
            store.restore(&k, &half_right).await.unwrap(),
            Transition::Refused,
            "restore {half_right:?}"
        );
        assert_eq!(
            store.confirm(&k, &half_right, pid_a, "fp-a").await.unwrap(),
            Transition::Refused,
            "confirm {half_right:?}"
        );
    }
    let stored = live(backend, &k).await.unwrap();
    assert_eq!(
        (
            stored.status.as_str(),
            stored.owner.as_deref(),
            stored.fence
        ),
        ("processing", Some("worker-b"), 2)
    );
    assert_eq!(stored.payment_id, None);

    assert_eq!(store.extend(&k, &b).await.unwrap(), Transition::Applied);
    let extended = live(backend, &k).await.unwrap();
    assert!(extended.lease_left_ms.unwrap() > 100, "{extended:?}");
    assert_eq!(store.restore(&k, &b).await.unwrap(), Transition::Applied);
    let restored = live(backend, &k).await.unwrap();
    assert_eq!(
        (
            restored.status.as_str(),
            restored.owner.as_deref(),
            restored.fence
        ),
        ("pending", None, 2)
    );
    // A restored token belongs to nobody: neither claim applies any more.
    assert_eq!(
        store.confirm(&k, &b, pid_a, "fp").await.unwrap(),
        Transition::Refused
    );
    assert_eq!(
        store.confirm(&k, &a, pid_a, "fp").await.unwrap(),
        Transition::Refused
    );

    let c = Claim {
        owner: "worker-c".into(),
        fence: reserved_fence(store.reserve(&k, "worker-c").await.unwrap()),
    };
    assert_eq!(c.fence, 3);
    let pid = Uuid::new_v4();
    assert_eq!(
        store.confirm(&k, &c, pid, "fp-c").await.unwrap(),
        Transition::Applied
    );
    let done = live(backend, &k).await.unwrap();
    assert_eq!(done.status, "completed");
    assert_eq!((done.owner.as_deref(), done.fence), (Some("worker-c"), 3));
    assert_eq!(done.payment_id, Some(pid.to_string()));
    assert_eq!(done.fingerprint.as_deref(), Some("fp-c"));
    // A confirm whose answer was lost can be repeated; a different payment cannot.
    assert_eq!(
        store.confirm(&k, &c, pid, "fp-c").await.unwrap(),
        Transition::Applied
    );
    assert_eq!(
        store.confirm(&k, &c, Uuid::new_v4(), "fp-c").await.unwrap(),
        Transition::Refused
    );
    for stale in [&a, &b] {
        assert_eq!(
            store.confirm(&k, stale, pid, "fp-c").await.unwrap(),
            Transition::Refused
        );
        assert_eq!(store.restore(&k, stale).await.unwrap(), Transition::Refused);
        assert_eq!(store.extend(&k, stale).await.unwrap(), Transition::Refused);
    }
    assert_eq!(
        store.restore(&k, &c).await.unwrap(),
        Transition::Refused,
        "completed is final"
    );
    assert_eq!(
        store.extend(&k, &c).await.unwrap(),
        Transition::Refused,
        "a completed token has no lease to extend"
    );
    assert_eq!(
        store.reserve(&k, "worker-d").await.unwrap(),
        Reservation::Completed {
            payment_id: pid,
            fingerprint: Some("fp-c".into())
        }
    );
    let after = live(backend, &k).await.unwrap();
    assert_eq!(
        RawToken {
            ttl_ms: 0,
            expires_in_ms: 0,
            ..after.clone()
        },
        RawToken {
            ttl_ms: 0,
            expires_in_ms: 0,
            ..done.clone()
        },
        "refused operations change nothing"
    );
    assert!(
        after.ttl_ms <= done.ttl_ms,
        "a repeated confirm keeps the tombstone's TTL"
    );
}

/// A lapsed lease nobody took over still lets its owner finish (owner and fence match).
pub async fn late_confirm_without_takeover(backend: &dyn Backend) {
    let store = backend
        .store(policy(TokenMode::Implicit, 150, 60_000, 60_000))
        .await;
    let k = key("late");
    let a = Claim {
        owner: "slow".into(),
        fence: reserved_fence(store.reserve(&k, "slow").await.unwrap()),
    };
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(store.extend(&k, &a).await.unwrap(), Transition::Applied);
    tokio::time::sleep(Duration::from_millis(250)).await;
    let pid = Uuid::new_v4();
    assert_eq!(
        store.confirm(&k, &a, pid, "fp").await.unwrap(),
        Transition::Applied
    );
    let stored = live(backend, &k).await.unwrap();
    assert_eq!((stored.status.as_str(), stored.fence), ("completed", 1));
    assert_eq!(stored.lease_left_ms, None, "a tombstone has no lease");
}

/// The two token modes: implicit creates an unknown key in processing; issued reports Missing.
pub async fn modes(backend: &dyn Backend) {
    let implicit = backend
        .store(policy(TokenMode::Implicit, 30_000, 120_000, 60_000))
        .await;
    let issued = backend
        .store(policy(TokenMode::Issued, 30_000, 120_000, 60_000))
        .await;

    let k = key("implicit");
    assert_eq!(implicit.show(&k).await.unwrap(), None);
    assert_eq!(
        implicit.reserve(&k, "w1").await.unwrap(),
        Reservation::Reserved {
            fence: 1,
            predecessor: Predecessor::Nobody
        }
    );
    let view = implicit
        .show(&k)
        .await
        .unwrap()
        .expect("created by reserve");
    assert_eq!(view.state, TokenState::Processing);
    assert_eq!((view.owner.as_deref(), view.fence), (Some("w1"), 1));
    let lease_left = view.lease_left.unwrap();
    assert!(
        lease_left > Duration::from_secs(29) && lease_left <= Duration::from_secs(30),
        "{view:?}"
    );
    let ttl = view.ttl.unwrap();
    assert!(
        ttl > Duration::from_secs(119) && ttl <= Duration::from_secs(120),
        "{view:?}"
    );
    let stored = live(backend, &k).await.unwrap();
    assert_eq!(
        (
            stored.status.as_str(),
            stored.owner.as_deref(),
            stored.fence
        ),
        ("processing", Some("w1"), 1)
    );
    assert!(
        stored.expires_in_ms > 119_000 && stored.expires_in_ms <= 120_000,
        "{stored:?}"
    );

    let k = key("issued");
    assert_eq!(
        issued.reserve(&k, "w1").await.unwrap(),
        Reservation::Missing
    );
    assert_eq!(
        backend.raw_token(&k).await,
        None,
        "issued mode must not create anything"
    );
    assert_eq!(issued.show(&k).await.unwrap(), None);
    assert_eq!(
        issued.issue(&k, Duration::from_secs(90)).await.unwrap(),
        IssueOutcome::Created
    );
    assert_eq!(
        issued.issue(&k, Duration::from_secs(900)).await.unwrap(),
        IssueOutcome::AlreadyExists
    );
    let pending = live(backend, &k).await.unwrap();
    assert_eq!(
        (
            pending.status.as_str(),
            pending.owner.as_deref(),
            pending.fence
        ),
        ("pending", None, 0)
    );
    assert!(
        pending.ttl_ms > 89_000 && pending.ttl_ms <= 90_000,
        "second issue must not touch the TTL: {pending:?}"
    );
    let view = issued.show(&k).await.unwrap().unwrap();
    assert_eq!(
        (view.state, view.lease_left, view.fence),
        (TokenState::Pending, None, 0)
    );
    assert_eq!(
        issued.reserve(&k, "w1").await.unwrap(),
        Reservation::Reserved {
            fence: 1,
            predecessor: Predecessor::Nobody
        }
    );
    assert!(matches!(
        issued.reserve(&k, "w2").await.unwrap(),
        Reservation::InFlight { .. }
    ));
    assert!(matches!(
        implicit.reserve(&k, "w2").await.unwrap(),
        Reservation::InFlight { .. }
    ));
    // An issued token is reservable in implicit mode too: it simply exists already.
    let k2 = key("issued-then-implicit");
    assert_eq!(
        issued.issue(&k2, Duration::from_secs(90)).await.unwrap(),
        IssueOutcome::Created
    );
    assert_eq!(
        implicit.reserve(&k2, "w3").await.unwrap(),
        Reservation::Reserved {
            fence: 1,
            predecessor: Predecessor::Nobody
        }
    );
    let stored = live(backend, &k2).await.unwrap();
    assert!(
        stored.expires_in_ms <= 90_000,
        "implicit reserve keeps the issued deadline: {stored:?}"
    );
}

/// I4: a processing token whose lease ran out is reservable again, with a higher fence.
/// The lease must outlast the calls made while it is meant to be live, the listing of
/// expired leases included. On Redis that listing scans the whole keyspace, so a shared
/// server holding many keys (CI once ran with 675,000 left over) makes it slow: the
/// lease is sized from one timed listing, never below 2 s (a 200 ms lease once lapsed
/// before the listing that follows the reservation).
pub async fn lapsed_lease_is_reservable(backend: &dyn Backend) {
    let probe = backend
        .store(policy(TokenMode::Issued, 2_000, 60_000, 60_000))
        .await;
    let started = std::time::Instant::now();
    assert!(probe.expired_leases(100).await.unwrap().is_empty());
    let listing_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let lease_ms = 2_000.max(listing_ms.saturating_mul(4).saturating_add(1_000));
    let store = backend
        .store(policy(TokenMode::Issued, lease_ms, 60_000, 60_000))
        .await;
    let k = key("lapse");
    store.issue(&k, Duration::from_secs(60)).await.unwrap();
    assert_eq!(
        store.reserve(&k, "a").await.unwrap(),
        Reservation::Reserved {
            fence: 1,
            predecessor: Predecessor::Nobody
        }
    );
    match store.reserve(&k, "b").await.unwrap() {
        Reservation::InFlight { lease_left } => {
            assert!(lease_left <= Duration::from_millis(lease_ms))
        }
        other => panic!("expected InFlight, got {other:?}"),
    }
    assert!(store.expired_leases(100).await.unwrap().is_empty());
    tokio::time::sleep(Duration::from_millis(lease_ms + 100)).await;
    let view = store.show(&k).await.unwrap().unwrap();
    assert_eq!(
        (view.state, view.lease_left),
        (TokenState::Processing, Some(Duration::ZERO))
    );
    assert_eq!(store.expired_leases(100).await.unwrap(), vec![k.clone()]);
    assert_eq!(
        store.reserve(&k, "b").await.unwrap(),
        Reservation::Reserved {
            fence: 2,
            predecessor: Predecessor::Holder("a".into())
        }
    );
    assert!(store.expired_leases(100).await.unwrap().is_empty());
    let stored = live(backend, &k).await.unwrap();
    assert_eq!((stored.owner.as_deref(), stored.fence), (Some("b"), 2));
}

/// A reservation says who held the token before it: nobody for a new token, else the
/// owner who restored it last (kept across the restore), so the caller can tell its
/// own earlier attempt from a stranger whose charge it cannot know.
pub async fn reservations_name_the_previous_holder(backend: &dyn Backend) {
    let store = backend
        .store(policy(TokenMode::Implicit, 30_000, 120_000, 60_000))
        .await;
    let k = key("predecessor");
    let first = store.reserve(&k, "w1").await.unwrap();
    assert_eq!(
        first,
        Reservation::Reserved {
            fence: 1,
            predecessor: Predecessor::Nobody
        }
    );
    let w1 = Claim {
        owner: "w1".into(),
        fence: 1,
    };
    assert_eq!(store.restore(&k, &w1).await.unwrap(), Transition::Applied);
    // The restore leaves nobody holding it, but remembers who did.
    let stored = live(backend, &k).await.unwrap();
    assert_eq!(
        (stored.status.as_str(), stored.owner.as_deref()),
        ("pending", None)
    );
    assert_eq!(
        store.reserve(&k, "w2").await.unwrap(),
        Reservation::Reserved {
            fence: 2,
            predecessor: Predecessor::Holder("w1".into())
        }
    );
    let w2 = Claim {
        owner: "w2".into(),
        fence: 2,
    };
    assert_eq!(store.restore(&k, &w2).await.unwrap(), Transition::Applied);
    let third = store.reserve(&k, "w3").await.unwrap();
    let Reservation::Reserved { predecessor, .. } = &third else {
        panic!("{third:?}");
    };
    assert!(predecessor.is_stranger(Some("w1")), "w2 restored it last");
    assert!(!predecessor.is_stranger(Some("w2")), "{third:?}");
    assert!(predecessor.is_stranger(None), "{third:?}");
}

/// A reservation whose answer was lost is taken back at once, its lease still live, by
/// the next attempt that names it (`reserve_reclaiming`): that attempt ended when it
/// gave up waiting, so its lease guards nothing. Naming anybody else takes nothing,
/// and once taken back the lost owner is nobody. Both token modes.
pub async fn a_lost_reservation_is_reclaimed_by_the_attempt_that_names_it_only(
    backend: &dyn Backend,
) {
    for mode in [TokenMode::Implicit, TokenMode::Issued] {
        let store = backend.store(policy(mode, 60_000, 60_000, 60_000)).await;
        let k = key("reclaim");
        if mode == TokenMode::Issued {
            store.issue(&k, Duration::from_secs(60)).await.unwrap();
        }
        // The first attempt reserved as "lost-1" and never heard back.
        let Reservation::Reserved { fence, .. } = store.reserve(&k, "lost-1").await.unwrap() else {
            panic!("{mode:?}: a fresh token is reservable");
        };
        for (owner, naming) in [("stranger", "someone-else"), ("stranger", "")] {
            assert!(
                matches!(
                    store.reserve_reclaiming(&k, owner, naming).await.unwrap(),
                    Reservation::InFlight { .. }
                ),
                "{mode:?}: naming {naming:?} takes nothing from a live lease"
            );
        }
        assert!(matches!(
            store.reserve(&k, "stranger").await.unwrap(),
            Reservation::InFlight { .. }
        ));
        assert_eq!(
            store
                .reserve_reclaiming(&k, "attempt-2", "lost-1")
                .await
                .unwrap(),
            Reservation::Reserved {
                fence: fence + 1,
                predecessor: Predecessor::Holder("lost-1".to_owned()),
            },
            "{mode:?}: the attempt that names the lost reservation takes the token at once"
        );
        let raw = backend.raw_token(&k).await.unwrap();
        assert_eq!(
            (raw.status.as_str(), raw.owner.as_deref(), raw.fence),
            ("processing", Some("attempt-2"), fence + 1)
        );
        assert!(
            matches!(
                store
                    .reserve_reclaiming(&k, "attempt-3", "lost-1")
                    .await
                    .unwrap(),
                Reservation::InFlight { .. }
            ),
            "{mode:?}: the lost owner no longer holds it: attempt-2's live lease stands"
        );
        assert_eq!(backend.raw_token(&k).await.unwrap().fence, fence + 1);
    }
}
