//! Slow charges: the lease is renewed while the charge runs, and a worker that lost
//! its lease cannot commit.

use std::time::{Duration, Instant};

use payment_worker::fault::{FaultPoint, Faults};
use payment_worker::payment::{Attempt, CommandContext, Outcome, RejectionKind};
use payment_worker::token::TokenState;
use payment_worker_devtools::{SimulatorConfig, SlowKey};

use crate::support::helpers::assert_duplicate_of;

use super::rig::*;

fn slow(key: &str, millis: u64) -> SimulatorConfig {
    SimulatorConfig {
        slow_keys: vec![SlowKey {
            key: ikey(key),
            delay: Duration::from_millis(millis),
        }],
        ..SimulatorConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_charge_renews_its_lease_so_a_second_worker_waits() {
    let key = "slow-1";
    let rig = Rig::new(slow(key, 2500), short_lease()).await;
    let cmd = command(key, 640, "pm_card_visa");
    let first = {
        let (processor, cmd) = (rig.processor("a"), cmd.clone());
        tokio::spawn(async move { processor.process(&cmd, &CommandContext::default()).await })
    };
    // Well past the 1 s lease the reservation started with.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let second = rig.processor("b");
    let during = second.process(&cmd, &CommandContext::default()).await;
    assert!(
        matches!(&during, Attempt::Retry { reason, .. } if reason == IN_FLIGHT),
        "{during:?}"
    );

    let first = first.await.unwrap();
    assert!(
        matches!(first, Attempt::Final(Outcome::Succeeded { .. })),
        "{first:?}"
    );
    let (later, _) = until_final(&second, &cmd).await;
    let payment_id = rig.assert_charged_once(key).await;
    assert_duplicate_of(&later, payment_id);
    assert_eq!(rig.token(key).await.unwrap().fence, 1, "never taken over");
}

/// I5: Redis loses the token while a slow charge runs and another worker reserves
/// it afresh. The first worker's renewal is refused, so it must not commit; the
/// second one waits on the unique key, then records the same charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_lost_its_lease_during_the_charge_does_not_commit() {
    let key = "fenced-1";
    let rig = Rig::new(slow(key, 2000), short_lease()).await;
    let cmd = command(key, 640, "pm_card_visa");
    let first = {
        let (processor, cmd) = (rig.processor("a"), cmd.clone());
        tokio::spawn(async move { processor.process(&cmd, &CommandContext::default()).await })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.ledger_for(key).is_empty() {
        assert!(Instant::now() < deadline, "the first charge never arrived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    rig.forget_token(key).await;
    let second = {
        let (processor, cmd) = (rig.processor("b"), cmd.clone());
        tokio::spawn(async move { until_final(&processor, &cmd).await })
    };

    let first = first.await.unwrap();
    assert_eq!(
        first,
        Attempt::Retry {
            after: Duration::ZERO,
            reason: "lease lost during the gateway call".to_owned(),
            charge: payment_worker::payment::ChargeEvidence::MayHaveCharged,
        }
    );
    let (second, _) = second.await.unwrap();
    let Outcome::Succeeded {
        payment_id,
        transaction_id,
    } = second
    else {
        panic!("{second:?}")
    };
    let ledger = rig.ledger_for(key);
    assert_eq!(ledger.len(), 1, "one charge");
    assert_eq!(ledger[0].transaction_id, transaction_id);
    let rows = rig.rows(key).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].0, rows[0].2.as_deref()),
        (payment_id, Some(transaction_id.as_str()))
    );
    let token = rig.token(key).await.unwrap();
    assert_eq!(
        (token.state, token.payment_id),
        (TokenState::Completed, Some(payment_id))
    );
}

/// A key used again with another request while the first request's charge is
/// unbooked (it charged and crashed before recording) is never booked: the look-up
/// that a later reservation (fence > 1) makes finds a charge for another amount,
/// which is `internal` (`gateway_charge_mismatch`), flagged, never `key_reused` nor
/// a row claiming an amount the gateway did not charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_key_after_a_crash_after_charge_is_rejected() {
    let rig = Rig::new(SimulatorConfig::default(), short_lease()).await;
    let key = "reused-after-crash";
    let first = rig
        .processor("a")
        .with_faults(Faults::fail_at(FaultPoint::AfterCharge))
        .process(
            &command(key, 100, "pm_card_visa"),
            &CommandContext::default(),
        )
        .await;
    assert!(matches!(first, Attempt::Retry { .. }), "{first:?}");
    let (second, _) = until_final(&rig.processor("b"), &command(key, 20_000, "pm_card_visa")).await;
    assert!(
        matches!(
            &second,
            Outcome::Rejected {
                kind: RejectionKind::Internal,
                reason,
            } if reason.starts_with("gateway_charge_mismatch")
        ),
        "{second:?}"
    );
    let booked: Vec<(i64,)> =
        sqlx::query_as("SELECT amount_minor FROM payments WHERE idempotency_key = $1")
            .bind(key)
            .fetch_all(&rig.db.pool)
            .await
            .unwrap();
    assert!(
        booked.iter().all(|(amount,)| *amount == 100),
        "a row must never claim an amount the gateway did not charge: {booked:?}"
    );
}
