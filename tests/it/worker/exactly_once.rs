//! `--results exactly-once`: results, dead letters and offsets leave the worker in
//! Kafka transactions. The worker's side, on librdkafka's stock mock cluster in
//! process.
//!
//! The stock mock (2.12.1) runs the transactional protocol (InitProducerId,
//! AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn, with error
//! injection), but writes no commit/abort markers, reports no aborted transactions,
//! stores no offset sent with a transaction, and ignores the group generation a
//! TxnOffsetCommit carries. These tests check what the worker does: a transaction
//! that commits carries each command's answer once, answers enter it in offset
//! order, and a transaction the group coordinator refuses (ILLEGAL_GENERATION,
//! injected) is aborted and its commands are answered again, as duplicates carrying
//! the original answer, without a second charge. What a `read_committed` reader
//! sees through crashes and a zombie is proven on `txn-broker`, the mock patched to
//! carry transactions out (`chaos::exactly_once`, `worker::transaction_fencing`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use payment_worker::configuration::{KafkaSettings, ResultsMode, WorkerSettings};
use payment_worker::operator::WorkloadSpec;
use payment_worker::payment::SourcePosition;
use payment_worker::worker::{self, ResultRecord, TransactionFailure, Transactions};
use payment_worker_devtools::{LocalKafka, SimulatorConfig};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerGroupMetadata};
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

use crate::support::answers::{assert_one_answer_per_command, assert_one_answer_per_offset};
use crate::support::helpers::{quick_worker_settings, read_topic, result_records, unique, Stack};

use super::poison::{producer, send_command, start_run};

pub(crate) fn exactly_once_settings() -> WorkerSettings {
    WorkerSettings {
        results: ResultsMode::ExactlyOnce,
        transaction_interval: Duration::from_millis(100),
        transaction_max_records: 200,
        ..quick_worker_settings()
    }
}

/// The process's transactional producer, started off the runtime as `run` does.
pub(crate) async fn start_transactions(settings: &KafkaSettings) -> std::sync::Arc<Transactions> {
    let settings = settings.clone();
    tokio::task::spawn_blocking(move || {
        Transactions::start(&settings, &exactly_once_settings()).unwrap()
    })
    .await
    .unwrap()
}

/// Every result record a `read_committed` reader of the results topic gets.
pub(crate) async fn read_committed(settings: &KafkaSettings) -> Vec<ResultRecord> {
    result_records(&read_topic(settings, &settings.results_topic, "read_committed").await)
}

/// Every position answered; at most one first answer (`succeeded`/`declined`) per
/// key; every answer of a key names its one payment, and every duplicate carries
/// the original answer as the payment row holds it (`rows`: key → status,
/// gateway transaction id). Returns the answers per position.
pub(crate) fn check_answers<'a>(
    results: &'a [ResultRecord],
    positions: usize,
    rows: &HashMap<String, (String, Option<String>)>,
) -> HashMap<(i32, i64), Vec<&'a ResultRecord>> {
    let mut by_position: HashMap<(i32, i64), Vec<&ResultRecord>> = HashMap::new();
    for r in results {
        by_position
            .entry((r.source.partition, r.source.offset))
            .or_default()
            .push(r);
    }
    assert_eq!(by_position.len(), positions, "every command answered");
    let mut first: HashSet<&str> = HashSet::new();
    let mut payment: HashMap<&str, Option<uuid::Uuid>> = HashMap::new();
    for r in results {
        let key = r.idempotency_key.as_deref().unwrap();
        let (status, transaction) = &rows[key];
        let named = payment.entry(key).or_insert(r.payment_id);
        assert_eq!(*named, r.payment_id, "one payment per key: {r:?}");
        if r.outcome == "duplicate" {
            let original = r
                .original
                .as_ref()
                .expect("a duplicate carries the original");
            assert_eq!(&original.outcome, status, "{r:?}");
            assert_eq!(Some(original.payment_id), r.payment_id, "{r:?}");
            assert_eq!(&original.gateway_transaction_id, transaction, "{r:?}");
        } else {
            assert!(
                first.insert(key),
                "{key} answered as first processing twice"
            );
            assert_eq!(&r.outcome, status, "{r:?}");
            assert_eq!(&r.gateway_transaction_id, transaction, "{r:?}");
        }
    }
    by_position
}

