//! Finding a create whose answer was lost, by listing the PaymentIntents made
//! around its recorded time: a listing is not repeated for what it already
//! covered, and one that stops before covering its window says so.

use std::sync::Arc;
use std::time::Duration;

use payment_worker::configuration::StripeCompat;
use payment_worker::gateway::{PaymentGateway, StripeGateway};
use payment_worker::payment::{Attempt, CommandContext, Outcome};
use payment_worker::token::IdempotencyKey;

use tracing::instrument::WithSubscriber;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer;

use crate::support::helpers::unique;
use crate::support::scripted_stripe::{Scripted, ScriptedStripe};
use crate::support::stripe::{command, until_final, StripeRig};

const KEY: &str = "sk_test_listing";
const ACCOUNT: &str = "acct_listing";

async fn rig() -> (ScriptedStripe, StripeRig) {
    let server = ScriptedStripe::start(&[(KEY, ACCOUNT)]).await;
    let rig = StripeRig::new(&server.url(), StripeCompat::Stripe, Duration::from_secs(1)).await;
    (server, rig)
}

fn ikey(key: &str) -> IdempotencyKey {
    IdempotencyKey::try_from(key).unwrap()
}

/// The log lines of what runs under [`Captured::errors`], as text.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// A subscriber writing error lines here.
    fn errors(&self) -> impl tracing::Subscriber + Send + Sync {
        let writer = self.clone();
        tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(move || writer.clone())
                .with_filter(tracing_subscriber::filter::LevelFilter::ERROR),
        )
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// A first attempt whose create Stripe answered 500 as `scripted` says: a record
/// without a PaymentIntent id, which every later look-up must look for by listing.
async fn lost_create(
    server: &ScriptedStripe,
    rig: &StripeRig,
    gateway: &Arc<StripeGateway>,
    tag: &str,
    scripted: Scripted,
) -> String {
    let key = unique(tag);
    server.script_creates(&key, &[scripted]);
    let processor = rig.processor(Arc::clone(gateway) as Arc<dyn PaymentGateway>);
    let first = processor
        .process(
            &command(&key, 2200, "USD", "pm_card_visa"),
            &CommandContext::default(),
        )
        .await;
    assert!(matches!(first, Attempt::Retry { .. }), "{first:?}");
    assert_eq!(rig.records(&key).await[0].1, None, "no id recorded");
    key
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_listed_once_is_not_listed_again() {
    let (server, rig) = rig().await;
    let gateway = Arc::new(rig.gateway_with_key(KEY));
    let key = lost_create(
        &server,
        &rig,
        &gateway,
        "st-lost-old",
        Scripted::ServerErrorBeforeWork,
    )
    .await;
    // The lost create is an hour old: its whole window is in the past, so one
    // listing that found nothing answers for good.
    sqlx::query(
        "UPDATE stripe_payment_intents SET requested_at = requested_at - interval '1 hour'
         WHERE idempotency_key = $1",
    )
    .bind(&key)
    .execute(&rig.db.pool)
    .await
    .unwrap();
    let lists = server.lists();
    for _ in 0..3 {
        assert_eq!(gateway.lookup(&ikey(&key)).await.unwrap(), None);
    }
    assert_eq!(server.lists() - lists, 1, "three look-ups, one listing");

    // The next attempt looks up (fence 2) and reads the payment's standing again:
    // neither lists; it makes a new PaymentIntent and confirms it.
    let processor = rig.processor(Arc::clone(&gateway) as Arc<dyn PaymentGateway>);
    let outcome = until_final(&processor, &command(&key, 2200, "USD", "pm_card_visa")).await;
    assert!(matches!(outcome, Outcome::Succeeded { .. }), "{outcome:?}");
    assert_eq!(server.lists() - lists, 1, "still the one listing");
    assert_eq!(
        server.keys_seen(&key),
        [
            format!("{key}:create:1"),
            format!("{key}:create:2"),
            format!("{key}:confirm:1")
        ]
    );
    assert_eq!(server.charges(&key), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_still_open_is_listed_again_only_from_where_the_last_listing_ended() {
    let (server, rig) = rig().await;
    let gateway = Arc::new(rig.gateway_with_key(KEY));
    let key = lost_create(
        &server,
        &rig,
        &gateway,
        "st-lost-fresh",
        Scripted::ServerErrorBeforeWork,
    )
    .await;
    // The window reaches minutes into the future: a PaymentIntent made later in it
    // could still show, so it is listed again, but only from where Stripe's clock
    // stood when the last listing was answered.
    let before = server.list_windows().len();
    assert_eq!(gateway.lookup(&ikey(&key)).await.unwrap(), None);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(gateway.lookup(&ikey(&key)).await.unwrap(), None);
    let windows = server.list_windows();
    let [first, second] = &windows[before..] else {
        panic!("two listings: {windows:?}");
    };
    let (Some(first_from), Some(first_to)) = *first else {
        panic!("{first:?}");
    };
    let now = chrono::Utc::now().timestamp();
    assert!(first_from < now - 300 && first_to > now + 300, "{first:?}");
    assert_eq!(second.1, Some(first_to), "the same end");
    let second_from = second.0.expect("a lower bound");
    assert!(
        second_from > first_from && second_from >= now - 3,
        "the second listing starts where the first ended: {first:?} then {second:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_stopped_by_its_page_limit_is_a_failed_look_up_not_a_none() {
    let (server, rig) = rig().await;
    let gateway = Arc::new(rig.gateway_with_key(KEY).with_list_page_limit(1));
    // Made, then answered 500: the PaymentIntent exists, its id was never recorded.
    let key = lost_create(
        &server,
        &rig,
        &gateway,
        "st-page-limit",
        Scripted::ServerErrorAfterWork,
    )
    .await;
    // 150 newer PaymentIntents of other payments push it onto the second page,
    // beyond the one page this adapter reads.
    server.crowd(ACCOUNT, 150);

    let logged = Captured::default();
    let error = gateway
        .lookup(&ikey(&key))
        .with_subscriber(logged.errors())
        .await
        .expect_err("an incomplete listing proves nothing");
    assert!(error.to_string().contains("page limit"), "{error}");
    let logged = logged.text();
    assert!(
        logged.contains("ERROR")
            && logged.contains("stopped before covering its window")
            && logged.contains("page limit of 1 pages"),
        "logged at error, with why: {logged}"
    );

    // An attempt cannot tell whether its first PaymentIntent exists: it retries,
    // and makes no second one meanwhile.
    let processor = rig.processor(Arc::clone(&gateway) as Arc<dyn PaymentGateway>);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let attempt = processor
        .process(
            &command(&key, 2200, "USD", "pm_card_visa"),
            &CommandContext::default(),
        )
        .await;
    match &attempt {
        Attempt::Retry { reason, .. } => assert!(reason.contains("page limit"), "{reason}"),
        other => panic!("expected a retry: {other:?}"),
    }
    assert_eq!(server.keys_seen(&key), [format!("{key}:create:1")]);
    assert_eq!(server.intents(&key).len(), 1);

    // With every page read, the listing finds it and the payment completes on it.
    let whole = Arc::new(rig.gateway_with_key(KEY));
    let processor = rig.processor(Arc::clone(&whole) as Arc<dyn PaymentGateway>);
    let outcome = until_final(&processor, &command(&key, 2200, "USD", "pm_card_visa")).await;
    assert!(matches!(outcome, Outcome::Succeeded { .. }), "{outcome:?}");
    assert_eq!(
        server.keys_seen(&key),
        [format!("{key}:create:1"), format!("{key}:confirm:1")]
    );
    assert_eq!(server.charges(&key), 1);
}
