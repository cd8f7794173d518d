//! The command line, black-box: `migrate`, `tokens issue`, `tokens show`; the
//! exit statuses per command (a worker stopped while it starts included) and log
//! output fit for a file.

use std::process::{Output, Stdio};

use payment_worker::payment::PaymentCommand;
use payment_worker::token::IdempotencyKey;
use payment_worker_devtools::SimulatorConfig;

use crate::support::helpers::{silent_server, NoLease, Stack, TestDb, TestRedis, REDIS_URL};

fn run(db: &TestDb, redis: &TestRedis, args: &[&str]) -> (bool, String, String) {
    let output = std::process::Command::new(crate::support::procs::BINARY)
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
    assert!(!ok && out.contains("missing"), "{out}");
    let (ok, _, err) = run(&db, &redis, &["tokens", "show", "bad key!"]);
    assert!(!ok && err.contains("idempotency_key"), "{err}");

    // A key the worker would refuse (`card_number_as_key`) gets no token, in no
    // store, and the refusal shows it masked.
    for backend in ["redis", "postgres"] {
        let (ok, out, err) = run(
            &db,
            &redis,
            &[
                "tokens",
                "issue",
                "--token-store",
                backend,
                "ok-1",
                "4111-1111-1111-1111",
            ],
        );
        assert!(!ok && out.is_empty(), "{backend}: {out} {err}");
        assert!(
            err.contains("****-****-****-1111") && !err.contains("4111-1111"),
            "{backend}: {err}"
        );
        for key in ["ok-1", "4111-1111-1111-1111"] {
            let (ok, out, err) = run(
                &db,
                &redis,
                &["tokens", "show", "--token-store", backend, key],
            );
            assert!(!ok && out.contains("missing"), "{backend} {key}: {out}");
            assert!(!err.contains("4111-1111"), "{backend}: {err}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_starting_together_create_their_database_once() {
    crate::support::helpers::ensure_services();
    let url = format!(
        "postgres://postgres@{}/{}",
        crate::support::helpers::PG_ADDR,
        crate::support::helpers::unique("pw_race")
    );
    let starts: Vec<_> = (0..8)
        .map(|_| {
            let settings = payment_worker::configuration::DatabaseSettings::with_url(&url);
            tokio::spawn(async move { payment_worker::startup::ensure_database(&settings).await })
        })
        .collect();
    for start in starts {
        start
            .await
            .unwrap()
            .expect("a concurrent CREATE DATABASE is not an error");
    }
}

/// An orchestrator may stop a worker that is still starting (connecting to its
/// stores, creating its Kafka clients). The signal handlers come first, so the
/// worker finishes starting, stops at once and exits 0; without them the default
/// action of SIGTERM killed it mid-start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stopped_while_it_starts_exits_cleanly() {
    let stack = Stack::new(2, SimulatorConfig::default()).await;
    let mut env = stack.run_env();
    // Exactly-once start-up also initialises a transactional producer: about half
    // a second of broker round trips, a window the signal cannot miss.
    env.insert("RESULTS_MODE".into(), "exactly-once".into());
    stop_while_starting("starting-worker", &env).await;
}

/// Starts `run` with `env` and SIGTERMs it on its first line, which is written
/// before the stores are reached: the rest of the start-up is still ahead when the
/// signal lands. Asserts a clean exit; returns the stopped process.
async fn stop_while_starting(
    name: &str,
    env: &std::collections::HashMap<String, String>,
) -> crate::support::procs::Proc {
    let mut worker =
        crate::support::procs::Proc::spawn(name, crate::support::procs::binary(&["run"], env));
    worker
        .wait_for(std::time::Duration::from_secs(30), |l| {
            l.contains("starting worker").then_some(())
        })
        .await;
    worker.stop(std::time::Duration::from_secs(60)).await;
    worker
}

/// A worker whose database does not answer (a listener that accepts and stays
/// silent) waits in its start-up; a SIGTERM then ends it at once with exit 0,
/// instead of being held until the connection attempts give up with an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stopped_while_its_database_does_not_answer_exits_cleanly() {
    let (silent, held) = silent_server().await;
    let stack = Stack::new(2, SimulatorConfig::default()).await;
    let mut env = stack.run_env();
    env.insert(
        "DATABASE_URL".into(),
        format!("postgres://postgres@{silent}/silent"),
    );
    let worker = stop_while_starting("waiting-worker", &env).await;
    assert!(
        worker
            .find_last(|l| l.contains("stopped while connecting").then_some(()))
            .is_some(),
        "{}",
        worker.tail(10)
    );
    held.abort();
}

/// A Postgres that never answers fails the start-up with a clear error, instead
/// of holding it forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_never_answers_fails_the_start_up() {
    let (silent, held) = silent_server().await;
    let url = format!("postgres://postgres@{silent}/silent");
    let output = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        pw(&["migrate", "--database-url", &url], &[]),
    )
    .await
    .expect("migrate still waiting for the silent server after 60 s");
    assert_eq!(status_of(&output), 1, "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cannot reach Postgres") && stderr.contains("no answer within 10s"),
        "{stderr}"
    );
    held.abort();
}

