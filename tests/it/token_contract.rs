//! The token lifecycle contract (SPEC §3), run unchanged against every backend.
//!
//! Each backend supplies stores and an independent view of what is really stored (the
//! Redis hash, the Postgres row), read without going through the store under test, so
//! the assertions are about the server's state and not only about return values.
#![allow(dead_code)]

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use payment_worker::token::{
    Claim, IdempotencyKey, IssueOutcome, LockOutcome, Reservation, TokenMode, TokenPolicy,
    TokenState, TokenStore, Transition,
};
use uuid::Uuid;

/// Concurrent callers per race round.
pub const RACERS: usize = 64;
/// Rounds per race; every round uses a fresh key.
pub const RACE_ROUNDS: usize = 1_000;

/// A token as the server holds it right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawToken {
    pub status: String,
    pub owner: Option<String>,
    pub fence: u64,
    pub payment_id: Option<String>,
    pub fingerprint: Option<String>,
    /// Until the key / row is gone (Redis PTTL; for Postgres the later of the token's
    /// deadline and a processing lease). Zero or less: it is dead.
    pub ttl_ms: i64,
    /// Until the token's own deadline (what restore must bring back).
    pub expires_in_ms: i64,
    /// Until the lease ends; `None` when no lease is recorded.
    pub lease_left_ms: Option<i64>,
}

#[async_trait::async_trait]
pub trait Backend: Send + Sync + 'static {
    /// A store with `policy` on the backend's shared namespace. Every call may open its
    /// own connection, so racers really come from different clients.
    async fn store(&self, policy: TokenPolicy) -> Arc<dyn TokenStore>;
    /// The token as stored, read directly; `None` when nothing is stored at all.
    async fn raw_token(&self, key: &IdempotencyKey) -> Option<RawToken>;
    /// The owner of the scheme-2 lock when a live lock is stored.
    async fn raw_lock(&self, key: &IdempotencyKey) -> Option<String>;
}

pub fn key(label: &str) -> IdempotencyKey {
    IdempotencyKey::try_from(format!("{label}-{}", Uuid::new_v4().simple())).unwrap()
}

pub fn policy(
    mode: TokenMode,
    lease_ms: u64,
    pending_ttl_ms: u64,
    completed_ttl_ms: u64,
) -> TokenPolicy {
    TokenPolicy {
        mode,
        lease: Duration::from_millis(lease_ms),
        pending_ttl: Duration::from_millis(pending_ttl_ms),
        completed_ttl: Duration::from_millis(completed_ttl_ms),
    }
}

/// Long enough that nothing expires while a race and its checks run.
fn race_policy(mode: TokenMode) -> TokenPolicy {
    policy(mode, 600_000, 3_600_000, 3_600_000)
}

async fn live(backend: &dyn Backend, key: &IdempotencyKey) -> Option<RawToken> {
    backend.raw_token(key).await.filter(|t| t.ttl_ms > 0)
}

fn reserved_fence(r: Reservation) -> u64 {
    match r {
        Reservation::Reserved { fence } => fence,
        other => panic!("expected Reserved, got {other:?}"),
    }
}

/// `RACERS` tasks, each with its own store; before every round all of them meet at a
/// barrier, then call `op` on that round's key at once. Returns `results[round][task]`.
async fn race<T, F, Fut>(
    stores: Vec<Arc<dyn TokenStore>>,
    keys: Arc<Vec<IdempotencyKey>>,
    op: F,
) -> Vec<Vec<T>>
where
    T: Send + 'static,
    F: Fn(Arc<dyn TokenStore>, usize, IdempotencyKey) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = T> + Send,
{
    let barrier = Arc::new(tokio::sync::Barrier::new(stores.len()));
    let mut tasks = Vec::new();
    for (task, store) in stores.into_iter().enumerate() {
        let (barrier, keys, op) = (barrier.clone(), keys.clone(), op.clone());
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::with_capacity(keys.len());
            for key in keys.iter() {
                barrier.wait().await;
                out.push(op(store.clone(), task, key.clone()).await);
            }
            out
        }));
    }
    let mut per_task = Vec::new();
    for t in tasks {
        per_task.push(t.await.expect("racer panicked"));
    }
    let rounds = keys.len();
    let mut per_round: Vec<Vec<T>> = (0..rounds)
        .map(|_| Vec::with_capacity(per_task.len()))
        .collect();
    for results in per_task {
        for (round, r) in results.into_iter().enumerate() {
            per_round[round].push(r);
        }
    }
    per_round
}

async fn racer_stores(backend: &dyn Backend, policy: TokenPolicy) -> Vec<Arc<dyn TokenStore>> {
    let mut stores = Vec::with_capacity(RACERS);
    for _ in 0..RACERS {
        stores.push(backend.store(policy).await);
    }
    stores
}

