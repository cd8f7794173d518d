//! The lease inside the Stripe adapter: two holders of one key, the first held
//! between its steps while its Postgres session is ended and Redis loses the
//! token, the second charging meanwhile. Stripe cannot tell their requests apart
//! (each create and confirm has its own `Idempotency-Key`), so only the lease check
//! right before each POST keeps the first from charging a second time: exactly
//! one PaymentIntent succeeds, and the books agree with it.

use std::sync::Arc;
use std::time::Duration;

use payment_worker::configuration::StripeCompat;
use payment_worker::payment::{Attempt, CommandContext, Outcome, PaymentCommand, Processor};

use crate::support::books::flush_prefix;
use crate::support::helpers::{http, unique};
use crate::support::scripted_stripe::{Gate, Route, Scripted, ScriptedStripe};
use crate::support::stripe::{command, until_final, StripeRig};

const KEY: &str = "sk_test_lease_race";

/// A lease long enough that the first half of it, in which a fresh attempt may
/// skip its first check, covers the whole race.
const LEASE: Duration = Duration::from_secs(10);

struct Race {
    server: ScriptedStripe,
    rig: StripeRig,
    /// The first holder and the second: two workers, each with its own adapter.
    first: Arc<Processor>,
    second: Processor,
}

impl Race {
    async fn new() -> Self {
        let server = ScriptedStripe::start(&[(KEY, "acct_race")]).await;
        let rig = StripeRig::new(&server.url(), StripeCompat::Stripe, LEASE).await;
        let first = Arc::new(rig.processor(Arc::new(rig.gateway_with_key(KEY))));
        let second = rig.processor(Arc::new(rig.gateway_with_key(KEY)));
        Self {
            server,
            rig,
            first,
            second,
        }
    }

    /// Runs the first holder's attempt until the server holds it at `gate`; then
    /// its Postgres session is ended (its uncommitted row goes, so the second
    /// holder's insert does not wait on it), Redis loses the token, and the second
    /// holder charges. Returns the first holder's attempt once let go.
    async fn take_over_while_held(&self, order: &PaymentCommand, gate: Gate) -> Attempt {
        let first = Arc::clone(&self.first);
        let held_order = order.clone();
        let attempt =
            tokio::spawn(
                async move { first.process(&held_order, &CommandContext::default()).await },
            );
        gate.arrival().await;
        let ended: i64 = sqlx::query_scalar(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE datname = current_database() AND state = 'idle in transaction'",
        )
        .fetch_one(&self.rig.db.pool)
        .await
        .unwrap();
        assert_eq!(ended, 1, "the first holder's payment transaction was open");
        let mut redis = self.rig._redis.conn.clone();
        assert!(
            flush_prefix(&mut redis, &self.rig._redis.prefix).await >= 1,
            "the token was in Redis"
        );
        let outcome = until_final(&self.second, order).await;
        assert!(
            matches!(outcome, Outcome::Succeeded { .. }),
            "the second holder charges: {outcome:?}"
        );
        gate.release();
        tokio::time::timeout(Duration::from_secs(60), attempt)
            .await
            .expect("the first holder's attempt ends")
            .unwrap()
    }

    /// Exactly one PaymentIntent of `key` succeeded, charged once, and it is the
    /// one the one `succeeded` row books.
    async fn assert_one_charge_booked(&self, key: &str) {
        assert_eq!(self.server.charges(key), 1, "charged once");
        let succeeded: Vec<String> = self
            .server
            .intents(key)
            .into_iter()
            .filter(|(_, status)| status == "succeeded")
            .map(|(id, _)| id)
            .collect();
        assert_eq!(succeeded.len(), 1, "{:?}", self.server.intents(key));
        let rows = self.rig.rows(key).await;
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(
            (rows[0].1.as_str(), rows[0].2.as_deref()),
            ("succeeded", Some(succeeded[0].as_str()))
        );
    }
}