/// Runs the binary with only the given environment (none inherited), so no
/// ambient variable can point it elsewhere.
async fn pw(args: &[&str], env: &[(&str, &str)]) -> Output {
    tokio::process::Command::new(crate::support::procs::BINARY)
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .output()
        .await
        .unwrap()
}

fn status_of(output: &Output) -> i32 {
    output.status.code().expect("exited, not killed")
}

fn stdout_json(output: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn command_json(key: &str, amount: i64) -> String {
    serde_json::json!({
        "idempotency_key": key, "account_id": "acct_cli", "amount_minor": amount,
        "currency": "EUR", "payment_method": "pm_card_visa",
    })
    .to_string()
}

/// A URL where nothing listens: a port bound, then released.
fn dead_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

/// `process` says "try again later" (75) for a store it cannot reach at start, as it
/// does for one that fails inside the attempt: a caller that retries on 75 must
/// not take an outage for a permanent failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_exits_75_when_a_store_cannot_be_reached_at_start() {
    let db = TestDb::new().await;
    let redis = TestRedis::new().await;
    let closed = dead_url();
    let closed = closed.trim_start_matches("http://");
    let order = command_json("cli-store-down-1", 300);
    let postgres_down = format!("postgres://postgres@{closed}/payments");
    let redis_down = format!("redis://{closed}");
    // Servers that accept and never answer: the start-up gives up on them after
    // its own bound, and that is the same outage.
    let (silent, _silence) = crate::support::helpers::silent_server().await;
    let postgres_silent = format!("postgres://postgres@{silent}/payments");
    let redis_silent = format!("redis://{silent}");
    for (what, database, redis_url) in [
        ("Postgres", postgres_down.as_str(), REDIS_URL),
        ("Redis", db.url.as_str(), redis_down.as_str()),
        ("silent Postgres", postgres_silent.as_str(), REDIS_URL),
        ("silent Redis", db.url.as_str(), redis_silent.as_str()),
    ] {
        let env = [
            ("DATABASE_URL", database),
            ("REDIS_URL", redis_url),
            ("REDIS_KEY_PREFIX", redis.prefix.as_str()),
            ("GATEWAY_URL", "http://127.0.0.1:9"),
        ];
        let output = pw(&["process", &order], &env).await;
        assert_eq!(status_of(&output), 75, "{what} down: {output:?}");
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("try again later"),
            "{what} down: {output:?}"
        );
    }
    // A refused login is not an outage: 1, as before.
    let refused = format!(
        "postgres://no_such_role_{}@127.0.0.1:5432/payments",
        redis.prefix.replace('-', "_")
    );
    let env = [
        ("DATABASE_URL", refused.as_str()),
        ("REDIS_URL", REDIS_URL),
        ("GATEWAY_URL", "http://127.0.0.1:9"),
    ];
    let output = pw(&["process", &order], &env).await;
    assert_eq!(status_of(&output), 1, "{output:?}");
}