fn owner_of(task: usize) -> String {
    format!("racer-{task}")
}

/// Issues every key, a few at a time.
async fn issue_all(store: &Arc<dyn TokenStore>, keys: &[IdempotencyKey], ttl: Duration) {
    use futures::StreamExt;
    let outcomes: Vec<_> = futures::stream::iter(keys.iter().cloned())
        .map(|k| {
            let store = store.clone();
            async move { store.issue(&k, ttl).await.unwrap() }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    assert!(outcomes.iter().all(|o| *o == IssueOutcome::Created));
}

/// Exactly one of `RACERS` concurrent reservations of the same token wins each round;
/// the others see it in flight. `issued`: the token was issued before the race,
/// otherwise the key is unknown and the implicit mode creates it.
pub async fn race_reserve(backend: &dyn Backend, mode: TokenMode, rounds: usize) {
    let started = Instant::now();
    let keys: Arc<Vec<_>> = Arc::new((0..rounds).map(|_| key("race-reserve")).collect());
    let setup = backend.store(race_policy(mode)).await;
    if mode == TokenMode::Issued {
        issue_all(&setup, &keys, Duration::from_secs(3600)).await;
    }
    let stores = racer_stores(backend, race_policy(mode)).await;
    let results = race(stores, keys.clone(), |store, task, key| async move {
        store.reserve(&key, &owner_of(task)).await.unwrap()
    })
    .await;
    for (round, outcomes) in results.iter().enumerate() {
        let winners: Vec<usize> = outcomes
            .iter()
            .enumerate()
            .filter(|(_, r)| matches!(r, Reservation::Reserved { .. }))
            .map(|(task, _)| task)
            .collect();
        assert_eq!(
            winners.len(),
            1,
            "round {round}: {} reservations won: {outcomes:?}",
            winners.len()
        );
        let winner = winners[0];
        assert_eq!(
            outcomes[winner],
            Reservation::Reserved { fence: 1 },
            "round {round}"
        );
        for (task, r) in outcomes.iter().enumerate() {
            if task != winner {
                match r {
                    Reservation::InFlight { lease_left } => {
                        assert!(
                            *lease_left > Duration::ZERO && *lease_left <= Duration::from_secs(600)
                        )
                    }
                    other => panic!("round {round} task {task}: expected InFlight, got {other:?}"),
                }
            }
        }
        let stored = backend
            .raw_token(&keys[round])
            .await
            .expect("the winner's token is stored");
        assert_eq!(stored.status, "processing", "round {round}");
        assert_eq!(
            stored.owner.as_deref(),
            Some(owner_of(winner).as_str()),
            "round {round}"
        );
        assert_eq!(stored.fence, 1, "round {round}");
    }
    eprintln!(
        "race_reserve {mode:?}: {rounds} rounds x {RACERS} in {:?}",
        started.elapsed()
    );
}

/// Tokens whose lease lapsed are taken over by exactly one of `RACERS`, under fence 2.
pub async fn race_takeover(backend: &dyn Backend, rounds: usize) {
    let started = Instant::now();
    let keys: Arc<Vec<_>> = Arc::new((0..rounds).map(|_| key("race-takeover")).collect());
    let short = backend
        .store(policy(TokenMode::Implicit, 50, 3_600_000, 3_600_000))
        .await;
    for k in keys.iter() {
        assert_eq!(
            short.reserve(k, "crashed").await.unwrap(),
            Reservation::Reserved { fence: 1 }
        );
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    let stores = racer_stores(backend, race_policy(TokenMode::Issued)).await;
    let results = race(stores, keys.clone(), |store, task, key| async move {
        store.reserve(&key, &owner_of(task)).await.unwrap()
    })
    .await;
    for (round, outcomes) in results.iter().enumerate() {
        let winners: Vec<usize> = (0..outcomes.len())
            .filter(|t| matches!(outcomes[*t], Reservation::Reserved { .. }))
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {outcomes:?}");
        assert_eq!(outcomes[winners[0]], Reservation::Reserved { fence: 2 });
        assert!(outcomes
            .iter()
            .enumerate()
            .all(|(t, r)| t == winners[0] || matches!(r, Reservation::InFlight { .. })));
        let stored = backend.raw_token(&keys[round]).await.unwrap();
        assert_eq!((stored.status.as_str(), stored.fence), ("processing", 2));
        assert_eq!(stored.owner, Some(owner_of(winners[0])));
    }
    eprintln!(
        "race_takeover: {rounds} rounds x {RACERS} in {:?}",
        started.elapsed()
    );
}

/// Exactly one of `RACERS` concurrent consumers of the same pending token gets it.
pub async fn race_consume(backend: &dyn Backend, rounds: usize) {
    let started = Instant::now();
    let keys: Arc<Vec<_>> = Arc::new((0..rounds).map(|_| key("race-consume")).collect());
    let setup = backend.store(race_policy(TokenMode::Issued)).await;
    issue_all(&setup, &keys, Duration::from_secs(3600)).await;
    let stores = racer_stores(backend, race_policy(TokenMode::Issued)).await;
    let results = race(stores, keys.clone(), |store, _task, key| async move {
        store.consume(&key).await.unwrap()
    })
    .await;
    for (round, outcomes) in results.iter().enumerate() {
        let winners = outcomes.iter().filter(|c| **c).count();
        assert_eq!(winners, 1, "round {round}: {winners} consumers won");
        assert_eq!(
            backend.raw_token(&keys[round]).await,
            None,
            "round {round}: token still stored"
        );
    }
    eprintln!(
        "race_consume: {rounds} rounds x {RACERS} in {:?}",
        started.elapsed()
    );
}

/// Exactly one of `RACERS` concurrent lockers of the same key acquires the lock.
pub async fn race_lock(backend: &dyn Backend, rounds: usize) {
    let started = Instant::now();
    let keys: Arc<Vec<_>> = Arc::new((0..rounds).map(|_| key("race-lock")).collect());
    let stores = racer_stores(backend, race_policy(TokenMode::Implicit)).await;
    let results = race(stores, keys.clone(), |store, task, key| async move {
        store
            .lock(&key, &owner_of(task), Duration::from_secs(600))
            .await
            .unwrap()
    })
    .await;
    for (round, outcomes) in results.iter().enumerate() {
        let winners: Vec<usize> = (0..outcomes.len())
            .filter(|t| outcomes[*t] == LockOutcome::Acquired)
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {outcomes:?}");
        assert!(outcomes
            .iter()
            .enumerate()
            .all(|(t, o)| t == winners[0] || *o == LockOutcome::Held));
        assert_eq!(
            backend.raw_lock(&keys[round]).await,
            Some(owner_of(winners[0])),
            "round {round}"
        );
    }
    eprintln!(
        "race_lock: {rounds} rounds x {RACERS} in {:?}",
        started.elapsed()
    );
}

/// I5: once A's lease lapsed and B reserved, nothing A does lands; B's operations do.
pub async fn fencing(backend: &dyn Backend) {
    let store = backend
        .store(policy(TokenMode::Implicit, 200, 60_000, 60_000))
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

    tokio::time::sleep(Duration::from_millis(300)).await;
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

/// SPEC §3 modes: implicit creates an unknown key in processing; issued reports Missing.
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
        Reservation::Reserved { fence: 1 }
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
        Reservation::Reserved { fence: 1 }
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
        Reservation::Reserved { fence: 1 }
    );
    let stored = live(backend, &k2).await.unwrap();
    assert!(
        stored.expires_in_ms <= 90_000,
        "implicit reserve keeps the issued deadline: {stored:?}"
    );
}

/// I4: a processing token whose lease ran out is reservable again, with a higher fence.
pub async fn lapsed_lease_is_reservable(backend: &dyn Backend) {
    let store = backend
        .store(policy(TokenMode::Issued, 200, 60_000, 60_000))
        .await;
    let k = key("lapse");
    store.issue(&k, Duration::from_secs(60)).await.unwrap();
    assert_eq!(
        store.reserve(&k, "a").await.unwrap(),
        Reservation::Reserved { fence: 1 }
    );
    match store.reserve(&k, "b").await.unwrap() {
        Reservation::InFlight { lease_left } => assert!(lease_left <= Duration::from_millis(200)),
        other => panic!("expected InFlight, got {other:?}"),
    }
    assert!(store.expired_leases(100).await.unwrap().is_empty());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let view = store.show(&k).await.unwrap().unwrap();
    assert_eq!(
        (view.state, view.lease_left),
        (TokenState::Processing, Some(Duration::ZERO))
    );
    assert_eq!(store.expired_leases(100).await.unwrap(), vec![k.clone()]);
    assert_eq!(
        store.reserve(&k, "b").await.unwrap(),
        Reservation::Reserved { fence: 2 }
    );
    assert!(store.expired_leases(100).await.unwrap().is_empty());
    let stored = live(backend, &k).await.unwrap();
    assert_eq!((stored.owner.as_deref(), stored.fence), (Some("b"), 2));
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
        Reservation::Reserved { fence: 2 }
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
        Reservation::Reserved { fence: 1 }
    );
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

/// Scheme 2: SET NX PX, release only by the holder, expiry frees the lock.
pub async fn lock_and_release(backend: &dyn Backend) {
    let store = backend
        .store(policy(TokenMode::Implicit, 30_000, 60_000, 60_000))
        .await;
    let k = key("lock");
    let ttl = Duration::from_millis(300);
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
    tokio::time::sleep(Duration::from_millis(400)).await;
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
