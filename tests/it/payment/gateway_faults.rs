//! Gateway faults: an answer that comes too late, a gateway that ignores idempotency
//! keys, an unavailable gateway, a decline.

use std::time::Duration;

use payment_worker::fault::{FaultPoint, Faults};
use payment_worker::gateway::{ChargeStatus, PaymentGateway};
use payment_worker::payment::{Attempt, CommandContext, GatewayLookup, Outcome};
use payment_worker::token::{TokenPolicy, TokenState};
use payment_worker_devtools::SimulatorConfig;

use crate::support::helpers::{assert_duplicate_of, final_outcome, NoLease};

use super::rig::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_comes_too_late_is_looked_up_and_succeeds() {
    let sim = SimulatorConfig {
        timeout_after_charge_rate: 1.0,
        late_by_ms: 2000,
        ..SimulatorConfig::default()
    };
    let rig = Rig::with_timeout(sim, TokenPolicy::default(), Duration::from_millis(300)).await;
    let key = "late-1";
    let outcome = rig
        .processor("p")
        .process(
            &command(key, 700, "pm_card_visa"),
            &CommandContext::default(),
        )
        .await;
    let payment_id = rig.assert_charged_once(key).await;
    let transaction_id = rig.ledger_for(key)[0].transaction_id.clone();
    assert_eq!(
        outcome,
        Attempt::Final(Outcome::Succeeded {
            payment_id,
            transaction_id
        })
    );
    assert_eq!(
        rig.gateway.charges(),
        1,
        "the unknown outcome was not re-charged"
    );
    assert!(
        rig.gateway.lookups() >= 1,
        "the outcome came from a look-up"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_ignoring_idempotency_keys_still_charges_once_with_lookup_always() {
    let sim = SimulatorConfig {
        ignore_idempotency_key: true,
        ..SimulatorConfig::default()
    };
    let rig = Rig::new(sim, short_lease()).await;
    let always = |id: &str| rig.processor_with(rig.tokens(), GatewayLookup::Always, id);

    // The premise: this gateway books every POST, whatever its key.
    let probe = command("probe", 100, "pm_card_visa");
    for _ in 0..2 {
        rig.gateway
            .charge(&probe.idempotency_key, &probe.charge_request(), &NoLease)
            .await
            .unwrap();
    }
    assert_eq!(rig.ledger_for("probe").len(), 2);

    // Crash after the charge (in process), then the lease runs out and a retry comes.
    let cmd = command("ignore-1", 900, "pm_card_visa");
    let first = always("a")
        .with_faults(Faults::fail_at(FaultPoint::AfterCharge))
        .process(&cmd, &CommandContext::default())
        .await;
    assert!(matches!(first, Attempt::Retry { .. }), "{first:?}");
    let (second, _) = until_final(&always("b"), &cmd).await;
    assert!(matches!(second, Outcome::Succeeded { .. }), "{second:?}");
    assert_eq!(rig.ledger_for("ignore-1").len(), 1, "one charge");

    // The same crash, then Redis loses the token: the retry reserves fence 1 again, so
    // only `always` stands between it and a second charge.
    let cmd = command("ignore-2", 900, "pm_card_visa");
    let first = always("a")
        .with_faults(Faults::fail_at(FaultPoint::AfterCharge))
        .process(&cmd, &CommandContext::default())
        .await;
    assert!(matches!(first, Attempt::Retry { .. }), "{first:?}");
    rig.forget_token("ignore-2").await;
    let (second, retries) = until_final(&always("b"), &cmd).await;
    assert!(retries.is_empty(), "{retries:?}");
    assert!(matches!(second, Outcome::Succeeded { .. }), "{second:?}");
    assert_eq!(rig.ledger_for("ignore-2").len(), 1, "one charge");
    assert_eq!(
        rig.token("ignore-2").await.unwrap().fence,
        1,
        "the retry really started from scratch"
    );

    // And with a real process SIGKILLed between charge and commit.
    let json = command_json("ignore-3", 900);
    let child = start_frozen(&rig, &json, FaultPoint::AfterCharge, "always").await;
    assert_eq!(rig.ledger_for("ignore-3").len(), 1);
    sigkill(child).await;
    let view = process_with_binary(&rig, &json, "always").await;
    assert_eq!(view["outcome"], "succeeded", "{view}");
    let ledger = rig.ledger_for("ignore-3");
    assert_eq!(ledger.len(), 1, "one charge: {ledger:?}");
    let rows = rig.rows("ignore-3").await;
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0].2.as_deref(),
        Some(ledger[0].transaction_id.as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unavailable_gateway_is_retried_without_a_charge_and_the_token_restored() {
    let sim = SimulatorConfig {
        error_rate: 1.0,
        ..SimulatorConfig::default()
    };
    let rig = Rig::new(sim, TokenPolicy::default()).await;
    let key = "unavailable-1";
    let cmd = command(key, 4200, "pm_card_visa");
    for attempt in 1..=2u64 {
        let outcome = rig
            .processor("p")
            .process(&cmd, &CommandContext::default())
            .await;
        assert!(matches!(outcome, Attempt::Retry { .. }), "{outcome:?}");
        assert!(rig.ledger_for(key).is_empty(), "no charge");
        assert!(rig.rows(key).await.is_empty(), "no row");
        let token = rig.token(key).await.unwrap();
        assert_eq!(
            token.state,
            TokenState::Pending,
            "restored, not left to its lease"
        );
        // Reservable again at once: each attempt took the next fence.
        assert_eq!(token.fence, attempt);
    }
    assert_eq!(
        rig.gateway.charges(),
        2,
        "both attempts reached the gateway and were refused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declined_payment_is_final_and_a_replay_is_a_duplicate() {
    let rig = Rig::new(SimulatorConfig::default(), TokenPolicy::default()).await;
    let key = "declined-1";
    let cmd = command(key, 5000, "pm_card_declined");
    let outcome = rig
        .processor("p")
        .process(&cmd, &CommandContext::default())
        .await;
    let Attempt::Final(Outcome::Declined {
        payment_id,
        transaction_id,
    }) = outcome
    else {
        panic!("{outcome:?}")
    };
    let ledger = rig.ledger_for(key);
    assert_eq!(ledger.len(), 1);
    assert_eq!(
        (ledger[0].status, &ledger[0].transaction_id),
        (ChargeStatus::Declined, &transaction_id)
    );
    let rows = rig.rows(key).await;
    assert_eq!(
        rows,
        vec![(payment_id, "declined".to_owned(), Some(transaction_id), 1)]
    );
    let token = rig.token(key).await.unwrap();
    assert_eq!(
        (token.state, token.payment_id),
        (TokenState::Completed, Some(payment_id))
    );

    let again = rig
        .processor("q")
        .process(&cmd, &CommandContext::default())
        .await;
    assert_duplicate_of(&final_outcome(again), payment_id);
    assert_eq!(
        rig.gateway.charges(),
        1,
        "the replay never reached the gateway"
    );
    assert_eq!(rig.ledger_for(key)[0].attempts, 1);

    // The row says why; a successful payment has no failure reason.
    let approved = command("approved-1", 5000, "pm_card_visa");
    let outcome = rig
        .processor("p")
        .process(&approved, &CommandContext::default())
        .await;
    assert!(
        matches!(outcome, Attempt::Final(Outcome::Succeeded { .. })),
        "{outcome:?}"
    );
    let reasons: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT idempotency_key, failure_reason FROM payments
         WHERE idempotency_key IN ($1, 'approved-1') ORDER BY idempotency_key",
    )
    .bind(key)
    .fetch_all(&rig.db.pool)
    .await
    .unwrap();
    assert_eq!(
        reasons,
        vec![
            ("approved-1".to_owned(), None),
            (key.to_owned(), Some("declined by gateway".to_owned())),
        ]
    );
}
