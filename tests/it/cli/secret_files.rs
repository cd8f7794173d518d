//! Secrets as files, as orchestrators mount them: `DATABASE_URL_FILE`,
//! `REDIS_URL_FILE` and `KAFKA_CONFIG_FILE` (a librdkafka properties file) are read
//! at start and used — a worker pays a command through a Redis that wants the
//! password only its file holds — and what they hold appears in no log line (at
//! debug), no `--help` and no error. A setting given both ways is a usage error, a
//! file others may read is warned about.

use std::collections::HashMap;
use std::time::Duration;

use payment_worker::operator::{RecordKind, WorkloadRecord};
use payment_worker_devtools::SimulatorConfig;

use crate::support::helpers::{unique, Stack};
use crate::support::pki::path_str;
use crate::support::procs::{binary, run_to_end, Proc};
use crate::support::redis_servers::{private_file, PasswordRedis, TempDir};
use crate::support::tokens::redis_token_status;

const DB_PASSWORD: &str = "db-file-pass-5c1e07";
const REDIS_PASSWORD: &str = "redis-file-pass-93ab1f";
const KAFKA_SECRET: &str = "kafka-file-secret-77d0c2";
const SECRETS: [&str; 3] = [DB_PASSWORD, REDIS_PASSWORD, KAFKA_SECRET];

fn assert_shows_no_secret(what: &str, output: &str) {
    for secret in SECRETS {
        assert!(!output.contains(secret), "{what} shows {secret}:\n{output}");
    }
}

/// `payment-worker <args>` with `env` to its end: exit code and output.
async fn run(args: &[&str], env: &HashMap<String, String>) -> (Option<i32>, String) {
    let (status, lines) =
        run_to_end("secret-files", binary(args, env), Duration::from_secs(60)).await;
    (status.code(), lines.join("\n"))
}

