//! A charge an attempt cannot see is still never forgotten: a successor that takes
//! over a killed holder's expired lease inherits that holder's unknown outcome, a
//! redriven record's `x-charge-unknown: true` is evidence on its own, and a record
//! without a Kafka key that panics after its POST is flagged like a keyed one. Each
//! ends flagged (dead letter, `unresolved_charges`, the result's `charge_unknown`)
//! or booked from a look-up, never with a blind POST. The simulator ignores
//! idempotency keys in the tests where a blind POST would hide behind them: there
//! it would show as a second charge in the ledger.

use std::time::{Duration, Instant};

use payment_worker::gateway::{HttpGateway, PaymentGateway};
use payment_worker::operator::{self, RecordKind, WorkloadRecord};
use payment_worker::payment::PaymentCommand;
use payment_worker::token::TokenPolicy;
use payment_worker::worker;
use payment_worker_devtools::SimulatorConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use super::answers::ikey;
use super::unknown_outcomes::{
    behind_a_front, charges_for, header, letter_of, record, short_budget, start_run,
    unresolved_keys,
};
use crate::support::helpers::{quick_worker_settings, stop_all, NoLease, Stack};
use crate::support::scripted_gateway::PostAnswer;
use crate::support::tokens::redis_token_key;

/// Waits until `done` holds (polling), failing after `within` with `what`.
async fn wait_until(within: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_successor_that_cannot_look_up_a_killed_holders_charge_flags_it_and_a_redrive_books_it() {
    let (stack, front) = behind_a_front(
        SimulatorConfig {
            ignore_idempotency_key: true,
            ..SimulatorConfig::default()
        },
        TokenPolicy {
            lease: Duration::from_secs(1),
            ..TokenPolicy::default()
        },
    )
    .await;
    let key = "tk-killed";
    // The holder's POST charges at once and is never answered; no look-up answers
    // until the successor has given up.
    front.script(key, &[PostAnswer::ChargeLate(Duration::ZERO)]);
    front.lookups_down(key, true);
    let mut holder = start_run(
        &stack,
        "tk-holder",
        &front.url(),
        &[("LEASE", "1s"), ("GATEWAY_TIMEOUT", "60s")],
    )
    .await;
    stack.produce(&[record(key, 7100)]).await;
    wait_until(Duration::from_secs(30), "the holder never charged", || {
        charges_for(&stack, key).len() == 1
    })
    .await;
    holder.sigkill();
    // The holder's lease runs out before the successor reserves: it takes over.
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    let successor = stack.start_worker_retrying(
        "tk-successor",
        &quick_worker_settings(),
        short_budget(Duration::from_secs(3)),
    );
    let results = stack.wait_for_results(1, Duration::from_secs(90)).await;
    stack.wait_for_commits(Duration::from_secs(30)).await;
    stop_all(vec![successor]).await;

    let result = &results[0];
    assert_eq!(result.outcome, "rejected", "{result:?}");
    assert!(
        result
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with("retries_exhausted")),
        "{result:?}"
    );
    assert!(
        result.charge_unknown,
        "the result must say the charge may exist: {result:?}"
    );
    let letters = stack.dead_letters().await;
    assert_eq!(
        header(letter_of(&letters, key), worker::CHARGE_UNKNOWN).as_deref(),
        Some("true"),
        "the holder POSTed before it was killed"
    );
    assert_eq!(unresolved_keys(&stack).await, vec![key]);
    assert_eq!(front.posts_seen(key), 1, "the successor never POSTed");

    // Later the token is gone (its life ended, or Redis lost it): a redrive starts
    // at fence 1 again, and still looks the charge up instead of charging.
    let _: () = redis::cmd("DEL")
        .arg(redis_token_key(&stack.redis.prefix, key))
        .query_async(&mut stack.redis.conn.clone())
        .await
        .unwrap();
    assert!(stack.tokens.show(&ikey(key)).await.unwrap().is_none());
    front.lookups_down(key, false);
    operator::redrive(operator::RedriveArgs {
        kafka: stack.settings.clone(),
        kind: None,
        max: None,
    })
    .await
    .unwrap();
    let booking = stack.start_worker_retrying(
        "tk-redrive",
        &quick_worker_settings(),
        short_budget(Duration::from_secs(20)),
    );
    let results = stack.wait_for_results(2, Duration::from_secs(60)).await;
    stop_all(vec![booking]).await;
    let charged = charges_for(&stack, key);
    assert_eq!(charged.len(), 1, "never charged again: {charged:?}");
    assert_eq!(results[1].outcome, "succeeded", "{results:?}");
    assert_eq!(
        results[1].gateway_transaction_id.as_deref(),
        Some(charged[0].transaction_id.as_str()),
        "the holder's charge is booked"
    );
    assert!(!results[1].charge_unknown, "{results:?}");
    assert_eq!(front.posts_seen(key), 1);
    assert!(
        unresolved_keys(&stack).await.is_empty(),
        "booked: off the list"
    );
}

