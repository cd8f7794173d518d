//! What one payment costs in round trips, counted from the client spans the code
//! opens for each request (a regression here fails CI; time is never asserted).

use payment_worker::devtools::SimulatorConfig;
use payment_worker::payment::{CommandContext, Outcome, PaymentCommand};
use payment_worker::telemetry::{RoundTripCounter, RoundTrips};
use tracing::instrument::WithSubscriber;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer;

use crate::support::helpers::{final_outcome, Stack};

fn command(key: &str) -> PaymentCommand {
    let value = serde_json::json!({"idempotency_key": key, "account_id": "acct_rt",
        "amount_minor": 1250, "currency": "EUR", "payment_method": "pm_card_visa"});
    PaymentCommand::parse(value.to_string().as_bytes()).unwrap()
}

async fn counted(stack: &Stack, command: &PaymentCommand) -> (Outcome, RoundTrips) {
    let counter = RoundTripCounter::default();
    // A per-layer filter, as the test binary's global subscriber has: spans of the
    // shared connection pools cross between the two registries.
    let subscriber = tracing_subscriber::registry().with(
        counter
            .clone()
            .with_filter(tracing_subscriber::filter::LevelFilter::TRACE),
    );
    let outcome = stack
        .processor("round-trips")
        .process(command, &CommandContext::default())
        .with_subscriber(subscriber)
        .await;
    (final_outcome(outcome), counter.snapshot())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_payment_costs_four_postgres_three_redis_and_one_gateway_round_trip() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let fresh = command("rt-fresh");
    let (outcome, trips) = counted(&stack, &fresh).await;
    assert!(matches!(outcome, Outcome::Succeeded { .. }), "{outcome:?}");
    // BEGIN, INSERT (with the pre-existing check), UPDATE, COMMIT; reserve, the fence
    // check before COMMIT, confirm (the lease is fresh at the POST); one POST.
    assert_eq!(
        trips,
        RoundTrips {
            postgres: 4,
            token_store: 3,
            gateway: 1
        }
    );
    // A duplicate decided by the Redis tombstone reads its original answer once.
    let (outcome, trips) = counted(&stack, &fresh).await;
    assert!(
        matches!(
            outcome,
            Outcome::Duplicate {
                original: Some(_),
                ..
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(
        trips,
        RoundTrips {
            postgres: 1,
            token_store: 1,
            gateway: 0
        }
    );
}
