//! Issue 2's command line, black-box: `migrate`, `tokens issue`, `tokens show`.

use crate::helpers::{TestDb, TestRedis, REDIS_URL};

fn run(db: &TestDb, redis: &TestRedis, args: &[&str]) -> (bool, String, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_payment-worker"))
        .args(args)
        .env("DATABASE_URL", &db.url)
        .env("REDIS_URL", REDIS_URL)
        .env("REDIS_KEY_PREFIX", &redis.prefix)
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn tokens_are_issued_and_shown_through_the_command_line() {
    let db = TestDb::new().await;
    let redis = TestRedis::new().await;
    let (ok, out, _) = run(&db, &redis, &["migrate"]);
    assert!(ok && out.contains("migrations applied"));

    let (ok, out, err) = run(
        &db,
        &redis,
        &["tokens", "issue", "--count", "3", "--ttl", "1h"],
    );
    assert!(ok, "{err}");
    let keys: Vec<&str> = out.lines().collect();
    assert_eq!(keys.len(), 3, "one token per line: {out}");

    for backend in ["redis", "postgres"] {
        let (ok, out, err) = run(
            &db,
            &redis,
            &["tokens", "issue", "--token-store", backend, "ord-cli-1"],
        );
        assert!(ok && out.trim() == "ord-cli-1", "{backend}: {out} {err}");
        let (ok, out, err) = run(
            &db,
            &redis,
            &["tokens", "issue", "--token-store", backend, "ord-cli-1"],
        );
        assert!(
            ok && out.is_empty() && err.contains("already exists"),
            "{backend}: {out} {err}"
        );
        let (ok, out, _) = run(
            &db,
            &redis,
            &["tokens", "show", "--token-store", backend, "ord-cli-1"],
        );
        assert!(ok);
        let view: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(view["state"], "pending", "{backend}: {view}");
        assert_eq!(view["fence"], 0);
        let ttl = view["ttl"].as_str().unwrap();
        assert!(
            ttl.starts_with("23h") || ttl.starts_with("1day") || ttl.starts_with("24h"),
            "{ttl}"
        );
    }
    let (ok, out, _) = run(&db, &redis, &["tokens", "show", keys[0]]);
    assert!(ok);
    assert!(out.contains("\"state\":\"pending\""), "{out}");
    let (ok, out, _) = run(&db, &redis, &["tokens", "show", "never-issued"]);
    assert!(ok && out.contains("missing"), "{out}");
    let (ok, _, err) = run(&db, &redis, &["tokens", "show", "bad key!"]);
    assert!(!ok && err.contains("idempotency_key"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_starting_together_create_their_database_once() {
    crate::helpers::ensure_services();
    let url = format!(
        "postgres://postgres@{}/{}",
        crate::helpers::PG_ADDR,
        crate::helpers::unique("pw_race")
    );
    let starts: Vec<_> = (0..8)
        .map(|_| {
            let settings = payment_worker::configuration::DatabaseSettings::with_url(&url);
            tokio::spawn(async move { settings.ensure_database().await })
        })
        .collect();
    for start in starts {
        start
            .await
            .unwrap()
            .expect("a concurrent CREATE DATABASE is not an error");
    }
}
