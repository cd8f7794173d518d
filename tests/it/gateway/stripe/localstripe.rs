//! The Stripe adapter in process against localstripe: a payment succeeds and one is
//! declined, each with exactly one PaymentIntent made, recorded and answered; a
//! replay charges nothing; an amount Stripe cannot express is refused before
//! anything is sent.

use payment_worker::payment::{Outcome, RejectionKind};
use payment_worker_devtools::LocalStripe;

use crate::support::helpers::{assert_duplicate_of, unique};
use crate::support::stripe::{command, intents_for, localstripe_intents, until_final, StripeRig};

async fn rig() -> (LocalStripe, StripeRig) {
    StripeRig::localstripe().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_succeeds_and_one_is_declined_each_with_one_payment_intent() {
    let (localstripe, rig) = rig().await;
    let processor = rig.processor(rig.gateway());

    let paid = unique("ls-paid");
    let outcome = until_final(&processor, &command(&paid, 1999, "USD", "pm_card_visa")).await;
    let Outcome::Succeeded {
        payment_id,
        transaction_id,
    } = outcome.clone()
    else {
        panic!("expected a success: {outcome:?}");
    };
    let intents = localstripe_intents(&localstripe.url()).await;
    let mine: Vec<_> = intents
        .iter()
        .filter(|pi| pi["metadata"]["idempotency_key"] == paid.as_str())
        .collect();
    assert_eq!(mine.len(), 1, "one PaymentIntent: {mine:?}");
    let pi = mine[0];
    assert_eq!(pi["id"], transaction_id.as_str());
    assert_eq!(pi["status"], "succeeded");
    assert_eq!(
        (pi["amount"].as_i64(), pi["currency"].as_str()),
        (Some(1999), Some("usd"))
    );
    assert_eq!(
        pi["metadata"]["payment_id"],
        payment_id.to_string().as_str()
    );
    assert_eq!(pi["capture_method"], "automatic");
    let rows = rig.rows(&paid).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].1.as_str(), rows[0].2.as_deref()),
        ("succeeded", Some(transaction_id.as_str()))
    );
    assert_eq!(
        rig.records(&paid).await,
        [(1, Some(transaction_id.clone()), 1)],
        "one create and one confirm, recorded"
    );

    // localstripe declines only this canned method (its
    // pm_card_visa_chargeDeclined declines at attach time, never on a charge).
    let refused = unique("ls-declined");
    let outcome = until_final(
        &processor,
        &command(&refused, 500, "EUR", "pm_card_chargeCustomerFail"),
    )
    .await;
    let Outcome::Declined { transaction_id, .. } = outcome.clone() else {
        panic!("expected a decline: {outcome:?}");
    };
    let rows = rig.rows(&refused).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].1, "declined");
    assert_eq!(rows[0].2.as_deref(), Some(transaction_id.as_str()));
    assert_eq!(
        rows[0].3.as_deref(),
        Some("declined by gateway: card_declined"),
        "the decline's code is kept"
    );
    // Cancelled once the answer was recorded: nothing can confirm it later.
    assert_eq!(
        intents_for(&localstripe.url(), &refused).await,
        [(transaction_id.clone(), "canceled".to_owned())]
    );

    // Delivered again: answered from the rows, nothing made or confirmed.
    let before = localstripe_intents(&localstripe.url()).await.len();
    for again in [
        command(&paid, 1999, "USD", "pm_card_visa"),
        command(&refused, 500, "EUR", "pm_card_chargeCustomerFail"),
    ] {
        let outcome = until_final(&processor, &again).await;
        let id = rig.rows(again.idempotency_key.as_str()).await[0].0;
        assert_duplicate_of(&outcome, id);
    }
    assert_eq!(localstripe_intents(&localstripe.url()).await.len(), before);
    assert_eq!(rig.records(&paid).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amounts_go_in_stripes_unit_and_one_it_cannot_express_is_refused_before_anything_is_sent() {
    let (localstripe, rig) = rig().await;
    let processor = rig.processor(rig.gateway());

    // ISK has no minor unit; Stripe takes it with two decimals of 00.
    let isk = unique("ls-isk");
    let outcome = until_final(&processor, &command(&isk, 5, "ISK", "pm_card_visa")).await;
    assert!(matches!(outcome, Outcome::Succeeded { .. }), "{outcome:?}");
    let sent = localstripe_intents(&localstripe.url())
        .await
        .into_iter()
        .find(|pi| pi["metadata"]["idempotency_key"] == isk.as_str())
        .unwrap();
    assert_eq!(
        (sent["amount"].as_i64(), sent["currency"].as_str()),
        (Some(500), Some("isk"))
    );
    // The ledger reads it back in minor units, so the books match the row.
    let ledger = rig.gateway().ledger().await.unwrap();
    let entry = ledger.iter().find(|e| e.idempotency_key == isk).unwrap();
    assert_eq!((entry.amount_minor, entry.currency.as_str()), (5, "ISK"));

    // KWD in fils: Stripe's last digit must be 0.
    let kwd = unique("ls-kwd");
    let outcome = until_final(&processor, &command(&kwd, 1235, "KWD", "pm_card_visa")).await;
    match &outcome {
        Outcome::Rejected {
            kind: RejectionKind::Invalid,
            reason,
        } => assert!(reason.starts_with("amount_not_representable:"), "{reason}"),
        other => panic!("expected invalid: {other:?}"),
    }
    assert!(
        intents_for(&localstripe.url(), &kwd).await.is_empty(),
        "nothing sent"
    );
    assert!(rig.records(&kwd).await.is_empty());
    assert!(rig.rows(&kwd).await.is_empty());
    let token = rig
        .tokens
        .show(&payment_worker::token::IdempotencyKey::try_from(kwd.as_str()).unwrap())
        .await
        .unwrap();
    assert!(token.is_none(), "its token was never touched: {token:?}");
}
