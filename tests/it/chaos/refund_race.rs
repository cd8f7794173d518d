//! Refunds racing under different keys for the same payments through a group of
//! worker processes and the gateway simulator (without idempotency: a second POST
//! under one key would be a second refund), with a SIGKILL, a Redis flush and a
//! replay (`support/refund_race.rs`).

use crate::support::deployment::*;
use crate::support::helpers::{TestDb, TestRedis};
use crate::support::refund_race::{refund_race, Refusals};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refunds_racing_across_keys_workers_a_kill_and_a_redis_flush_never_pass_the_charge() {
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
            "9",
        ],
        &[],
    )
    .await;
    refund_race(&mut deployment, &db, &mut redis, 40, Refusals::Listed).await;
}
