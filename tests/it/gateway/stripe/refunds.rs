//! Refunds through the Stripe adapter against localstripe (which ignores
//! `Idempotency-Key`, so only the adapter's look-up before each POST keeps a
//! repeated refund from refunding twice): a refund of a succeeded PaymentIntent
//! under a key, the same key again refunding nothing more, two partial refunds,
//! each found by its key and listed for audit; a lease that fails sends nothing.

use payment_worker::gateway::{ChargeStatus, GatewayError, LeaseGuard, LeaseLoss, RefundRequest};
use payment_worker::payment::Outcome;
use payment_worker::token::IdempotencyKey;
use payment_worker_devtools::LocalStripe;
use serde_json::Value;

use crate::support::helpers::{unique, NoLease};
use crate::support::stripe::{command, localstripe_list, until_final, StripeRig};

async fn rig() -> (LocalStripe, StripeRig) {
    StripeRig::localstripe().await
}

/// A succeeded PaymentIntent of `amount` USD, paid through the processor.
async fn paid(rig: &StripeRig, amount: i64) -> String {
    let processor = rig.processor(rig.gateway());
    let key = unique("rf-paid");
    match until_final(&processor, &command(&key, amount, "USD", "pm_card_visa")).await {
        Outcome::Succeeded { transaction_id, .. } => transaction_id,
        other => panic!("expected a success: {other:?}"),
    }
}

/// localstripe's refunds of `intent` (raw JSON), asked directly.
async fn refunds_at(url: &str, intent: &str) -> Vec<Value> {
    localstripe_list(
        url,
        &format!("/v1/refunds?payment_intent={intent}&limit=100"),
    )
    .await
}

fn refund(intent: &str, amount: i64) -> RefundRequest {
    RefundRequest {
        payment_transaction_id: intent.to_owned(),
        amount_minor: amount,
        currency: "USD".into(),
        refund_id: Some(uuid::Uuid::new_v4()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_refunds_each_made_once_found_by_key_and_listed() {
    let (localstripe, rig) = rig().await;
    let gateway = rig.gateway();
    let intent = paid(&rig, 1999).await;

    let first_key = IdempotencyKey::try_from(unique("rf-a")).unwrap();
    let first = refund(&intent, 500);
    let answer = gateway.refund(&first_key, &first, &NoLease).await.unwrap();
    assert_eq!(answer.status, ChargeStatus::Approved);
    assert!(answer.transaction_id.starts_with("re_"), "{answer:?}");
    // The same key again: found by the look-up, nothing sent.
    let again = gateway.refund(&first_key, &first, &NoLease).await.unwrap();
    assert_eq!(again, answer);
    let at_stripe = refunds_at(&localstripe.url(), &intent).await;
    assert_eq!(at_stripe.len(), 1, "{at_stripe:?}");
    assert_eq!(at_stripe[0]["amount"], 500);
    assert_eq!(
        at_stripe[0]["metadata"]["idempotency_key"],
        first_key.as_str()
    );
    assert_eq!(
        at_stripe[0]["metadata"]["refund_id"],
        first.refund_id.unwrap().to_string().as_str()
    );

    // The same key for another amount is a reused key, not a second refund.
    let reused = gateway
        .refund(&first_key, &refund(&intent, 501), &NoLease)
        .await;
    assert!(
        matches!(reused, Err(GatewayError::Rejected { status: 422, .. })),
        "{reused:?}"
    );

    let second_key = IdempotencyKey::try_from(unique("rf-b")).unwrap();
    let second = refund(&intent, 700);
    let other = gateway
        .refund(&second_key, &second, &NoLease)
        .await
        .unwrap();
    assert_eq!(other.status, ChargeStatus::Approved);
    assert_ne!(other.transaction_id, answer.transaction_id);
    assert_eq!(refunds_at(&localstripe.url(), &intent).await.len(), 2);

    let found = gateway
        .lookup_refund(&first_key, &first)
        .await
        .unwrap()
        .expect("found by its key");
    assert!(found.matches(&first), "{found:?}");
    assert_eq!(found.transaction_id, answer.transaction_id);
    assert_eq!(found.status, ChargeStatus::Approved);
    let found = gateway.lookup_refund(&second_key, &second).await.unwrap();
    assert_eq!(found.map(|e| e.amount_minor), Some(700));
    let nobody = IdempotencyKey::try_from(unique("rf-none")).unwrap();
    assert_eq!(gateway.lookup_refund(&nobody, &first).await.unwrap(), None);

    let mut listed: Vec<_> = gateway
        .refunds()
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.idempotency_key, e.payment_transaction_id, e.amount_minor))
        .collect();
    listed.sort();
    let mut expected = vec![
        (first_key.as_str().to_owned(), intent.clone(), 500),
        (second_key.as_str().to_owned(), intent.clone(), 700),
    ];
    expected.sort();
    assert_eq!(listed, expected);
}

struct LostLease;

#[async_trait::async_trait]
impl LeaseGuard for LostLease {
    async fn check(&self) -> Result<(), LeaseLoss> {
        Err(LeaseLoss::Lost)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_fails_or_a_refund_stripe_would_misread_sends_nothing() {
    let (localstripe, rig) = rig().await;
    let gateway = rig.gateway();
    let intent = paid(&rig, 1000).await;
    let key = IdempotencyKey::try_from(unique("rf-lost")).unwrap();
    let lost = gateway
        .refund(&key, &refund(&intent, 100), &LostLease)
        .await;
    assert!(
        matches!(lost, Err(GatewayError::LeaseNotHeld(LeaseLoss::Lost))),
        "{lost:?}"
    );
    assert!(refunds_at(&localstripe.url(), &intent).await.is_empty());
    let bad = gateway
        .refund(&key, &refund("ch_123/../x", 100), &NoLease)
        .await;
    assert!(matches!(bad, Err(GatewayError::Rejected { .. })), "{bad:?}");
    // Stripe takes no currency on a refund: another one than the charge's would
    // be refunded in the charge's unit, so it is refused before anything is sent.
    let euros = RefundRequest {
        currency: "EUR".into(),
        ..refund(&intent, 100)
    };
    let mismatch = gateway.refund(&key, &euros, &NoLease).await;
    assert!(
        matches!(&mismatch, Err(GatewayError::Rejected { reason, .. }) if reason.starts_with("currency_mismatch")),
        "{mismatch:?}"
    );
    let missing = gateway
        .refund(&key, &refund("pi_nothing", 100), &NoLease)
        .await;
    assert!(
        matches!(&missing, Err(GatewayError::Rejected { reason, .. }) if reason.starts_with("charge_not_found")),
        "{missing:?}"
    );
    assert!(refunds_at(&localstripe.url(), &intent).await.is_empty());
}
