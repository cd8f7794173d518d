//! `replay --to-beginning` right after every worker was SIGKILLed: the group still
//! lists the dead members until their session timeout passed, so the replay must
//! wait them out (or say why it cannot), then rewind the group; the workers started
//! again answer every command a second time without charging anything.

use std::collections::HashMap;
use std::time::Duration;

use payment_worker::operator;
use payment_worker::operator::WorkloadSpec;

use crate::support::books::*;
use crate::support::deployment::*;
use crate::support::helpers::{unique, TestDb, TestRedis};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replay_right_after_the_workers_were_killed_waits_out_their_sessions_and_rewinds() {
    let db = TestDb::new().await;
    let mut redis = TestRedis::new().await;
    let mut deployment = Deployment::start(
        PARTITIONS,
        &db.url,
        &redis.prefix,
        &[
            "--ignore-idempotency-key",
            "--latency-ms",
            "5",
            "--seed",
            "38",
        ],
        &[],
    )
    .await;
    let spec = WorkloadSpec {
        count: 300,
        duplicate_ratio: 0.1,
        invalid_ratio: 0.05,
        decline_ratio: 0.05,
        seed: 38,
    };
    let records = operator::generate(&spec, &unique("rk"));
    deployment.start_workers();
    deployment
        .wait_for_stable_group(Duration::from_secs(90))
        .await;
    deployment.produce_paced(&records, 50).await.unwrap();
    let first_pass = deployment
        .wait_until_settled(records.len(), HashMap::new(), Duration::from_secs(180))
        .await;

    // No drain, no commit, no LeaveGroup: the group keeps the three members until
    // their sessions expire on the broker.
    deployment.assert_workers_running();
    for worker in &mut deployment.workers {
        worker.sigkill();
    }
    let ledger_before = deployment.ledger().await;
    let results_end = deployment
        .high_watermarks(&deployment.settings.results_topic.clone())
        .await;
    let (status, output) = deployment.replay_to_beginning().await;
    assert!(status.success(), "replay failed:\n{}", output.join("\n"));
    let rewound = deployment.committed().await;
    assert!(
        rewound.values().all(|o| *o == 0),
        "the group starts over at 0: {rewound:?}"
    );

    deployment.workers.clear();
    deployment.start_workers();
    let replayed = deployment
        .wait_until_settled(records.len(), results_end, Duration::from_secs(180))
        .await;
    deployment.stop_workers().await;

    let held = deployment.holdings(&db.pool).await;
    assert_eq!(held.ledger, ledger_before, "the replay reached the gateway");
    for (position, answers) in by_position(&replayed) {
        let outcome_ok = match &held.expected[&position] {
            Expected::Valid { .. } => answers.iter().all(|a| a.outcome == "duplicate"),
            Expected::Invalid { .. } => answers.iter().all(|a| a.outcome == "rejected"),
        };
        assert!(outcome_ok, "replayed {position:?} answered {answers:?}");
    }
    let mut results = first_pass;
    results.extend(replayed);
    let tokens = token_statuses(&mut redis.conn, &redis.prefix).await;
    held.check(&records, &results, &tokens);
    eprintln!(
        "replay after kill: {} commands, {} charges, replay output: {}",
        records.len(),
        held.ledger.len(),
        output.join(" | ")
    );
    flush_prefix(&mut redis.conn, &redis.prefix).await;
}
