//! Three `payment-worker run` processes with `--gateway stripe` against
//! localstripe (which ignores `Idempotency-Key`: a second PaymentIntent for a key
//! would be a second one, visibly): two SIGKILLs and a Redis flush while commands
//! flow, then a replay of the whole topic. One succeeded PaymentIntent per key,
//! the books clean, and the replay makes none.

use std::collections::HashMap;
use std::time::Duration;

use payment_worker::operator::{self, WorkloadSpec};

use crate::support::books::*;
use crate::support::helpers::{unique, TestDb, TestRedis};
use crate::support::stripe::{localstripe_deployment, localstripe_intents};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_group_with_kills_and_a_redis_flush_makes_one_payment_intent_per_key_and_a_replay_none() {
    let db = TestDb::new().await;
    let mut redis = TestRedis::new().await;
    let (mut deployment, url, key_file) = localstripe_deployment(&db, &redis).await;
    // No declines: localstripe knows none of the workload's declining methods.
    let spec = WorkloadSpec {
        count: 300,
        duplicate_ratio: 0.25,
        invalid_ratio: 0.05,
        decline_ratio: 0.0,
        seed: 33,
    };
    let records = operator::generate(&spec, &unique("stripe-group"));
    deployment.start_workers();

    let thirds: Vec<_> = records.chunks(records.len().div_ceil(3)).collect();
    deployment.publish_until(thirds[0], 0.4).await;
    deployment.kill(0);
    deployment.restart(0);
    deployment.publish_until(thirds[1], 0.4).await;
    let flushed = flush_prefix(&mut redis.conn, &redis.prefix).await;
    assert!(flushed > 0, "Redis held tokens to lose");
    deployment.kill(2);
    deployment.restart(2);
    deployment.publish_until(thirds[2], 0.2).await;
    let first_pass = deployment
        .wait_until_settled(records.len(), HashMap::new(), Duration::from_secs(300))
        .await;

    deployment.stop_workers().await;
    let intents_before = localstripe_intents(&url).await.len();
    let results_end = deployment
        .high_watermarks(&deployment.settings.results_topic.clone())
        .await;
    deployment.rewind_to_beginning().await;
    deployment.start_workers();
    let replayed = deployment
        .wait_until_settled(records.len(), results_end, Duration::from_secs(180))
        .await;
    deployment.stop_workers().await;
    assert_eq!(
        localstripe_intents(&url).await.len(),
        intents_before,
        "the replay made no PaymentIntent"
    );

    // One succeeded PaymentIntent per key (the Stripe ledger says the same, below).
    let mut succeeded: HashMap<String, usize> = HashMap::new();
    for pi in localstripe_intents(&url).await {
        if pi["status"] == "succeeded" {
            let key = pi["metadata"]["idempotency_key"]
                .as_str()
                .unwrap_or_default();
            *succeeded.entry(key.to_owned()).or_default() += 1;
        }
    }
    let twice: Vec<_> = succeeded.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "keys charged twice: {twice:?}");

    let held = deployment.holdings(&db.pool).await;
    let mut results = first_pass;
    results.extend(replayed);
    let tokens = token_statuses(&mut redis.conn, &redis.prefix).await;
    held.check(&records, &results, &tokens);
    let _ = std::fs::remove_file(&key_file);
}
