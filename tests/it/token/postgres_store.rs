//! The Postgres token store as a worker uses it. The token is completed by
//! the payment's own transaction (a SIGKILL right after COMMIT finds it `completed`),
//! lease renewals use their own pool, the start-up check refuses pools the server
//! cannot serve, and expired rows are purged in bounded batches while a worker runs.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use payment_worker::configuration::DatabaseSettings;
use payment_worker::fault::{FaultPoint, Faults, FROZEN_MARKER};
use payment_worker::operator;
use payment_worker::operator::WorkloadSpec;
use payment_worker::startup::{connect_with_size, purge_round, PURGE_BATCHES_PER_ROUND};
use payment_worker::token::{
    IdempotencyKey, PostgresTokenStore, Reservation, TokenPolicy, TokenStore,
};
use payment_worker_devtools::{GatewaySimulator, SimulatorConfig};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::support::helpers::{quick_worker_settings, stop_all, unique, Stack, TestDb, REDIS_URL};
use crate::support::tokens::pg_token_row;

const BIN: &str = crate::support::procs::BINARY;

fn command_json(key: &str, amount_minor: i64) -> String {
    serde_json::json!({
        "idempotency_key": key, "account_id": "acct_11", "amount_minor": amount_minor,
        "currency": "EUR", "payment_method": "pm_card_visa", "description": "postgres store",
    })
    .to_string()
}

fn process_command(db: &TestDb, gateway_url: &str, json: &str) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(BIN);
    command
        .args(["process", json])
        .args(["--database-url", &db.url])
        .args(["--redis-url", REDIS_URL])
        .args(["--token-store", "postgres"])
        .args(["--gateway-url", gateway_url])
        .args(["--database-max-connections", "2"])
        .args(["--token-lease-connections", "1"])
        .args(["--lease", "1s"])
        .env("RUST_LOG", "warn")
        .kill_on_drop(true);
    command
}

async fn payment_id(db: &TestDb, key: &str) -> Option<uuid::Uuid> {
    sqlx::query_scalar("SELECT id FROM payments WHERE idempotency_key = $1")
        .bind(key)
        .fetch_optional(&db.pool)
        .await
        .unwrap()
}

/// The crash the issue was about: a worker killed between COMMIT and the token's
/// confirm. With the Postgres store the token was completed by the same transaction,
/// so nothing is left `processing` and the next delivery is a duplicate at once
/// (no lease to wait out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_right_after_commit_has_already_completed_the_postgres_token() {
    let db = TestDb::new().await;
    let simulator =
        GatewaySimulator::bind("127.0.0.1:0".parse().unwrap(), SimulatorConfig::default())
            .unwrap()
            .spawn();
    let key = "pg-after-commit-1";
    let json = command_json(key, 4100);

    let mut child = process_command(&db, &simulator.url(), &json)
        .env(Faults::ENV, FaultPoint::AfterCommit.as_str())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let wanted = format!("{FROZEN_MARKER} {}", FaultPoint::AfterCommit.as_str());
    let frozen = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains(&wanted) {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(frozen, Ok(true), "the process never froze after COMMIT");

    // Frozen after COMMIT, before anything else: the row and the token are both final.
    let paid = payment_id(&db, key)
        .await
        .expect("the payment row is committed");
    let row = pg_token_row(&db.pool, key).await.expect("token row");
    assert_eq!(row.status, "completed", "the commit completed the token");
    assert_eq!((row.fence, row.payment_id), (1, Some(paid)));

    let pid = Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    kill(pid, Signal::SIGKILL).unwrap();
    child.wait().await.unwrap();

    // Redelivery right away (well inside the 1 s lease): answered from the token.
    let output = process_command(&db, &simulator.url(), &json)
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let view: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(view["outcome"], "duplicate", "{view}");
    assert_eq!(view["payment_id"], paid.to_string());
    let charges = simulator
        .ledger()
        .into_iter()
        .filter(|e| e.idempotency_key == key)
        .count();
    assert_eq!(charges, 1);
    assert_eq!(
        pg_token_row(&db.pool, key).await.unwrap().status,
        "completed"
    );
}

