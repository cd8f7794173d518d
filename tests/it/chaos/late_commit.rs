//! `--results exactly-once` when the transaction coordinator answers a commit only
//! after the worker stopped waiting (a slow or overloaded coordinator). librdkafka
//! then keeps the commit pending and refuses every abort, so the member can neither
//! answer nor redo anything: it must end (exit 4) rather than hold its partitions
//! while looking healthy. The broker did end the transaction, so its answers and
//! offsets are committed; the next member goes on from there without answering any
//! command twice.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use payment_worker::configuration::KafkaSettings;
use payment_worker::operator::{self, WorkloadSpec};

use crate::support::answers::assert_one_answer_per_command;
use crate::support::books::*;
use crate::support::deployment::*;
use crate::support::helpers::{unique, TestDb, TestRedis};
use crate::support::txn_broker;

const LATE_PARTITIONS: i32 = 3;
const COUNT: usize = 300;
/// Each of the txn-broker's brokers answers one commit late once armed; a member
/// whose coordinator still holds its late answer ends the same way.
const BROKERS: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_commit_answered_after_the_worker_stopped_waiting_ends_it_and_nothing_is_answered_twice()
{
    let db = TestDb::new().await;
    let mut redis = TestRedis::new().await;
    let topics = KafkaSettings::local(String::new(), String::new());
    let kafka = txn_broker::start(LATE_PARTITIONS, &topics).await;
    let mut deployment = Deployment::start_on(
        kafka,
        LATE_PARTITIONS,
        &db.url,
        &redis.prefix,
        &["--seed", "9"],
        &[("RESULTS_MODE", "exactly-once")],
    )
    .await;
    let spec = WorkloadSpec {
        count: COUNT,
        duplicate_ratio: 0.2,
        invalid_ratio: 0.02,
        decline_ratio: 0.05,
        seed: 9,
    };
    let records = operator::generate(&spec, &unique("late"));
    let (before, after) = records.split_at(COUNT / 2);
    deployment.add_worker();
    deployment
        .wait_for_stable_group(Duration::from_secs(60))
        .await;

    // The first half answered and committed as usual.
    deployment.produce_paced(before, 50).await.unwrap();
    deployment
        .wait_until_settled(before.len(), HashMap::new(), Duration::from_secs(120))
        .await;

    // Armed: the next commit each coordinator handles is answered 30 s late, past
    // the worker's 10 s wait for it.
    let broker = deployment.kafka_process();
    broker.signal(Signal::SIGUSR1);
    broker
        .wait_for(Duration::from_secs(10), |line| {
            line.contains("txn-broker late commits armed").then_some(())
        })
        .await;
    deployment.produce_paced(after, 50).await.unwrap();
    let mut first = deployment.workers.remove(0);
    let status = first.wait_exit(Duration::from_secs(90)).await;
    assert_eq!(
        status.code(),
        Some(4),
        "a member whose commit is left pending must end as fatal:\n{}",
        first.tail(40)
    );
    assert!(
        first
            .lines()
            .iter()
            .any(|l| l.contains("could not then be rolled back")),
        "it says why:\n{}",
        first.tail(40)
    );

    // Members take over until every command is answered; one whose coordinator still
    // holds a late answer ends the same way (each broker answers one commit late).
    let mut ended = 1;
    let ends = deployment
        .high_watermarks(&deployment.settings.commands_topic.clone())
        .await;
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        if deployment.workers.is_empty() {
            deployment.add_worker();
        }
        if deployment.committed().await == ends {
            break;
        }
        if let Some(status) = deployment.workers[0].exit_status() {
            let worker = deployment.workers.remove(0);
            assert_eq!(status.code(), Some(4), "{}", worker.tail(40));
            ended += 1;
            assert!(
                ended <= BROKERS,
                "more members ended than late answers were armed"
            );
        }
        assert!(
            Instant::now() < deadline,
            "the commands were never all answered"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let visible = deployment
        .wait_until_settled(records.len(), HashMap::new(), Duration::from_secs(60))
        .await;
    deployment.stop_workers().await;

    // One visible result per command, the books balance, one charge per key.
    assert_one_answer_per_command(&visible, records.len());
    let held = deployment.holdings(&db.pool).await;
    let tokens = token_statuses(&mut redis.conn, &redis.prefix).await;
    held.check(&records, &visible, &tokens);
    eprintln!("late commit: {ended} member(s) ended with exit 4");
    flush_prefix(&mut redis.conn, &redis.prefix).await;
}
