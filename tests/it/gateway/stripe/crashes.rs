//! `payment-worker process --gateway stripe` against localstripe, SIGKILLed
//! between the create and the confirm, and after the confirm before the payment
//! committed: the next attempt confirms the recorded PaymentIntent or books the
//! one that succeeded, never makes a second. Then `audit`: the books clean, an
//! orphaned unconfirmed PaymentIntent listed, and `--repair` cancelling it unless
//! its payment is in progress.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use payment_worker::fault::{FaultPoint, Faults, FROZEN_MARKER};
use payment_worker::token::{IdempotencyKey, RedisTokenStore, TokenPolicy, TokenStore};
use payment_worker_devtools::{LocalStripe, LOCALSTRIPE_KEY};
use serde_json::Value;

use crate::support::audit::{run_audit, AuditVerdict};
use crate::support::helpers::{http, unique, TestDb, TestRedis, REDIS_URL};
use crate::support::procs::{binary, run_to_end, Proc};
use crate::support::stripe::{intents_for, localstripe_intents};

struct Setup {
    db: TestDb,
    redis: TestRedis,
    localstripe: LocalStripe,
    key_file: std::path::PathBuf,
}

impl Setup {
    async fn new() -> Self {
        let db = TestDb::new().await;
        let redis = TestRedis::new().await;
        let localstripe = LocalStripe::start().await.unwrap();
        let key_file = std::env::temp_dir().join(unique("pw-stripe-key"));
        std::fs::write(&key_file, format!("{LOCALSTRIPE_KEY}\n")).unwrap();
        Self {
            db,
            redis,
            localstripe,
            key_file,
        }
    }