/// The commands that look at the stores (`audit`, `tokens show`) never create or
/// migrate the database, whatever `--migrate` says: a misspelt database name is an
/// error, not a new empty database reported as clean books.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_that_look_never_create_or_migrate_the_database() {
    let db = TestDb::new().await;
    let redis = TestRedis::new().await;
    let missing = format!("{}_misspelt", db.name);
    let missing_url = db.url.replace(&db.name, &missing);
    let exists = || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)",
        )
        .bind(&missing)
        .fetch_one(&db.pool)
        .await
        .unwrap()
    };
    let env = [
        ("DATABASE_URL", missing_url.as_str()),
        ("REDIS_URL", REDIS_URL),
        ("REDIS_KEY_PREFIX", redis.prefix.as_str()),
        ("GATEWAY_URL", "http://127.0.0.1:9"),
        ("MIGRATE", "auto"),
    ];
    for args in [&["audit"][..], &["tokens", "show", "cli-look-1"]] {
        let output = pw(args, &env).await;
        assert_ne!(status_of(&output), 0, "{args:?}: {output:?}");
        assert!(!exists().await, "{args:?} created the database");
    }
    // A database that exists without the schema: refused with the way out, and
    // left without tables.
    sqlx::query(&format!("CREATE DATABASE {missing}"))
        .execute(&db.pool)
        .await
        .unwrap();
    let output = pw(&["audit"], &env).await;
    assert_ne!(status_of(&output), 0, "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("payment-worker migrate"),
        "{output:?}"
    );
    let bare = sqlx::PgPool::connect(&missing_url).await.unwrap();
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'",
    )
    .fetch_one(&bare)
    .await
    .unwrap();
    bare.close().await;
    sqlx::query(&format!("DROP DATABASE {missing} WITH (FORCE)"))
        .execute(&db.pool)
        .await
        .unwrap();
    assert_eq!(tables, 0, "audit migrated the database");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_exits_with_its_documented_status() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let gateway = stack.simulator.url();
    let env = [
        ("DATABASE_URL", stack.db.url.as_str()),
        ("REDIS_URL", REDIS_URL),
        ("REDIS_KEY_PREFIX", stack.redis.prefix.as_str()),
        ("GATEWAY_URL", gateway.as_str()),
    ];

    // process: 0 for every final outcome, the outcome on stdout.
    let order = command_json("cli-exit-1", 1999);
    let output = pw(&["process", &order], &env).await;
    assert_eq!(status_of(&output), 0, "{output:?}");
    assert_eq!(stdout_json(&output)["outcome"], "succeeded");
    let output = pw(&["process", &order], &env).await;
    assert_eq!(status_of(&output), 0, "{output:?}");
    assert_eq!(stdout_json(&output)["outcome"], "duplicate");
    let output = pw(&["process", &command_json("cli-exit-1", 5)], &env).await;
    assert_eq!(status_of(&output), 0, "{output:?}");
    assert_eq!(stdout_json(&output)["outcome"], "rejected");
    assert!(stdout_json(&output)["detail"]
        .as_str()
        .is_some_and(|d| d.starts_with("key_reused")));

    // process: 65 for an invalid command, answered before any service is asked.
    for invalid in ["{\"idempotency_key\": ", &command_json("cli-exit-2", -5)] {
        let output = pw(&["process", invalid], &[]).await;
        assert_eq!(status_of(&output), 65, "{output:?}");
        assert_eq!(stdout_json(&output)["outcome"], "rejected");
        assert!(String::from_utf8_lossy(&output.stderr).contains("invalid input"));
    }

    // process: 75 when the gateway is down; the token is restored, so the same
    // command succeeds once the gateway is back.
    let down = dead_url();
    let retried = command_json("cli-exit-3", 700);
    let output = pw(&["process", "--gateway-url", &down, &retried], &env).await;
    assert_eq!(status_of(&output), 75, "{output:?}");
    assert_eq!(stdout_json(&output)["outcome"], "retry");
    let output = pw(&["process", &retried], &env).await;
    assert_eq!(status_of(&output), 0, "{output:?}");
    assert_eq!(stdout_json(&output)["outcome"], "succeeded");

    // tokens: 0 for an issued or shown token, 1 for a missing one.
    let output = pw(&["tokens", "issue", "cli-tok-1"], &env).await;
    assert_eq!(status_of(&output), 0, "{output:?}");
    let output = pw(&["tokens", "show", "cli-tok-1"], &env).await;
    assert_eq!(status_of(&output), 0, "{output:?}");
    assert_eq!(stdout_json(&output)["state"], "pending");
    let output = pw(&["tokens", "show", "cli-tok-never"], &env).await;
    assert_eq!(status_of(&output), 1, "{output:?}");
    assert_eq!(stdout_json(&output)["state"], "missing");
    // tokens issue: 65 for a key that holds a card number, shown masked.
    let output = pw(&["tokens", "issue", "4111-1111-1111-1111"], &env).await;
    assert_eq!(status_of(&output), 65, "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no token issued"), "{stderr}");
    assert!(
        crate::support::cards::card_like_numbers(&stderr).is_empty(),
        "{stderr}"
    );

    // audit: 0 on clean books, 3 once a charge has no payment row.
    let output = pw(&["audit"], &env).await;
    assert_eq!(status_of(&output), 0, "{output:?}");
    let stray = PaymentCommand::parse(command_json("cli-stray-1", 42).as_bytes()).unwrap();
    stack
        .gateway
        .charge(
            &IdempotencyKey::try_from("cli-stray-1").unwrap(),
            &stray.charge_request(),
            &NoLease,
        )
        .await
        .unwrap();
    let output = pw(&["audit"], &env).await;
    assert_eq!(status_of(&output), 3, "{output:?}");
    let output = pw(&["audit", "--json"], &env).await;
    assert_eq!(status_of(&output), 3, "{output:?}");
    assert_eq!(stdout_json(&output)["charges_without_row"]["count"], 1);

    // migrate: 0; 1 when the database cannot be reached.
    let output = pw(&["migrate"], &env).await;
    assert_eq!(status_of(&output), 0, "{output:?}");
    let unreachable = format!(
        "postgres://postgres@{}/payments",
        dead_url().trim_start_matches("http://")
    );
    let output = pw(&["migrate", "--database-url", &unreachable], &[]).await;
    assert_eq!(status_of(&output), 1, "{output:?}");

    // Usage errors are clap's 2, before anything runs.
    for usage in [
        vec!["process"],
        vec!["tokens", "show", "--no-such-flag", "k"],
        vec!["produce", "--key-prefix", "not a key"],
        vec!["replay", "--dry-run"],
        vec!["replay", "--to-beginning", "--json"],
        // Out of range: each would panic or misbehave further in (an empty pool,
        // overflowing deadline arithmetic, an unbounded channel).
        vec!["migrate", "--database-max-connections", "0"],
        vec!["run", "--max-in-flight", "0"],
        vec!["run", "--max-in-flight", "4294967296"],
        vec!["run", "--gateway-timeout", "18446744073709551615s"],
        vec!["process", "--lease", "2years", "{}"],
        // Flags that would be dropped without a word, or do nothing useful.
        vec!["tokens", "issue", "--count", "5", "order-1"],
        vec!["tokens", "issue", "--count", "0"],
        vec!["tokens", "issue", "--ttl", "0s"],
        vec!["produce", "--file", "commands.jsonl", "--count", "10"],
        // Answers written where commands are read would be read back as commands.
        vec!["run", "--results-topic", "payments.commands"],
        vec!["dlq", "redrive", "--dlq-topic", "payments.commands"],
        vec!["run", "--kafka-config", "sasl.password: hunter2=="],
        // Names written into log lines, spans and headers hold no card number.
        vec!["run", "--kafka-group-id", "grp-4111-1111-1111-1111"],
        vec!["dlq", "redrive", "--dlq-topic", "dlq.4111111111111111"],
    ] {
        let output = pw(&usage, &[]).await;
        assert_eq!(status_of(&output), 2, "{usage:?}: {output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            crate::support::cards::card_like_numbers(&stderr).is_empty(),
            "{usage:?}: {stderr}"
        );
    }
    // clap quotes the argument it refuses: a card number pasted there is masked.
    for pasted in ["4111111111111111", "4111 1111 1111 1111"] {
        let output = pw(&["healthcheck", "--timeout", pasted], &[]).await;
        assert_eq!(status_of(&output), 2, "{output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("invalid value") && stderr.contains("--timeout"),
            "{stderr}"
        );
        assert!(
            crate::support::cards::card_like_numbers(&stderr).is_empty(),
            "{stderr}"
        );
    }
    // `--help` shows each setting's value from the environment: masked too.
    let output = pw(&["run", "--help"], &[("WORKER_ID", "4111 1111 1111 1111")]).await;
    assert_eq!(status_of(&output), 0, "{output:?}");
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(help.contains("[env: WORKER_ID="), "{help}");
    assert!(
        crate::support::cards::card_like_numbers(&help).is_empty(),
        "{help}"
    );
    // Completions and the manual need nothing and succeed.
    for args in [
        vec!["completions", "bash"],
        vec!["completions", "zsh"],
        vec!["completions", "fish"],
        vec!["man"],
    ] {
        let output = pw(&args, &[]).await;
        assert_eq!(status_of(&output), 0, "{args:?}: {output:?}");
        assert!(!output.stdout.is_empty());
    }
}

