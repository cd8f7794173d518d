//! The operator's tools against a live group's topics: `dlq redrive` puts dead
//! letters back once, never a masked or dropped one; `replay` refuses while a worker
//! is alive.

use std::time::Duration;

use payment_worker::operator;
use payment_worker::worker;
use payment_worker_devtools::SimulatorConfig;
use rdkafka::message::Message;

use crate::support::helpers::{quick_worker_settings, read_topic, stop_all, Stack};

use super::poison::{header_value as header, start_run};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dead_letters_are_redriven_once_with_their_original_key_value_and_headers() {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let producer: FutureProducer = worker::producer_config(&stack.settings).create().unwrap();
    let bad = br#"{"idempotency_key":"redrive-1","amount_minor":5}"#.to_vec();
    producer
        .send(
            FutureRecord::to(&stack.settings.commands_topic)
                .key("redrive-1")
                .payload(&bad)
                .headers(OwnedHeaders::new().insert(Header {
                    key: "tenant",
                    value: Some("acme"),
                })),
            rdkafka::util::Timeout::After(Duration::from_secs(10)),
        )
        .await
        .unwrap();
    // Refused for its card number: its dead letter carries the number masked, a
    // value that would pass the rules the original broke; it must never go back.
    let masked = br#"{"idempotency_key":"redrive-2","account_id":"a","amount_minor":5,"currency":"EUR","payment_method":"4111111111111111"}"#;
    producer
        .send(
            FutureRecord::to(&stack.settings.commands_topic)
                .key("redrive-2")
                .payload(&masked[..]),
            rdkafka::util::Timeout::After(Duration::from_secs(10)),
        )
        .await
        .unwrap();
    let worker = stack.start_worker("d", &quick_worker_settings());
    stack.wait_for_results(2, Duration::from_secs(30)).await;
    stop_all(vec![worker]).await;
    let letters = stack.dead_letters().await;
    assert_eq!(letters.len(), 2);
    // Both commands run at once: their dead letters land in either order.
    let masked_letter = letters
        .iter()
        .find(|l| l.key() == Some(&b"redrive-2"[..]))
        .expect("the masked command's dead letter");
    assert_eq!(
        header(masked_letter, "x-payload-redacted").as_deref(),
        Some("card_number")
    );

    let redrive = || operator::RedriveArgs {
        kafka: stack.settings.clone(),
        kind: None,
        max: None,
    };
    operator::redrive(redrive()).await.unwrap();
    let commands = read_topic(
        &stack.settings,
        &stack.settings.commands_topic,
        "read_committed",
    )
    .await;
    assert_eq!(
        commands.len(),
        3,
        "the first dead letter is back on the commands topic, the masked one is not"
    );
    let again = &commands[2];
    assert_eq!(again.key(), Some(&b"redrive-1"[..]));
    assert_eq!(again.payload(), Some(&bad[..]));
    assert_eq!(
        header(again, "tenant").as_deref(),
        Some("acme"),
        "original headers kept"
    );
    assert_eq!(
        header(again, "x-error-kind"),
        None,
        "dead-letter headers removed"
    );

    // Progress is remembered: a second redrive sends nothing.
    operator::redrive(redrive()).await.unwrap();
    let commands = read_topic(
        &stack.settings,
        &stack.settings.commands_topic,
        "read_committed",
    )
    .await;
    assert_eq!(commands.len(), 3);
    assert!(
        !commands.iter().any(|c| c
            .payload()
            .is_some_and(|v| String::from_utf8_lossy(v).contains("**"))),
        "no masked value was ever sent as a command"
    );

    // A kind that does not exist is refused, instead of matching nothing and
    // passing every dead letter over for good.
    let mistyped = <payment_worker::cli::Cli as clap::Parser>::try_parse_from([
        "payment-worker",
        "dlq",
        "redrive",
        "--kind",
        "retries-exhausted",
    ]);
    assert!(mistyped.is_err(), "{mistyped:?}");
    let known = <payment_worker::cli::Cli as clap::Parser>::try_parse_from([
        "payment-worker",
        "dlq",
        "redrive",
        "--kind",
        "retries_exhausted",
    ]);
    assert!(known.is_ok(), "{known:?}");
}