/// A claim that lost its token before COMMIT rolls the payment back: the fence check
/// inside the transaction is what refuses it, not a separate round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_taken_over_before_commit_rolls_the_payment_back() {
    let db = TestDb::new().await;
    let policy = TokenPolicy {
        lease: Duration::from_millis(300),
        ..TokenPolicy::default()
    };
    let store = PostgresTokenStore::new(db.pool.clone(), policy);
    let key = IdempotencyKey::try_from("pg-fenced-1").unwrap();
    let Reservation::Reserved { fence, .. } = store.reserve(&key, "old:1").await.unwrap() else {
        panic!("first reservation");
    };
    let stale = payment_worker::token::Claim {
        owner: "old:1".into(),
        fence,
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(matches!(
        store.reserve(&key, "new:2").await.unwrap(),
        Reservation::Reserved { fence: 2, .. }
    ));
    let settle = store
        .in_transaction()
        .expect("the Postgres store settles in transaction");
    let mut tx = db.pool.begin().await.unwrap();
    let verdict = settle
        .confirm_in(&mut tx, &key, &stale, uuid::Uuid::now_v7(), "fp")
        .await
        .unwrap();
    assert_eq!(verdict, payment_worker::token::Transition::Refused);
    tx.rollback().await.unwrap();
    let row = pg_token_row(&db.pool, "pg-fenced-1").await.unwrap();
    assert_eq!(
        (row.status.as_str(), row.owner.as_deref(), row.fence),
        ("processing", Some("new:2"), 2)
    );

    // The current owner's confirm inside a transaction that then rolls back leaves
    // the token exactly as it was: token and payment commit together or not at all.
    let current = payment_worker::token::Claim {
        owner: "new:2".into(),
        fence: 2,
    };
    let mut tx = db.pool.begin().await.unwrap();
    let verdict = settle
        .confirm_in(&mut tx, &key, &current, uuid::Uuid::now_v7(), "fp")
        .await
        .unwrap();
    assert_eq!(verdict, payment_worker::token::Transition::Applied);
    tx.rollback().await.unwrap();
    assert_eq!(
        pg_token_row(&db.pool, "pg-fenced-1").await.unwrap().status,
        "processing"
    );
}

/// The start-up check: pools the server cannot serve are refused with the figures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_pools_exceed_the_servers_connections_refuses_to_start() {
    let db = TestDb::new().await;
    let output = tokio::process::Command::new(BIN)
        .args(["process", &command_json("pg-budget-1", 100)])
        .args(["--database-url", &db.url])
        .args(["--token-store", "postgres"])
        .args(["--database-max-connections", "100000"])
        .args(["--token-lease-connections", "3"])
        .args(["--gateway-url", "http://127.0.0.1:9"])
        .env("RUST_LOG", "warn")
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("needs 100004 Postgres connections")
            && stderr.contains("DATABASE_MAX_CONNECTIONS 100000")
            && stderr.contains("TOKEN_LEASE_CONNECTIONS 3")
            && stderr.contains("max_connections"),
        "{stderr}"
    );
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotency_tokens")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(rows, 0, "nothing was processed");
}

const EXPIRED_ROWS: i64 = 10_000;

