//! The refund race (`support/refund_race.rs`) against localstripe, which ignores
//! `Idempotency-Key` and refunds past a charge without refusing: a refund sent twice
//! or too much would show in its refunds. Three workers with `--gateway stripe`, a
//! SIGKILL, a Redis flush, a replay from offset 0.

use crate::support::helpers::{TestDb, TestRedis};
use crate::support::refund_race::{refund_race, Refusals};
use crate::support::stripe::localstripe_deployment;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refunds_racing_against_localstripe_with_a_kill_and_a_flush_never_pass_the_charge() {
    let db = TestDb::new().await;
    let mut redis = TestRedis::new().await;
    let (mut deployment, _url, key_file) = localstripe_deployment(&db, &redis).await;
    refund_race(&mut deployment, &db, &mut redis, 20, Refusals::NotKept).await;
    let _ = std::fs::remove_file(&key_file);
}
