//! Races: many callers at once on one key, many rounds; exactly one winner each time.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use payment_worker::token::{
    IdempotencyKey, IssueOutcome, LockOutcome, Predecessor, Reservation, TokenMode, TokenPolicy,
    TokenStore,
};

use super::backend::*;

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
    let racers = stores.len();
    let barrier = Arc::new(tokio::sync::Barrier::new(racers));
    let mut tasks = tokio::task::JoinSet::new();
    for (task, store) in stores.into_iter().enumerate() {
        let (barrier, keys, op) = (barrier.clone(), keys.clone(), op.clone());
        tasks.spawn(async move {
            let mut out = Vec::with_capacity(keys.len());
            for key in keys.iter() {
                barrier.wait().await;
                out.push(op(store.clone(), task, key.clone()).await);
            }
            (task, out)
        });
    }
    // A racer that fails leaves the others waiting at the next barrier for ever:
    // the first failure ends the race, and the test, at once.
    let mut per_task: Vec<Vec<T>> = (0..racers).map(|_| Vec::new()).collect();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((task, out)) => per_task[task] = out,
            Err(error) => {
                tasks.abort_all();
                panic!("racer failed: {error}");
            }
        }
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
            Reservation::Reserved {
                fence: 1,
                predecessor: Predecessor::Nobody
            },
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
            Reservation::Reserved {
                fence: 1,
                predecessor: Predecessor::Nobody
            }
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
        assert_eq!(
            outcomes[winners[0]],
            Reservation::Reserved {
                fence: 2,
                predecessor: Predecessor::Holder("crashed".into())
            }
        );
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