/// Runs the binary with its standard error written to a file, as a service
/// manager or `2> log` would, and returns the exit status and the file's text.
async fn with_stderr_in_file(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let dir = std::env::temp_dir().join(crate::support::helpers::unique("pw_logs"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("stderr.log");
    let file = std::fs::File::create(&path).unwrap();
    let status = tokio::process::Command::new(crate::support::procs::BINARY)
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::from(file))
        .status()
        .await
        .unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (status.code().expect("exited"), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_written_to_a_file_are_plain_text_and_routine_notices_stay_out() {
    let db = TestDb::new().await;
    let redis = TestRedis::new().await;
    let down = dead_url();
    let env = [
        ("DATABASE_URL", db.url.as_str()),
        ("REDIS_URL", REDIS_URL),
        ("REDIS_KEY_PREFIX", redis.prefix.as_str()),
        ("GATEWAY_URL", down.as_str()),
    ];
    // A gateway that refuses connections makes the processor log a warning.
    let order = command_json("cli-log-1", 300);
    let (status, log) = with_stderr_in_file(&["process", &order], &env).await;
    assert_eq!(status, 75);
    assert!(
        log.contains("WARN") && log.contains("gateway call failed"),
        "{log}"
    );
    assert!(
        !log.contains('\u{1b}'),
        "escape sequences in a log file: {log:?}"
    );

    // LOG_FORMAT=json is unchanged: every log line is a JSON object.
    let json_env: Vec<(&str, &str)> = env
        .iter()
        .copied()
        .chain([("LOG_FORMAT", "json")])
        .collect();
    let (status, log) = with_stderr_in_file(&["process", &order], &json_env).await;
    assert_eq!(status, 75);
    let log_lines: Vec<serde_json::Value> = log
        .lines()
        .filter(|l| !l.starts_with("error: "))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(
        log_lines.iter().any(|l| l["level"] == "WARN"),
        "{log_lines:?}"
    );

    // The migrations table already exists on every start after the first: Postgres
    // says so in a notice that is debug material, not an info line.
    let (status, log) = with_stderr_in_file(&["migrate"], &env).await;
    assert_eq!(status, 0);
    assert!(!log.contains("_sqlx_migrations"), "{log}");
    let debug_env: Vec<(&str, &str)> = env.iter().copied().chain([("RUST_LOG", "debug")]).collect();
    let (status, log) = with_stderr_in_file(&["migrate"], &debug_env).await;
    assert_eq!(status, 0);
    assert!(
        log.contains("relation \"_sqlx_migrations\" already exists"),
        "{log}"
    );
    assert!(!log.contains('\u{1b}'), "{log:?}");
}

/// A variable that is not UTF-8 anywhere in the environment (a stray one, nothing to
/// do with the worker) is no reason to panic: `run` gets as far as its real problem
/// here, a database it cannot reach, and exits with its documented 1.
#[tokio::test]
async fn a_variable_that_is_not_utf8_does_not_stop_the_worker_from_starting() {
    use std::os::unix::ffi::OsStrExt;
    let unreachable = format!(
        "postgres://postgres@{}/payments",
        dead_url().trim_start_matches("http://")
    );
    let output = tokio::process::Command::new(crate::support::procs::BINARY)
        .arg("run")
        .env_clear()
        .env("DATABASE_URL", &unreachable)
        .env("STRAY", std::ffi::OsStr::from_bytes(b"\xff\xfe"))
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(status_of(&output), 1, "{stderr}");
}
