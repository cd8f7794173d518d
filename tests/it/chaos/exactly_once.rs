//! `--results exactly-once` on a broker that carries out Kafka transactions
//! (`txn-broker`, see `support::txn_broker`): three worker processes, SIGKILLs and
//! forced rebalances while commands flow, then what a `read_committed` reader of the
//! results topic sees. The same run in at-least-once mode shows the repeats that
//! exactly-once removes. A zombie (SIGSTOP past its session) is fenced.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use payment_worker::configuration::KafkaSettings;
use payment_worker::operator::{self, WorkloadSpec};
use payment_worker::worker::ResultRecord;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::support::answers::assert_one_answer_per_command;
use crate::support::books::*;
use crate::support::deployment::*;
use crate::support::helpers::{read_topic, result_records, unique, TestDb, TestRedis};
use crate::support::procs::{current_membership, Membership};
use crate::support::txn_broker;

const COMMANDS: usize = 2000;
const KILLS: usize = 8;
/// After the kill of these rounds a fourth worker joins and, once it works, leaves
/// (SIGTERM): two forced rebalances on top of those the kills cause.
const REBALANCE_ROUNDS: [usize; 2] = [2, 5];
/// A transaction a SIGKILL left open holds the results' last stable offset back
/// until the broker aborts it, this long after it began.
const TRANSACTION_TIMEOUT_MS: &str = "10000";

/// What a run left behind, its books already checked.
struct Run {
    /// How many commands the run published.
    commands: usize,
    /// What a `read_committed` reader of the results topic gets.
    visible: Vec<ResultRecord>,
    /// Every result record written, aborted transactions included.
    written: Vec<ResultRecord>,
    /// Dead letters a `read_committed` reader gets: (partition, offset) of their command.
    visible_dead_letters: Vec<Position>,
}

fn topics() -> KafkaSettings {
    KafkaSettings::local(String::new(), String::new())
}

/// Reads `topic` as a `read_uncommitted` reader: aborted and open transactions too.
async fn read_uncommitted(deployment: &Deployment, topic: &str) -> Vec<ResultRecord> {
    result_records(&read_topic(&deployment.settings, topic, "read_uncommitted").await)
}

/// Every `duplicate` carries the original answer, as the payment row records it.
fn check_originals(results: &[ResultRecord], rows: &HashMap<String, PaymentRow>) {
    for result in results.iter().filter(|r| r.outcome == "duplicate") {
        let key = result
            .idempotency_key
            .as_deref()
            .expect("a duplicate has a key");
        let row = &rows[key];
        let original = result
            .original
            .as_ref()
            .unwrap_or_else(|| panic!("a duplicate without the original answer: {result:?}"));
        assert_eq!(original.outcome, row.status, "{result:?}");
        assert_eq!(original.payment_id, row.id, "{result:?}");
        assert_eq!(
            original.gateway_transaction_id, row.transaction_id,
            "{result:?}"
        );
    }
}

/// A fourth worker joins, gets partitions, and leaves with SIGTERM.
async fn force_rebalance(deployment: &mut Deployment) {
    deployment.add_worker();
    deployment
        .wait_for_stable_group(Duration::from_secs(90))
        .await;
    let mut extra = deployment.workers.pop().expect("the fourth worker");
    extra.stop(Duration::from_secs(60)).await;
}

