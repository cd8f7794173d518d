//! One of three worker processes SIGKILLed mid-run and restarted later.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use payment_worker::operator;
use payment_worker::operator::WorkloadSpec;

use crate::support::helpers::{unique, TestDb, TestRedis};

use crate::support::books::*;
use crate::support::deployment::*;

// ---------------------------------------------------------------------------

/// SIGKILL one of three worker processes mid-run, restart it later.
///
/// The simulator ignores idempotency keys here, so a second POST for a key would
/// be a second ledger entry: "charged once" is observed, not granted by the gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_process_killed_mid_run_loses_nothing_and_charges_nothing_twice() {
    let started = Instant::now();
    let db = TestDb::new().await;
    let mut redis = TestRedis::new().await;
    let mut deployment = Deployment::start(
        PARTITIONS,
        &db.url,
        &redis.prefix,
        &[
            "--ignore-idempotency-key",
            "--error-rate",
            "0.02",
            "--latency-ms",
            "5",
            "--seed",
            "4",
        ],
        &[],
    )
    .await;
    let spec = WorkloadSpec {
        count: 2000,
        duplicate_ratio: 0.25,
        invalid_ratio: 0.05,
        decline_ratio: 0.05,
        seed: 44,
    };
    let records = operator::generate(&spec, &unique("mp"));

    deployment.start_workers();
    deployment
        .wait_for_stable_group(Duration::from_secs(90))
        .await;

    // The workload arrives over several seconds, so the kill lands while commands
    // are still coming in and in flight.
    let producer = deployment.produce_paced(&records, 50);

    let victim = 1;
    let deadline = Instant::now() + Duration::from_secs(120);
    let at_kill = loop {
        deployment.assert_workers_running();
        let done = answered(&deployment.results().await);
        if done >= 400 {
            break done;
        }
        assert!(Instant::now() < deadline, "only {done} commands answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    deployment.kill(victim);
    assert!(
        at_kill < records.len(),
        "the kill came mid-run ({at_kill} of {} answered)",
        records.len()
    );

    // The survivors take over once the dead member's session expired; then restart.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        deployment.assert_workers_running_except(Some(victim));
        let done = answered(&deployment.results().await);
        if done >= (at_kill + 600).min(records.len()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the survivors did not go on ({done} answered)"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    deployment.restart(victim);
    producer.await.unwrap();

    let results = deployment
        .wait_until_settled(records.len(), HashMap::new(), Duration::from_secs(180))
        .await;
    deployment.stop_workers().await;

    let held = deployment.holdings(&db.pool).await;
    let tokens = token_statuses(&mut redis.conn, &redis.prefix).await;
    held.check(&records, &results, &tokens);
    let ledger = held.ledger;
    let repeated = by_position(&results)
        .values()
        .filter(|l| l.len() > 1)
        .count();
    eprintln!(
        "kill one: 1 SIGKILL at {at_kill} answered; {} results for {} commands ({repeated} answered again), \
         {} charges, {} payments under a later reservation; {:?}",
        results.len(),
        records.len(),
        ledger.len(),
        later_reservations(&db.pool).await,
        started.elapsed()
    );
    flush_prefix(&mut redis.conn, &redis.prefix).await;
}
