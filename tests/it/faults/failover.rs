//! A Postgres failover mid-run: a primary with a synchronous streaming standby, and
//! a proxy standing for the read-write service endpoint that operators such as
//! CloudNativePG give clients (`<cluster>-rw`). While two workers process a paced
//! workload, the primary is stopped hard; the endpoint points at the standby while
//! it is still read-only (as a service does for a moment while its endpoints
//! change), then the standby is promoted and every connection that was open is
//! reset. Transactions open at that moment, COMMITs whose answer is lost, inserts
//! refused as read-only (SQLSTATE 25006) and the pool refilling: each handled, the
//! books balanced, `audit` clean.
//!
//! The standby applies each commit 150 ms late and the primary's COMMIT waits for
//! that (`synchronous_commit = remote_apply`), so many COMMITs are in flight when the
//! primary stops. With synchronous replication every acknowledged COMMIT is on the
//! standby, so a lost answer is the only unknown, and the next owner finds the row
//! (or, for a COMMIT the standby never received, looks the charge up). With
//! asynchronous replication a COMMIT the primary acknowledged can be missing after
//! the promotion: its token says `completed`, the gateway holds its charge, and no
//! row books it; `audit` reports that charge as unbooked (docs/OPERATIONS.md).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use payment_worker::configuration::DatabaseSettings;
use payment_worker::operator::{self, WorkloadSpec};
use sqlx::Connection;

use crate::support::books;
use crate::support::deployment::Deployment;
use crate::support::fault_proxy::{Fault, FaultProxy};
use crate::support::helpers::{observer_connection, unique, REDIS_URL};
use crate::support::procs::PrivatePostgres;

const PARTITIONS: i32 = 4;

async fn wait_for_sync_standby(primary: &sqlx::PgPool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let sync: Option<String> = sqlx::query_scalar(
            "SELECT sync_state FROM pg_stat_replication WHERE sync_state = 'sync' LIMIT 1",
        )
        .fetch_optional(primary)
        .await
        .unwrap();
        if sync.is_some() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the standby never became synchronous"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn promote(standby: &PrivatePostgres) {
    let admin = sqlx::PgPool::connect(&standby.url("postgres"))
        .await
        .unwrap();
    let promoted: bool = sqlx::query_scalar("SELECT pg_promote(true, 60)")
        .fetch_one(&admin)
        .await
        .unwrap();
    assert!(promoted, "the standby was not promoted");
    admin.close().await;
}

/// The retries the workers logged, by the start of their reason.
fn retry_reasons(lines: &[String]) -> std::collections::BTreeMap<String, usize> {
    let mut reasons = std::collections::BTreeMap::new();
    for line in lines.iter().filter(|l| l.contains("retrying command")) {
        let Ok(entry) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let reason = entry["fields"]["reason"].as_str().unwrap_or("?");
        let start: String = reason.split(':').next().unwrap_or(reason).to_owned();
        *reasons.entry(start).or_default() += 1;
    }
    reasons
}

/// Retries the workers logged because a COMMIT's outcome was unknown.
fn commit_outcomes_unknown(lines: &[String]) -> usize {
    lines
        .iter()
        .filter(|l| l.contains("retrying command") && l.contains("commit failed"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_postgres_failover_mid_run_loses_nothing_and_charges_nothing_twice() {
    let mut primary = PrivatePostgres::start().await;
    let database = unique("pw_failover");
    let settings = DatabaseSettings {
        max_connections: 2,
        ..DatabaseSettings::with_url(primary.url(&database))
    };
    let setup = payment_worker::startup::connect_and_migrate(&settings)
        .await
        .unwrap();
    // A standby that applies each commit 150 ms late, and a primary whose COMMIT
    // waits for that apply: many COMMITs are in flight when the primary stops, so
    // the run meets commit outcomes it cannot know, not only open transactions.
    let standby =
        PrivatePostgres::standby_of(&primary, &["recovery_min_apply_delay=150ms".to_owned()]).await;
    for setting in [
        "ALTER SYSTEM SET synchronous_standby_names = '*'",
        "ALTER SYSTEM SET synchronous_commit = 'remote_apply'",
    ] {
        sqlx::query(setting).execute(&setup).await.unwrap();
    }
    sqlx::query("SELECT pg_reload_conf()")
        .execute(&setup)
        .await
        .unwrap();
    wait_for_sync_standby(&setup).await;
    setup.close().await;
    // A reload reaches the server's processes a moment later: the run starts once a
    // new session commits the new way.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut session = sqlx::PgConnection::connect(&primary.url(&database))
            .await
            .unwrap();
        let mode: String = sqlx::query_scalar("SHOW synchronous_commit")
            .fetch_one(&mut session)
            .await
            .unwrap();
        if mode == "remote_apply" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "synchronous_commit stayed {mode}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let endpoint = FaultProxy::start(format!("127.0.0.1:{}", primary.port).parse().unwrap()).await;
    let endpoint_url = format!("postgres://postgres@{}/{database}", endpoint.addr());
    let prefix = unique("failover");
    let mut deployment = Deployment::start(
        PARTITIONS,
        &endpoint_url,
        &prefix,
        &["--latency-ms", "20", "--seed", "31"],
        &[
            ("DATABASE_MAX_CONNECTIONS", "12"),
            // The reason of every retry, to count the COMMITs whose outcome was lost.
            ("RUST_LOG", "info,payment_worker::worker::handler=debug"),
        ],
    )
    .await;
    let records = operator::generate(
        &WorkloadSpec {
            count: 1000,
            duplicate_ratio: 0.2,
            invalid_ratio: 0.0,
            decline_ratio: 0.05,
            seed: 31,
        },
        &prefix,
    );
    deployment.add_worker();
    deployment.add_worker();
    deployment
        .wait_for_stable_group(Duration::from_secs(90))
        .await;
    let producer = deployment.produce_paced(&records, 10);
    let warm = Instant::now() + Duration::from_secs(60);
    while books::by_position(&deployment.results().await).len() < 150 {
        assert!(Instant::now() < warm, "the run never warmed up");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The failover.
    let began = Instant::now();
    primary.crash().await;
    endpoint.retarget(format!("127.0.0.1:{}", standby.port).parse().unwrap());
    tokio::time::sleep(Duration::from_secs(1)).await;
    promote(&standby).await;
    endpoint.reset_all();
    endpoint.set(Fault::Pass);
    eprintln!(
        "failover: promoted {:?} after the primary stopped",
        began.elapsed()
    );

    producer.await.unwrap();
    let results = deployment
        .wait_until_settled(records.len(), HashMap::new(), Duration::from_secs(240))
        .await;
    eprintln!(
        "failover: every command answered and committed {:?} after the primary stopped",
        began.elapsed()
    );
    let lines = deployment.stop_workers().await;

    let books_pool = sqlx::PgPool::connect(&standby.url(&database))
        .await
        .unwrap();
    let mut direct = observer_connection(REDIS_URL).await;
    let tokens = books::token_statuses(&mut direct, &prefix).await;
    deployment
        .check_end_of_run(&books_pool, &records, &results, &tokens)
        .await;
    let read_only = lines
        .iter()
        .filter(|l| l.contains("retrying command") && l.contains("read-only transaction"))
        .count();
    eprintln!(
        "failover: {} results for {} commands; {} commit outcomes unknown; {read_only} statements \
         refused by a read-only server",
        results.len(),
        records.len(),
        commit_outcomes_unknown(&lines),
    );
    eprintln!("failover: retries by reason {:?}", retry_reasons(&lines));
}
