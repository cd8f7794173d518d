//! A partition paused for back pressure and revoked while paused is consumed again
//! after the rebalance.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use payment_worker::operator;
use payment_worker::operator::WorkloadSpec;

use crate::support::helpers::{unique, TestDb, TestRedis};
use crate::support::procs::current_membership;

use crate::support::books::*;
use crate::support::deployment::*;

/// A worker pauses a partition when more records arrive than it can hold (back
/// pressure). librdkafka keeps that pause across a rebalance, so a partition revoked
/// while paused and assigned again must be resumed, or it stalls for good: nothing
/// processed, its offset never committed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partition_paused_for_back_pressure_is_consumed_again_after_a_rebalance() {
    let db = TestDb::new().await;
    let mut redis = TestRedis::new().await;
    let spec = WorkloadSpec {
        count: 1100,
        duplicate_ratio: 0.0,
        invalid_ratio: 0.0,
        decline_ratio: 0.0,
        seed: 3,
    };
    let records = operator::generate(&spec, &unique("pause"));
    // The first command's charge is held for 20 s and one command runs at a time, so
    // the rest pile up beyond what the worker holds and the partition is paused.
    let held = format!(
        "{}=20000",
        String::from_utf8(records[0].key.clone().unwrap()).unwrap()
    );
    let mut deployment = Deployment::start(
        1,
        &db.url,
        &redis.prefix,
        &["--slow-key", &held],
        &[
            ("MAX_IN_FLIGHT", "1"),
            ("GATEWAY_TIMEOUT", "60s"),
            // librdkafka's own log line is the only outside sign of a pause.
            ("KAFKA_CONFIG_DEBUG", "topic"),
            ("RUST_LOG", "info,librdkafka=debug"),
        ],
    )
    .await;
    deployment.add_worker();
    deployment
        .wait_for_stable_group(Duration::from_secs(60))
        .await;
    deployment
        .produce_paced(&records, records.len())
        .await
        .unwrap();
    deployment.workers[0]
        .wait_for(Duration::from_secs(60), |l| {
            l.contains("Application pausing").then_some(())
        })
        .await;

    // A second member joins (every partition is revoked, the paused one included)
    // and leaves again, so the first member owns the partition once more.
    deployment.add_worker();
    let deadline = Instant::now() + Duration::from_secs(60);
    while current_membership(&deployment.workers[1]).is_none() {
        deployment.assert_workers_running();
        assert!(Instant::now() < deadline, "the second member never joined");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut second = deployment.workers.pop().unwrap();
    second.stop(Duration::from_secs(30)).await;

    deployment
        .wait_until_settled(records.len(), HashMap::new(), Duration::from_secs(120))
        .await;
    deployment.stop_workers().await;
    assert_eq!(
        deployment.ledger().await.len(),
        records.len(),
        "every command charged"
    );
    flush_prefix(&mut redis.conn, &redis.prefix).await;
}