/// 2,000 commands (25 % duplicates) through three workers on the txn-broker, with
/// eight SIGKILLs at random moments of the processing and two forced rebalances;
/// settles, stops the workers and checks the books.
async fn run_with_kills_and_rebalances(mode: &str) -> Run {
    let started = Instant::now();
    let db = TestDb::new().await;
    let mut redis = TestRedis::new().await;
    let kafka = txn_broker::start(PARTITIONS, &topics()).await;
    let mut deployment = Deployment::start_on(
        kafka,
        PARTITIONS,
        &db.url,
        &redis.prefix,
        // Errors and late answers make some charges retry while later commands of
        // their partition finish: the kills find answers whose offsets could not
        // be committed yet.
        &[
            "--latency-ms",
            "30",
            "--error-rate",
            "0.05",
            "--decline-rate",
            "0.05",
            "--timeout-after-charge-rate",
            "0.02",
            "--late-by-ms",
            "1500",
            "--seed",
            "15",
        ],
        &[
            ("GATEWAY_TIMEOUT", "500ms"),
            ("RESULTS_MODE", mode),
            (
                "KAFKA_CONFIG_TRANSACTION_TIMEOUT_MS",
                TRANSACTION_TIMEOUT_MS,
            ),
        ],
    )
    .await;
    let spec = WorkloadSpec {
        count: COMMANDS,
        duplicate_ratio: 0.25,
        invalid_ratio: 0.05,
        decline_ratio: 0.05,
        seed: 1515,
    };
    let records = operator::generate(&spec, &unique("eos"));
    let mut rng = StdRng::seed_from_u64(1515);

    deployment.start_workers();
    let results_topic = deployment.settings.results_topic.clone();
    for (round, share) in records.chunks(records.len().div_ceil(KILLS)).enumerate() {
        let fraction = rng.random_range(0.2..0.6);
        let strike_at = deployment.publish_until(share, fraction).await;
        let victim = rng.random_range(0..WORKERS);
        deployment.kill(victim);
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..1500))).await;
        deployment.restart(victim);
        if REBALANCE_ROUNDS.contains(&round) {
            force_rebalance(&mut deployment).await;
        }
        eprintln!(
            "{mode}: round {round}: SIGKILL of slot {victim} at {strike_at} results{}; {:?}",
            if REBALANCE_ROUNDS.contains(&round) {
                ", then a worker joined and left"
            } else {
                ""
            },
            started.elapsed()
        );
    }
    assert_eq!(deployment.kills, KILLS);

    // Committed offsets at the end of every partition, every position answered.
    let visible = deployment
        .wait_until_settled(records.len(), HashMap::new(), Duration::from_secs(240))
        .await;
    deployment.stop_workers().await;

    let written = read_uncommitted(&deployment, &results_topic).await;
    let held = deployment.holdings(&db.pool).await;
    let tokens = token_statuses(&mut redis.conn, &redis.prefix).await;
    held.check(&records, &visible, &tokens);
    check_originals(&visible, &held.rows);
    let visible_dead_letters = held.dead_letters.iter().map(source_position).collect();
    eprintln!(
        "{mode}: {} commands, {KILLS} SIGKILLs, 2 forced rebalances: {} results visible \
         ({} positions answered more than once), {} written, {} charges; {:?}",
        records.len(),
        visible.len(),
        by_position(&visible)
            .values()
            .filter(|a| a.len() > 1)
            .count(),
        written.len(),
        held.ledger.len(),
        started.elapsed()
    );
    flush_prefix(&mut redis.conn, &redis.prefix).await;
    Run {
        commands: records.len(),
        visible,
        written,
        visible_dead_letters,
    }
}

/// Exactly-once through eight SIGKILLs and two forced rebalances: a
/// `read_committed` reader sees exactly one result per command position (and one
/// dead letter per invalid command), each duplicate with the original answer; the
/// gateway charged each key once; the committed offsets reach the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_once_gives_every_command_one_visible_result_through_kills_and_rebalances() {
    let run = run_with_kills_and_rebalances("exactly-once").await;
    assert_one_answer_per_command(&run.visible, run.commands);
    let mut lettered: HashMap<Position, usize> = HashMap::new();
    for position in &run.visible_dead_letters {
        *lettered.entry(*position).or_default() += 1;
    }
    lettered.retain(|_, count| *count > 1);
    assert!(
        lettered.is_empty(),
        "dead-lettered more than once: {lettered:?}"
    );
    // The kills did cut transactions short: the topic holds answers that no
    // `read_committed` reader is given.
    assert!(
        run.written.len() > run.visible.len(),
        "no aborted answer: {} written, {} visible",
        run.written.len(),
        run.visible.len()
    );
}

/// The same run in at-least-once mode: commands answered again after the kills,
/// every repeat a `duplicate` carrying the original answer (the books and
/// `check_originals` in the run check those).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn at_least_once_answers_again_after_kills_and_every_repeat_carries_the_original() {
    let run = run_with_kills_and_rebalances("at-least-once").await;
    let repeated = by_position(&run.visible)
        .values()
        .filter(|answers| answers.len() > 1)
        .count();
    assert!(
        repeated > 0,
        "{KILLS} SIGKILLs mid-run and no command answered twice: the run cannot tell the modes apart"
    );
    assert_eq!(
        run.written.len(),
        run.visible.len(),
        "at-least-once writes no transactions to abort"
    );
}