async fn rows(stack: &Stack) -> HashMap<String, (String, Option<String>)> {
    stack
        .payment_rows()
        .await
        .into_iter()
        .map(|(key, status, transaction)| (key, (status, transaction)))
        .collect()
}

/// Nothing fails: each command position has exactly one result, duplicates of the
/// workload carry the original answer, one charge per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_once_answers_every_command_once() {
    let stack = Stack::new(3, SimulatorConfig::default()).await;
    let spec = WorkloadSpec {
        count: 600,
        duplicate_ratio: 0.25,
        invalid_ratio: 0.0,
        decline_ratio: 0.05,
        seed: 15,
    };
    let records = payment_worker::operator::generate(&spec, &unique("eos"));
    stack.produce(&records).await;
    let worker = stack.start_worker("eos", &exactly_once_settings());
    stack
        .wait_for_results(records.len(), Duration::from_secs(120))
        .await;
    worker.stop().await.unwrap();

    let results = read_committed(&stack.settings).await;
    check_answers(&results, records.len(), &rows(&stack).await);
    assert_one_answer_per_command(&results, records.len());
    assert!(
        results.iter().any(|r| r.outcome == "duplicate"),
        "the workload's duplicates are answered as such"
    );
    stack.assert_books_balance().await;
    let keys: HashSet<_> = records.iter().map(|r| r.key.clone()).collect();
    assert_eq!(stack.ledger().len(), keys.len(), "one charge per key");
}

/// The group coordinator refuses the offsets of some transactions (ILLEGAL_GENERATION,
/// what a member fenced by a newer generation gets): each is aborted, the member
/// rewinds to its last committed offsets and answers those commands again. On the
/// mock cluster the aborted answers stay readable (it writes no abort markers), so
/// the repeats are visible here: every one of them is a `duplicate` carrying the
/// original answer, and nothing is charged twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_aborted_transaction_is_redone_as_duplicates_of_the_original_answers() {
    let stack = Stack::new(3, SimulatorConfig::default()).await;
    let spec = WorkloadSpec {
        count: 600,
        duplicate_ratio: 0.25,
        invalid_ratio: 0.0,
        decline_ratio: 0.05,
        seed: 16,
    };
    let records = payment_worker::operator::generate(&spec, &unique("eos-abort"));
    let worker = stack.start_worker("eos", &exactly_once_settings());
    crate::support::helpers::wait_for_stable_group(std::slice::from_ref(&worker), 3).await;
    // Armed before the first record: a transaction commits nothing until it holds
    // answers, so the first three that do are refused, whatever the machine's speed
    // (armed mid-run, a fast worker could have committed everything already).
    stack.kafka.cluster().request_errors(
        RDKafkaApiKey::TxnOffsetCommit,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_ILLEGAL_GENERATION; 3],
    );
    stack.produce(&records).await;
    stack
        .wait_for_results(records.len(), Duration::from_secs(120))
        .await;
    worker.stop().await.unwrap();

    let results = read_committed(&stack.settings).await;
    let answers = check_answers(&results, records.len(), &rows(&stack).await);
    let repeats = answers.values().filter(|a| a.len() > 1).count();
    assert!(
        repeats > 0,
        "the aborted transactions' commands were redone"
    );
    for list in answers.values().filter(|a| a.len() > 1) {
        assert!(
            list[1..].iter().all(|r| r.outcome == "duplicate"),
            "a redone command is a duplicate: {list:?}"
        );
    }
    stack.assert_books_balance().await;
    let keys: HashSet<_> = records.iter().map(|r| r.key.clone()).collect();
    assert_eq!(stack.ledger().len(), keys.len(), "one charge per key");
    eprintln!(
        "exactly-once abort: {} results for {} commands, {repeats} redone",
        results.len(),
        records.len()
    );
}