fn with(env: &HashMap<String, String>, extra: &[(&str, &str)]) -> HashMap<String, String> {
    let mut env = env.clone();
    env.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    env
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn secrets_given_as_files_are_used_and_shown_nowhere() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let redis = PasswordRedis::start(REDIS_PASSWORD).await;
    let dir = TempDir::new("pw-secret-files");
    // Postgres here trusts local clients: the password is carried, not checked.
    let database_url = stack.db.url.replacen(
        "postgres://postgres@",
        &format!("postgres://postgres:{DB_PASSWORD}@"),
        1,
    );
    assert_ne!(database_url, stack.db.url);
    let database_file = private_file(&dir.0, "database-url", &format!("{database_url}\n"));
    let redis_file = private_file(
        &dir.0,
        "redis-url",
        &format!("redis://:{REDIS_PASSWORD}@127.0.0.1:{}\n", redis.port),
    );
    let kafka_file = private_file(
        &dir.0,
        "kafka.properties",
        &format!(
            "# what a managed cluster's credentials look like\nclient.id = pw-secret-files\n\
             sasl.password={KAFKA_SECRET}\n"
        ),
    );
    let mut env = stack.run_env();
    env.remove("DATABASE_URL");
    env.remove("REDIS_URL");
    env.insert("RUST_LOG".into(), "debug".into());
    env.insert("DATABASE_URL_FILE".into(), path_str(&database_file).into());
    env.insert("REDIS_URL_FILE".into(), path_str(&redis_file).into());
    env.insert("KAFKA_CONFIG_FILE".into(), path_str(&kafka_file).into());

    // A worker pays a command with the three files.
    let key = unique("secret-files").replace('_', "-");
    let value = serde_json::json!({"idempotency_key": key, "account_id": "acct_files",
        "amount_minor": 700, "currency": "EUR", "payment_method": "pm_card_visa"});
    stack
        .produce(&[WorkloadRecord {
            kind: RecordKind::Valid,
            key: Some(key.clone().into_bytes()),
            value: Some(value.to_string().into_bytes()),
            partition_hint: None,
        }])
        .await;
    let mut worker = Proc::spawn("worker-secret-files", binary(&["run"], &env));
    let results = stack.wait_for_results(1, Duration::from_secs(90)).await;
    worker.stop(Duration::from_secs(30)).await;
    assert_eq!(results[0].outcome, "succeeded", "{results:?}");
    // The token is on the Redis only REDIS_URL_FILE's password opens.
    let mut private = redis::Client::open(format!(
        "redis://:{REDIS_PASSWORD}@127.0.0.1:{}",
        redis.port
    ))
    .unwrap()
    .get_multiplexed_async_connection()
    .await
    .unwrap();
    let status = redis_token_status(&mut private, &stack.redis.prefix, &key).await;
    assert_eq!(status.as_deref(), Some("completed"));
    let log = worker.lines().join("\n");
    assert!(log.contains("starting worker"), "{log}");
    assert_shows_no_secret("the worker's log at debug", &log);

    // `--help` with every form in the environment, the plain ones included.
    let everything = with(
        &env,
        &[
            ("DATABASE_URL", &database_url),
            ("GATEWAY_API_KEY", KAFKA_SECRET),
        ],
    );
    for command in [
        &["run", "--help"][..],
        &["audit", "--help"],
        &["migrate", "--help"],
    ] {
        let (code, help) = run(command, &everything).await;
        assert_eq!(code, Some(0), "{help}");
        assert!(help.contains("DATABASE_URL_FILE"), "{help}");
        assert_shows_no_secret(&format!("{command:?}"), &help);
    }
    let (_, help) = run(&["run", "--help"], &env).await;
    for setting in ["REDIS_URL_FILE", "KAFKA_CONFIG_FILE", "REDIS_CLIENT_CERT"] {
        assert!(help.contains(setting), "{help}");
    }

    // Both forms: a usage error that names the settings, not what they hold.
    let (code, output) = run(
        &["migrate"],
        &with(&env, &[("DATABASE_URL", &database_url)]),
    )
    .await;
    assert_eq!(code, Some(2), "{output}");
    assert!(output.contains("--database-url-file"), "{output}");
    assert_shows_no_secret("DATABASE_URL twice", &output);
    let redis_url = format!("redis://:{REDIS_PASSWORD}@127.0.0.1:{}", redis.port);
    let (code, output) = run(
        &["tokens", "show", "k1"],
        &with(&env, &[("REDIS_URL", &redis_url)]),
    )
    .await;
    assert_eq!(code, Some(2), "{output}");
    assert!(output.contains("--redis-url-file"), "{output}");
    assert_shows_no_secret("REDIS_URL twice", &output);
    let (code, output) = run(
        &["run"],
        &with(&env, &[("KAFKA_CONFIG_CLIENT_ID", "twice")]),
    )
    .await;
    assert_eq!(
        code,
        Some(2),
        "a usage error, as for the other settings: {output}"
    );
    assert!(
        output.contains("KAFKA_CONFIG_FILE") && output.contains("client.id"),
        "{output}"
    );
    assert_shows_no_secret("client.id twice", &output);

    // A file naming a setting the worker owns, and one that is not there.
    let owned = private_file(
        &dir.0,
        "owned.properties",
        &format!("sasl.password={KAFKA_SECRET}\nenable.auto.commit=true\n"),
    );
    let (code, output) = run(
        &["run"],
        &with(&env, &[("KAFKA_CONFIG_FILE", path_str(&owned))]),
    )
    .await;
    assert_eq!(code, Some(2), "{output}");
    assert!(
        output.contains("line 2") && output.contains("enable.auto.commit"),
        "{output}"
    );
    assert_shows_no_secret("an owned setting in the file", &output);
    let missing = dir.0.join("missing");
    let (code, output) = run(
        &["migrate"],
        &with(&env, &[("DATABASE_URL_FILE", path_str(&missing))]),
    )
    .await;
    assert_eq!(code, Some(2), "{output}");
    assert!(
        output.contains("DATABASE_URL_FILE") && output.contains(path_str(&missing)),
        "{output}"
    );
    // A file that never ends (a device named by mistake) is refused, not read
    // until memory runs out.
    let (code, output) = run(
        &["migrate"],
        &with(&env, &[("DATABASE_URL_FILE", "/dev/zero")]),
    )
    .await;
    assert_eq!(code, Some(2), "{output}");
    assert!(
        output.contains("DATABASE_URL_FILE /dev/zero: larger than 4 MiB"),
        "{output}"
    );

    // A file every user may read is named in a warning; a private one is not.
    let (code, output) = run(&["migrate"], &env).await;
    assert_eq!(code, Some(0), "{output}");
    assert!(!output.contains("readable by every user"), "{output}");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&database_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (code, output) = run(&["migrate"], &env).await;
    assert_eq!(code, Some(0), "{output}");
    assert!(
        output.contains("readable by every user") && output.contains("DATABASE_URL_FILE"),
        "{output}"
    );
    assert_shows_no_secret("migrate", &output);
}
