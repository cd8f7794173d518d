//! The Stripe adapter against a scripted Stripe-like server, for what localstripe
//! cannot do: answers lost after the work was done, 500s replayed for the same
//! `Idempotency-Key`, declines with a `decline_code`, accounts per API key.

use std::time::Duration;

use payment_worker::configuration::{StripeCompat, DEFAULT_STRIPE_API_VERSION};
use payment_worker::payment::{Attempt, CommandContext, Outcome};

use crate::support::helpers::{http, unique};
use crate::support::scripted_stripe::{Scripted, ScriptedStripe};
use crate::support::stripe::{command, until_final, StripeRig};

const KEY_A: &str = "sk_test_account_a";
const KEY_B: &str = "sk_test_account_b";

async fn rig() -> (ScriptedStripe, StripeRig) {
    let server = ScriptedStripe::start(&[(KEY_A, "acct_a"), (KEY_B, "acct_b")]).await;
    let rig = StripeRig::new(&server.url(), StripeCompat::Stripe, Duration::from_secs(1)).await;
    (server, rig)
}

fn keys(key: &str, suffixes: &[&str]) -> Vec<String> {
    suffixes.iter().map(|s| format!("{key}:{s}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirm_answered_500_after_charging_is_booked_from_the_look_up_never_sent_again() {
    let (server, rig) = rig().await;
    let processor = rig.processor(std::sync::Arc::new(rig.gateway_with_key(KEY_A)));
    let key = unique("st-500-after");
    server.script_confirms(&key, &[Scripted::ServerErrorAfterWork]);

    let outcome = until_final(&processor, &command(&key, 1999, "USD", "pm_card_visa")).await;
    let Outcome::Succeeded { transaction_id, .. } = outcome.clone() else {
        panic!("expected a success: {outcome:?}");
    };
    assert_eq!(server.charges(&key), 1, "charged once");
    assert_eq!(
        server.intents(&key),
        [(transaction_id.clone(), "succeeded".to_owned())]
    );
    assert_eq!(
        server.keys_seen(&key),
        keys(&key, &["create:1", "confirm:1"]),
        "the confirm went out once; the look-up, not a retry, settled it"
    );
    assert!(server.retrieves() >= 1, "the PaymentIntent was looked up");
    // Every request pins the API version; the confirm is off session (nobody is
    // there to authenticate a payment taken from a queue).
    let received = server.received(&key);
    assert!(
        received
            .iter()
            .all(|r| r.stripe_version.as_deref() == Some(DEFAULT_STRIPE_API_VERSION)),
        "{received:?}"
    );
    assert_eq!(
        received
            .iter()
            .map(|r| r.off_session.as_deref())
            .collect::<Vec<_>>(),
        [None, Some("true")],
        "the create carries no off_session; the confirm carries off_session=true"
    );
    let rows = rig.rows(&key).await;
    assert_eq!(
        (rows.len(), rows[0].1.as_str(), rows[0].2.as_deref()),
        (1, "succeeded", Some(transaction_id.as_str()))
    );

    // Why a same-key retry could never have settled it: the server still answers
    // that key with its first answer, the 500, although the PaymentIntent succeeded.
    let replay = http()
        .post(format!(
            "{}/v1/payment_intents/{transaction_id}/confirm",
            server.url()
        ))
        .bearer_auth(KEY_A)
        .header("Idempotency-Key", format!("{key}:confirm:1"))
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status().as_u16(), 500);
    assert_eq!(
        replay
            .headers()
            .get("idempotent-replayed")
            .and_then(|v| v.to_str().ok()),
        Some("true")
    );
    assert_eq!(server.charges(&key), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirm_answered_500_before_charging_is_confirmed_again_under_a_new_key_only() {
    let (server, rig) = rig().await;
    let processor = rig.processor(std::sync::Arc::new(rig.gateway_with_key(KEY_A)));
    let key = unique("st-500-before");
    server.script_confirms(&key, &[Scripted::ServerErrorBeforeWork]);

    let outcome = until_final(&processor, &command(&key, 700, "EUR", "pm_card_visa")).await;
    assert!(matches!(outcome, Outcome::Succeeded { .. }), "{outcome:?}");
    assert_eq!(server.charges(&key), 1);
    assert_eq!(
        server.intents(&key).len(),
        1,
        "the same PaymentIntent, confirmed again"
    );
    assert_eq!(
        server.keys_seen(&key),
        keys(&key, &["create:1", "confirm:1", "confirm:2"])
    );
    assert_eq!(rig.records(&key).await[0].2, 2, "both confirms recorded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_answered_500_is_found_by_listing_or_made_again_and_confirmed_once() {
    let (server, rig) = rig().await;
    let processor = rig.processor(std::sync::Arc::new(rig.gateway_with_key(KEY_A)));

    // Made, then answered 500: the next attempt lists the window and finds it.
    let made = unique("st-create-made");
    server.script_creates(&made, &[Scripted::ServerErrorAfterWork]);
    let outcome = until_final(&processor, &command(&made, 100, "USD", "pm_card_visa")).await;
    assert!(matches!(outcome, Outcome::Succeeded { .. }), "{outcome:?}");
    assert!(server.lists() >= 1, "looked for by listing");
    assert_eq!(server.intents(&made).len(), 1, "found, not made again");
    assert_eq!(
        server.keys_seen(&made),
        keys(&made, &["create:1", "confirm:1"])
    );
    assert_eq!(server.charges(&made), 1);

    // Refused with 500 before anything was made: a new create, under a new key.
    let lost = unique("st-create-lost");
    server.script_creates(&lost, &[Scripted::ServerErrorBeforeWork]);
    let outcome = until_final(&processor, &command(&lost, 100, "USD", "pm_card_visa")).await;
    assert!(matches!(outcome, Outcome::Succeeded { .. }), "{outcome:?}");
    assert_eq!(server.intents(&lost).len(), 1);
    assert_eq!(
        server.keys_seen(&lost),
        keys(&lost, &["create:1", "create:2", "confirm:1"])
    );
    assert_eq!(server.charges(&lost), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decline_keeps_its_decline_code_and_its_payment_intent_is_cancelled() {
    let (server, rig) = rig().await;
    let processor = rig.processor(std::sync::Arc::new(rig.gateway_with_key(KEY_A)));
    let key = unique("st-declined");
    server.script_confirms(&key, &[Scripted::Decline("insufficient_funds")]);

    let outcome = until_final(&processor, &command(&key, 2500, "GBP", "pm_card_visa")).await;
    let Outcome::Declined { transaction_id, .. } = outcome.clone() else {
        panic!("expected a decline: {outcome:?}");
    };
    assert_eq!(
        rig.rows(&key).await[0].3.as_deref(),
        Some("declined by gateway: insufficient_funds")
    );
    assert_eq!(
        server.intents(&key),
        [(transaction_id, "canceled".to_owned())]
    );
    assert_eq!(server.charges(&key), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_is_continued_only_under_the_account_it_started_with() {
    let (server, rig) = rig().await;
    let under_a = rig.processor(std::sync::Arc::new(rig.gateway_with_key(KEY_A)));
    let under_b = rig.processor(std::sync::Arc::new(rig.gateway_with_key(KEY_B)));
    let key = unique("st-account");
    let order = command(&key, 4200, "USD", "pm_card_visa");
    // Started under account A and left unknown: its confirm answered 500.
    server.script_confirms(&key, &[Scripted::ServerErrorBeforeWork]);
    let first = under_a.process(&order, &CommandContext::default()).await;
    assert!(matches!(first, Attempt::Retry { .. }), "{first:?}");

    // A key for account B cannot see A's PaymentIntent: it must neither make one
    // of its own nor decide anything.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let refused = until_retry(&under_b, &order).await;
    assert!(refused.contains("acct_a"), "{refused}");
    assert_eq!(
        server.intents(&key).len(),
        1,
        "nothing made under account B"
    );
    assert_eq!(
        server.keys_seen(&key),
        keys(&key, &["create:1", "confirm:1"])
    );

    // Back under A, it is finished: one charge.
    let outcome = until_final(&under_a, &order).await;
    assert!(matches!(outcome, Outcome::Succeeded { .. }), "{outcome:?}");
    assert_eq!(server.charges(&key), 1);
}

/// The first attempt that reaches the gateway's refusal (waiting out the lease of
/// an earlier one): its reason.
async fn until_retry(
    processor: &payment_worker::payment::Processor,
    order: &payment_worker::payment::PaymentCommand,
) -> String {
    for _ in 0..50 {
        match processor.process(order, &CommandContext::default()).await {
            Attempt::Retry { reason, .. } if reason.contains("account") => return reason,
            Attempt::Retry { after, .. } => {
                tokio::time::sleep(after.max(Duration::from_millis(100))).await
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    panic!("never refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_retried_under_new_keys_or_final_as_stripe_says_and_charge_once() {
    let (server, rig) = rig().await;
    let processor = rig.processor(std::sync::Arc::new(rig.gateway_with_key(KEY_A)));
    let pay = |key: &str| command(key, 900, "USD", "pm_card_visa");

    // A confirm answered 409 (another request on the PaymentIntent) or 400
    // idempotency_error: unknown, looked up, confirmed again under a new key.
    for (tag, status, kind) in [
        ("st-409", 409, "invalid_request_error"),
        ("st-idem", 400, "idempotency_error"),
    ] {
        let key = unique(tag);
        server.script_confirms(&key, &[Scripted::Refuse(status, kind, None)]);
        let outcome = until_final(&processor, &pay(&key)).await;
        assert!(
            matches!(outcome, Outcome::Succeeded { .. }),
            "{tag}: {outcome:?}"
        );
        assert_eq!(
            server.keys_seen(&key),
            keys(&key, &["create:1", "confirm:1", "confirm:2"]),
            "{tag}"
        );
        assert_eq!(server.charges(&key), 1, "{tag}");
    }

    // A confirm refused with 400 that Stripe says to retry (a lock it could not
    // take, say): nothing was charged and the PaymentIntent still awaits its
    // confirm, so it is confirmed again under a new key, never cancelled.
    let key = unique("st-confirm-400-retry");
    server.script_confirms(
        &key,
        &[Scripted::Refuse(400, "invalid_request_error", Some(true))],
    );
    let outcome = until_final(&processor, &pay(&key)).await;
    assert!(matches!(outcome, Outcome::Succeeded { .. }), "{outcome:?}");
    assert_eq!(
        server.keys_seen(&key),
        keys(&key, &["create:1", "confirm:1", "confirm:2"])
    );
    assert_eq!(server.charges(&key), 1);
    assert_eq!(
        server.intents(&key).len(),
        1,
        "one PaymentIntent, not cancelled"
    );

    // The same refusal without that advice is final: invalid, and the PaymentIntent
    // it leaves is cancelled rather than left to linger as an orphan.
    let key = unique("st-confirm-400-final");
    server.script_confirms(
        &key,
        &[Scripted::Refuse(400, "invalid_request_error", Some(false))],
    );
    let outcome = until_final(&processor, &pay(&key)).await;
    assert!(
        matches!(
            &outcome,
            Outcome::Rejected {
                kind: payment_worker::payment::RejectionKind::Invalid,
                ..
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(
        server.keys_seen(&key),
        keys(&key, &["create:1", "confirm:1"])
    );
    assert_eq!(server.charges(&key), 0);
    assert_eq!(
        server
            .intents(&key)
            .iter()
            .map(|(_, s)| s.as_str())
            .collect::<Vec<_>>(),
        ["canceled"]
    );

    // A create answered 429, or 400 that Stripe says to retry: nothing was made;
    // a new create under a new key.
    for (tag, status, retry) in [("st-429", 429, None), ("st-400-retry", 400, Some(true))] {
        let key = unique(tag);
        server.script_creates(
            &key,
            &[Scripted::Refuse(status, "invalid_request_error", retry)],
        );
        let outcome = until_final(&processor, &pay(&key)).await;
        assert!(
            matches!(outcome, Outcome::Succeeded { .. }),
            "{tag}: {outcome:?}"
        );
        assert_eq!(
            server.keys_seen(&key),
            keys(&key, &["create:1", "create:2", "confirm:1"]),
            "{tag}"
        );
        assert_eq!(server.charges(&key), 1, "{tag}");
    }

    // A create refused with 400 and Stripe-Should-Retry: false is final: invalid.
    let key = unique("st-400-final");
    server.script_creates(
        &key,
        &[Scripted::Refuse(400, "invalid_request_error", Some(false))],
    );
    let outcome = until_final(&processor, &pay(&key)).await;
    match &outcome {
        Outcome::Rejected {
            kind: payment_worker::payment::RejectionKind::Invalid,
            reason,
        } => assert!(reason.starts_with("gateway_rejected: HTTP 400"), "{reason}"),
        other => panic!("expected invalid: {other:?}"),
    }
    assert_eq!(server.keys_seen(&key), keys(&key, &["create:1"]));
    assert!(server.intents(&key).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirm_answered_with_a_proxy_page_is_looked_up_never_taken_for_a_refusal() {
    let (server, rig) = rig().await;
    let processor = rig.processor(std::sync::Arc::new(rig.gateway_with_key(KEY_A)));
    // A 400 or 404 whose body is no Stripe error came from something in between
    // (a proxy, a router): whether Stripe got the confirm is unknown. The
    // PaymentIntent is looked up, still awaits its confirm, and is confirmed again
    // under a new key, never cancelled nor the command refused.
    for status in [404, 400] {
        let key = unique(&format!("st-proxy-{status}"));
        server.script_confirms(&key, &[Scripted::ProxyPage(status)]);
        let outcome = until_final(&processor, &command(&key, 1500, "USD", "pm_card_visa")).await;
        assert!(
            matches!(outcome, Outcome::Succeeded { .. }),
            "{status}: {outcome:?}"
        );
        assert_eq!(
            server.keys_seen(&key),
            keys(&key, &["create:1", "confirm:1", "confirm:2"]),
            "{status}"
        );
        assert_eq!(server.charges(&key), 1, "{status}");
        assert_eq!(
            server
                .intents(&key)
                .iter()
                .map(|(_, s)| s.as_str())
                .collect::<Vec<_>>(),
            ["succeeded"],
            "{status}: one PaymentIntent, not cancelled"
        );
        let rows = rig.rows(&key).await;
        assert_eq!(
            (rows.len(), rows[0].1.as_str()),
            (1, "succeeded"),
            "{status}"
        );
    }
}