/// Puts `value` on the commands topic under `key` with `x-charge-unknown: true`, as
/// `dlq redrive` puts back a dead letter whose charge is unknown.
async fn produce_flagged(stack: &Stack, key: &str, value: &str) {
    let producer: FutureProducer = worker::producer_config(&stack.settings).create().unwrap();
    producer
        .send(
            FutureRecord::to(&stack.settings.commands_topic)
                .key(key)
                .payload(value)
                .headers(OwnedHeaders::new().insert(Header {
                    key: worker::CHARGE_UNKNOWN,
                    value: Some("true"),
                })),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
}

fn command_json(key: &str, amount_minor: i64) -> String {
    serde_json::json!({
        "idempotency_key": key, "account_id": "acct_9", "amount_minor": amount_minor,
        "currency": "USD", "payment_method": "pm_card_visa",
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_flagged_charge_unknown_is_looked_up_before_any_post_and_keeps_its_flag() {
    let (stack, front) = behind_a_front(
        SimulatorConfig {
            ignore_idempotency_key: true,
            ..SimulatorConfig::default()
        },
        TokenPolicy {
            lease: Duration::from_millis(500),
            ..TokenPolicy::default()
        },
    )
    .await;
    // Both keys were charged by an earlier delivery that could record nothing: no
    // token, no row, no `unresolved_charges` entry; only the redriven record's flag.
    let ledger = HttpGateway::new(
        &stack.simulator.url(),
        Duration::from_secs(5),
        Duration::from_secs(1),
    )
    .unwrap();
    let (found, unreachable) = ("tk-flag-found", "tk-flag-down");
    for (key, amount) in [(found, 8100), (unreachable, 8200)] {
        let value = command_json(key, amount);
        let request = PaymentCommand::parse(value.as_bytes())
            .unwrap()
            .charge_request();
        ledger.charge(&ikey(key), &request, &NoLease).await.unwrap();
        produce_flagged(&stack, key, &value).await;
    }
    // A redriven record that cannot even be read: nothing settles its charge either.
    let unreadable = "tk-flag-unreadable";
    produce_flagged(
        &stack,
        unreadable,
        r#"{"idempotency_key":"tk-flag-unreadable"}"#,
    )
    .await;
    front.lookups_down(unreachable, true);
    let running = stack.start_worker_retrying(
        "tk-flagged",
        &quick_worker_settings(),
        short_budget(Duration::from_secs(3)),
    );
    let results = stack.wait_for_results(3, Duration::from_secs(60)).await;
    stack.wait_for_commits(Duration::from_secs(30)).await;
    stop_all(vec![running]).await;

    let of = |key: &str| {
        results
            .iter()
            .find(|r| r.idempotency_key.as_deref() == Some(key))
            .unwrap_or_else(|| panic!("no result for {key}: {results:?}"))
    };
    // Found by the look-up: booked, nothing POSTed.
    let booked = of(found);
    assert_eq!(booked.outcome, "succeeded", "{booked:?}");
    assert_eq!(
        booked.gateway_transaction_id.as_deref(),
        Some(charges_for(&stack, found)[0].transaction_id.as_str())
    );
    assert!(!booked.charge_unknown, "{booked:?}");
    // Look-ups down throughout: never POSTed blind, and the flag is kept.
    let kept = of(unreachable);
    assert_eq!(kept.outcome, "rejected", "{kept:?}");
    assert!(kept.charge_unknown, "{kept:?}");
    let letters = stack.dead_letters().await;
    assert_eq!(letters.len(), 2);
    for key in [unreachable, unreadable] {
        assert_eq!(
            header(letter_of(&letters, key), worker::CHARGE_UNKNOWN).as_deref(),
            Some("true"),
            "{key}"
        );
    }
    assert_eq!(unresolved_keys(&stack).await, vec![unreachable]);
    for key in [found, unreachable] {
        assert_eq!(front.posts_seen(key), 0, "{key}: POSTed without a look-up");
        assert!(front.lookups_seen(key) > 0, "{key}");
        assert_eq!(charges_for(&stack, key).len(), 1, "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_without_a_kafka_key_that_panics_after_its_post_is_flagged() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let key = "tk-unkeyed";
    let mut run = start_run(
        &stack,
        "tk-unkeyed-run",
        &stack.simulator.url(),
        &[
            ("PAYMENT_WORKER_FAULT", "panic:after_charge"),
            ("PAYMENT_WORKER_FAULT_KEY", key),
            ("LEASE", "1s"),
        ],
    )
    .await;
    let unkeyed = WorkloadRecord {
        key: None,
        ..record(key, 4600)
    };
    assert!(matches!(unkeyed.kind, RecordKind::Valid));
    stack.produce(&[unkeyed]).await;
    let results = stack.wait_for_results(1, Duration::from_secs(90)).await;
    stack.wait_for_commits(Duration::from_secs(30)).await;
    run.assert_running();
    run.stop(Duration::from_secs(20)).await;

    let result = &results[0];
    assert_eq!(result.outcome, "rejected", "{result:?}");
    assert!(result.charge_unknown, "{result:?}: {}", run.tail(30));
    let letters = stack.dead_letters().await;
    assert_eq!(letters.len(), 1);
    assert_eq!(
        header(&letters[0], worker::ERROR_KIND).as_deref(),
        Some("internal")
    );
    assert_eq!(
        header(&letters[0], worker::CHARGE_UNKNOWN).as_deref(),
        Some("true"),
        "the POST was sent before the panics"
    );
    assert_eq!(charges_for(&stack, key).len(), 1, "charged once");
    assert_eq!(unresolved_keys(&stack).await, vec![key]);
}