/// A worker frozen (SIGSTOP) past its session timeout while answers wait in its
/// open transaction: the group moves its partitions to another worker, which
/// answers the commands again (as duplicates: they were charged). When the zombie
/// wakes (SIGCONT) its transaction is fenced: a `read_committed` reader never sees
/// what it produced, and nothing is charged twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_zombie_past_its_session_is_fenced_and_nothing_it_produced_becomes_visible() {
    const ZOMBIE_PARTITIONS: i32 = 3;
    const COUNT: usize = 60;
    let db = TestDb::new().await;
    let mut redis = TestRedis::new().await;
    let kafka = txn_broker::start(ZOMBIE_PARTITIONS, &topics()).await;
    let mut deployment = Deployment::start_on(
        kafka,
        ZOMBIE_PARTITIONS,
        &db.url,
        &redis.prefix,
        &["--seed", "7"],
        &[
            ("RESULTS_MODE", "exactly-once"),
            // The zombie's transaction stays open across the freeze: it is the
            // group generation that fences it, not the broker's timeout. (The
            // interval must stay below that timeout, or the worker refuses to start.)
            ("KAFKA_CONFIG_TRANSACTION_TIMEOUT_MS", "120000"),
            ("TRANSACTION_INTERVAL", "110s"),
            ("TRANSACTION_MAX_RECORDS", "100000"),
        ],
    )
    .await;
    let spec = WorkloadSpec {
        count: COUNT,
        duplicate_ratio: 0.0,
        invalid_ratio: 0.0,
        decline_ratio: 0.0,
        seed: 7,
    };
    let records = operator::generate(&spec, &unique("zombie"));
    let results_topic = deployment.settings.results_topic.clone();

    // The zombie-to-be answers every command inside one open transaction.
    deployment.add_worker();
    deployment
        .wait_for_stable_group(Duration::from_secs(60))
        .await;
    deployment.produce_paced(&records, 60).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while read_uncommitted(&deployment, &results_topic).await.len() < COUNT {
        assert!(Instant::now() < deadline, "the first worker did not answer");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(deployment.ledger().await.len(), COUNT);
    deployment.workers[0].signal(Signal::SIGSTOP);

    // A second worker, committing as usual, takes every partition once the
    // zombie's session expired, and answers the commands again.
    deployment
        .worker_env
        .insert("TRANSACTION_INTERVAL".into(), "100ms".into());
    deployment.add_worker();
    let deadline = Instant::now() + Duration::from_secs(60);
    while current_membership(&deployment.workers[1])
        != Some(Membership::Assigned(ZOMBIE_PARTITIONS as usize))
    {
        assert!(
            Instant::now() < deadline,
            "the second worker never took over"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ends = deployment
        .high_watermarks(&deployment.settings.commands_topic.clone())
        .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while deployment.committed().await != ends {
        assert!(
            Instant::now() < deadline,
            "the second worker did not commit its answers"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The zombie wakes with its transaction still open.
    deployment.workers[0].signal(Signal::SIGCONT);
    let deadline = Instant::now() + Duration::from_secs(60);
    let visible = loop {
        // Until the zombie's transaction ends, it holds the last stable offset back.
        let visible: Vec<ResultRecord> = deployment.results().await;
        if visible.len() >= COUNT {
            break visible;
        }
        assert!(
            Instant::now() < deadline,
            "only {} results visible after the zombie woke",
            visible.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let written = read_uncommitted(&deployment, &results_topic).await;
    let rows = payment_rows(&db.pool).await;

    for (position, answer) in assert_one_answer_per_command(&visible, COUNT) {
        assert_eq!(
            answer.outcome, "duplicate",
            "the zombie's first answer became visible: {position:?} {answer:?}"
        );
    }
    check_originals(&visible, &rows);
    let first_answers = written.iter().filter(|r| r.outcome != "duplicate").count();
    assert_eq!(
        first_answers, COUNT,
        "the zombie wrote its first answers, which stay invisible"
    );
    let ledger = deployment.ledger().await;
    assert_eq!(ledger.len(), COUNT, "one charge per key");

    // The zombie may have ended on the fencing (exit 4) or rejoined: either way it
    // goes now; the second worker stops as usual.
    let mut zombie = deployment.workers.remove(0);
    zombie.sigkill();
    deployment.stop_workers().await;
    flush_prefix(&mut redis.conn, &redis.prefix).await;
}
