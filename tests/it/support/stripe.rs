//! The Stripe adapter under test: a database and Redis prefix of its own, the
//! adapter against a given server (localstripe or the scripted one) recording on
//! a pool of its own, processors over it, and what the tables and localstripe
//! hold afterwards.

use std::sync::Arc;
use std::time::{Duration, Instant};

use payment_worker::configuration::{DatabaseSettings, StripeCompat, DEFAULT_STRIPE_API_VERSION};
use payment_worker::fault::Faults;
use payment_worker::gateway::{GatewayTransport, PaymentGateway, StripeGateway, StripeOptions};
use payment_worker::payment::{
    Attempt, CommandContext, GatewayLookup, Outcome, PaymentCommand, Processor,
};
use payment_worker::token::{RedisTokenStore, TokenPolicy, TokenStore};
use payment_worker_devtools::{LocalStripe, LOCALSTRIPE_KEY};
use serde_json::Value;
use uuid::Uuid;

use crate::support::deployment::{DeployedGateway, Deployment, PARTITIONS};
use crate::support::helpers::{http, unique, TestDb, TestRedis};
use crate::support::procs;

pub struct StripeRig {
    pub db: TestDb,
    pub _redis: TestRedis,
    pub tokens: Arc<dyn TokenStore>,
    url: String,
    compat: StripeCompat,
    records: sqlx::PgPool,
}

impl StripeRig {
    /// A rig whose adapter talks to `url`; tokens leased for `lease`.
    pub async fn new(url: &str, compat: StripeCompat, lease: Duration) -> Self {
        let db = TestDb::new().await;
        let redis = TestRedis::new().await;
        let tokens: Arc<dyn TokenStore> = Arc::new(RedisTokenStore::new(
            redis.conn.clone(),
            redis.prefix.clone(),
            TokenPolicy {
                lease,
                ..TokenPolicy::default()
            },
        ));
        let records =
            payment_worker::startup::connect_with_size(&DatabaseSettings::with_url(&db.url), 2)
                .await
                .unwrap();
        Self {
            db,
            _redis: redis,
            tokens,
            url: url.to_owned(),
            compat,
            records,
        }
    }

    /// A localstripe of its own and a rig against it (leases of 5 s).
    pub async fn localstripe() -> (LocalStripe, Self) {
        let localstripe = LocalStripe::start().await.unwrap();
        let rig = Self::new(
            &localstripe.url(),
            StripeCompat::Localstripe,
            Duration::from_secs(5),
        )
        .await;
        (localstripe, rig)
    }

    /// The adapter with this API key.
    pub fn gateway_with_key(&self, api_key: &str) -> StripeGateway {
        StripeGateway::new(
            &StripeOptions {
                base_url: self.url.clone(),
                api_version: DEFAULT_STRIPE_API_VERSION.to_owned(),
                compat: self.compat,
                timeout: Duration::from_secs(10),
                connect_timeout: Duration::from_secs(1),
            },
            &GatewayTransport::with_api_key(api_key.into()),
            self.records.clone(),
        )
        .unwrap()
        .with_faults(Faults::none())
    }

    /// The adapter with localstripe's key.
    pub fn gateway(&self) -> Arc<dyn PaymentGateway> {
        Arc::new(self.gateway_with_key(LOCALSTRIPE_KEY))
    }

    pub fn processor(&self, gateway: Arc<dyn PaymentGateway>) -> Processor {
        Processor::new(
            Arc::clone(&self.tokens),
            gateway,
            self.db.pool.clone(),
            GatewayLookup::Uncertain,
            "stripe-test",
        )
        .with_faults(Faults::none())
    }

    /// (payment id, status, transaction id, failure reason) of the key's rows.
    pub async fn rows(&self, key: &str) -> Vec<(Uuid, String, Option<String>, Option<String>)> {
        sqlx::query_as(
            "SELECT id, status, gateway_transaction_id, failure_reason FROM payments
             WHERE idempotency_key = $1",
        )
        .bind(key)
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }

