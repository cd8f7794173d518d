//! Test harness: makes sure the local services run, and gives each test an isolated
//! Postgres database (random name) and Redis key prefix, so tests run in parallel.
#![allow(dead_code)]

use std::net::TcpStream;
use std::process::Command;
use std::sync::Once;
use std::time::Duration;

use payment_worker::configuration::DatabaseSettings;
use payment_worker::operator;
use sqlx::PgPool;

pub const PG_ADDR: &str = "127.0.0.1:5432";
pub const REDIS_ADDR: &str = "127.0.0.1:6379";
pub const REDIS_URL: &str = "redis://127.0.0.1:6379";

fn reachable(addr: &str) -> bool {
    addr.parse()
        .ok()
        .and_then(|a| TcpStream::connect_timeout(&a, Duration::from_millis(300)).ok())
        .is_some()
}

fn wait_for(addr: &str) {
    for _ in 0..100 {
        if reachable(addr) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{addr} is still unreachable after starting it");
}

fn start_postgres() {
    let versions =
        std::fs::read_dir("/etc/postgresql").expect("no /etc/postgresql: install postgresql");
    for version in versions.flatten() {
        let _ = Command::new("pg_ctlcluster")
            .args(["--skip-systemctl-redirect"])
            .arg(version.file_name())
            .args(["main", "start"])
            .status();
    }
}

fn start_redis() {
    let _ = std::fs::create_dir_all("/var/lib/redis");
    let _ = std::fs::create_dir_all("/var/log/redis");
    let _ = Command::new("redis-server")
        .args([
            "--daemonize",
            "yes",
            "--bind",
            "127.0.0.1",
            "-::1",
            "--port",
            "6379",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            "/var/lib/redis",
            "--logfile",
            "/var/log/redis/ci.log",
        ])
        .status();
}

/// Spans of every trace that arrived with a sampled `traceparent` (the test of
/// the span tree sends one); traces started here are not sampled, so the other
/// tests' spans cost nothing.
pub fn span_exporter() -> &'static opentelemetry_sdk::trace::InMemorySpanExporter {
    static EXPORTER: std::sync::OnceLock<opentelemetry_sdk::trace::InMemorySpanExporter> =
        std::sync::OnceLock::new();
    EXPORTER.get_or_init(opentelemetry_sdk::trace::InMemorySpanExporter::default)
}

fn install_tracing() {
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        // The worker's own ids: a random one may read as a card number, which the
        // worker then refuses to send on (results, gateway requests).
        .with_id_generator(payment_worker::telemetry::CardFreeIds::default())
        .with_sampler(opentelemetry_sdk::trace::Sampler::ParentBased(Box::new(
            opentelemetry_sdk::trace::Sampler::AlwaysOff,
        )))
        .with_simple_exporter(span_exporter().clone())
        .build();
    let traces = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("payment-worker-tests"))
        .with_filter(tracing_subscriber::EnvFilter::new(
            "info,payment_worker=debug",
        ));
    // Logs only when RUST_LOG is set, captured per test.
    let logs = tracing_subscriber::fmt::layer()
        .with_test_writer()
        .with_filter(tracing_subscriber::EnvFilter::from_default_env());
    let _ = tracing_subscriber::registry()
        .with(logs)
        .with(traces)
        .try_init();
    // Keep the provider alive for the whole test binary.
    std::mem::forget(provider);
}

/// Starts Postgres and Redis when they are down (CI may run on a machine where
/// they were stopped). Runs once per test binary.
pub fn ensure_services() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        payment_worker::telemetry::install_crypto_provider();
        install_tracing();
        if !reachable(PG_ADDR) {
            start_postgres();
            wait_for(PG_ADDR);
        }
        if !reachable(REDIS_ADDR) {
            start_redis();
            wait_for(REDIS_ADDR);
        }
    });
}

