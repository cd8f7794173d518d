//! The worker's own failures: a panic is contained and dead-letters its record on the
//! third, a stalled poll loop fails `/healthz` and ends the process, a database error
//! no retry can fix is final at once, and a broker that refuses the group ends the
//! worker with a fatal error.

use std::time::{Duration, Instant};

use payment_worker::payment::RejectionKind;
use payment_worker::worker;
use payment_worker_devtools::SimulatorConfig;
use rdkafka::message::{Message, OwnedHeaders};
use serde_json::json;

use crate::support::helpers::Stack;
use crate::support::procs::free_port;

use super::poison::{command, header_value, producer, send, send_command, start_run};

// ---------------------------------------------------------------------------
// Panics are contained; a dead part ends the process.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_whose_handling_panics_is_dead_lettered_internal_on_the_third_panic() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let topic = stack.settings.commands_topic.clone();
    let producer = producer(&stack);
    let mut offsets = vec![];
    for n in 0..25 {
        let key = if n == 5 {
            "p-panic".to_owned()
        } else {
            format!("p-after-{n}")
        };
        let mut record = command(&key);
        if n == 5 {
            // A field the worker ignores, carrying a card number: whatever made the
            // record panic, its dead letter must not carry that number.
            record["note"] = json!("card 4111 1111 1111 1111 on file");
        }
        let value = serde_json::to_vec(&record).unwrap();
        offsets.push(
            send(
                &producer,
                &topic,
                Some(key.as_bytes()),
                Some(&value),
                OwnedHeaders::new(),
            )
            .await,
        );
    }
    let health = free_port();
    let mut run = start_run(
        &stack,
        "panic-run",
        &[
            ("PAYMENT_WORKER_FAULT", "panic:after_reserve"),
            ("PAYMENT_WORKER_FAULT_KEY", "p-panic"),
            ("LEASE", "1s"),
            ("HEALTH_LISTEN", &format!("127.0.0.1:{health}")),
        ],
    )
    .await;
    let results = stack.wait_for_results(25, Duration::from_secs(60)).await;
    run.assert_running();
    let panicked = results
        .iter()
        .find(|r| r.source.offset == offsets[5])
        .unwrap();
    assert_eq!(panicked.outcome, "rejected");
    // Not decoded again, but named by the record's key.
    assert_eq!(panicked.idempotency_key.as_deref(), Some("p-panic"));
    assert!(
        panicked
            .reason
            .as_deref()
            .unwrap_or("")
            .starts_with("internal: panicked"),
        "{panicked:?}"
    );
    assert_eq!(
        results.iter().filter(|r| r.outcome == "succeeded").count(),
        24,
        "the records after it were processed"
    );
    let letters = stack.dead_letters().await;
    assert_eq!(letters.len(), 1);
    assert_eq!(
        header_value(&letters[0], "x-error-kind").as_deref(),
        Some("internal")
    );
    assert_eq!(
        header_value(&letters[0], "x-attempts").as_deref(),
        Some("3")
    );
    let letter = String::from_utf8_lossy(letters[0].payload().unwrap_or_default()).into_owned();
    assert!(
        !letter.contains("4111 1111 1111 1111") && letter.contains("p-panic"),
        "the dead letter is the record, masked: {letter}"
    );
    assert_eq!(
        header_value(&letters[0], "x-payload-redacted").as_deref(),
        Some("card_number")
    );
    assert!(
        stack
            .ledger()
            .iter()
            .all(|e| e.idempotency_key != "p-panic"),
        "the panic came before the charge"
    );
    // Nothing was sent, and the record was not flagged: nothing is said unknown.
    assert_eq!(header_value(&letters[0], "x-charge-unknown"), None);
    assert!(!panicked.charge_unknown, "{panicked:?}");
    let panics = run
        .lines()
        .iter()
        .filter(|l| l.contains("handling a record panicked"))
        .count();
    assert_eq!(panics, 3, "{}", run.tail(40));
    // The partition task lived on: ready, and committed past the record.
    let ready = crate::support::helpers::http_get(format!("http://127.0.0.1:{health}/readyz"))
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    let end = offsets.last().unwrap() + 1;
    let deadline = Instant::now() + Duration::from_secs(15);
    while stack.committed().await.get(&0).copied().unwrap_or(-1) < end {
        assert!(
            Instant::now() < deadline,
            "committed offset never reached {end}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    run.stop(Duration::from_secs(20)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_poll_loop_fails_healthz_then_ends_the_process_non_zero() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let producer = producer(&stack);
    send_command(&producer, &stack, "p-stall").await;
    let health = free_port();
    let mut run = start_run(
        &stack,
        "stall-run",
        &[
            ("PAYMENT_WORKER_FAULT", "stall_poll_loop"),
            ("HEALTH_LISTEN", &format!("127.0.0.1:{health}")),
        ],
    )
    .await;
    let url = format!("http://127.0.0.1:{health}/healthz");
    let ready_url = format!("http://127.0.0.1:{health}/readyz");
    let (mut healthy, mut failing) = (false, false);
    // What /readyz said while /healthz failed: never ready, for the stall.
    let mut readiness_while_failing = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(40);
    while run.is_running() {
        assert!(Instant::now() < deadline, "still running: {}", run.tail(20));
        match crate::support::helpers::http_get(&url).await {
            Ok(answer) if answer.status() == 200 => healthy = true,
            Ok(answer) if answer.status() == 503 => {
                failing = true;
                if let Ok(ready) = crate::support::helpers::http_get(&ready_url).await {
                    let status = ready.status().as_u16();
                    readiness_while_failing.push((status, ready.text().await.unwrap_or_default()));
                }
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        healthy && failing,
        "healthz was ok ({healthy}), then failed ({failing})"
    );
    assert!(
        !readiness_while_failing.is_empty()
            && readiness_while_failing
                .iter()
                .all(|(status, why)| *status == 503 && why.contains("has not polled")),
        "{readiness_while_failing:?}"
    );
    let status = run.wait_exit(Duration::from_secs(1)).await;
    assert_eq!(status.code(), Some(1), "{}", run.tail(20));
    assert!(
        run.lines().iter().any(|l| l.contains("has not polled")),
        "{}",
        run.tail(20)
    );
}

// ---------------------------------------------------------------------------
// Errors that no retry can fix are final at once.

fn parsed(key: &str, account: &str) -> payment_worker::payment::PaymentCommand {
    let mut value = command(key);
    value["account_id"] = json!(account);
    payment_worker::payment::PaymentCommand::parse(&serde_json::to_vec(&value).unwrap()).unwrap()
}

/// A final rejection of `kind` whose reason starts with `code` and names `sqlstate`.
fn assert_final(
    outcome: &payment_worker::payment::Outcome,
    kind: RejectionKind,
    code: &str,
    sqlstate: &str,
) {
    let payment_worker::payment::Outcome::Rejected {
        kind: found,
        reason,
    } = outcome
    else {
        panic!("not final: {outcome:?}");
    };
    assert_eq!(*found, kind);
    assert!(
        reason.starts_with(code) && reason.contains(sqlstate),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_errors_no_retry_can_fix_are_final_at_once_and_charge_nothing() {
    use payment_worker::payment::CommandContext;
    use payment_worker::token::{IdempotencyKey, TokenState};
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let processor = stack.processor("sqlstate");
    // Data the database refuses (class 23, a CHECK of the operator's).
    sqlx::query("ALTER TABLE payments ADD CONSTRAINT no_blocked CHECK (account_id <> 'blocked')")
        .execute(&stack.db.pool)
        .await
        .unwrap();
    let refused = processor
        .process(&parsed("db-refused", "blocked"), &CommandContext::default())
        .await
        .into_final()
        .expect("final at once");
    assert_final(
        &refused,
        RejectionKind::Invalid,
        "database_refused:",
        "23514",
    );
    // Our own SQL broken (class 42): `internal`, also at once.
    sqlx::query("ALTER TABLE payments RENAME COLUMN fingerprint TO fingerprint_renamed")
        .execute(&stack.db.pool)
        .await
        .unwrap();
    let broken = processor
        .process(&parsed("db-broken", "acct_ok"), &CommandContext::default())
        .await
        .into_final()
        .expect("final at once");
    assert_final(&broken, RejectionKind::Internal, "database_error:", "42703");
    // Nothing was charged, and both tokens were restored for a later fix and redrive.
    assert!(stack.ledger().is_empty());
    for key in ["db-refused", "db-broken"] {
        let key = IdempotencyKey::try_from(key).unwrap();
        let view = stack.tokens.show(&key).await.unwrap();
        assert!(
            view.as_ref().is_none_or(|v| v.state == TokenState::Pending),
            "{view:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_that_refuses_the_group_ends_the_worker_with_a_fatal_error() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    stack.kafka.cluster().request_errors(
        RDKafkaApiKey::JoinGroup,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED; 20],
    );
    let reason = fatal_broker_failure_of_a_worker(&stack, "fatal").await;
    assert!(reason.contains("uthorization"), "{reason}");
}

/// Publishes `count` valid commands, generated from `seed`, keyed `prefix…`.
async fn produce_valid(stack: &Stack, count: usize, seed: u64, prefix: &str) {
    let spec = payment_worker::operator::WorkloadSpec {
        count,
        duplicate_ratio: 0.0,
        invalid_ratio: 0.0,
        decline_ratio: 0.0,
        seed,
    };
    stack
        .produce(&payment_worker::operator::generate(&spec, prefix))
        .await;
}

async fn assert_nothing_committed(stack: &Stack) {
    let committed = stack.committed().await;
    assert!(
        committed.values().all(|&offset| offset <= 0),
        "nothing unanswered is committed: {committed:?}"
    );
}

/// Runs a worker on `stack` until it ends on its own; asserts it ended with a fatal
/// broker error (exit status 4) and returns that error's text.
async fn fatal_broker_failure_of_a_worker(stack: &Stack, name: &str) -> String {
    let handler = std::sync::Arc::new(payment_worker::worker::Handler::new(
        stack.processor(name),
        payment_worker::worker::Publisher::new(&stack.settings).unwrap(),
        payment_worker::retry::RetryPolicy::default(),
    ));
    let settings = crate::support::helpers::quick_worker_settings();
    let run = payment_worker::worker::run_until(
        &stack.settings,
        &settings,
        handler,
        std::future::pending(),
    );
    let ended = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the worker ends on its own");
    let error = ended.expect_err("a fatal broker error ends the worker with an error");
    assert_eq!(payment_worker::cli::exit_code(&error), 4, "{error:#}");
    match error.downcast_ref::<worker::WorkerFailure>() {
        Some(worker::WorkerFailure::FatalBroker(reason)) => reason.clone(),
        _ => panic!("not a fatal broker error: {error:#}"),
    }
}

/// The brokers refuse the worker's records for good (no write permission on the
/// results and dead-letter topics): every answer would be retried forever while the
/// worker looked healthy. The worker ends instead, with the fatal-broker exit code,
/// and commits nothing it did not answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_topic_the_worker_may_not_write_ends_it_with_a_fatal_error() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    produce_valid(&stack, 3, 9, "nowrite").await;
    // From here on only the worker produces.
    stack.kafka.cluster().request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED; 1000],
    );
    let reason = fatal_broker_failure_of_a_worker(&stack, "nowrite").await;
    assert!(
        reason.starts_with("results producer") && reason.contains("uthoriz"),
        "{reason}"
    );
    assert_nothing_committed(&stack).await;
}

/// A Ctrl-C (SIGINT) while the worker drains stops it at once (exit 130) instead of
/// being ignored until the drain and the final commit are done; the command it cut
/// short is left to its lease, as after any crash. A repeated SIGTERM, as
/// orchestrators and scripts send, only asks for the same clean stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_ctrl_c_ends_a_draining_worker_at_once_and_a_repeated_sigterm_does_not() {
    use nix::sys::signal::Signal;
    use payment_worker::token::{IdempotencyKey, TokenState};
    let stack = Stack::new(
        1,
        SimulatorConfig {
            latency_ms: 30_000,
            ..SimulatorConfig::default()
        },
    )
    .await;
    let mut run = start_run(
        &stack,
        "twice",
        &[("GATEWAY_TIMEOUT", "60s"), ("DRAIN_DEADLINE", "5s")],
    )
    .await;
    let key = "stopped-twice";
    send_command(&producer(&stack), &stack, key).await;
    // The charge is at the gateway, which takes 30 s to answer.
    let held = IdempotencyKey::try_from(key).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while stack
        .tokens
        .show(&held)
        .await
        .unwrap()
        .is_none_or(|view| view.state != TokenState::Processing)
    {
        assert!(Instant::now() < deadline, "the command never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    run.signal(Signal::SIGTERM);
    tokio::time::sleep(Duration::from_millis(500)).await;
    run.signal(Signal::SIGTERM);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        run.exit_status().is_none(),
        "a repeated SIGTERM cut the drain short"
    );
    let interrupted = Instant::now();
    run.signal(Signal::SIGINT);
    let status = run.wait_exit(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(130), "{status:?}");
    assert!(
        interrupted.elapsed() < Duration::from_secs(2),
        "stopped {:?} after the Ctrl-C, not at once",
        interrupted.elapsed()
    );
    assert!(stack.results().await.is_empty(), "nothing was answered");
}

/// A drain cuts a retry loop short without an answer: the command is left to the
/// partition's next owner, never dead-lettered as `retries_exhausted` on the way out.
/// The command waits on another owner's lease (held by the test), so it is in the
/// retry loop, with budget to spare, when the drain begins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_leaves_a_retrying_command_unanswered_for_the_next_owner() {
    use std::sync::Arc;

    use payment_worker::configuration::WorkerSettings;
    use payment_worker::retry::RetryPolicy;
    use payment_worker::token::IdempotencyKey;
    use payment_worker::worker::{Handler, Publisher};
    use rdkafka::message::{OwnedMessage, Timestamp};
    use tokio_util::sync::CancellationToken;

    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let key = "drained-while-waiting";
    let held = IdempotencyKey::try_from(key).unwrap();
    assert!(matches!(
        stack.tokens.reserve(&held, "another-worker").await.unwrap(),
        payment_worker::token::Reservation::Reserved { .. }
    ));
    let handler = Arc::new(Handler::new(
        stack.processor("drained"),
        Publisher::for_mode(&stack.settings, &WorkerSettings::default()).unwrap(),
        RetryPolicy {
            budget: Duration::from_secs(60),
            ..RetryPolicy::default()
        },
    ));
    let message = OwnedMessage::new(
        Some(serde_json::to_vec(&command(key)).unwrap()),
        Some(key.as_bytes().to_vec()),
        stack.settings.commands_topic.clone(),
        Timestamp::now(),
        0,
        0,
        None,
    );
    let draining = CancellationToken::new();
    let handling = {
        let (handler, draining) = (Arc::clone(&handler), draining.clone());
        tokio::spawn(async move {
            handler
                .handle(&message, &draining, worker::AnswerPlace::Free)
                .await
        })
    };
    // The attempt has met the other owner's lease and is waiting to retry.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!handling.is_finished(), "the command waits on the lease");
    draining.cancel();
    let answer = tokio::time::timeout(Duration::from_secs(20), handling)
        .await
        .expect("the drain ends the retry loop")
        .unwrap();
    assert!(
        answer.is_none(),
        "a drained command is left unanswered, not dead-lettered"
    );
    assert!(stack.results().await.is_empty(), "no result was published");
    assert!(stack.dead_letters().await.is_empty(), "no dead letter");
}

/// A results producer that librdkafka gave up on (here: the cluster refuses it the
/// idempotent-write permission) would leave every answer waiting forever while the
/// worker looked healthy; the worker ends instead, with the fatal-broker exit code,
/// and commits nothing it did not answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_results_producer_refused_for_good_ends_the_worker_with_a_fatal_error() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    produce_valid(&stack, 5, 5, "pfatal").await;
    // The next InitProducerId is the worker's results producer's.
    stack.kafka.cluster().request_errors(
        RDKafkaApiKey::InitProducerId,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED],
    );
    let reason = fatal_broker_failure_of_a_worker(&stack, "pfatal").await;
    assert!(reason.starts_with("results producer"), "{reason}");
    assert!(
        stack.results().await.is_empty(),
        "no answer left the worker"
    );
    assert_nothing_committed(&stack).await;
}