fn assert_lease_lost(attempt: &Attempt) {
    match attempt {
        Attempt::Retry { reason, .. } => assert!(reason.contains("lease lost"), "{reason}"),
        other => panic!("the first holder must give up its attempt: {other:?}"),
    }
}

/// The first holder's create is held at Stripe's door, so the second holder's
/// listing cannot see it and makes its own PaymentIntent, which it confirms. Let
/// in, the first create makes a PaymentIntent the first holder records; the lease
/// check before its confirm finds the lease gone, and nothing confirms it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_lease_was_lost_during_its_create_never_confirms() {
    let race = Race::new().await;
    let key = unique("st-race-confirm");
    let order = command(&key, 3100, "USD", "pm_card_visa");
    let gate = race.server.hold(Route::Create, &key, 0);

    let first = race.take_over_while_held(&order, gate).await;
    assert_eq!(race.server.charges(&key), 1, "charged once");
    assert_lease_lost(&first);
    assert_eq!(
        race.server.keys_seen(&key),
        [
            format!("{key}:create:2"),
            format!("{key}:confirm:1"),
            format!("{key}:create:1"),
        ],
        "the second holder's create and confirm, then the first holder's create, let in \
         last; no confirm after it"
    );
    let records = race.rig.records(&key).await;
    assert_eq!(records.len(), 2, "{records:?}");
    assert!(
        records[0].1.is_some(),
        "the first holder's create was answered and recorded before its confirm was due: \
         {records:?}"
    );
    race.assert_one_charge_booked(&key).await;
    let orphan = &records[0].1;
    assert!(
        race.server
            .intents(&key)
            .iter()
            .any(|(id, status)| Some(id) == orphan.as_ref() && status == "requires_confirmation"),
        "the first holder's PaymentIntent is left unconfirmed, for audit: {:?}",
        race.server.intents(&key)
    );
}

/// The first holder looks at a cancelled PaymentIntent (so a new one is due) and is
/// held there while the second holder makes and confirms its own. Let go, the
/// first holder finds nothing alive in what it read, and the lease check before
/// its create finds the lease gone: it makes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_lease_was_lost_before_its_create_makes_nothing() {
    let race = Race::new().await;
    let key = unique("st-race-create");
    let order = command(&key, 4700, "EUR", "pm_card_visa");
    // An earlier attempt leaves a PaymentIntent awaiting its confirm (the confirm
    // answered 409, a look-up found it unconfirmed), which is then cancelled, as
    // `audit --repair` cancels an orphan.
    race.server.script_confirms(
        &key,
        &[Scripted::Refuse(409, "invalid_request_error", None)],
    );
    let earlier = race.first.process(&order, &CommandContext::default()).await;
    assert!(matches!(earlier, Attempt::Retry { .. }), "{earlier:?}");
    let made = race.server.intents(&key);
    assert_eq!(made.len(), 1, "{made:?}");
    let cancelled = http()
        .post(format!(
            "{}/v1/payment_intents/{}/cancel",
            race.server.url(),
            made[0].0
        ))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert!(cancelled.status().is_success());

    // The next attempt (fence 2) looks it up first, then reads it again inside the
    // charge: that second read is held.
    let gate = race.server.hold(Route::Retrieve, &made[0].0, 1);
    let first = race.take_over_while_held(&order, gate).await;
    assert_eq!(race.server.charges(&key), 1, "charged once");
    assert_lease_lost(&first);
    assert_eq!(
        race.server.keys_seen(&key),
        [
            format!("{key}:create:1"),
            format!("{key}:confirm:1"),
            format!("{key}:create:2"),
            format!("{key}:confirm:2"),
        ],
        "the earlier attempt's create and confirm, the second holder's; nothing from the \
         first holder once let go"
    );
    let records = race.rig.records(&key).await;
    assert!(
        records.iter().skip(2).all(|(_, id, _)| id.is_none()),
        "no PaymentIntent made after the lease was lost: {records:?}"
    );
    race.assert_one_charge_booked(&key).await;
}