    /// (create attempt, PaymentIntent id, confirm attempts) recorded for the key.
    pub async fn records(&self, key: &str) -> Vec<(i32, Option<String>, i32)> {
        sqlx::query_as(
            "SELECT create_attempt, payment_intent_id, confirm_attempts
             FROM stripe_payment_intents WHERE idempotency_key = $1 ORDER BY create_attempt",
        )
        .bind(key)
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }
}

pub fn command(key: &str, amount_minor: i64, currency: &str, method: &str) -> PaymentCommand {
    PaymentCommand::new(key, "acct_7", amount_minor, currency, method, None).unwrap()
}

/// Attempts `command` until an attempt is final (retries wait as the handler
/// would: a token left to its lease is reserved again once the lease ran out).
pub async fn until_final(processor: &Processor, command: &PaymentCommand) -> Outcome {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match processor.process(command, &CommandContext::default()).await {
            Attempt::Final(outcome) | Attempt::Unbooked(outcome) => return outcome,
            Attempt::Retry { after, reason, .. } => {
                assert!(
                    Instant::now() < deadline,
                    "still retrying after 60 s: {reason}"
                );
                tokio::time::sleep(after.max(Duration::from_millis(100))).await;
            }
        }
    }
}

/// Every PaymentIntent localstripe at `url` holds (its raw JSON).
pub async fn localstripe_intents(url: &str) -> Vec<Value> {
    localstripe_list(url, "/v1/payment_intents?limit=10000").await
}

/// The `data` of one page of a localstripe list (`path` with its query), raw.
pub async fn localstripe_list(url: &str, path: &str) -> Vec<Value> {
    let page: Value = http()
        .get(format!("{url}{path}"))
        .bearer_auth(LOCALSTRIPE_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    page["data"].as_array().cloned().unwrap_or_default()
}

/// localstripe's PaymentIntents made for `key`: (id, status).
pub async fn intents_for(url: &str, key: &str) -> Vec<(String, String)> {
    localstripe_intents(url)
        .await
        .into_iter()
        .filter(|pi| pi["metadata"]["idempotency_key"] == key)
        .map(|pi| {
            (
                pi["id"].as_str().unwrap_or_default().to_owned(),
                pi["status"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// A deployment of three `run` workers with `--gateway stripe` against a fresh
/// localstripe (kept alive by the deployment): the deployment, localstripe's URL and
/// the API key file the workers read (the caller removes it).
pub async fn localstripe_deployment(
    db: &TestDb,
    redis: &TestRedis,
) -> (Deployment, String, std::path::PathBuf) {
    let localstripe = LocalStripe::start().await.unwrap();
    let url = localstripe.url();
    let key_file = std::env::temp_dir().join(unique("pw-stripe-key"));
    std::fs::write(&key_file, format!("{LOCALSTRIPE_KEY}\n")).unwrap();
    let records =
        payment_worker::startup::connect_with_size(&DatabaseSettings::with_url(&db.url), 2)
            .await
            .unwrap();
    let client = StripeGateway::new(
        &StripeOptions {
            base_url: url.clone(),
            api_version: DEFAULT_STRIPE_API_VERSION.to_owned(),
            compat: StripeCompat::Localstripe,
            timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(2),
        },
        &GatewayTransport::with_api_key(LOCALSTRIPE_KEY.into()),
        records,
    )
    .unwrap();
    let gateway = DeployedGateway {
        keep: Box::new(localstripe),
        env: vec![
            ("GATEWAY_KIND".to_owned(), "stripe".to_owned()),
            ("GATEWAY_URL".to_owned(), url.clone()),
            (
                "GATEWAY_API_KEY_FILE".to_owned(),
                key_file.display().to_string(),
            ),
            ("STRIPE_COMPAT".to_owned(), "localstripe".to_owned()),
            ("STRIPE_RECORD_CONNECTIONS".to_owned(), "2".to_owned()),
        ],
        client: Arc::new(client),
    };
    let deployment = Deployment::start_with_gateway(
        procs::dev_kafka(PARTITIONS).await,
        PARTITIONS,
        &db.url,
        &redis.prefix,
        gateway,
        &[("DATABASE_MAX_CONNECTIONS", "8")],
    );
    (deployment, url, key_file)
}