/// Every payment connection held across a slow gateway call: the database still
/// answers, and so does `/readyz`, through its own connection. Asked through the
/// payment pool, the probe waited behind the held payments and reported
/// "postgres: no answer" for as long as the gateway was slow.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readyz_answers_while_every_payment_connection_waits_on_a_slow_gateway() {
    use payment_worker::token::IdempotencyKey;
    use payment_worker_devtools::SlowKey;
    const HELD: [&str; 2] = ["ready-held-1", "ready-held-2"];
    let stack = Stack::new(
        1,
        SimulatorConfig {
            slow_keys: HELD
                .iter()
                .map(|key| SlowKey {
                    key: IdempotencyKey::try_from(*key).unwrap(),
                    delay: Duration::from_secs(8),
                })
                .collect(),
            ..SimulatorConfig::default()
        },
    )
    .await;
    let producer = producer(&stack);
    for key in HELD {
        send_command(&producer, &stack, key).await;
    }
    let health = free_port();
    let mut run = start_run(
        &stack,
        "readyz-run",
        &[
            // One connection per held payment: the pool has none left.
            ("DATABASE_MAX_CONNECTIONS", "2"),
            ("HEALTH_LISTEN", &format!("127.0.0.1:{health}")),
        ],
    )
    .await;
    // The gateway books a charge before it holds the answer: both are held now.
    let deadline = Instant::now() + Duration::from_secs(30);
    while stack.ledger().len() < HELD.len() {
        assert!(Instant::now() < deadline, "{}", run.tail(30));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ready = crate::support::helpers::http_get(format!("http://127.0.0.1:{health}/readyz"))
        .await
        .unwrap();
    let status = ready.status();
    let body = ready.text().await.unwrap();
    assert!(
        stack.results().await.is_empty(),
        "the gateway still holds both payments while readiness is asked"
    );
    assert_eq!(status, reqwest::StatusCode::OK, "{body}");
    stack
        .wait_for_results(HELD.len(), Duration::from_secs(60))
        .await;
    run.stop(Duration::from_secs(20)).await;
}
