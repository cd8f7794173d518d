//! A duplicate that meets another worker's live lease is woken by that worker's
//! settle instead of sleeping its backoff (the lease left), with either token store.

use std::sync::Arc;
use std::time::Duration;

use payment_worker::payment::{Attempt, CommandContext, Outcome};
use payment_worker::token::{
    PostgresTokenStore, RedisTokenStore, TokenPolicy, TokenState, TokenStore, Woken,
};
use payment_worker_devtools::{SimulatorConfig, SlowKey};

use crate::support::helpers::{assert_duplicate_of, REDIS_URL};
use crate::support::tokens::pg_token_row;

use super::rig::*;

/// Far longer than the held charge: a duplicate that only backed off would sleep it.
fn long_lease() -> TokenPolicy {
    TokenPolicy {
        lease: Duration::from_secs(120),
        ..TokenPolicy::default()
    }
}

fn held_charge(key: &str) -> SimulatorConfig {
    SimulatorConfig {
        slow_keys: vec![SlowKey {
            key: ikey(key),
            delay: Duration::from_millis(1500),
        }],
        ..SimulatorConfig::default()
    }
}

/// Worker A charges slowly; worker B (its own store client, as another process
/// would have) meets A's lease, gets a watch and is woken by A's settle through
/// the notification path, finds the token completed and answers the duplicate.
async fn duplicate_is_woken_by_the_holders_settle(
    rig: &Rig,
    key: &str,
    a_tokens: Arc<dyn TokenStore>,
    b_tokens: Arc<dyn TokenStore>,
) {
    let cmd = command(key, 910, "pm_card_visa");
    let a = rig.processor_with(
        a_tokens,
        payment_worker::payment::GatewayLookup::Uncertain,
        "a",
    );
    let holder = {
        let cmd = cmd.clone();
        tokio::spawn(async move { a.process(&cmd, &CommandContext::default()).await })
    };
    // A holds the lease once its token is processing (the charge takes 1.5 s).
    let mut polls = 0;
    while rig.token(key).await.map(|t| t.state) != Some(TokenState::Processing) {
        polls += 1;
        assert!(polls < 1000, "A never reserved the token");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let b = rig.processor_with(
        b_tokens,
        payment_worker::payment::GatewayLookup::Uncertain,
        "b",
    );
    let payment_worker::payment::Watched {
        attempt: met,
        watch,
        ..
    } = b
        .process_watching(&cmd.clone().into(), &CommandContext::default())
        .await;
    let Attempt::Retry { after, reason, .. } = &met else {
        panic!("B should have met A's lease: {met:?}");
    };
    assert_eq!(reason, IN_FLIGHT);
    assert!(
        *after > Duration::from_secs(60),
        "the backoff alone would wait out the lease: {after:?}"
    );
    let watch = watch.expect("B watches for A's settle");
    // A hang guard only, far below the lease B would otherwise wait for.
    let woken = tokio::time::timeout(Duration::from_secs(60), watch.settled())
        .await
        .expect("B was never woken");
    assert_eq!(woken, Woken::Notification, "woken by A's announcement");
    // Woken after the settle, not before: A's token is already completed.
    assert_eq!(
        rig.token(key).await.map(|t| t.state),
        Some(TokenState::Completed)
    );
    let answered = holder.await.unwrap();
    assert!(
        matches!(answered, Attempt::Final(Outcome::Succeeded { .. })),
        "{answered:?}"
    );
    let again = b.process(&cmd, &CommandContext::default()).await;
    let Attempt::Final(duplicate) = again else {
        panic!("B's next attempt answers at once: {again:?}");
    };
    let payment_id = rig.assert_charged_once(key).await;
    assert_duplicate_of(&duplicate, payment_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_waiting_on_a_redis_lease_is_woken_by_the_settle() {
    let key = "wake-redis-1";
    let rig = Rig::new(held_charge(key), long_lease()).await;
    let client = redis::Client::open(REDIS_URL).unwrap();
    let store = |conn: redis::aio::ConnectionManager| -> Arc<dyn TokenStore> {
        Arc::new(
            RedisTokenStore::new(conn, rig.redis.prefix.clone(), long_lease())
                .with_settle_notifications(client.clone()),
        )
    };
    let a_tokens = store(rig.redis.conn.clone());
    let b_conn = redis::aio::ConnectionManager::new(client.clone())
        .await
        .unwrap();
    let b_tokens = store(b_conn);
    duplicate_is_woken_by_the_holders_settle(&rig, key, a_tokens, b_tokens).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_waiting_on_a_postgres_lease_is_woken_by_the_settle() {
    let key = "wake-pg-1";
    let rig = Rig::new(held_charge(key), long_lease()).await;
    let store = || -> Arc<dyn TokenStore> {
        Arc::new(PostgresTokenStore::new(rig.db.pool.clone(), long_lease()))
    };
    let (a_tokens, b_tokens) = (store(), store());
    // The rig reads tokens through its Redis store: read this one's through Postgres.
    let pg = PgRig { rig: &rig };
    pg.run(key, a_tokens, b_tokens).await;
}

/// The same scenario, reading the token's state from the Postgres table.
struct PgRig<'a> {
    rig: &'a Rig,
}

impl PgRig<'_> {
    async fn state(&self, key: &str) -> Option<String> {
        pg_token_row(&self.rig.db.pool, key)
            .await
            .map(|row| row.status)
    }

    async fn run(&self, key: &str, a_tokens: Arc<dyn TokenStore>, b_tokens: Arc<dyn TokenStore>) {
        let rig = self.rig;
        let cmd = command(key, 910, "pm_card_visa");
        let a = rig.processor_with(
            a_tokens,
            payment_worker::payment::GatewayLookup::Uncertain,
            "a",
        );
        let holder = {
            let cmd = cmd.clone();
            tokio::spawn(async move { a.process(&cmd, &CommandContext::default()).await })
        };
        let mut polls = 0;
        while self.state(key).await.as_deref() != Some("processing") {
            polls += 1;
            assert!(polls < 1000, "A never reserved the token");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let b = rig.processor_with(
            b_tokens,
            payment_worker::payment::GatewayLookup::Uncertain,
            "b",
        );
        let payment_worker::payment::Watched {
            attempt: met,
            watch,
            ..
        } = b
            .process_watching(&cmd.clone().into(), &CommandContext::default())
            .await;
        assert!(
            matches!(&met, Attempt::Retry { reason, after, .. }
                if reason == IN_FLIGHT && *after > Duration::from_secs(60)),
            "B should have met A's lease: {met:?}"
        );
        let woken = tokio::time::timeout(
            Duration::from_secs(60),
            watch.expect("B watches for A's settle").settled(),
        )
        .await
        .expect("B was never woken");
        assert_eq!(woken, Woken::Notification, "woken by A's announcement");
        // Announced at A's COMMIT: the token is completed by then.
        assert_eq!(self.state(key).await.as_deref(), Some("completed"));
        let answered = holder.await.unwrap();
        assert!(
            matches!(answered, Attempt::Final(Outcome::Succeeded { .. })),
            "{answered:?}"
        );
        let again = b.process(&cmd, &CommandContext::default()).await;
        let Attempt::Final(duplicate) = again else {
            panic!("B's next attempt answers at once: {again:?}");
        };
        let ledger = rig.ledger_for(key);
        assert_eq!(ledger.len(), 1, "one charge: {ledger:?}");
        let rows = rig.rows(key).await;
        assert_eq!(rows.len(), 1, "one payment row");
        assert_duplicate_of(&duplicate, rows[0].0);
    }
}