/// The partition's first command is held by the gateway for seconds: the commands
/// behind it are still charged and booked meanwhile (per-key parallelism), but none
/// of them is answered before it. Were a later answer let into a transaction that
/// commits the partition's offset below it, a crash after that commit would answer
/// the command a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn answers_of_a_partition_enter_the_transaction_in_offset_order_around_a_held_charge() {
    const COMMANDS: usize = 40;
    const HOLD: Duration = Duration::from_secs(5);
    let records = payment_worker::operator::generate(
        &WorkloadSpec {
            count: COMMANDS,
            duplicate_ratio: 0.0,
            invalid_ratio: 0.0,
            decline_ratio: 0.0,
            seed: 17,
        },
        &unique("eos-order"),
    );
    let (stack, held) = Stack::holding_the_first_charge(&records, HOLD).await;
    // Room for every command at once: a command waiting for its turn to answer
    // keeps its place among the partition's commands in flight.
    let settings = WorkerSettings {
        max_in_flight: 64,
        ..exactly_once_settings()
    };
    let worker = stack.start_worker("eos", &settings);

    // Order, not timing: wait until every other command is booked, then look.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let booked_around_the_held_one = loop {
        let rows = stack.payment_rows().await;
        let others = rows
            .iter()
            .filter(|(key, status, _)| key != &held && status == "succeeded")
            .count();
        if others == COMMANDS - 1 {
            break rows;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "only {others} of the other commands were booked"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let answered_meanwhile = stack.results().await;
    let held_status = stack
        .payment_rows()
        .await
        .into_iter()
        .find(|(key, _, _)| key == &held)
        .map(|(_, status, _)| status);
    assert_ne!(
        held_status.as_deref(),
        Some("succeeded"),
        "the held charge ended before the others were booked (a machine slower than the {HOLD:?} hold): {booked_around_the_held_one:?}"
    );
    assert!(
        answered_meanwhile.is_empty(),
        "answers entered the transaction before the partition's first command: {answered_meanwhile:?}"
    );

    stack
        .wait_for_results(COMMANDS, Duration::from_secs(60))
        .await;
    worker.stop().await.unwrap();
    let results = read_committed(&stack.settings).await;
    // Entering in order is not producing in order: the records of answers that
    // entered one after the other may reach the topic in either order.
    assert_one_answer_per_offset(&results, COMMANDS);
    assert_eq!(stack.ledger().len(), COMMANDS, "one charge per key");
    stack.assert_books_balance().await;
}

/// What a commit refuses: an answer whose offset the transaction would not commit
/// past (an earlier command of its partition still running), and an answer whose
/// command was abandoned before its partition recorded it as settled (the drain
/// deadline passed, or its handler panicked after answering). Both would be visible
/// after the commit while the command is read and answered again. Each such
/// transaction is aborted instead; a covered answer commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_carries_no_answer_past_its_offsets_and_none_abandoned_unsettled() {
    let kafka = LocalKafka::start(1).expect("mock cluster");
    let settings = KafkaSettings::local(kafka.bootstrap_servers(), unique("group"));
    kafka.create_payment_topics(&settings, 1).expect("topics");
    let topic = settings.commands_topic.clone();
    let transactions = start_transactions(&settings).await;
    let member: BaseConsumer = {
        let mut config = worker::base_config(&settings);
        config.set("group.id", &settings.group_id);
        config.create().unwrap()
    };
    let commit = |answered, next, settled| {
        answer_then_commit(&transactions, &topic, answered, next, settled, &member)
    };
    let refused = commit(5, 3, true).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|reason| reason.contains("offset 5")),
        "an answer past the committed offset (an earlier command still runs): {refused:?}"
    );
    let refused = commit(6, 7, false).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|reason| reason.contains("abandoned")),
        "an answer abandoned before it settled: {refused:?}"
    );
    let committed = commit(6, 7, true).await;
    assert_eq!(committed, Ok((1, 1)), "a settled, covered answer commits");
}

/// One answer at `offset` of partition 0, the partition settled up to `next`, the
/// answer's guard let go as settled or dropped unsettled; then a commit with the
/// group metadata of `member`. Returns what it carried, or why it aborted.
async fn answer_then_commit(
    transactions: &Arc<Transactions>,
    topic: &str,
    offset: i64,
    next: i64,
    settled: bool,
    member: &BaseConsumer,
) -> Result<(u64, usize), String> {
    let at = SourcePosition {
        topic: topic.to_owned(),
        partition: 0,
        offset,
    };
    let guard = transactions.enter(&at).await;
    transactions.settle(topic, 0, next);
    if settled {
        guard.settled();
    } else {
        drop(guard);
    }
    commit(transactions, member.group_metadata()).await
}

