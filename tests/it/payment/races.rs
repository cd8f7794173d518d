//! Many processors, one command: 32 racers per round, many rounds, against each token
//! store; exactly one charge per key every round.

use std::sync::Arc;

use payment_worker::configuration::DatabaseSettings;
use payment_worker::payment::{GatewayLookup, Outcome};
use payment_worker::token::{
    PostgresTokenStore, RedisTokenStore, TokenPolicy, TokenState, TokenStore,
};
use payment_worker_devtools::SimulatorConfig;
use uuid::Uuid;

use super::rig::*;

/// One round: `stores[i]` is processor i's token store. All start together.
/// Returns the payment and how many attempts found the token in flight.
async fn race_round(rig: &Rig, stores: Vec<Arc<dyn TokenStore>>, key: &str) -> (Uuid, usize) {
    let n = stores.len();
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let command = command(key, 2500, "pm_card_visa");
    let tasks: Vec<_> = stores
        .into_iter()
        .enumerate()
        .map(|(i, tokens)| {
            let processor = rig.processor_with(tokens, GatewayLookup::Uncertain, &format!("p{i}"));
            let barrier = Arc::clone(&barrier);
            let command = command.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                until_final(&processor, &command).await
            })
        })
        .collect();
    let mut winners = Vec::new();
    let mut duplicates = Vec::new();
    let mut in_flight = 0;
    for task in tasks {
        let (outcome, retries) = task.await.unwrap();
        in_flight += retries.len();
        // The only acceptable detour is waiting for the owner of the token.
        assert!(
            retries.iter().all(|r| r == IN_FLIGHT),
            "unexpected retries: {retries:?}"
        );
        match outcome {
            Outcome::Succeeded {
                payment_id,
                transaction_id,
            } => winners.push((payment_id, transaction_id)),
            Outcome::Duplicate { payment_id, .. } => duplicates.push(payment_id),
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one processor charged");
    assert_eq!(
        duplicates.len(),
        n - 1,
        "every other processor saw a duplicate"
    );
    let (payment_id, transaction_id) = winners.pop().unwrap();
    assert!(
        duplicates.iter().all(|d| *d == payment_id),
        "duplicates name the original payment"
    );
    let ledger = rig.ledger_for(key);
    assert_eq!(ledger.len(), 1, "one charge for {key}");
    assert_eq!(ledger[0].attempts, 1, "one POST reached the gateway");
    assert_eq!(ledger[0].transaction_id, transaction_id);
    let rows = rig.rows(key).await;
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].0, rows[0].1.as_str()), (payment_id, "succeeded"));
    assert_eq!(rows[0].2.as_deref(), Some(transaction_id.as_str()));
    (payment_id, in_flight)
}

const RACERS: usize = 32;
const ROUNDS: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_processors_sharing_redis_charge_once() {
    let rig = Rig::new(SimulatorConfig::default(), TokenPolicy::default()).await;
    let mut waited = 0;
    for round in 0..ROUNDS {
        let key = format!("race-redis-{round}");
        let (payment_id, in_flight) = race_round(&rig, vec![rig.tokens(); RACERS], &key).await;
        waited += in_flight;
        let token = rig.token(&key).await.unwrap();
        assert_eq!(
            (token.state, token.payment_id),
            (TokenState::Completed, Some(payment_id))
        );
        assert_eq!(token.fence, 1, "nobody took the lease over");
    }
    assert!(waited > 0, "the processors really overlapped");
    assert_eq!(rig.gateway.charges(), ROUNDS, "one POST per round");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_processors_sharing_the_postgres_token_store_charge_once() {
    let rig = Rig::new(SimulatorConfig::default(), TokenPolicy::default()).await;
    // A pool of its own, smaller than the racers: the statements still contend on
    // the row, and the test leaves Postgres connections for everything else running.
    let token_pool = payment_worker::startup::connect(&DatabaseSettings {
        max_connections: 12,
        ..DatabaseSettings::with_url(&rig.db.url)
    })
    .await
    .unwrap();
    let tokens: Arc<dyn TokenStore> =
        Arc::new(PostgresTokenStore::new(token_pool, TokenPolicy::default()));
    let mut waited = 0;
    for round in 0..ROUNDS {
        let key = format!("race-pg-{round}");
        let (payment_id, in_flight) =
            race_round(&rig, vec![Arc::clone(&tokens); RACERS], &key).await;
        waited += in_flight;
        let token = tokens.show(&ikey(&key)).await.unwrap().unwrap();
        assert_eq!(
            (token.state, token.payment_id),
            (TokenState::Completed, Some(payment_id))
        );
    }
    assert!(waited > 0, "the processors really overlapped");
    assert_eq!(rig.gateway.charges(), ROUNDS, "one POST per round");
}

/// Redis split-brain (every processor has its own empty token namespace, as after a
/// failover that lost the data): all 32 reserve fence 1, and only the unique key in
/// Postgres serialises them (I6).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_holders_of_a_reservation_are_serialised_by_postgres() {
    let rig = Rig::new(SimulatorConfig::default(), TokenPolicy::default()).await;
    for round in 0..ROUNDS {
        let key = format!("split-{round}");
        let stores: Vec<Arc<dyn TokenStore>> = (0..RACERS)
            .map(|i| {
                let prefix = format!("{}-brain{i}", rig.redis.prefix);
                Arc::new(RedisTokenStore::new(
                    rig.redis.conn.clone(),
                    prefix,
                    TokenPolicy::default(),
                )) as Arc<dyn TokenStore>
            })
            .collect();
        let (payment_id, in_flight) = race_round(&rig, stores.clone(), &key).await;
        assert_eq!(
            in_flight, 0,
            "nobody shares a token, so nobody waits on one"
        );
        // Every processor held its own reservation and settled it on the one row.
        for store in &stores {
            let token = store.show(&ikey(&key)).await.unwrap().unwrap();
            assert_eq!(
                (token.state, token.fence, token.payment_id),
                (TokenState::Completed, 1, Some(payment_id))
            );
        }
    }
    assert_eq!(rig.gateway.charges(), ROUNDS, "one POST per round");
}