/// A redrive whose sends start failing part-way records what it sent before it
/// stops: the next run goes on with the record that failed, and no dead letter is
/// put back twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redrive_that_fails_part_way_goes_on_where_it_stopped_and_sends_nothing_twice() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let keys: Vec<String> = (0..10).map(|i| format!("redrive-part-{i}")).collect();
    dead_letter_retries_exhausted(&stack, &keys).await;
    // Each send is acknowledged before the next starts: one produce request each.
    // The fifth is refused for good.
    let mut answers = vec![RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR; 4];
    answers.push(RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED);
    stack
        .kafka
        .cluster()
        .request_errors(RDKafkaApiKey::Produce, &answers);
    let redrive = || operator::RedriveArgs {
        kafka: stack.settings.clone(),
        kind: None,
        max: None,
    };
    let error = operator::redrive(redrive())
        .await
        .expect_err("the fifth send is refused");
    let error = format!("{error:#}");
    assert!(
        error.contains("the 4 sent before it are recorded") && error.contains("offset 4"),
        "{error}"
    );
    assert_eq!(
        redriven_keys(&stack).await,
        keys[..4],
        "sent before the failure"
    );

    operator::redrive(redrive()).await.unwrap();
    assert_eq!(
        redriven_keys(&stack).await,
        keys,
        "the second run starts with the record that failed"
    );
}

/// A backlog larger than what a redrive reads at once (1,000 per partition) goes
/// back whole, in order, once; `--max` stops a run mid-window and the next run
/// goes on from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backlog_larger_than_a_window_is_redriven_whole_in_steps_of_max() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let keys: Vec<String> = (0..2_100).map(|i| format!("redrive-big-{i:05}")).collect();
    dead_letter_retries_exhausted(&stack, &keys).await;
    let redrive = |max| operator::RedriveArgs {
        kafka: stack.settings.clone(),
        kind: None,
        max,
    };
    operator::redrive(redrive(Some(1_500))).await.unwrap();
    assert_eq!(
        redriven_keys(&stack).await,
        keys[..1_500],
        "the first 1,500"
    );
    operator::redrive(redrive(None)).await.unwrap();
    assert_eq!(redriven_keys(&stack).await, keys, "then the rest, once");
    operator::redrive(redrive(None)).await.unwrap();
    assert_eq!(
        redriven_keys(&stack).await.len(),
        keys.len(),
        "nothing left"
    );
}

/// A `retries_exhausted` dead letter of a valid command for each key, in order.
async fn dead_letter_retries_exhausted(stack: &Stack, keys: &[String]) {
    use rdkafka::message::{Header, OwnedHeaders};
    let producer = super::poison::producer(stack);
    for key in keys {
        let value = serde_json::to_vec(&super::poison::command(key)).unwrap();
        let letter = OwnedHeaders::new().insert(Header {
            key: worker::ERROR_KIND,
            value: Some("retries_exhausted"),
        });
        super::poison::send(
            &producer,
            &stack.settings.dlq_topic,
            Some(key.as_bytes()),
            Some(&value),
            letter,
        )
        .await;
    }
}

/// The keys on the commands topic, in order.
async fn redriven_keys(stack: &Stack) -> Vec<String> {
    let commands = read_topic(
        &stack.settings,
        &stack.settings.commands_topic,
        "read_committed",
    )
    .await;
    commands
        .iter()
        .map(|c| String::from_utf8_lossy(c.key().unwrap_or_default()).into_owned())
        .collect()
}

/// A replay run with a live static worker's environment (its `KAFKA_GROUP_INSTANCE_ID`
/// too) finds the worker and refuses, and the worker goes on. (The replay joins as a
/// dynamic member so that a real broker does not hand it the worker's place; the mock
/// cluster does not fence by instance id, so that part is not shown here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replay_refuses_while_a_static_worker_is_alive() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let mut run = start_run(
        &stack,
        "static-worker",
        &[("KAFKA_GROUP_INSTANCE_ID", "static-1")],
    )
    .await;
    let settings = payment_worker::configuration::KafkaSettings {
        group_instance_id: Some("static-1".to_owned()),
        session_timeout: Duration::from_secs(6),
        ..stack.settings.clone()
    };
    let rewound = tokio::task::spawn_blocking(move || operator::rewind_group(&settings, None))
        .await
        .unwrap();
    let refused = rewound.expect_err("the replay found the live worker");
    assert!(
        refused.to_string().contains("stop the workers first"),
        "{refused:#}"
    );
    run.assert_running();
    run.stop(Duration::from_secs(20)).await;
}
