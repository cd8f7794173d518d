//! A backlog drained by three `run` processes: every admitted payment gets its
//! database connection without waiting it out, and every command is answered.
//! Counts, not timings.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use payment_worker::operator;
use payment_worker::operator::WorkloadSpec;

use crate::support::helpers::{unique, TestDb, TestRedis};

use crate::support::books::*;
use crate::support::deployment::*;

const COMMANDS: usize = 5_000;

/// 5,000 commands wait on the topic (a quarter of them duplicates, half of those on
/// another partition than their original) before three workers start together,
/// against a 20 ms gateway. No worker logs a pool timeout or a payment left without
/// a connection, every command position is answered, every key is charged exactly
/// once and every duplicate answered as one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_workers_drain_a_backlog_without_waiting_for_connections() {
    let db = TestDb::new().await;
    let mut redis = TestRedis::new().await;
    let spec = WorkloadSpec {
        count: COMMANDS,
        duplicate_ratio: 0.25,
        invalid_ratio: 0.0,
        decline_ratio: 0.0,
        seed: 35,
    };
    let records = operator::generate(&spec, &unique("backlog"));
    let keys: HashSet<Vec<u8>> = records.iter().filter_map(|r| r.key.clone()).collect();
    let cross_partition = records
        .iter()
        .filter(|r| r.partition_hint.is_some())
        .count();
    assert!(
        keys.len() < COMMANDS && cross_partition > 0,
        "the backlog holds duplicates, some on another partition"
    );

    let mut deployment = Deployment::start(
        3,
        &db.url,
        &redis.prefix,
        &["--latency-ms", "20"],
        &[("RUST_LOG", "info")],
    )
    .await;
    deployment
        .produce_paced(&records, records.len())
        .await
        .unwrap();
    deployment.start_workers();
    let results = deployment
        .wait_until_settled(COMMANDS, HashMap::new(), Duration::from_secs(240))
        .await;
    let logs: Vec<(String, Vec<String>)> = deployment
        .workers
        .iter()
        .map(|w| (w.name.clone(), w.lines()))
        .collect();
    deployment.stop_workers().await;

    for (name, lines) in &logs {
        let waited: Vec<&String> = lines
            .iter()
            .filter(|l| l.contains("pool timed out") || l.contains("no payment-pool connection"))
            .collect();
        assert!(
            waited.is_empty(),
            "{name} had payments waiting for a connection: {waited:#?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.contains("payments run at most one per payment-pool connection")),
            "{name} started its worker"
        );
    }
    let answered: HashSet<(i32, i64)> = results
        .iter()
        .map(|r| (r.source.partition, r.source.offset))
        .collect();
    assert_eq!(answered.len(), COMMANDS, "every command answered");
    let mut outcomes: HashMap<&str, usize> = HashMap::new();
    for result in &results {
        *outcomes.entry(result.outcome.as_str()).or_default() += 1;
    }
    let first_answers = answered.len();
    assert_eq!(
        outcomes.get("succeeded").copied().unwrap_or(0)
            + outcomes.get("duplicate").copied().unwrap_or(0),
        results.len(),
        "only payments and duplicates: {outcomes:?} over {first_answers} positions"
    );
    let ledger = deployment.ledger().await;
    let charged: HashSet<&str> = ledger.iter().map(|e| e.idempotency_key.as_str()).collect();
    assert_eq!(ledger.len(), keys.len(), "each key charged once");
    assert_eq!(charged.len(), keys.len());
    let held = deployment.holdings(&db.pool).await;
    let tokens = token_statuses(&mut redis.conn, &redis.prefix).await;
    held.check(&records, &results, &tokens);
    flush_prefix(&mut redis.conn, &redis.prefix).await;
}