/// Where `#[sqlx::test]` makes each test's database (see tests/it/main.rs).
pub const SQLX_TEST_SERVER: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// An HTTP client for tests. reqwest is built without a crypto provider of its
/// own (the binary installs ring as the process default): install it first.
pub fn http() -> reqwest::Client {
    payment_worker::telemetry::install_crypto_provider();
    reqwest::Client::new()
}

/// `GET url` with [`http`].
pub async fn http_get(url: impl reqwest::IntoUrl) -> reqwest::Result<reqwest::Response> {
    http().get(url).send().await
}

/// A fresh key or name: `<prefix>_` and 128 random bits written as 32 letters
/// (`a`–`p`, hex with letters for digits). It holds no digit of its own, so it
/// never reads as a card number, whatever a test appends to it (`-1`, a counter,
/// a generated workload's `:000123`): the worker refuses such a key
/// (`card_number_as_key`) and masks it where it echoes one, and a test that wants
/// such a key says so. (A hex id held a digit run that passes as one now and then.)
pub fn unique(prefix: &str) -> String {
    let bits = uuid::Uuid::new_v4().as_u128();
    let letters: String = (0..32)
        .rev()
        .map(|at| char::from(b'a' + ((bits >> (at * 4)) & 0xf) as u8))
        .collect();
    format!("{prefix}_{letters}")
}

/// A fresh trace id (hex) that no strict reader drops as a card number, as the
/// worker's own ids are (`telemetry::CardFreeIds`).
pub fn card_free_trace_id() -> opentelemetry::trace::TraceId {
    use opentelemetry_sdk::trace::IdGenerator as _;
    payment_worker::telemetry::CardFreeIds::default().new_trace_id()
}

#[test]
fn unique_names_and_what_tests_append_to_them_are_never_card_numbers() {
    use proptest::prelude::*;
    proptest!(|(prefix in "[a-z][a-z_-]{0,12}", n in 0u64..1_000_000_000, separator in "[-_.:/ ]")| {
        let name = unique(&prefix);
        prop_assert!(!name.bytes().skip(prefix.len()).any(|b| b.is_ascii_digit()), "{}", name);
        let appended = format!("{name}{separator}{n}");
        prop_assert!(!payment_worker::redaction::holds_card_number(appended.as_bytes()), "{}", appended);
    });
}

/// A fresh database with `migrations/` applied, dropped when the test passes (kept
/// for a post-mortem when it fails), as `#[sqlx::test]` does with its own: a suite
/// run would otherwise leave some 300 databases behind. For tests that need its URL
/// (worker processes) or more connections than `#[sqlx::test]`'s shared pool.
pub struct TestDb {
    pub name: String,
    pub url: String,
    pub pool: PgPool,
}

impl TestDb {
    pub async fn new() -> Self {
        ensure_services();
        let name = unique("pw_test");
        let url = format!("postgres://postgres@{PG_ADDR}/{name}");
        // Small pools: tests run in parallel against one server.
        let settings = DatabaseSettings {
            max_connections: 12,
            ..DatabaseSettings::with_url(&url)
        };
        let pool = payment_worker::startup::connect_and_migrate(&settings)
            .await
            .expect("test database");
        Self { name, url, pool }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept database {} for a post-mortem", self.name);
            return;
        }
        // FORCE ends the connections still open (pools, worker processes going away).
        let _ = Command::new("psql")
            .args(["-h", "127.0.0.1", "-U", "postgres", "-qc"])
            .arg(format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// A Redis connection plus a key prefix nobody else uses.
pub struct TestRedis {
    pub prefix: String,
    pub conn: redis::aio::ConnectionManager,
}

impl TestRedis {
    pub async fn new() -> Self {
        ensure_services();
        Self {
            prefix: unique("pwt"),
            conn: observer_connection(REDIS_URL).await,
        }
    }
}

/// A connection for a test's own look at Redis (planting, scanning, flushing a
/// prefix): with redis-rs's default half-second answer timeout, a SCAN on a machine
/// running six tests at once was seen to time out, failing a test for its
/// instrument's sake. The worker's own connections keep their settings.
pub async fn observer_connection(url: &str) -> redis::aio::ConnectionManager {
    let client = redis::Client::open(url).expect("redis url");
    patient_connection(client, Duration::from_secs(5)).await
}

/// A connection that waits up to `answer_timeout` for each answer (and 10 s to
/// connect), for tests that assert what Redis decides, not how fast it answers.
pub async fn patient_connection(
    client: redis::Client,
    answer_timeout: Duration,
) -> redis::aio::ConnectionManager {
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(10)))
        .set_response_timeout(Some(answer_timeout));
    redis::aio::ConnectionManager::new_with_config(client, config)
        .await
        .expect("redis connection")
}