/// Commits the open transaction with `group`'s metadata: what it carried (answers,
/// partitions), or why it aborted (a fatal failure fails the test).
pub(crate) async fn commit(
    transactions: &Arc<Transactions>,
    group: Option<ConsumerGroupMetadata>,
) -> Result<(u64, usize), String> {
    let transactions = Arc::clone(transactions);
    tokio::task::spawn_blocking(move || match transactions.commit(group) {
        Ok(committed) => Ok((committed.answers, committed.partitions)),
        Err((TransactionFailure::Aborted(reason), _gate)) => Err(reason),
        Err((TransactionFailure::Fatal(reason), _gate)) => panic!("fatal: {reason}"),
    })
    .await
    .unwrap()
}

/// A record whose handling panics after it answered, in exactly-once mode: its
/// answer is in the open transaction and the command will be handled again, so the
/// transaction aborts and the member rewinds, starting its partitions with new
/// tasks. The panic count outlives those tasks: the third panic dead-letters the
/// record as `internal` and the member commits again. Counted per task, it would
/// start over after every rewind, and the member would abort forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_that_panics_after_answering_is_dead_lettered_on_the_third_panic_across_rewinds() {
    const PANICKING: &str = "eos-answer-panic";
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let producer = producer(&stack);
    let mut keys = vec![];
    for n in 0..10 {
        let key = if n == 3 {
            PANICKING.to_owned()
        } else {
            format!("eos-after-{n}")
        };
        send_command(&producer, &stack, &key).await;
        keys.push(key);
    }
    let mut run = start_run(
        &stack,
        "eos-panic",
        &[
            ("RESULTS_MODE", "exactly-once"),
            ("PAYMENT_WORKER_FAULT", "panic:after_answer"),
            ("PAYMENT_WORKER_FAULT_KEY", PANICKING),
        ],
    )
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let internal = loop {
        let results = stack.results().await;
        let internal = results.into_iter().find(|r| {
            r.idempotency_key.as_deref() == Some(PANICKING)
                && r.reason
                    .as_deref()
                    .is_some_and(|r| r.starts_with("internal: panicked"))
        });
        if let Some(internal) = internal {
            break internal;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never dead-lettered; the worker said: {}",
            run.tail(30)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(internal.outcome, "rejected");
    stack
        .wait_for_results(keys.len(), Duration::from_secs(60))
        .await;
    run.assert_running();
    // The worker's output is read on a thread of its own, so the third panic's line
    // may reach `lines()` after its dead letter reached the topic: wait for it.
    let count_panics = |run: &crate::support::procs::Proc| {
        run.lines()
            .iter()
            .filter(|l| l.contains("handling a record panicked"))
            .count()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while count_panics(&run) < 3 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(count_panics(&run), 3, "{}", run.tail(40));
    let aborts = run
        .lines()
        .iter()
        .filter(|l| l.contains("aborting the Kafka transaction"))
        .count();
    assert!(
        aborts >= 1,
        "each answered-then-panicked attempt aborts: {}",
        run.tail(40)
    );
    run.stop(Duration::from_secs(20)).await;
    let charged: HashSet<String> = stack
        .ledger()
        .into_iter()
        .map(|e| e.idempotency_key)
        .collect();
    assert_eq!(
        charged,
        keys.iter().cloned().collect(),
        "one charge per key"
    );
    stack.assert_books_balance().await;
}

/// A principal without permission on its transactional id: the refusal at start is
/// a fatal broker error (exit 4, as the consumer's authorisation errors are), not a
/// plain failure that hints at brokers without transactions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_id_the_broker_refuses_ends_the_start_with_a_fatal_error() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    stack.kafka.cluster().request_errors(
        RDKafkaApiKey::InitProducerId,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED],
    );
    let settings = stack.settings.clone();
    let refused = tokio::task::spawn_blocking(move || {
        Transactions::start(&settings, &exactly_once_settings()).err()
    })
    .await
    .unwrap()
    .expect("the start is refused");
    assert_eq!(payment_worker::cli::exit_code(&refused), 4, "{refused:#}");
    assert!(
        format!("{refused:#}").contains("initialising Kafka transactions"),
        "{refused:#}"
    );
}