/// Purge: 10,000 dead rows go in statements of at most one batch each, rounds of at
/// most `PURGE_BATCHES_PER_ROUND` statements, while a worker on the same store
/// processes commands; live rows (a pending token, a lease still running past its
/// token's deadline) stay, and `housekeeping` reports the table before and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expired_token_rows_are_purged_in_bounded_batches_while_a_worker_runs() {
    let mut stack = Stack::new(2, SimulatorConfig::default()).await;
    let lease_pool = payment_worker::startup::connect(&DatabaseSettings {
        max_connections: 2,
        ..DatabaseSettings::with_url(&stack.db.url)
    })
    .await
    .unwrap();
    let store = Arc::new(
        PostgresTokenStore::new(
            stack.db.pool.clone(),
            TokenPolicy {
                lease: Duration::from_secs(5),
                ..TokenPolicy::default()
            },
        )
        .with_maintenance_pool(lease_pool),
    );
    stack.tokens = Arc::clone(&store) as Arc<dyn TokenStore>;

    sqlx::query(
        "INSERT INTO idempotency_tokens (key, status, fence, expires_at, payment_id, fingerprint)
         SELECT 'dead-' || g, 'completed', 1, now() - interval '2 hours' + g * interval '1 ms',
                gen_random_uuid(), 'fp'
           FROM generate_series(1, $1) AS g",
    )
    .bind(EXPIRED_ROWS)
    .execute(&stack.db.pool)
    .await
    .unwrap();
    // Live although past (or near) a deadline: must survive every purge.
    sqlx::query(
        "INSERT INTO idempotency_tokens (key, status, owner, fence, lease_expires_at, expires_at)
         VALUES ('live-pending', 'pending', NULL, 0, NULL, now() + interval '1 hour'),
                ('live-lease', 'processing', 'w:1', 3, now() + interval '1 hour',
                 now() - interval '1 hour')",
    )
    .execute(&stack.db.pool)
    .await
    .unwrap();

    let before = store.housekeeping().await.unwrap().expect("table figures");
    assert_eq!(before.expired_rows, EXPIRED_ROWS as u64);
    assert!(before.rows >= EXPIRED_ROWS as u64 + 2);
    assert!(before.table_bytes > 0);
    let oldest = before.oldest_expired_for.expect("an oldest dead row");
    assert!(oldest >= Duration::from_secs(7100), "{oldest:?}");

    let records = operator::generate(
        &WorkloadSpec {
            count: 400,
            duplicate_ratio: 0.25,
            invalid_ratio: 0.0,
            decline_ratio: 0.05,
            seed: 11,
        },
        &unique("purge"),
    );
    let running = stack.start_worker("purging", &quick_worker_settings());
    stack.produce(&records).await;

    // While the worker works: each statement deletes at most one batch, each round at
    // most PURGE_BATCHES_PER_ROUND of them.
    const BATCH: usize = 300;
    let first_round = purge_round(store.as_ref(), BATCH).await;
    assert_eq!(first_round, (BATCH * PURGE_BATCHES_PER_ROUND) as u64);
    let mut purged = first_round;
    loop {
        let rows = store.purge_expired(BATCH).await.unwrap();
        assert!(rows <= BATCH as u64, "a batch deleted {rows} rows");
        if rows == 0 {
            break;
        }
        purged += rows;
    }
    assert_eq!(purged, EXPIRED_ROWS as u64, "every dead row, nothing else");

    stack
        .wait_for_results(records.len(), Duration::from_secs(120))
        .await;
    stop_all(vec![running]).await;
    stack.assert_books_balance().await;

    let after = store.housekeeping().await.unwrap().expect("table figures");
    assert_eq!(after.expired_rows, 0);
    assert_eq!(after.oldest_expired_for, None);
    let remaining: Vec<String> = sqlx::query_scalar(
        "SELECT key FROM idempotency_tokens WHERE key LIKE 'live-%' OR key LIKE 'dead-%' ORDER BY key",
    )
    .fetch_all(&stack.db.pool)
    .await
    .unwrap();
    assert_eq!(remaining, ["live-lease", "live-pending"]);
    let processing: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM idempotency_tokens WHERE status = 'processing' AND key <> 'live-lease'",
    )
    .fetch_one(&stack.db.pool)
    .await
    .unwrap();
    assert_eq!(processing, 0, "the worker's own tokens were all settled");
    assert_eq!(purge_round(store.as_ref(), BATCH).await, 0);
}

/// `run` purges by itself: dead rows planted before a worker starts are gone after a
/// few purge intervals, and the worker exports `payment_worker.tokens.purged`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_running_worker_purges_expired_rows_and_exports_the_purge_metric() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let (otlp, received) = crate::telemetry::traces::start_receiver().await;
    sqlx::query(
        "INSERT INTO idempotency_tokens (key, status, fence, expires_at, payment_id, fingerprint)
         SELECT 'gone-' || g, 'completed', 1, now() - interval '1 hour', gen_random_uuid(), 'fp'
           FROM generate_series(1, 3000) AS g",
    )
    .execute(&stack.db.pool)
    .await
    .unwrap();
    let mut child = tokio::process::Command::new(BIN)
        .arg("run")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("KAFKA_BROKERS", &stack.settings.brokers)
        .env("KAFKA_GROUP_ID", &stack.settings.group_id)
        .env("KAFKA_SESSION_TIMEOUT", "6s")
        .env("DRAIN_DEADLINE", "3s")
        .env("DATABASE_URL", &stack.db.url)
        .env("DATABASE_MAX_CONNECTIONS", "4")
        .env("TOKEN_STORE", "postgres")
        .env("TOKEN_PURGE_INTERVAL", "200ms")
        .env("TOKEN_PURGE_BATCH", "250")
        .env("GATEWAY_URL", stack.simulator.url())
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{otlp}"))
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        .env("OTEL_METRIC_EXPORT_INTERVAL", "500")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM idempotency_tokens WHERE key LIKE 'gone-%'")
                .fetch_one(&stack.db.pool)
                .await
                .unwrap();
        if left == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{left} expired rows still there after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let one more metric export happen, then a graceful stop flushes the rest.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let pid = Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    kill(pid, Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
    let received = received.lock().unwrap();
    assert!(
        received
            .metrics
            .iter()
            .any(|m| m == "payment_worker.tokens.purged"),
        "{:?}",
        received.metrics
    );
}