// ---------------------------------------------------------------------------
// The whole stack in process: database, Redis prefix, local Kafka, simulator.

use std::collections::HashMap;
use std::sync::Arc;

use payment_worker::configuration::{KafkaSettings, WorkerSettings};
use payment_worker::gateway::{HttpGateway, LedgerEntry, PaymentGateway};
use payment_worker::payment::{GatewayLookup, Processor};
use payment_worker::retry::RetryPolicy;
use payment_worker::token::{IdempotencyKey, RedisTokenStore, TokenPolicy, TokenStore};
use payment_worker::worker::{self, Handler, Publisher, ResultRecord, RunningWorker};
use payment_worker_devtools::LocalKafka;
use payment_worker_devtools::{GatewaySimulator, RunningSimulator, SimulatorConfig, SlowKey};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::OwnedMessage;
use rdkafka::{Offset, TopicPartitionList};

pub struct Stack {
    pub db: TestDb,
    pub redis: TestRedis,
    pub kafka: LocalKafka,
    pub settings: KafkaSettings,
    pub partitions: i32,
    pub simulator: RunningSimulator,
    pub tokens: Arc<dyn TokenStore>,
    pub gateway: Arc<dyn PaymentGateway>,
}

pub fn quick_worker_settings() -> WorkerSettings {
    WorkerSettings {
        drain_deadline: Duration::from_secs(3),
        ..WorkerSettings::default()
    }
}

impl Stack {
    pub async fn new(partitions: i32, simulator: SimulatorConfig) -> Self {
        Self::with_policy(
            partitions,
            simulator,
            TokenPolicy {
                lease: Duration::from_secs(5),
                ..TokenPolicy::default()
            },
        )
        .await
    }

    /// One partition, `records` produced to it, and a gateway that answers in 20 ms
    /// but holds the charge of the first record's key for `hold`; returns the stack
    /// and the held key.
    pub async fn holding_the_first_charge(
        records: &[operator::WorkloadRecord],
        hold: Duration,
    ) -> (Self, String) {
        let held = String::from_utf8(records[0].key.clone().expect("generated keys")).unwrap();
        let stack = Self::new(
            1,
            SimulatorConfig {
                latency_ms: 20,
                slow_keys: vec![SlowKey {
                    key: IdempotencyKey::try_from(held.as_str()).unwrap(),
                    delay: hold,
                }],
                ..SimulatorConfig::default()
            },
        )
        .await;
        stack.produce(records).await;
        (stack, held)
    }

    pub async fn with_policy(
        partitions: i32,
        simulator: SimulatorConfig,
        policy: TokenPolicy,
    ) -> Self {
        let db = TestDb::new().await;
        let redis = TestRedis::new().await;
        let kafka = LocalKafka::start(3).expect("mock cluster");
        let settings = KafkaSettings::local(kafka.bootstrap_servers(), unique("group"));
        kafka
            .create_payment_topics(&settings, partitions)
            .expect("topics");
        let simulator = GatewaySimulator::bind("127.0.0.1:0".parse().unwrap(), simulator)
            .expect("simulator")
            .spawn();
        let tokens: Arc<dyn TokenStore> = Arc::new(RedisTokenStore::new(
            redis.conn.clone(),
            redis.prefix.clone(),
            policy,
        ));
        let gateway: Arc<dyn PaymentGateway> = Arc::new(
            HttpGateway::new(
                &simulator.url(),
                Duration::from_secs(15),
                Duration::from_secs(1),
            )
            .unwrap(),
        );
        Self {
            db,
            redis,
            kafka,
            settings,
            partitions,
            simulator,
            tokens,
            gateway,
        }
    }

