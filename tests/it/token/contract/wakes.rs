//! Settle announcements: a reservation that met a live lease is woken by the holder's
//! confirm or restore, through the store's notification path, and by nothing else.

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use payment_worker::token::{Claim, Reservation, TokenMode, TokenStore, Transition, Woken};
use uuid::Uuid;

use super::backend::*;

/// Longer than anything here takes: a watch still pending after it lost its wake-up.
const HANG: Duration = Duration::from_secs(20);

fn long_lease() -> payment_worker::token::TokenPolicy {
    policy(TokenMode::Implicit, 600_000, 3_600_000, 3_600_000)
}

async fn held(store: &dyn TokenStore, k: &payment_worker::token::IdempotencyKey) -> Claim {
    Claim {
        owner: "holder".into(),
        fence: reserved_fence(store.reserve(k, "holder").await.unwrap()),
    }
}

async fn in_flight(store: &dyn TokenStore, k: &payment_worker::token::IdempotencyKey) {
    let met = store.reserve(k, "waiter").await.unwrap();
    assert!(matches!(met, Reservation::InFlight { .. }), "{met:?}");
}

/// The holder's confirm wakes the waiter by notification; an extend of the same
/// lease and the settle of another key do not.
pub async fn confirm_wakes_a_waiting_reservation(backend: &dyn Backend) {
    let holder = backend.store(long_lease()).await;
    // Another client, as another worker process would be.
    let waiter = backend.store(long_lease()).await;
    let k = key("wake-confirm");
    let claim = held(holder.as_ref(), &k).await;
    in_flight(waiter.as_ref(), &k).await;
    let watch = waiter
        .watch_settle(&k)
        .await
        .expect("the store announces settles");
    let mut woken = Box::pin(watch.settled());

    let other = key("wake-other");
    let other_claim = held(holder.as_ref(), &other).await;
    in_flight(waiter.as_ref(), &other).await;
    let other_watch = waiter.watch_settle(&other).await.unwrap();
    assert_eq!(
        holder.extend(&k, &claim).await.unwrap(),
        Transition::Applied
    );
    assert_eq!(
        holder
            .confirm(&other, &other_claim, Uuid::new_v4(), "fp-other")
            .await
            .unwrap(),
        Transition::Applied
    );
    assert_eq!(
        tokio::time::timeout(HANG, other_watch.settled())
            .await
            .expect("the other key's waiter is woken"),
        Woken::Notification
    );
    // One listener connection delivers in order: anything the extend or the other
    // key's settle sent about `k` would have arrived before the other key's wake.
    assert!(
        (&mut woken).now_or_never().is_none(),
        "woken by something other than its own token's settle"
    );

    assert_eq!(
        holder
            .confirm(&k, &claim, Uuid::new_v4(), "fp")
            .await
            .unwrap(),
        Transition::Applied
    );
    assert_eq!(
        tokio::time::timeout(HANG, woken)
            .await
            .expect("woken by the confirm"),
        Woken::Notification
    );
    assert!(matches!(
        waiter.reserve(&k, "waiter").await.unwrap(),
        Reservation::Completed { .. }
    ));
}

/// The holder's restore wakes the waiter, which then reserves the token itself.
pub async fn restore_wakes_a_waiting_reservation(backend: &dyn Backend) {
    let holder = backend.store(long_lease()).await;
    let waiter = backend.store(long_lease()).await;
    let k = key("wake-restore");
    let claim = held(holder.as_ref(), &k).await;
    in_flight(waiter.as_ref(), &k).await;
    let watch = waiter.watch_settle(&k).await.unwrap();
    assert_eq!(
        holder.restore(&k, &claim).await.unwrap(),
        Transition::Applied
    );
    assert_eq!(
        tokio::time::timeout(HANG, watch.settled())
            .await
            .expect("woken by the restore"),
        Woken::Notification
    );
    assert_eq!(
        reserved_fence(waiter.reserve(&k, "waiter").await.unwrap()),
        claim.fence + 1
    );
}

/// A settle between the reservation that met the lease and the watch is not missed:
/// the watch ends at once, saying so.
pub async fn a_settle_before_the_watch_is_not_missed(backend: &dyn Backend) {
    let holder = backend.store(long_lease()).await;
    let waiter = backend.store(long_lease()).await;
    let k = key("wake-early");
    let claim = held(holder.as_ref(), &k).await;
    in_flight(waiter.as_ref(), &k).await;
    assert_eq!(
        holder
            .confirm(&k, &claim, Uuid::new_v4(), "fp")
            .await
            .unwrap(),
        Transition::Applied
    );
    let watch = waiter.watch_settle(&k).await.unwrap();
    assert_eq!(watch.settled().now_or_never(), Some(Woken::AlreadySettled));
}

/// The holder settles while the waiter sets up its watch, `rounds` times: every
/// watch ends (by the announcement or by finding the token settled), none is left
/// waiting for a wake-up that was sent before it listened.
pub async fn race_settle_against_watch(backend: &dyn Backend, rounds: usize) {
    let holder: Arc<dyn TokenStore> = backend.store(long_lease()).await;
    let waiter = backend.store(long_lease()).await;
    let mut notified = 0;
    for round in 0..rounds {
        let k = key("wake-race");
        let claim = held(holder.as_ref(), &k).await;
        in_flight(waiter.as_ref(), &k).await;
        let settling = {
            let (holder, k) = (Arc::clone(&holder), k.clone());
            tokio::spawn(async move {
                if round % 2 == 0 {
                    holder.confirm(&k, &claim, Uuid::new_v4(), "fp").await
                } else {
                    holder.restore(&k, &claim).await
                }
            })
        };
        let watch = waiter.watch_settle(&k).await.unwrap();
        let woken = tokio::time::timeout(HANG, watch.settled())
            .await
            .unwrap_or_else(|_| panic!("round {round}: the watch missed the settle"));
        assert_eq!(settling.await.unwrap().unwrap(), Transition::Applied);
        assert!(
            matches!(woken, Woken::Notification | Woken::AlreadySettled),
            "{woken:?}"
        );
        notified += usize::from(woken == Woken::Notification);
    }
    eprintln!("{notified} of {rounds} watches woken by the announcement");
}
