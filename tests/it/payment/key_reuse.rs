//! A key reused with other content, a token Redis lost, and issued-token mode.

use std::time::Duration;

use payment_worker::gateway::PaymentGateway;
use payment_worker::payment::{Attempt, CommandContext, Outcome, RejectionKind};
use payment_worker::token::{TokenMode, TokenPolicy, TokenStore};
use payment_worker_devtools::SimulatorConfig;

use crate::support::helpers::{assert_duplicate_of, final_outcome, NoLease};

use super::rig::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_with_another_amount_is_rejected_and_never_charged() {
    let rig = Rig::new(SimulatorConfig::default(), TokenPolicy::default()).await;
    let key = "reuse-1";
    let original = rig
        .processor("p")
        .process(
            &command(key, 1000, "pm_card_visa"),
            &CommandContext::default(),
        )
        .await;
    assert!(
        matches!(original, Attempt::Final(Outcome::Succeeded { .. })),
        "{original:?}"
    );
    let payment_id = rig.assert_charged_once(key).await;

    let other = command(key, 2000, "pm_card_visa");
    // Fast path: the completed token kept the fingerprint.
    let outcome = rig
        .processor("p")
        .process(&other, &CommandContext::default())
        .await;
    assert!(
        matches!(
            outcome,
            Attempt::Final(Outcome::Rejected {
                kind: RejectionKind::KeyReused,
                ..
            })
        ),
        "{outcome:?}"
    );
    // Postgres path: Redis lost the token, the row's fingerprint decides.
    rig.forget_token(key).await;
    let outcome = rig
        .processor("p")
        .process(&other, &CommandContext::default())
        .await;
    assert!(
        matches!(
            outcome,
            Attempt::Final(Outcome::Rejected {
                kind: RejectionKind::KeyReused,
                ..
            })
        ),
        "{outcome:?}"
    );

    assert_eq!(
        rig.gateway.charges(),
        1,
        "the reused key never reached the gateway"
    );
    assert_eq!(
        rig.assert_charged_once(key).await,
        payment_id,
        "the original payment is untouched"
    );
    let ledger = rig.ledger_for(key);
    assert_eq!(ledger[0].amount_minor, 1000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_redis_lost_the_token_postgres_answers_duplicate() {
    let rig = Rig::new(SimulatorConfig::default(), TokenPolicy::default()).await;
    let key = "flushed-1";
    let cmd = command(key, 1500, "pm_card_visa");
    let first = rig
        .processor("p")
        .process(&cmd, &CommandContext::default())
        .await;
    assert!(
        matches!(first, Attempt::Final(Outcome::Succeeded { .. })),
        "{first:?}"
    );
    rig.forget_token(key).await;
    assert!(rig.token(key).await.is_none());

    let again = rig
        .processor("q")
        .process(&cmd, &CommandContext::default())
        .await;
    let payment_id = rig.assert_charged_once(key).await;
    assert_duplicate_of(&final_outcome(again), payment_id);
    assert_eq!(
        (rig.gateway.charges(), rig.gateway.lookups()),
        (1, 0),
        "decided by Postgres alone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issued_mode_rejects_a_missing_token_unless_the_gateway_holds_its_charge() {
    let policy = TokenPolicy {
        mode: TokenMode::Issued,
        ..TokenPolicy::default()
    };
    let rig = Rig::new(SimulatorConfig::default(), policy).await;
    assert_eq!(rig.policy.mode, TokenMode::Issued);

    // Never issued, never charged: token_missing, nothing written anywhere.
    let cmd = command("never-issued", 800, "pm_card_visa");
    let outcome = rig
        .processor("p")
        .process(&cmd, &CommandContext::default())
        .await;
    assert!(
        matches!(
            outcome,
            Attempt::Final(Outcome::Rejected {
                kind: RejectionKind::TokenMissing,
                ..
            })
        ),
        "{outcome:?}"
    );
    assert!(rig.ledger_for("never-issued").is_empty());
    assert!(rig.rows("never-issued").await.is_empty());
    assert!(
        rig.token("never-issued").await.is_none(),
        "no token was created"
    );

    // Never issued (or expired), but an earlier attempt charged and crashed before
    // recording: the charge is recorded, not repeated.
    let cmd = command("charged-before", 800, "pm_card_visa");
    let earlier = rig
        .gateway
        .charge(&cmd.idempotency_key, &cmd.charge_request(), &NoLease)
        .await
        .unwrap();
    let charges_before = rig.gateway.charges();
    let outcome = rig
        .processor("p")
        .process(&cmd, &CommandContext::default())
        .await;
    let Attempt::Final(Outcome::Succeeded {
        payment_id,
        transaction_id,
    }) = outcome
    else {
        panic!("{outcome:?}")
    };
    assert_eq!(transaction_id, earlier.transaction_id);
    let ledger = rig.ledger_for("charged-before");
    assert_eq!(
        (ledger.len(), ledger[0].attempts),
        (1, 1),
        "not charged again"
    );
    assert_eq!(rig.gateway.charges(), charges_before, "no POST");
    let rows = rig.rows("charged-before").await;
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].0, rows[0].1.as_str()), (payment_id, "succeeded"));
    assert_eq!(rows[0].2.as_deref(), Some(earlier.transaction_id.as_str()));
    let again = rig
        .processor("p")
        .process(&cmd, &CommandContext::default())
        .await;
    assert_duplicate_of(&final_outcome(again), payment_id);

    // The gateway holds a charge under the key, made for another request (another
    // amount): it is never booked as this command's payment, nor taken for a reused
    // key: the charge no row will record is flagged (`gateway_charge_mismatch`).
    let earlier_cmd = command("charged-otherwise", 800, "pm_card_visa");
    rig.gateway
        .charge(
            &earlier_cmd.idempotency_key,
            &earlier_cmd.charge_request(),
            &NoLease,
        )
        .await
        .unwrap();
    let charges_before = rig.gateway.charges();
    let cmd = command("charged-otherwise", 900, "pm_card_visa");
    let outcome = rig
        .processor("p")
        .process(&cmd, &CommandContext::default())
        .await;
    assert!(
        matches!(
            &outcome,
            Attempt::Unbooked(Outcome::Rejected {
                kind: RejectionKind::Internal,
                reason,
            }) if reason.starts_with("gateway_charge_mismatch")
        ),
        "{outcome:?}"
    );
    assert_eq!(rig.gateway.charges(), charges_before, "no POST");
    assert!(
        rig.rows("charged-otherwise").await.is_empty(),
        "the other request's charge is not recorded as this payment"
    );

    // An issued token is charged the ordinary way.
    let cmd = command("issued-1", 800, "pm_card_visa");
    rig.store
        .issue(&cmd.idempotency_key, Duration::from_secs(60))
        .await
        .unwrap();
    let outcome = rig
        .processor("p")
        .process(&cmd, &CommandContext::default())
        .await;
    assert!(
        matches!(outcome, Attempt::Final(Outcome::Succeeded { .. })),
        "{outcome:?}"
    );
    rig.assert_charged_once("issued-1").await;
}
