//! The Stripe account probed at start, through the binary: a key Stripe refuses, or
//! a server without Stripe's account route (the localstripe fake without
//! `STRIPE_COMPAT=localstripe`), ends `process` and `run` at once with a message
//! that says what to fix, instead of retrying every command forever.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use payment_worker_devtools::LocalStripe;

use crate::support::helpers::{unique, TestDb, TestRedis, REDIS_URL};
use crate::support::procs::{binary, run_to_end};
use crate::support::scripted_stripe::ScriptedStripe;

const KNOWN: &str = "sk_test_probe_known_31";
const REVOKED: &str = "sk_test_probe_revoked_58";

struct Setup {
    db: TestDb,
    redis: TestRedis,
    key_file: std::path::PathBuf,
}

impl Setup {
    async fn new(api_key: &str) -> Self {
        let key_file = std::env::temp_dir().join(unique("pw-probe-key"));
        std::fs::write(&key_file, format!("{api_key}\n")).unwrap();
        Self {
            db: TestDb::new().await,
            redis: TestRedis::new().await,
            key_file,
        }
    }

    fn env(&self, url: &str) -> HashMap<String, String> {
        [
            ("DATABASE_URL", self.db.url.as_str()),
            ("REDIS_URL", REDIS_URL),
            ("REDIS_KEY_PREFIX", self.redis.prefix.as_str()),
            ("DATABASE_MAX_CONNECTIONS", "4"),
            ("GATEWAY_KIND", "stripe"),
            ("GATEWAY_URL", url),
            ("GATEWAY_TIMEOUT", "3s"),
            ("GATEWAY_API_KEY_FILE", &self.key_file.display().to_string()),
            // `run` never gets as far as Kafka: nothing listens here.
            ("KAFKA_BROKERS", "127.0.0.1:9"),
            ("RUST_LOG", "debug"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.key_file);
    }
}

fn order(key: &str) -> String {
    serde_json::json!({"idempotency_key": key, "account_id": "acct_1", "amount_minor": 1200,
        "currency": "USD", "payment_method": "pm_card_visa"})
    .to_string()
}

/// `args` run to their end (at most 60 s): exit code, output, and how long it took.
async fn run(args: &[&str], env: &HashMap<String, String>) -> (Option<i32>, String, Duration) {
    let started = Instant::now();
    let (status, lines) = run_to_end("probe", binary(args, env), Duration::from_secs(60)).await;
    (status.code(), lines.join("\n"), started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_stripe_refuses_ends_process_and_run_at_start() {
    let server = ScriptedStripe::start(&[(KNOWN, "acct_probe")]).await;
    let setup = Setup::new(REVOKED).await;
    let env = setup.env(&server.url());
    let key = unique("probe-401");
    for args in [&["process", &order(&key)][..], &["run"]] {
        let before = server.requests();
        let (code, output, took) = run(args, &env).await;
        assert_eq!(code, Some(1), "{args:?}: {output}");
        assert!(
            output.contains("refused the API key (HTTP 401)") && output.contains("GATEWAY_API_KEY"),
            "{args:?}: {output}"
        );
        assert!(
            !output.contains(REVOKED),
            "{args:?} shows the key: {output}"
        );
        assert!(took < Duration::from_secs(30), "{args:?} took {took:?}");
        assert_eq!(
            server.requests() - before,
            1,
            "{args:?}: the probe, then nothing"
        );
    }
    assert!(server.intents(&key).is_empty());

    // The right key: the probe passes and the payment is made.
    std::fs::write(&setup.key_file, format!("{KNOWN}\n")).unwrap();
    let (code, output, _) = run(&["process", &order(&key)], &env).await;
    assert_eq!(code, Some(0), "{output}");
    assert_eq!(server.charges(&key), 1);

    // Stripe unreachable at start is an outage, not a setting to fix: a warning,
    // and the command is tried (and, here, to be tried again later: 75).
    let (code, output, _) = run(
        &["process", &order(&unique("probe-down"))],
        &setup.env("http://127.0.0.1:9"),
    )
    .await;
    assert_eq!(code, Some(75), "{output}");
    assert!(output.contains("could not be probed at start"), "{output}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn localstripe_without_its_compat_setting_is_named_at_start() {
    let localstripe = LocalStripe::start().await.unwrap();
    let setup = Setup::new(payment_worker_devtools::LOCALSTRIPE_KEY).await;
    let mut env = setup.env(&localstripe.url());
    for args in [&["process", &order(&unique("probe-404"))][..], &["run"]] {
        let (code, output, took) = run(args, &env).await;
        assert_eq!(code, Some(1), "{args:?}: {output}");
        assert!(
            output.contains("no GET /v1/account (HTTP 404)")
                && output.contains("STRIPE_COMPAT=localstripe"),
            "{args:?}: {output}"
        );
        assert!(took < Duration::from_secs(30), "{args:?} took {took:?}");
    }

    // With it, the probe asks what the fake has, and the payment is made.
    env.insert("STRIPE_COMPAT".into(), "localstripe".into());
    let (code, output, _) = run(&["process", &order(&unique("probe-compat"))], &env).await;
    assert_eq!(code, Some(0), "{output}");
    assert!(output.contains("\"outcome\":\"succeeded\""), "{output}");
}