    pub fn processor(&self, id: &str) -> Arc<Processor> {
        Arc::new(Processor::new(
            Arc::clone(&self.tokens),
            Arc::clone(&self.gateway),
            self.db.pool.clone(),
            GatewayLookup::Uncertain,
            id,
        ))
    }

    pub fn start_worker(&self, id: &str, settings: &WorkerSettings) -> RunningWorker {
        let retry = RetryPolicy {
            budget: Duration::from_secs(60),
            ..RetryPolicy::default()
        };
        self.start_worker_retrying(id, settings, retry)
    }

    /// A worker on this stack whose handler retries by `retry`.
    pub fn start_worker_retrying(
        &self,
        id: &str,
        settings: &WorkerSettings,
        retry: RetryPolicy,
    ) -> RunningWorker {
        let handler = Arc::new(Handler::new(
            self.processor(id),
            Publisher::for_mode(&self.settings, settings).unwrap(),
            retry,
        ));
        worker::start(&self.settings, settings, handler).expect("worker start")
    }

    /// The environment of a `payment-worker run` process joining this stack's group.
    pub fn run_env(&self) -> HashMap<String, String> {
        [
            ("KAFKA_BROKERS", self.settings.brokers.clone()),
            ("KAFKA_GROUP_ID", self.settings.group_id.clone()),
            ("KAFKA_SESSION_TIMEOUT", "6s".to_owned()),
            ("DATABASE_URL", self.db.url.clone()),
            ("REDIS_URL", REDIS_URL.to_owned()),
            ("REDIS_KEY_PREFIX", self.redis.prefix.clone()),
            ("GATEWAY_URL", self.simulator.url()),
            ("LEASE", "5s".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    pub async fn produce(&self, records: &[operator::WorkloadRecord]) {
        let producer: rdkafka::producer::FutureProducer =
            worker::producer_config(&self.settings).create().unwrap();
        operator::publish_records(
            &producer,
            &self.settings.commands_topic,
            self.partitions,
            records,
        )
        .await
        .unwrap();
    }

    async fn read(&self, topic: String) -> Vec<OwnedMessage> {
        let settings = self.settings.clone();
        tokio::task::spawn_blocking(move || {
            operator::read_partitions(&settings, &topic, |_, low| low).unwrap()
        })
        .await
        .unwrap()
    }

    pub async fn results(&self) -> Vec<ResultRecord> {
        use rdkafka::message::Message;
        self.read(self.settings.results_topic.clone())
            .await
            .iter()
            .map(|m| {
                serde_json::from_slice(m.payload().expect("result payload")).expect("result json")
            })
            .collect()
    }

    pub async fn dead_letters(&self) -> Vec<OwnedMessage> {
        self.read(self.settings.dlq_topic.clone()).await
    }

    /// Waits until `count` distinct command positions have a result; returns all results.
    pub async fn wait_for_results(&self, count: usize, within: Duration) -> Vec<ResultRecord> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let results = self.results().await;
            let answered: std::collections::HashSet<_> = results
                .iter()
                .map(|r| (r.source.partition, r.source.offset))
                .collect();
            if answered.len() >= count {
                return results;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "only {} of {count} commands answered after {within:?}",
                answered.len()
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// Offsets the group committed, per partition of the commands topic.
    pub async fn committed(&self) -> HashMap<i32, i64> {
        committed_offsets(&self.settings, self.partitions).await
    }

    pub async fn high_watermarks(&self) -> HashMap<i32, i64> {
        let settings = self.settings.clone();
        let partitions = self.partitions;
        tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer = worker::base_config(&settings).create().unwrap();
            let out = (0..partitions)
                .map(|p| {
                    let (_, high) = consumer
                        .fetch_watermarks(&settings.commands_topic, p, Duration::from_secs(10))
                        .unwrap();
                    (p, high)
                })
                .collect();
            drop(consumer);
            out
        })
        .await
        .unwrap()
    }

    /// Waits until every partition's committed offset reached its high watermark.
    pub async fn wait_for_commits(&self, within: Duration) {
        let deadline = std::time::Instant::now() + within;
        let high = self.high_watermarks().await;
        loop {
            let committed = self.committed().await;
            if high.iter().all(|(p, h)| committed.get(p) == Some(h)) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "committed {committed:?} never reached {high:?}"
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    pub fn ledger(&self) -> Vec<LedgerEntry> {
        self.simulator.ledger()
    }

    pub async fn payment_rows(&self) -> Vec<(String, String, Option<String>)> {
        sqlx::query_as("SELECT idempotency_key, status, gateway_transaction_id FROM payments")
            .fetch_all(&self.db.pool)
            .await
            .unwrap()
    }

    /// I1 and I7: at most one charge per key, and ledger = books.
    pub async fn assert_books_balance(&self) {
        let ledger = self.ledger();
        let mut per_key: HashMap<&str, usize> = HashMap::new();
        for entry in &ledger {
            *per_key.entry(entry.idempotency_key.as_str()).or_default() += 1;
        }
        let doubles: Vec<_> = per_key.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            doubles.is_empty(),
            "keys charged more than once: {doubles:?}"
        );
        let rows = self.payment_rows().await;
        let by_key: HashMap<&str, (&str, Option<&str>)> = rows
            .iter()
            .map(|(k, s, t)| (k.as_str(), (s.as_str(), t.as_deref())))
            .collect();
        assert_eq!(
            rows.len(),
            ledger.len(),
            "every row has its ledger entry and vice versa"
        );
        for entry in &ledger {
            let expected = match entry.status {
                payment_worker::gateway::ChargeStatus::Approved => "succeeded",
                payment_worker::gateway::ChargeStatus::Declined => "declined",
            };
            assert_eq!(
                by_key.get(entry.idempotency_key.as_str()),
                Some(&(expected, Some(entry.transaction_id.as_str()))),
                "row of {}",
                entry.idempotency_key
            );
        }
    }
}

/// The offsets `settings.group_id` committed on the commands topic (-1: none).
pub async fn committed_offsets(settings: &KafkaSettings, partitions: i32) -> HashMap<i32, i64> {
    let settings = settings.clone();
    tokio::task::spawn_blocking(move || {
        let mut config = worker::base_config(&settings);
        config.set("group.id", &settings.group_id);
        let consumer: BaseConsumer = config.create().unwrap();
        let mut list = TopicPartitionList::new();
        for p in 0..partitions {
            list.add_partition(&settings.commands_topic, p);
        }
        // An offset an open transaction sent is not answered until the transaction
        // ends (librdkafka retries meanwhile): a SIGKILLed member's lasts until the
        // broker aborts it, up to the exactly-once tests' 10 s transaction timeout.
        let committed = consumer
            .committed_offsets(list, Duration::from_secs(30))
            .unwrap();
        let out = committed
            .elements()
            .iter()
            .map(|e| {
                // An error (an offset a transaction still holds, say) is not "none".
                if let Err(error) = e.error() {
                    panic!("committed offset of partition {}: {error}", e.partition());
                }
                let offset = match e.offset() {
                    Offset::Offset(o) => o,
                    _ => -1,
                };
                (e.partition(), offset)
            })
            .collect();
        // A partition list librdkafka returned that outlives its consumer makes the
        // consumer's drop hang: lists go first.
        drop(committed);
        drop(consumer);
        out
    })
    .await
    .unwrap()
}

/// Waits until the members own every partition between them and the group is quiet.
pub async fn wait_for_stable_group(workers: &[RunningWorker], partitions: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut stable_since = None;
    loop {
        let owned: Vec<usize> = workers
            .iter()
            .map(RunningWorker::assigned_partitions)
            .collect();
        let settled = owned.iter().sum::<usize>() == partitions && owned.iter().all(|n| *n > 0);
        match (settled, stable_since) {
            (true, Some(since))
                if std::time::Instant::now() - since > Duration::from_millis(1500) =>
            {
                return
            }
            (true, None) => stable_since = Some(std::time::Instant::now()),
            (false, _) => stable_since = None,
            _ => {}
        }
        assert!(
            std::time::Instant::now() < deadline,
            "group never settled: {owned:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Stops workers off the runtime threads (closing a consumer blocks).
pub async fn stop_all(workers: Vec<RunningWorker>) {
    for w in workers {
        w.stop().await.expect("worker stop");
    }
}

/// The final outcome `attempt` reached; a retry fails the test with its reason.
pub fn final_outcome(
    attempt: payment_worker::payment::Attempt,
) -> payment_worker::payment::Outcome {
    match attempt {
        payment_worker::payment::Attempt::Final(outcome)
        | payment_worker::payment::Attempt::Unbooked(outcome) => outcome,
        payment_worker::payment::Attempt::Retry { reason, .. } => {
            panic!("expected a final outcome, got a retry: {reason}")
        }
    }
}

/// A duplicate of `payment_id` that repeats the original answer read from its row.
pub fn assert_duplicate_of(outcome: &payment_worker::payment::Outcome, payment_id: uuid::Uuid) {
    let payment_worker::payment::Outcome::Duplicate {
        payment_id: found,
        original,
    } = outcome
    else {
        panic!("not a duplicate: {outcome:?}");
    };
    assert_eq!(*found, payment_id, "{outcome:?}");
    let original = original
        .as_ref()
        .expect("a duplicate carries the original answer");
    assert_eq!(original.payment_id, payment_id);
    assert!(
        ["succeeded", "declined"].contains(&original.outcome.as_str()),
        "{original:?}"
    );
    assert!(original.gateway_transaction_id.is_some(), "{original:?}");
}

/// A server that accepts connections and never answers (a hung host, a firewall
/// that swallows packets after the handshake); abort the handle to close it.
pub async fn silent_server() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut sockets = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            sockets.push(socket);
        }
    });
    (addr, held)
}

/// Every record of `topic`, from the start of each partition to the end a reader of
/// `isolation` (`read_committed`, `read_uncommitted`) sees.
pub async fn read_topic(
    settings: &KafkaSettings,
    topic: &str,
    isolation: &str,
) -> Vec<rdkafka::message::OwnedMessage> {
    let mut settings = settings.clone();
    settings
        .extra
        .push(("isolation.level".into(), isolation.into()));
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        operator::read_partitions(&settings, &topic, |_, low| low).unwrap()
    })
    .await
    .unwrap()
}

/// The result records of `records`.
pub fn result_records(records: &[rdkafka::message::OwnedMessage]) -> Vec<ResultRecord> {
    records
        .iter()
        .map(|m| {
            let payload = rdkafka::Message::payload(m).expect("result payload");
            serde_json::from_slice(payload).expect("result json")
        })
        .collect()
}

/// The lease of a test that calls a gateway's `charge` itself, holding no token:
/// every check passes, as for a caller that owns the key outright.
pub struct NoLease;

#[async_trait::async_trait]
impl payment_worker::gateway::LeaseGuard for NoLease {
    async fn check(&self) -> Result<(), payment_worker::gateway::LeaseLoss> {
        Ok(())
    }
}