    fn env(&self) -> HashMap<String, String> {
        [
            ("DATABASE_URL", self.db.url.clone()),
            ("REDIS_URL", REDIS_URL.to_owned()),
            ("REDIS_KEY_PREFIX", self.redis.prefix.clone()),
            ("LEASE", "1s".to_owned()),
            ("GATEWAY_KIND", "stripe".to_owned()),
            ("GATEWAY_URL", self.localstripe.url()),
            ("GATEWAY_API_KEY_FILE", self.key_file.display().to_string()),
            ("STRIPE_COMPAT", "localstripe".to_owned()),
            ("DATABASE_MAX_CONNECTIONS", "4".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// `process` frozen at `point` for `json`, then SIGKILLed there.
    async fn kill_at(&self, json: &str, point: FaultPoint) {
        let mut env = self.env();
        env.insert(Faults::ENV.to_owned(), point.as_str().to_owned());
        let mut process = Proc::spawn(
            format!("process-{}", point.as_str()),
            binary(&["process", json], &env),
        );
        let marker = format!("{FROZEN_MARKER} {}", point.as_str());
        process
            .wait_for(Duration::from_secs(60), |line| {
                line.contains(&marker).then_some(())
            })
            .await;
        process.sigkill();
    }

    /// `process` again until it prints a final outcome (exit 75 while the killed
    /// attempt's lease runs); returns that outcome's JSON.
    async fn process_until_final(&self, json: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (status, lines) = run_to_end(
                "process",
                binary(&["process", json], &self.env()),
                Duration::from_secs(60),
            )
            .await;
            if status.code() == Some(0) {
                let line = lines.iter().find(|l| l.starts_with("{\"outcome\""));
                return serde_json::from_str(line.expect("an outcome line")).unwrap();
            }
            assert_eq!(status.code(), Some(75), "{lines:#?}");
            assert!(Instant::now() < deadline, "never final: {lines:#?}");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    async fn audit(&self, flags: &[&str], prefix: &str) -> AuditVerdict {
        let mut args = vec!["--key-prefix", prefix, "--orphan-margin", "0s"];
        args.extend_from_slice(flags);
        run_audit(&args, &self.env()).await
    }

    async fn row(&self, key: &str) -> (String, Option<String>) {
        sqlx::query_as(
            "SELECT status, gateway_transaction_id FROM payments WHERE idempotency_key = $1",
        )
        .bind(key)
        .fetch_one(&self.db.pool)
        .await
        .unwrap()
    }

    /// An unconfirmed PaymentIntent carrying `key`'s metadata as the worker writes
    /// it, as a create whose answer was lost and that no listing found leaves behind.
    async fn orphan(&self, key: &str) -> String {
        let payment_id = uuid::Uuid::now_v7().to_string();
        let made: Value = http()
            .post(format!("{}/v1/payment_intents", self.localstripe.url()))
            .bearer_auth(LOCALSTRIPE_KEY)
            .form(&[
                ("amount", "1000"),
                ("currency", "usd"),
                ("payment_method", "pm_card_visa"),
                ("metadata[idempotency_key]", key),
                ("metadata[payment_id]", payment_id.as_str()),
                ("metadata[create_attempt]", "9"),
            ])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        made["id"].as_str().unwrap().to_owned()
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.key_file);
    }
}

fn json(key: &str) -> String {
    serde_json::json!({"idempotency_key": key, "account_id": "acct_1", "amount_minor": 1000,
        "currency": "USD", "payment_method": "pm_card_visa"})
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kills_between_the_phases_leave_one_succeeded_payment_intent_and_clean_books() {
    let setup = Setup::new().await;
    let prefix = unique("kill");
    let url = setup.localstripe.url();

    // Killed after the create was recorded, before the confirm: the PaymentIntent
    // waits unconfirmed; the next attempt confirms that one.
    let between = format!("{prefix}-between");
    setup
        .kill_at(&json(&between), FaultPoint::AfterCreate)
        .await;
    let left = intents_for(&url, &between).await;
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].1, "requires_confirmation");
    let outcome = setup.process_until_final(&json(&between)).await;
    assert_eq!(outcome["outcome"], "succeeded", "{outcome}");
    assert_eq!(
        intents_for(&url, &between).await,
        [(left[0].0.clone(), "succeeded".to_owned())],
        "the recorded PaymentIntent was confirmed, no second one made"
    );
    assert_eq!(
        setup.row(&between).await,
        ("succeeded".to_owned(), Some(left[0].0.clone()))
    );

    // Killed after the confirm, before the commit: charged, no row. The next
    // attempt finds the success and books it.
    let after = format!("{prefix}-after");
    setup.kill_at(&json(&after), FaultPoint::AfterCharge).await;
    let charged = intents_for(&url, &after).await;
    assert_eq!(charged.len(), 1);
    assert_eq!(charged[0].1, "succeeded");
    let outcome = setup.process_until_final(&json(&after)).await;
    assert_eq!(outcome["outcome"], "succeeded", "{outcome}");
    assert_eq!(
        intents_for(&url, &after).await,
        charged,
        "nothing more made"
    );
    assert_eq!(
        setup.row(&after).await,
        ("succeeded".to_owned(), Some(charged[0].0.clone()))
    );

    setup.audit(&[], &prefix).await.assert_clean();

    // An orphan of a finished payment is listed, and --repair cancels it.
    let orphan = setup.orphan(&between).await;
    // One whose payment a live worker holds is listed, and left alone.
    let held = format!("{prefix}-held");
    let worker_tokens = RedisTokenStore::new(
        setup.redis.conn.clone(),
        setup.redis.prefix.clone(),
        TokenPolicy {
            lease: Duration::from_secs(120),
            ..TokenPolicy::default()
        },
    );
    worker_tokens
        .reserve(
            &IdempotencyKey::try_from(held.as_str()).unwrap(),
            "live-worker",
        )
        .await
        .unwrap();
    let held_orphan = setup.orphan(&held).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let report = setup.audit(&[], &prefix).await;
    assert_eq!(
        report.code(),
        0,
        "orphans are warnings, not violations: {report}"
    );
    assert!(
        report.text().contains("orphaned unconfirmed charges") && report.text().contains(&orphan),
        "{report}"
    );
    let report = setup.audit(&["--repair"], &prefix).await;
    report.assert_success();
    assert!(
        report.text().contains("orphaned charges cancelled: 1"),
        "{report}"
    );
    let statuses: HashMap<String, String> = localstripe_intents(&url)
        .await
        .into_iter()
        .map(|pi| {
            (
                pi["id"].as_str().unwrap().to_owned(),
                pi["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(statuses[&orphan], "canceled");
    assert_eq!(
        statuses[&held_orphan], "requires_confirmation",
        "a payment in progress keeps its PaymentIntent"
    );
    // Still exactly one succeeded PaymentIntent per key.
    for key in [&between, &after] {
        let succeeded = intents_for(&url, key)
            .await
            .into_iter()
            .filter(|(_, status)| status == "succeeded")
            .count();
        assert_eq!(succeeded, 1, "{key}");
    }
}
