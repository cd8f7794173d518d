//! Both token stores under production-like load: three `run` processes with the default
//! in-flight bound (32 per partition), 3,000 commands with 25% duplicates, and the
//! faults of each store: SIGKILLs with the Postgres token store; Redis paused twice
//! (`CLIENT PAUSE`, on a private Redis so the machine's shared one is left alone)
//! with the Redis store. Each run ends with nothing left `processing`, the books of
//! books balanced, `audit` clean, and no pool acquire timeout in any log.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use payment_worker::operator;
use payment_worker::operator::{WorkloadRecord, WorkloadSpec};
use payment_worker::worker::ResultRecord;

use crate::support::helpers::{unique, TestDb};
use crate::support::procs::Proc;
use crate::support::tokens::pg_token_statuses;

use crate::support::books::*;
use crate::support::deployment::*;

const COMMANDS: usize = 3000;

enum Strike {
    /// SIGKILL this worker slot, restart it a second later.
    Kill(usize),
    /// `CLIENT PAUSE 2000` on the Redis at this URL.
    PauseRedis(String),
}

/// Every line any worker printed, the killed ones' included.
struct Logs(Vec<String>);

impl Logs {
    fn pool_timeouts(&self) -> Vec<&String> {
        self.0
            .iter()
            .filter(|l| {
                let l = l.to_ascii_lowercase();
                l.contains("pool timed out") || l.contains("pooltimedout")
            })
            .take(5)
            .collect()
    }
}

fn workload(prefix: &str) -> Vec<WorkloadRecord> {
    operator::generate(
        &WorkloadSpec {
            count: COMMANDS,
            duplicate_ratio: 0.25,
            invalid_ratio: 0.02,
            decline_ratio: 0.05,
            seed: 11,
        },
        &unique(prefix),
    )
}