/// Lease renewal never waits for the payment pool: with every payment connection
/// held by a transaction (here: the only one), `extend` still answers through the
/// store's own pool; the same store without it times out waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_renewal_is_served_while_every_payment_connection_is_held() {
    let db = TestDb::new().await;
    let settings = DatabaseSettings::with_url(&db.url);
    let payment_pool = connect_with_size(&settings, 1).await.unwrap();
    let lease_pool = connect_with_size(&settings, 1).await.unwrap();
    let policy = TokenPolicy::default();
    let own_pool = PostgresTokenStore::new(payment_pool.clone(), policy)
        .with_maintenance_pool(lease_pool)
        .with_op_timeout(Duration::from_millis(800));
    let shared_pool = PostgresTokenStore::new(payment_pool.clone(), policy)
        .with_op_timeout(Duration::from_millis(800));
    let key = IdempotencyKey::try_from("pg-renew-1").unwrap();
    let Reservation::Reserved { fence, .. } = own_pool.reserve(&key, "w:1").await.unwrap() else {
        panic!("reserved");
    };
    let claim = payment_worker::token::Claim {
        owner: "w:1".into(),
        fence,
    };
    // A payment transaction holds the pool's only connection, as during a slow charge.
    let mut tx = payment_pool.begin().await.unwrap();
    sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();

    assert_eq!(
        own_pool.extend(&key, &claim).await.unwrap(),
        payment_worker::token::Transition::Applied
    );
    let starved = shared_pool.extend(&key, &claim).await;
    assert!(
        matches!(starved, Err(ref e) if e.is_retryable()),
        "without its own pool the renewal waits for the payment connection: {starved:?}"
    );
    tx.rollback().await.unwrap();
}

/// A server that answers read-only (a failover's old primary back as a standby, a
/// standby a service briefly pointed at) makes the pool drop the connections opened
/// before that answer: the next reservation runs on a fresh connection, instead of
/// failing on each old one until the pool recycles it half an hour later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_answer_drops_the_connections_opened_before_it() {
    let db = TestDb::new().await;
    // Sessions opened from now on are read-only, as on a standby.
    let read_only = |on: bool| {
        let statement = if on {
            format!(
                "ALTER DATABASE {} SET default_transaction_read_only = on",
                db.name
            )
        } else {
            format!(
                "ALTER DATABASE {} RESET default_transaction_read_only",
                db.name
            )
        };
        let pool = db.pool.clone();
        async move { sqlx::query(&statement).execute(&pool).await.unwrap() }
    };
    read_only(true).await;
    let pool = connect_with_size(&DatabaseSettings::with_url(&db.url), 2)
        .await
        .unwrap();
    payment_worker::startup::open_all_connections(&pool)
        .await
        .unwrap();
    // The address leads to a primary again; the pool's two connections are the
    // standby's.
    read_only(false).await;
    let store = PostgresTokenStore::new(pool.clone(), TokenPolicy::default());
    let key = IdempotencyKey::try_from(unique("ro").as_str()).unwrap();

    let refused = store.reserve(&key, "w1").await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("read-only")),
        "{refused:?}"
    );
    let reserved = store.reserve(&key, "w1").await;
    assert!(
        matches!(reserved, Ok(Reservation::Reserved { .. })),
        "the old connection was handed out again: {reserved:?}"
    );
}
