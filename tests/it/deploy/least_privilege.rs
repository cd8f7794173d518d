//! `run --migrate skip` works with a role that may only read and write the
//! tables; `run --migrate auto` with that role stops and says what to do.

use std::time::Duration;

use payment_worker::operator::{RecordKind, WorkloadRecord};
use serde_json::json;

use crate::support::helpers::{unique, Stack};
use crate::support::procs::{binary, run_to_end, Proc};
use payment_worker::configuration::{DatabaseSettings, MigrateMode};
use payment_worker::startup::open_database;
use payment_worker_devtools::SimulatorConfig;

/// A login role with `SELECT, INSERT, UPDATE, DELETE` on the test database's
/// tables, `USAGE` on its sequences, and nothing else. Dropped on drop.
struct DmlRole {
    name: String,
    admin_url: String,
}

impl DmlRole {
    async fn create(pool: &sqlx::PgPool, admin_url: &str) -> Self {
        let name = unique("pw_dml");
        for statement in [
            format!("CREATE ROLE {name} LOGIN NOCREATEDB NOCREATEROLE"),
            format!(
                "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {name}"
            ),
            format!("GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {name}"),
        ] {
            sqlx::query(&statement).execute(pool).await.unwrap();
        }
        Self {
            name,
            admin_url: admin_url.to_owned(),
        }
    }

    fn url(&self, database_url: &str) -> String {
        database_url.replacen(
            "postgres://postgres@",
            &format!("postgres://{}@", self.name),
            1,
        )
    }
}

impl Drop for DmlRole {
    fn drop(&mut self) {
        // A role owning grants cannot be dropped until they are revoked.
        let _ = std::process::Command::new("psql")
            .arg(&self.admin_url)
            .args([
                "-qc",
                &format!("DROP OWNED BY {0}; DROP ROLE {0}", self.name),
            ])
            .output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dml_only_role_runs_with_migrate_skip_and_is_told_to_migrate_with_auto() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let role = DmlRole::create(&stack.db.pool, &stack.db.url).await;
    let key = unique("least-privilege");
    let value = json!({"idempotency_key": key, "account_id": "acct_lp", "amount_minor": 700,
        "currency": "EUR", "payment_method": "pm_card_visa"});
    stack
        .produce(&[WorkloadRecord {
            kind: RecordKind::Valid,
            key: Some(key.clone().into_bytes()),
            value: Some(value.to_string().into_bytes()),
            partition_hint: None,
        }])
        .await;

    let mut env = stack.run_env();
    env.insert("DATABASE_URL".into(), role.url(&stack.db.url));
    env.insert("MIGRATE".into(), "skip".into());
    let mut worker = Proc::spawn("run-migrate-skip", binary(&["run"], &env));
    let results = stack.wait_for_results(1, Duration::from_secs(60)).await;
    worker.stop(Duration::from_secs(20)).await;
    assert_eq!(results.len(), 1, "{results:?}");
    let rows = stack.payment_rows().await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].0, key);
    assert_eq!(rows[0].1, "succeeded");
    assert_eq!(stack.ledger().len(), 1, "charged once");

    env.insert("MIGRATE".into(), "auto".into());
    let (status, lines) = run_to_end(
        "run-migrate-auto",
        binary(&["run"], &env),
        Duration::from_secs(60),
    )
    .await;
    let output = lines.join("\n");
    assert!(
        !status.success(),
        "auto with a DML-only role must fail:\n{output}"
    );
    assert!(
        output.contains("run `payment-worker migrate`") && output.contains("owner role"),
        "the error must send the operator to `migrate` with an owner role:\n{output}"
    );
}

/// `deploy/postgres/roles.sql` (what docker-compose's Postgres runs at its first
/// start) really yields an owner that can migrate and a worker role that can use
/// the tables with `--migrate skip` but cannot change the schema. Role and database
/// names are made unique so parallel runs on one server do not clash.
#[tokio::test]
async fn the_compose_roles_script_separates_owner_and_worker() {
    crate::support::helpers::ensure_services();
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let database = format!("pw_roles_{suffix}");
    let owner = format!("pw_owner_{suffix}");
    let worker = format!("pw_worker_{suffix}");
    let script = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/postgres/roles.sql"
    ))
    .unwrap()
    .replace("payments_owner", &owner)
    .replace("payments_worker", &worker)
    .replace("DATABASE payments", &format!("DATABASE {database}"));
    let server = format!("postgres://postgres@{}", crate::support::helpers::PG_ADDR);
    let admin = DatabaseSettings::with_url(format!("{server}/{database}"));
    payment_worker::startup::ensure_database(&admin)
        .await
        .unwrap();
    let output = std::process::Command::new("psql")
        .arg(format!("{server}/{database}"))
        .args(["-v", "ON_ERROR_STOP=1", "-qc", &script])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    let as_role = |role: &str| {
        DatabaseSettings::with_url(format!(
            "postgres://{role}@{}/{database}",
            crate::support::helpers::PG_ADDR
        ))
    };
    let owner_pool = open_database(&as_role(&owner), MigrateMode::Auto)
        .await
        .unwrap();
    owner_pool.close().await;
    let worker_pool = open_database(&as_role(&worker), MigrateMode::Skip)
        .await
        .unwrap();
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM payments")
        .fetch_one(&worker_pool)
        .await
        .unwrap();
    assert_eq!(count, 0);
    let denied = sqlx::query("CREATE TABLE pw_not_allowed (id int)")
        .execute(&worker_pool)
        .await
        .expect_err("the worker role must not create tables");
    assert_eq!(
        denied.as_database_error().and_then(|e| e.code()).as_deref(),
        Some("42501")
    );
    worker_pool.close().await;
    let error = open_database(&as_role(&worker), MigrateMode::Auto)
        .await
        .expect_err("the worker role must not migrate");
    assert!(format!("{error:#}").contains("owner role"), "{error:#}");

    let _ = std::process::Command::new("psql")
        .arg(format!("{server}/postgres"))
        .args(["-qc", &format!("DROP DATABASE {database} WITH (FORCE)")])
        .output();
    let _ = std::process::Command::new("psql")
        .arg(format!("{server}/postgres"))
        .args(["-qc", &format!("DROP ROLE {worker}; DROP ROLE {owner}")])
        .output();
}

/// `--migrate skip` on a database nobody migrated stops at start-up and says what to
/// run, instead of failing on the first command.
#[tokio::test]
async fn migrate_skip_on_a_database_never_migrated_refuses_to_start() {
    crate::support::helpers::ensure_services();
    let name = unique("pw_unmigrated");
    let server = format!("postgres://postgres@{}", crate::support::helpers::PG_ADDR);
    let settings = DatabaseSettings::with_url(format!("{server}/{name}"));
    payment_worker::startup::ensure_database(&settings)
        .await
        .unwrap();
    let error = open_database(&settings, MigrateMode::Skip)
        .await
        .expect_err("an unmigrated database must be refused with --migrate skip");
    let message = format!("{error:#}");
    assert!(
        message.contains("payments table does not exist")
            && message.contains("run `payment-worker migrate`"),
        "{message}"
    );
    let _ = std::process::Command::new("psql")
        .arg(format!("{server}/postgres"))
        .args(["-qc", &format!("DROP DATABASE {name} WITH (FORCE)")])
        .output();
}
