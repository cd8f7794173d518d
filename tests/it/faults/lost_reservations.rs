//! A reservation whose answer is lost on the way back from Redis: the reservation was
//! made, nobody will settle it, and its lease (a minute here) would hold the command
//! that long. The next attempt of the same delivery names it and takes the token back
//! at once; a delivery that does not name it waits, as for any live lease.

use std::sync::Arc;
use std::time::Duration;

use payment_worker::gateway::{HttpGateway, PaymentGateway};
use payment_worker::payment::{
    Attempt, CommandContext, GatewayLookup, Outcome, PaymentCommand, Processor,
};
use payment_worker::token::{RedisTokenStore, TokenPolicy, TokenState, TokenStore};
use payment_worker_devtools::{GatewaySimulator, SimulatorConfig};

use crate::support::fault_proxy::{Direction, Fault, FaultProxy};
use crate::support::helpers::{unique, TestDb, TestRedis};

#[tokio::test]
async fn the_next_attempt_takes_back_a_reservation_whose_answer_was_lost() {
    let db = TestDb::new().await;
    let redis = TestRedis::new().await;
    let simulator =
        GatewaySimulator::bind("127.0.0.1:0".parse().unwrap(), SimulatorConfig::default())
            .unwrap()
            .spawn();
    let gateway: Arc<dyn PaymentGateway> = Arc::new(
        HttpGateway::new(
            &simulator.url(),
            Duration::from_secs(15),
            Duration::from_secs(1),
        )
        .unwrap(),
    );
    let proxy = FaultProxy::start("127.0.0.1:6379".parse().unwrap()).await;
    let policy = TokenPolicy {
        lease: Duration::from_secs(60),
        ..TokenPolicy::default()
    };
    let tokens: Arc<dyn TokenStore> = Arc::new(
        RedisTokenStore::connect(
            &format!("redis://{}", proxy.addr()),
            redis.prefix.clone(),
            policy,
        )
        .await
        .unwrap(),
    );
    let processor = Processor::new(
        Arc::clone(&tokens),
        gateway,
        db.pool.clone(),
        GatewayLookup::Uncertain,
        "w-lost-reservation",
    );
    let key = unique("pw-lost-reservation");
    let command = PaymentCommand::new(&key, "acct_42", 700, "USD", "pm_card_visa", None).unwrap();

    // Redis runs the reservation; its answer never comes back.
    proxy.set(Fault::HalfOpen(Direction::ToClient));
    let first = processor
        .process_watching(&command.clone().into(), &CommandContext::default())
        .await;
    assert!(
        matches!(&first.attempt, Attempt::Retry { reason, .. } if reason.contains("reserve")),
        "{:?}",
        first.attempt
    );
    let lost = first
        .lost_reservation
        .expect("an unanswered reservation is named to the next attempt");
    proxy.set(Fault::Pass);
    let view = tokens
        .show(&command.idempotency_key)
        .await
        .unwrap()
        .expect("the reservation was made");
    assert_eq!(view.state, TokenState::Processing);
    assert!(view
        .lease_left
        .is_some_and(|left| left > Duration::from_secs(30)));

    // Another delivery, which did not ask, waits for the lease.
    let stranger = processor
        .process(&command, &CommandContext::default())
        .await;
    assert!(
        matches!(&stranger, Attempt::Retry { reason, .. } if reason.contains("in flight")),
        "{stranger:?}"
    );
    // The same delivery's next attempt takes it back at once and charges, once.
    let context = CommandContext {
        lost_reservation: Some(lost.as_str()),
        ..CommandContext::default()
    };
    let second = processor.process(&command, &context).await;
    assert!(
        matches!(second, Attempt::Final(Outcome::Succeeded { .. })),
        "{second:?}"
    );
    let charges = simulator
        .ledger()
        .iter()
        .filter(|e| e.idempotency_key == key)
        .count();
    assert_eq!(charges, 1);
    let view = tokens
        .show(&command.idempotency_key)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(view.state, TokenState::Completed);
}
