//! Postgres over TLS: a private server with `ssl=on` and a certificate from a CA made
//! at test time. `migrate` and `run` connect with `sslmode=verify-full` and that CA;
//! a client given another CA refuses the server with an error that names TLS, with
//! `sslmode=require` too (a root certificate makes it verify, as in libpq).

use std::time::Duration;

use payment_worker::operator::{RecordKind, WorkloadRecord};
use payment_worker_devtools::SimulatorConfig;

use crate::support::helpers::{unique, Stack};
use crate::support::pki::{path_str, TestPki};
use crate::support::procs::{binary, is_root, postgres_user, run_to_end, PrivatePostgres, Proc};

fn tls_url(pg: &PrivatePostgres, database: &str, mode: &str, ca: &std::path::Path) -> String {
    format!(
        "postgres://postgres@localhost:{}/{database}?sslmode={mode}&sslrootcert={}",
        pg.port,
        path_str(ca)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_and_run_connect_with_verify_full_and_a_wrong_ca_is_refused() {
    let pki = TestPki::new();
    if is_root() {
        // The server runs as postgres and must read its key.
        let (uid, gid) = postgres_user();
        pki.chown_all(uid, gid);
    }
    let pg = PrivatePostgres::start_with(&[
        "ssl=on".to_owned(),
        format!("ssl_cert_file={}", path_str(&pki.server_cert())),
        format!("ssl_key_file={}", path_str(&pki.server_key())),
    ])
    .await;
    let database = "payments_tls";
    let url = tls_url(&pg, database, "verify-full", &pki.ca());

    let env = |url: &str| {
        [("DATABASE_URL".to_owned(), url.to_owned())]
            .into_iter()
            .collect()
    };
    let (status, lines) = run_to_end(
        "migrate-tls",
        binary(&["migrate"], &env(&url)),
        Duration::from_secs(60),
    )
    .await;
    assert!(status.success(), "{}", lines.join("\n"));

    // The worker: Kafka, Redis and the gateway from a stack, Postgres over TLS.
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let key = unique("tls");
    let value = serde_json::json!({"idempotency_key": key, "account_id": "acct_tls",
        "amount_minor": 900, "currency": "EUR", "payment_method": "pm_card_visa"});
    stack
        .produce(&[WorkloadRecord {
            kind: RecordKind::Valid,
            key: Some(key.clone().into_bytes()),
            value: Some(value.to_string().into_bytes()),
            partition_hint: None,
        }])
        .await;
    let mut run_env = stack.run_env();
    run_env.insert("DATABASE_URL".into(), url.clone());
    let mut worker = Proc::spawn("run-tls", binary(&["run"], &run_env));
    let results = stack.wait_for_results(1, Duration::from_secs(60)).await;
    worker.stop(Duration::from_secs(20)).await;
    assert_eq!(results.len(), 1);

    // Read back over TLS, and ask the server whether this very session is encrypted.
    let pool = payment_worker::startup::connect(
        &payment_worker::configuration::DatabaseSettings::with_url(&url),
    )
    .await
    .unwrap();
    let (status, encrypted): (String, bool) = sqlx::query_as(
        "SELECT p.status, s.ssl FROM payments p, pg_stat_ssl s \
         WHERE p.idempotency_key = $1 AND s.pid = pg_backend_pid()",
    )
    .bind(&key)
    .fetch_one(&pool)
    .await
    .unwrap();
    pool.close().await;
    assert_eq!(status, "succeeded");
    assert!(encrypted, "the session is not encrypted");

    // `sslmode=require` with a root certificate verifies the server too, as with
    // psql, rather than trusting whatever answers.
    for mode in ["verify-full", "require"] {
        let wrong = tls_url(&pg, database, mode, &pki.wrong_ca());
        let (status, lines) = run_to_end(
            &format!("migrate-{mode}-wrong-ca"),
            binary(&["migrate"], &env(&wrong)),
            Duration::from_secs(60),
        )
        .await;
        let output = lines.join("\n");
        assert!(
            !status.success(),
            "sslmode={mode} trusted a server the CA did not sign: {output}"
        );
        assert!(output.contains("TLS"), "the error must name TLS: {output}");
    }
}
