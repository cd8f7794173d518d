//! The consumer group, commit discipline, replay, broker
//! faults and per-key parallelism, all against librdkafka's mock cluster.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use payment_worker::operator;
use payment_worker::operator::{RecordKind, WorkloadRecord, WorkloadSpec};
use payment_worker::token::{IdempotencyKey, TokenMode};
use payment_worker::worker;
use payment_worker_devtools::{SimulatorConfig, SlowKey};
use rdkafka::message::{Headers, Message};

use crate::support::answers::{assert_one_answer_per_command, assert_one_answer_per_offset};
use crate::support::helpers::{quick_worker_settings, stop_all, wait_for_stable_group, Stack};

fn header(message: &rdkafka::message::OwnedMessage, name: &str) -> Option<String> {
    message.headers().and_then(|h| {
        h.iter()
            .find(|x| x.key == name)
            .and_then(|x| x.value.map(|v| String::from_utf8_lossy(v).into_owned()))
    })
}

fn valid_keys(records: &[WorkloadRecord]) -> HashSet<String> {
    records
        .iter()
        .filter(|r| r.kind == RecordKind::Valid)
        .map(|r| String::from_utf8(r.key.clone().unwrap()).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_group_of_three_charges_every_key_once_and_replays_without_charging() {
    let stack = Stack::new(
        6,
        SimulatorConfig {
            error_rate: 0.02,
            ..SimulatorConfig::default()
        },
    )
    .await;
    let spec = WorkloadSpec {
        count: 2000,
        duplicate_ratio: 0.25,
        invalid_ratio: 0.05,
        decline_ratio: 0.05,
        seed: 7,
    };
    let records = operator::generate(&spec, "grp");
    let duplicates_elsewhere = records
        .iter()
        .filter(|r| r.kind == RecordKind::Duplicate && r.partition_hint.is_some())
        .count();
    assert!(
        duplicates_elsewhere > 50,
        "the workload sends duplicates through other partitions"
    );

    // The group settles first: with no rebalance during the run, every command is
    // answered exactly once (a rebalance may repeat a result; see the fault test).
    let settings = quick_worker_settings();
    let workers: Vec<_> = (0..3)
        .map(|i| stack.start_worker(&format!("w{i}"), &settings))
        .collect();
    wait_for_stable_group(&workers, 6).await;
    stack.produce(&records).await;
    let results = stack
        .wait_for_results(records.len(), Duration::from_secs(240))
        .await;
    stack.wait_for_commits(Duration::from_secs(30)).await;

    // One result per command, for exactly the commands' positions.
    assert_one_answer_per_command(&results, records.len());

    // Every valid key charged exactly once.
    let ledger = stack.ledger();
    let charged: HashSet<String> = ledger.iter().map(|e| e.idempotency_key.clone()).collect();
    assert_eq!(charged, valid_keys(&records));
    stack.assert_books_balance().await;

    // Every invalid record is in the DLQ with its reason.
    let invalid = records
        .iter()
        .filter(|r| r.kind == RecordKind::Invalid)
        .count();
    let dead = stack.dead_letters().await;
    assert_eq!(dead.len(), invalid);
    for letter in &dead {
        assert_eq!(header(letter, "x-error-kind").as_deref(), Some("invalid"));
        let reason = header(letter, "x-error-reason").unwrap();
        assert!(
            !reason.is_empty() && !reason.contains("4242424242424242"),
            "{reason}"
        );
        assert!(header(letter, "x-source-offset").is_some());
    }
    let by_outcome = |results: &[worker::ResultRecord], o: &str| {
        results.iter().filter(|r| r.outcome == o).count()
    };
    assert_eq!(by_outcome(&results, "rejected"), invalid);
    stop_all(workers).await;

    // Replay from 0: not one new charge, every valid command a duplicate.
    let ledger_before = stack.ledger();
    let attempts_before: u64 = ledger_before.iter().map(|e| e.attempts).sum();
    let verdicts = operator::dry_run_verdicts(
        &stack.settings,
        None,
        &stack.db.pool,
        stack.tokens.as_ref(),
        TokenMode::Implicit,
    )
    .await
    .unwrap();
    assert_eq!(verdicts.len(), records.len());
    assert_eq!(
        verdicts.iter().filter(|v| v.verdict == "invalid").count(),
        invalid
    );
    assert!(
        verdicts
            .iter()
            .all(|v| v.verdict == "invalid" || v.verdict == "duplicate"),
        "dry run"
    );
    let attempts_after_dry: u64 = stack.ledger().iter().map(|e| e.attempts).sum();
    assert_eq!(
        attempts_before, attempts_after_dry,
        "dry run never calls the gateway"
    );

    let settings_for_rewind = stack.settings.clone();
    tokio::task::spawn_blocking(move || operator::rewind_group(&settings_for_rewind, None))
        .await
        .unwrap()
        .unwrap();
    let workers: Vec<_> = (0..3)
        .map(|i| stack.start_worker(&format!("r{i}"), &settings))
        .collect();
    // Members join one by one here, so a replayed command may be answered more than
    // once; each replay answer must be a duplicate of the first (or the same rejection).
    let deadline = Instant::now() + Duration::from_secs(240);
    let answers = loop {
        let mut answers: HashMap<(i32, i64), Vec<worker::ResultRecord>> = HashMap::new();
        for r in stack.results().await {
            answers
                .entry((r.source.partition, r.source.offset))
                .or_default()
                .push(r);
        }
        if answers.len() == records.len() && answers.values().all(|a| a.len() >= 2) {
            break answers;
        }
        assert!(
            Instant::now() < deadline,
            "the replay did not answer every command"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    stack.wait_for_commits(Duration::from_secs(30)).await;
    stop_all(workers).await;
    for list in answers.values() {
        let first_pass: Vec<_> = list.iter().filter(|a| a.outcome != "duplicate").collect();
        if list[0].outcome == "rejected" {
            assert!(list.iter().all(|a| a.outcome == "rejected"), "{list:?}");
        } else {
            assert!(
                first_pass.len() <= 1,
                "charged at most once, then only duplicates: {list:?}"
            );
            let payment = list[0].payment_id;
            assert!(payment.is_some(), "{list:?}");
            assert!(
                list.iter().all(|a| a.payment_id == payment),
                "same payment id: {list:?}"
            );
        }
    }
    assert_eq!(stack.ledger(), ledger_before, "the replay charged nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_committed_offset_never_passes_a_held_command() {
    let held = "held-0000";
    let stack = Stack::new(
        1,
        SimulatorConfig {
            slow_keys: vec![SlowKey {
                key: IdempotencyKey::try_from(held).unwrap(),
                delay: Duration::from_secs(10),
            }],
            ..SimulatorConfig::default()
        },
    )
    .await;
    let mut records = vec![];
    for n in 0..60 {
        let key = if n == 5 {
            held.to_owned()
        } else {
            format!("free-{n:04}")
        };
        let value = serde_json::json!({"idempotency_key": key, "account_id": "acct", "amount_minor": 100 + n,
            "currency": "EUR", "payment_method": "pm_card_visa"});
        records.push(WorkloadRecord {
            kind: RecordKind::Valid,
            key: Some(key.into_bytes()),
            value: Some(value.to_string().into_bytes()),
            partition_hint: None,
        });
    }
    stack.produce(&records).await;
    let worker = stack.start_worker("w", &quick_worker_settings());
    // While the held charge runs, the other 59 finish, yet the offset stays at 5.
    stack.wait_for_results(59, Duration::from_secs(30)).await;
    let started = Instant::now();
    let mut observed = vec![];
    while started.elapsed() < Duration::from_millis(1500) {
        let committed = stack.committed().await.get(&0).copied().unwrap_or(-1);
        assert!(
            committed <= 5,
            "committed offset {committed} passed the held command at 5"
        );
        observed.push(committed);
        assert_eq!(
            stack.results().await.len(),
            59,
            "the held command is still running"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        observed.contains(&5),
        "the offset advanced up to the held command: {observed:?}"
    );
    // After release it catches up to the end.
    stack.wait_for_results(60, Duration::from_secs(30)).await;
    stack.wait_for_commits(Duration::from_secs(15)).await;
    stop_all(vec![worker]).await;
    stack.assert_books_balance().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_faults_lose_nothing_and_charge_nothing_twice() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let stack = Stack::new(4, SimulatorConfig::default()).await;
    let records = operator::generate(
        &WorkloadSpec {
            count: 600,
            duplicate_ratio: 0.25,
            invalid_ratio: 0.05,
            decline_ratio: 0.0,
            seed: 11,
        },
        "flt",
    );
    stack.produce(&records).await;
    let cluster = stack.kafka.cluster();
    // Transient errors on produce (results) and on offset commits.
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION; 5],
    );
    cluster.request_errors(
        RDKafkaApiKey::OffsetCommit,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_COORDINATOR; 5],
    );
    let settings = quick_worker_settings();
    let workers: Vec<_> = (0..2)
        .map(|i| stack.start_worker(&format!("f{i}"), &settings))
        .collect();
    tokio::time::sleep(Duration::from_millis(800)).await;
    // All brokers down for a few seconds mid-run.
    for broker in 1..=3 {
        cluster.broker_down(broker).unwrap();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    for broker in 1..=3 {
        cluster.broker_up(broker).unwrap();
    }
    drop(cluster);
    let results = stack
        .wait_for_results(records.len(), Duration::from_secs(180))
        .await;
    stack.wait_for_commits(Duration::from_secs(60)).await;
    stop_all(workers).await;
    // A rebalance forced by the outage may answer a command again; never differently.
    // Not in order, though: a command abandoned at the drain deadline after its
    // payment committed leaves its result queued in the old member's producer, which
    // may deliver it after the new owner's `duplicate`.
    let mut answers: HashMap<(i32, i64), Vec<&worker::ResultRecord>> = HashMap::new();
    for r in &results {
        answers
            .entry((r.source.partition, r.source.offset))
            .or_default()
            .push(r);
    }
    assert_eq!(answers.len(), records.len(), "every command answered");
    for repeated in answers.values().filter(|a| a.len() > 1) {
        let mut distinct: Vec<(&str, Option<&str>)> = repeated
            .iter()
            .filter(|a| a.outcome != "duplicate")
            .map(|a| (a.outcome.as_str(), a.reason.as_deref()))
            .collect();
        distinct.dedup();
        assert!(
            distinct.len() <= 1
                && repeated
                    .iter()
                    .all(|a| a.payment_id == repeated[0].payment_id),
            "repeated answers disagree: {repeated:?}"
        );
    }
    let charged: HashSet<String> = stack
        .ledger()
        .iter()
        .map(|e| e.idempotency_key.clone())
        .collect();
    assert_eq!(charged, valid_keys(&records));
    stack.assert_books_balance().await;
}

/// Slow brokers (250 ms on every request to each of them, for 4 s mid-run): the run
/// slows down and nothing breaks: every command answered, every offset committed,
/// one charge per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_brokers_slow_the_run_and_break_nothing() {
    let stack = Stack::new(4, SimulatorConfig::default()).await;
    let records = operator::generate(
        &WorkloadSpec {
            count: 400,
            duplicate_ratio: 0.25,
            invalid_ratio: 0.0,
            decline_ratio: 0.0,
            seed: 13,
        },
        "slow",
    );
    stack.produce(&records).await;
    let settings = quick_worker_settings();
    let workers: Vec<_> = (0..2)
        .map(|i| stack.start_worker(&format!("s{i}"), &settings))
        .collect();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let cluster = stack.kafka.cluster();
    for broker in 1..=3 {
        cluster
            .broker_round_trip_time(broker, Duration::from_millis(250))
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    for broker in 1..=3 {
        cluster
            .broker_round_trip_time(broker, Duration::ZERO)
            .unwrap();
    }
    drop(cluster);
    let results = stack
        .wait_for_results(records.len(), Duration::from_secs(180))
        .await;
    stack.wait_for_commits(Duration::from_secs(60)).await;
    stop_all(workers).await;
    let answered: HashSet<(i32, i64)> = results
        .iter()
        .map(|r| (r.source.partition, r.source.offset))
        .collect();
    assert_eq!(answered.len(), records.len(), "every command answered");
    let charged: HashSet<String> = stack
        .ledger()
        .iter()
        .map(|e| e.idempotency_key.clone())
        .collect();
    assert_eq!(charged, valid_keys(&records));
    stack.assert_books_balance().await;
}

/// One partition of `COMMANDS` fresh commands whose first key the gateway holds for
/// `HOLD`; returns the keys in the order their results were read once all are
/// answered, and the held key.
async fn answers_around_a_held_charge(max_in_flight: usize) -> (Vec<String>, String) {
    const COMMANDS: usize = 60;
    const HOLD: Duration = Duration::from_secs(5);
    let records = operator::generate(
        &WorkloadSpec {
            count: COMMANDS,
            duplicate_ratio: 0.0,
            invalid_ratio: 0.0,
            decline_ratio: 0.0,
            seed: 3,
        },
        &format!("par{max_in_flight}"),
    );
    let (stack, held) = Stack::holding_the_first_charge(&records, HOLD).await;
    let settings = payment_worker::configuration::WorkerSettings {
        max_in_flight,
        ..quick_worker_settings()
    };
    let worker = stack.start_worker("p", &settings);
    let results = stack
        .wait_for_results(records.len(), Duration::from_secs(120))
        .await;
    stop_all(vec![worker]).await;
    stack.assert_books_balance().await;
    let order = results
        .iter()
        .filter_map(|r| r.idempotency_key.clone())
        .collect();
    (order, held)
}

/// A drain finishes every command the partition admitted, those queued behind their
/// key included: the offset it commits is past every answered command, so the
/// partition's next owner answers none of them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drain_finishes_what_it_admitted_and_commits_past_every_answer() {
    // Both below the session timeout (6 s), which a drain deadline must stay under.
    const HOLD: Duration = Duration::from_secs(4);
    let mut records = operator::generate(
        &WorkloadSpec {
            count: 20,
            duplicate_ratio: 0.0,
            invalid_ratio: 0.0,
            decline_ratio: 0.0,
            seed: 5,
        },
        "drainq",
    );
    // The held command's duplicate right behind it waits in its key's lane.
    records.insert(1, records[0].clone());
    let (stack, held) = Stack::holding_the_first_charge(&records, HOLD).await;
    let settings = payment_worker::configuration::WorkerSettings {
        drain_deadline: Duration::from_millis(5500),
        ..quick_worker_settings()
    };
    let worker = stack.start_worker("drain", &settings);
    // The others are answered around the held charge; then the worker stops.
    let around = stack
        .wait_for_results(records.len() - 2, Duration::from_secs(60))
        .await;
    assert!(
        around
            .iter()
            .all(|r| r.idempotency_key.as_deref() != Some(held.as_str())),
        "the held command was answered before the drain began"
    );
    stop_all(vec![worker]).await;

    let results = stack.results().await;
    // Every command answered once, the queued one too.
    assert_one_answer_per_offset(&results, records.len());
    assert_eq!(
        stack.committed().await.get(&0),
        Some(&(records.len() as i64)),
        "the drain committed past every answered command"
    );
    stack.assert_books_balance().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn different_keys_of_one_partition_run_in_parallel() {
    // Order, not timing: while the gateway holds the partition's first charge for
    // seconds, the others (20 ms each) are answered around it, so its result comes
    // last; one command at a time, it can only come first.
    let (parallel, held) = answers_around_a_held_charge(64).await;
    assert_eq!(
        parallel.len(),
        60,
        "every command answered once: {parallel:?}"
    );
    assert_eq!(
        parallel.last(),
        Some(&held),
        "per-key parallelism: the other commands of the partition waited for the held one"
    );
    let (sequential, held) = answers_around_a_held_charge(1).await;
    assert_eq!(sequential.len(), 60);
    assert_eq!(
        sequential.first(),
        Some(&held),
        "one at a time, nothing is answered before the partition's first command"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_key_is_processed_in_order_within_a_partition() {
    // Same key twice with different amounts back to back: the first wins, the
    // second is refused as key reuse, never charged; order is the topic's order.
    let stack = Stack::new(
        1,
        SimulatorConfig {
            latency_ms: 30,
            ..SimulatorConfig::default()
        },
    )
    .await;
    let mut records = vec![];
    for amount in [100, 200, 100] {
        let value = serde_json::json!({"idempotency_key": "same-key", "account_id": "acct", "amount_minor": amount,
            "currency": "EUR", "payment_method": "pm_card_visa"});
        records.push(WorkloadRecord {
            kind: RecordKind::Valid,
            key: Some(b"same-key".to_vec()),
            value: Some(value.to_string().into_bytes()),
            partition_hint: None,
        });
    }
    stack.produce(&records).await;
    let worker = stack.start_worker("o", &quick_worker_settings());
    let results = stack.wait_for_results(3, Duration::from_secs(30)).await;
    stop_all(vec![worker]).await;
    let mut by_offset: HashMap<i64, &str> = HashMap::new();
    for r in &results {
        by_offset.insert(r.source.offset, r.outcome.as_str());
    }
    assert_eq!(by_offset.get(&0), Some(&"succeeded"));
    assert_eq!(by_offset.get(&1), Some(&"rejected"));
    assert_eq!(by_offset.get(&2), Some(&"duplicate"));
    assert_eq!(stack.ledger().len(), 1);
    let dead = stack.dead_letters().await;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        header(&dead[0], "x-error-kind").as_deref(),
        Some("key_reused")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_too_large_to_dead_letter_whole_is_dead_lettered_without_its_value() {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    // Our producer may send 4 MiB; the worker keeps librdkafka's 1 MB default.
    let mut config = worker::producer_config(&stack.settings);
    config.set("message.max.bytes", "4194304");
    let producer: FutureProducer = config.create().unwrap();
    let huge = vec![b'x'; 1536 * 1024];
    producer
        .send(
            FutureRecord::to(&stack.settings.commands_topic)
                .key("huge-1")
                .payload(&huge),
            rdkafka::util::Timeout::After(Duration::from_secs(10)),
        )
        .await
        .unwrap();
    // Too large even without its value: the bulk is in a header.
    let blob = vec![b'h'; 1536 * 1024];
    producer
        .send(
            FutureRecord::to(&stack.settings.commands_topic)
                .key("huge-2")
                .payload("{}")
                .headers(
                    rdkafka::message::OwnedHeaders::new().insert(rdkafka::message::Header {
                        key: "x-blob",
                        value: Some(&blob),
                    }),
                ),
            rdkafka::util::Timeout::After(Duration::from_secs(10)),
        )
        .await
        .unwrap();
    let after =
        serde_json::json!({"idempotency_key": "after-huge", "account_id": "a", "amount_minor": 5,
        "currency": "EUR", "payment_method": "pm_card_visa"})
        .to_string();
    producer
        .send(
            FutureRecord::to(&stack.settings.commands_topic)
                .key("after-huge")
                .payload(&after),
            rdkafka::util::Timeout::After(Duration::from_secs(10)),
        )
        .await
        .unwrap();
    let worker = stack.start_worker("big", &quick_worker_settings());
    let results = stack.wait_for_results(3, Duration::from_secs(60)).await;
    stack.wait_for_commits(Duration::from_secs(30)).await;
    stop_all(vec![worker]).await;
    assert_eq!(
        results.iter().filter(|r| r.outcome == "succeeded").count(),
        1
    );
    let mut dead = stack.dead_letters().await;
    assert_eq!(dead.len(), 2, "one dead letter per refused record");
    // Keys run in parallel: the dead letters come in either order.
    dead.sort_by_key(|m| header(m, "x-source-offset"));
    assert_eq!(header(&dead[0], "x-error-kind").as_deref(), Some("invalid"));
    assert_eq!(
        header(&dead[0], "x-payload-dropped").as_deref(),
        Some("message_too_large")
    );
    assert_eq!(
        header(&dead[0], "x-original-size"),
        Some((1536 * 1024).to_string())
    );
    assert_eq!(header(&dead[0], "x-source-offset").as_deref(), Some("0"));
    assert_eq!(
        dead[0].key(),
        Some(&b"huge-1"[..]),
        "the original key is kept"
    );
    assert_eq!(dead[0].payload(), None);
    // Without value, key and its own headers: what says why and where is kept.
    assert_eq!(header(&dead[1], "x-source-offset").as_deref(), Some("1"));
    assert_eq!(header(&dead[1], "x-error-kind").as_deref(), Some("invalid"));
    assert_eq!(
        header(&dead[1], "x-original-dropped").as_deref(),
        Some("key,headers")
    );
    assert_eq!(header(&dead[1], "x-blob"), None);
    assert_eq!(dead[1].key(), None);
    assert_eq!(dead[1].payload(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_duplicate_result_repeats_the_original_answer() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let command = |key: &str| {
        serde_json::json!({"idempotency_key": key, "account_id": "acct_dup", "amount_minor": 700,
            "currency": "EUR", "payment_method": "pm_card_visa"})
        .to_string()
        .into_bytes()
    };
    // The second copy is decided by the Redis tombstone, the third after the token
    // is gone (Redis lost) by the payment row: both repeat the first answer.
    let record = |key: &str| WorkloadRecord {
        kind: RecordKind::Valid,
        key: Some(key.as_bytes().to_vec()),
        value: Some(command(key)),
        partition_hint: Some(0),
    };
    stack.produce(&[record("dup-1"), record("dup-1")]).await;
    let worker = stack.start_worker("dup", &quick_worker_settings());
    let results = stack.wait_for_results(2, Duration::from_secs(60)).await;
    let mut redis = stack.redis.conn.clone();
    let token = format!("{}:token:{{dup-1}}", stack.redis.prefix);
    let _: () = redis::AsyncCommands::del(&mut redis, &token).await.unwrap();
    stack.produce(&[record("dup-1")]).await;
    let results = if results.len() < 3 {
        stack.wait_for_results(3, Duration::from_secs(60)).await
    } else {
        results
    };
    stop_all(vec![worker]).await;
    let first = results.iter().find(|r| r.outcome == "succeeded").unwrap();
    let duplicates: Vec<_> = results
        .iter()
        .filter(|r| r.outcome == "duplicate")
        .collect();
    assert_eq!(duplicates.len(), 2, "{results:?}");
    for duplicate in duplicates {
        let original = duplicate.original.as_ref().expect("the original answer");
        assert_eq!(original.outcome, "succeeded");
        assert_eq!(Some(original.payment_id), first.payment_id);
        assert_eq!(
            original.gateway_transaction_id,
            first.gateway_transaction_id
        );
        assert_eq!(duplicate.payment_id, first.payment_id);
    }
    assert!(results
        .iter()
        .all(|r| r.outcome != "succeeded" || r.original.is_none()));
    assert_eq!(stack.ledger().len(), 1);
}