/// Starts the workers, publishes `records` paced, strikes at evenly spread points of
/// the run, and waits until every command is answered and committed. Returns the
/// results and every worker's output.
async fn run_with_strikes(
    deployment: &mut Deployment,
    records: &[WorkloadRecord],
    strikes: &[Strike],
) -> (Vec<ResultRecord>, Logs) {
    let mut logs = Vec::new();
    deployment.start_workers();
    deployment
        .wait_for_stable_group(Duration::from_secs(90))
        .await;
    let producer = deployment.produce_paced(records, 60);
    for (index, strike) in strikes.iter().enumerate() {
        let at = records.len() * (index + 1) / (strikes.len() + 2);
        let deadline = Instant::now() + Duration::from_secs(240);
        loop {
            deployment.assert_workers_running();
            let done = answered(&deployment.results().await);
            if done >= at {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "only {done} of {at} answered before strike {index}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        match strike {
            Strike::Kill(slot) => {
                deployment.kill(*slot);
                logs.extend(deployment.workers[*slot].lines());
                tokio::time::sleep(Duration::from_secs(1)).await;
                deployment.restart(*slot);
                eprintln!("stores: SIGKILL slot {slot} at {at} answered");
            }
            Strike::PauseRedis(url) => {
                let client = redis::Client::open(url.as_str()).unwrap();
                let mut conn = client.get_multiplexed_async_connection().await.unwrap();
                let _: () = redis::cmd("CLIENT")
                    .arg("PAUSE")
                    .arg(2000)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                eprintln!("stores: Redis paused for 2 s at {at} answered");
                tokio::time::sleep(Duration::from_millis(2500)).await;
            }
        }
    }
    producer.await.unwrap();
    let results = deployment
        .wait_until_settled(records.len(), HashMap::new(), Duration::from_secs(300))
        .await;
    // SIGTERM: drain, commit, leave; their whole output is kept.
    logs.extend(deployment.stop_workers().await);
    (results, Logs(logs))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_workers_on_the_postgres_token_store_survive_two_sigkills_with_no_pool_timeout() {
    let started = Instant::now();
    let db = TestDb::new().await;
    let mut deployment = Deployment::start(
        PARTITIONS,
        &db.url,
        &unique("unused"),
        &[
            "--ignore-idempotency-key",
            "--error-rate",
            "0.02",
            // Every charge holds its transaction's connection for a while.
            "--latency-ms",
            "20",
            "--seed",
            "11",
        ],
        // The worker's defaults: 48 payment connections, 32 in flight per partition;
        // the purge runs more often than its default 30 s to finish within the run.
        &[
            ("TOKEN_STORE", "postgres"),
            ("DATABASE_MAX_CONNECTIONS", "48"),
            ("TOKEN_PURGE_INTERVAL", "2s"),
            ("TOKEN_PURGE_BATCH", "500"),
        ],
    )
    .await;
    // Dead rows from an earlier life of the table: the workers' purge removes them.
    sqlx::query(
        "INSERT INTO idempotency_tokens (key, status, fence, expires_at, payment_id, fingerprint)
         SELECT 'dead-' || g, 'completed', 1, now() - interval '1 day', gen_random_uuid(), 'fp'
           FROM generate_series(1, 20000) AS g",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let records = workload("pgstore");
    let (results, logs) = run_with_strikes(
        &mut deployment,
        &records,
        &[Strike::Kill(1), Strike::Kill(2)],
    )
    .await;

    let timeouts = logs.pool_timeouts();
    assert!(timeouts.is_empty(), "pool acquire timeouts: {timeouts:?}");
    let dead: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idempotency_tokens WHERE key LIKE 'dead-%'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(dead, 0, "the workers purged every expired row");
    let tokens = pg_token_statuses(&db.pool).await;
    deployment
        .check_end_of_run(&db.pool, &records, &results, &tokens)
        .await;
    let repeated = by_position(&results)
        .values()
        .filter(|l| l.len() > 1)
        .count();
    eprintln!(
        "stores: postgres token store, 2 SIGKILLs: {} results for {} commands ({repeated} answered again), \
         {} payments under a later reservation; {:?}",
        results.len(),
        records.len(),
        later_reservations(&db.pool).await,
        started.elapsed()
    );
}

/// A Redis server of this test's own: `CLIENT PAUSE` stops every client of a server.
struct PrivateRedis {
    process: Proc,
    url: String,
}

impl PrivateRedis {
    async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut command = std::process::Command::new("redis-server");
        command.args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]);
        let mut process = Proc::spawn("redis", command);
        process
            .wait_for(Duration::from_secs(20), |l| {
                l.contains("Ready to accept connections").then_some(())
            })
            .await;
        Self {
            process,
            url: format!("redis://127.0.0.1:{port}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_workers_on_a_redis_paused_twice_leave_no_token_stuck() {
    let started = Instant::now();
    let db = TestDb::new().await;
    let redis = PrivateRedis::start().await;
    let prefix = unique("pause");
    let mut deployment = Deployment::start(
        PARTITIONS,
        &db.url,
        &prefix,
        &["--error-rate", "0.02", "--latency-ms", "5", "--seed", "12"],
        &[("REDIS_URL", redis.url.as_str())],
    )
    .await;
    let records = workload("paused");
    let (results, logs) = run_with_strikes(
        &mut deployment,
        &records,
        &[
            Strike::PauseRedis(redis.url.clone()),
            Strike::Kill(0),
            Strike::PauseRedis(redis.url.clone()),
        ],
    )
    .await;

    let mut conn = crate::support::helpers::observer_connection(redis.url.as_str()).await;
    let tokens = token_statuses(&mut conn, &prefix).await;
    deployment
        .check_end_of_run(&db.pool, &records, &results, &tokens)
        .await
        .assert_clean_without_warnings();
    let retried = logs
        .0
        .iter()
        .filter(|l| l.contains("failed; trying again"))
        .count();
    eprintln!(
        "stores: redis paused twice + 1 SIGKILL: {} results for {} commands, {retried} confirm/restore retries; {:?}",
        results.len(),
        records.len(),
        started.elapsed()
    );
    drop(redis.process);
}
