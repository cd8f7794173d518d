//! Crash tests with real processes: `dev-kafka`, `gateway-sim` and three `run`
//! workers, each its own OS process, SIGKILLed and restarted while they work.
//!
//! One of three workers is SIGKILLed mid-run and restarted later.
//! The chaos run: ten (fifty with `CHAOS_LARGE=1`) SIGKILLs of random
//! workers at random moments, Redis data loss twice, a Postgres restart, then a
//! replay of the whole topic. Both end with the invariants checked
//! against what the systems hold: gateway ledger, payments rows, Redis tokens,
//! result / dead-letter / offset state in Kafka.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use payment_worker::configuration::{DatabaseSettings, KafkaSettings};
use payment_worker::gateway::{ChargeStatus, HttpGateway, LedgerEntry, PaymentGateway};
use payment_worker::operator;
use payment_worker::operator::{RecordKind, WorkloadRecord, WorkloadSpec};
use payment_worker::worker::{self, ResultRecord};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message, OwnedMessage};
use sqlx::PgPool;

use crate::support::helpers::{unique, TestDb, TestRedis, REDIS_URL};
use crate::support::procs::{self, current_membership, Membership, PrivatePostgres, Proc};

pub(crate) const PARTITIONS: i32 = 6;
const WORKERS: usize = 3;
/// Workers ask for this; the group's first assignment after a SIGKILL waits for it.
pub(crate) const SESSION_TIMEOUT: &str = "6s";

/// The deployment of one test: a dev-kafka process, a gateway-sim process and the
/// worker processes of one consumer group, all sharing one database and Redis prefix.
pub(crate) struct Deployment {
    partitions: i32,
    _kafka: Proc,
    _gateway: Proc,
    pub(crate) settings: KafkaSettings,
    gateway: HttpGateway,
    pub(crate) worker_env: HashMap<String, String>,
    pub(crate) workers: Vec<Proc>,
    started: usize,
    kills: usize,
}

impl Deployment {
    pub(crate) async fn start(
        partitions: i32,
        database_url: &str,
        redis_prefix: &str,
        gateway_flags: &[&str],
        extra_env: &[(&str, &str)],
    ) -> Self {
        let (kafka, bootstrap) = procs::dev_kafka(partitions).await;
        let (gateway_proc, gateway_url) = procs::gateway_sim(gateway_flags).await;
        let settings = KafkaSettings::local(bootstrap.clone(), unique("group"));
        let mut worker_env: HashMap<String, String> = [
            ("KAFKA_BROKERS", bootstrap.as_str()),
            ("KAFKA_GROUP_ID", settings.group_id.as_str()),
            ("KAFKA_SESSION_TIMEOUT", SESSION_TIMEOUT),
            ("DRAIN_DEADLINE", "3s"),
            ("DATABASE_URL", database_url),
            ("DATABASE_MAX_CONNECTIONS", "16"),
            ("REDIS_URL", REDIS_URL),
            ("REDIS_KEY_PREFIX", redis_prefix),
            ("GATEWAY_URL", gateway_url.as_str()),
            ("LEASE", "5s"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        worker_env.extend(
            extra_env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        let gateway = HttpGateway::new(
            &gateway_url,
            Duration::from_secs(30),
            Duration::from_secs(2),
        )
        .unwrap();
        Self {
            partitions,
            _kafka: kafka,
            _gateway: gateway_proc,
            settings,
            gateway,
            worker_env,
            workers: Vec::new(),
            started: 0,
            kills: 0,
        }
    }

    pub(crate) fn spawn_worker(&mut self) -> Proc {
        self.started += 1;
        let name = format!("worker-{}", self.started);
        let mut env = self.worker_env.clone();
        env.insert("WORKER_ID".into(), name.clone());
        Proc::spawn(name, procs::binary(&["run"], &env))
    }

    fn add_worker(&mut self) {
        let worker = self.spawn_worker();
        self.workers.push(worker);
    }

    pub(crate) fn start_workers(&mut self) {
        for _ in 0..WORKERS {
            let worker = self.spawn_worker();
            self.workers.push(worker);
        }
    }

    /// SIGKILL: no drain, no commit, no leaving the group.
    fn kill(&mut self, slot: usize) {
        self.assert_workers_running();
        self.workers[slot].sigkill();
        self.kills += 1;
    }

    fn restart(&mut self, slot: usize) {
        assert!(!self.workers[slot].is_running(), "slot {slot} still runs");
        self.workers[slot] = self.spawn_worker();
    }

    /// Every worker must still run. The one exception is what an orchestrator would
    /// restart: a worker that exited before it ever joined the group because Redis
    /// or Postgres could not be reached (start-up fails fast by design; the shared
    /// Redis of this machine may be restarted by someone else meanwhile).
    pub(crate) fn assert_workers_running(&mut self) {
        self.assert_workers_running_except(None);
    }

    fn assert_workers_running_except(&mut self, skip: Option<usize>) {
        for slot in 0..self.workers.len() {
            let worker = &mut self.workers[slot];
            if Some(slot) == skip || worker.is_running() {
                continue;
            }
            let never_joined = current_membership(worker).is_none();
            let unreachable = worker
                .find_last(|l| (l.starts_with("error: ") && l.contains("connect")).then_some(()))
                .is_some();
            if never_joined && unreachable {
                eprintln!(
                    "{} could not reach a store at start-up; started again:\n{}",
                    worker.name,
                    worker.tail(3)
                );
                self.workers[slot] = self.spawn_worker();
            } else {
                worker.assert_running();
            }
        }
    }

    /// SIGTERM to every worker: drain, final commit, leave the group, exit 0.
    pub(crate) async fn stop_workers(&mut self) {
        for worker in &mut self.workers {
            worker.signal(nix::sys::signal::Signal::SIGTERM);
        }
        for worker in &mut self.workers {
            worker.stop(Duration::from_secs(60)).await;
        }
        self.workers.clear();
    }

    /// Waits until the live workers own every partition between them, each at
    /// least one, and nothing has changed for 1.5 s.
    pub(crate) async fn wait_for_stable_group(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        let mut stable_since: Option<Instant> = None;
        loop {
            self.assert_workers_running();
            let owned: Vec<Option<Membership>> =
                self.workers.iter().map(current_membership).collect();
            let settled = owned
                .iter()
                .all(|m| matches!(m, Some(Membership::Assigned(n)) if *n > 0))
                && owned
                    .iter()
                    .map(|m| match m {
                        Some(Membership::Assigned(n)) => *n,
                        _ => 0,
                    })
                    .sum::<usize>()
                    == self.partitions as usize;
            match (settled, stable_since) {
                (true, Some(since)) if since.elapsed() > Duration::from_millis(1500) => return,
                (true, None) => stable_since = Some(Instant::now()),
                (false, _) => stable_since = None,
                _ => {}
            }
            assert!(
                Instant::now() < deadline,
                "the group never settled: {owned:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Publishes `records` in the background, `per_tick` every 200 ms: the workers
    /// are kept busy for the whole run instead of finishing a backlog in seconds.
    pub(crate) fn produce_paced(
        &self,
        records: &[WorkloadRecord],
        per_tick: usize,
    ) -> tokio::task::JoinHandle<()> {
        let settings = self.settings.clone();
        let records = records.to_vec();
        let partitions = self.partitions;
        tokio::spawn(async move {
            let producer: rdkafka::producer::FutureProducer =
                worker::producer_config(&settings).create().unwrap();
            for chunk in records.chunks(per_tick) {
                operator::publish_records(&producer, &settings.commands_topic, partitions, chunk)
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    }

    async fn read(&self, topic: &str, from: HashMap<i32, i64>) -> Vec<OwnedMessage> {
        let settings = self.settings.clone();
        let topic = topic.to_owned();
        tokio::task::spawn_blocking(move || {
            operator::read_partitions(&settings, &topic, |p, low| {
                from.get(&p).copied().unwrap_or(low)
            })
            .unwrap()
        })
        .await
        .unwrap()
    }

    pub(crate) async fn commands(&self) -> Vec<OwnedMessage> {
        self.read(&self.settings.commands_topic, HashMap::new())
            .await
    }

    /// Result records from `from` (per partition of the results topic) on.
    async fn results_from(&self, from: HashMap<i32, i64>) -> Vec<ResultRecord> {
        self.read(&self.settings.results_topic, from)
            .await
            .iter()
            .map(|m| {
                serde_json::from_slice(m.payload().expect("result payload")).expect("result json")
            })
            .collect()
    }

    pub(crate) async fn results(&self) -> Vec<ResultRecord> {
        self.results_from(HashMap::new()).await
    }

    pub(crate) async fn dead_letters(&self) -> Vec<OwnedMessage> {
        self.read(&self.settings.dlq_topic, HashMap::new()).await
    }

    async fn high_watermarks(&self, topic: &str) -> HashMap<i32, i64> {
        let settings = self.settings.clone();
        let topic = topic.to_owned();
        let partitions = self.partitions;
        tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer = worker::base_config(&settings).create().unwrap();
            let out = (0..partitions)
                .map(|p| {
                    (
                        p,
                        consumer
                            .fetch_watermarks(&topic, p, Duration::from_secs(10))
                            .unwrap()
                            .1,
                    )
                })
                .collect();
            drop(consumer);
            out
        })
        .await
        .unwrap()
    }

    /// The group's committed offsets on the commands topic (-1: none).
    async fn committed(&self) -> HashMap<i32, i64> {
        crate::support::helpers::committed_offsets(&self.settings, self.partitions).await
    }

    /// Waits until the committed offset of every partition is at its end and every
    /// command position has a result at or after `results_from`; returns those results.
    pub(crate) async fn wait_until_settled(
        &mut self,
        positions: usize,
        results_from: HashMap<i32, i64>,
        within: Duration,
    ) -> Vec<ResultRecord> {
        let deadline = Instant::now() + within;
        let high = self
            .high_watermarks(&self.settings.commands_topic.clone())
            .await;
        assert_eq!(
            high.values().sum::<i64>() as usize,
            positions,
            "every command is on the topic"
        );
        loop {
            self.assert_workers_running();
            let committed = self.committed().await;
            if high.iter().all(|(p, h)| committed.get(p) == Some(h)) {
                let results = self.results_from(results_from.clone()).await;
                let answered: HashSet<(i32, i64)> = results
                    .iter()
                    .map(|r| (r.source.partition, r.source.offset))
                    .collect();
                // Commit discipline says this already holds; checked, not assumed.
                assert_eq!(
                    answered.len(),
                    positions,
                    "committed offsets reached the end, yet only {} of {positions} commands have a result",
                    answered.len()
                );
                return results;
            }
            assert!(
                Instant::now() < deadline,
                "after {within:?} the group committed {committed:?}, the partitions end at {high:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    pub(crate) async fn ledger(&self) -> Vec<LedgerEntry> {
        self.gateway.ledger().await.expect("the gateway ledger")
    }
}

// ---------------------------------------------------------------------------
// What a command position should lead to, from the topic itself.

#[derive(Debug, Clone)]
pub(crate) enum Expected {
    /// Decodes into a valid command for this key and fingerprint.
    Valid { key: String, fingerprint: String },
    /// Fails validation: its key (if any) and the original bytes.
    Invalid {
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
    },
}

pub(crate) type Position = (i32, i64);

pub(crate) fn expectations(commands: &[OwnedMessage]) -> BTreeMap<Position, Expected> {
    commands
        .iter()
        .map(|m| {
            let expected = match worker::Inbound::read(m).command {
                Ok(command) => Expected::Valid {
                    key: command.idempotency_key.as_str().to_owned(),
                    fingerprint: command.fingerprint().to_string(),
                },
                Err(_) => Expected::Invalid {
                    key: m.key().map(<[u8]>::to_vec),
                    value: m.payload().map(<[u8]>::to_vec),
                },
            };
            ((m.partition(), m.offset()), expected)
        })
        .collect()
}

fn header(message: &OwnedMessage, name: &str) -> Option<String> {
    message.headers().and_then(|h| {
        h.iter()
            .find(|x| x.key == name)
            .and_then(|x| x.value.map(|v| String::from_utf8_lossy(v).into_owned()))
    })
}

pub(crate) fn by_position(results: &[ResultRecord]) -> HashMap<Position, Vec<&ResultRecord>> {
    let mut out: HashMap<Position, Vec<&ResultRecord>> = HashMap::new();
    for r in results {
        out.entry((r.source.partition, r.source.offset))
            .or_default()
            .push(r);
    }
    out
}

pub(crate) struct PaymentRow {
    id: uuid::Uuid,
    status: String,
    transaction_id: Option<String>,
    fingerprint: String,
}

pub(crate) async fn payment_rows(pool: &PgPool) -> HashMap<String, PaymentRow> {
    let rows: Vec<(uuid::Uuid, String, String, Option<String>, String)> = sqlx::query_as(
        "SELECT id, idempotency_key, status, gateway_transaction_id, fingerprint FROM payments",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter()
        .map(|(id, key, status, transaction_id, fingerprint)| {
            (
                key,
                PaymentRow {
                    id,
                    status,
                    transaction_id,
                    fingerprint,
                },
            )
        })
        .collect()
}

/// Every token hash under `prefix` with its `status` field (see token/redis.rs).
pub(crate) async fn token_statuses(
    redis: &mut redis::aio::ConnectionManager,
    prefix: &str,
) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for key in scan(redis, &format!("{prefix}:token:*")).await {
        let status: Option<String> = redis::cmd("HGET")
            .arg(&key)
            .arg("status")
            .query_async(redis)
            .await
            .unwrap();
        if let Some(status) = status {
            out.insert(key, status);
        }
    }
    out
}

async fn scan(redis: &mut redis::aio::ConnectionManager, pattern: &str) -> Vec<String> {
    let mut cursor: u64 = 0;
    let mut keys = Vec::new();
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(redis)
            .await
            .unwrap();
        keys.extend(batch);
        if next == 0 {
            return keys;
        }
        cursor = next;
    }
}

/// Redis "loses its data": every key of this test's prefix is deleted (other tests
/// share the server, so no FLUSHALL). Returns how many keys went.
pub(crate) async fn flush_prefix(redis: &mut redis::aio::ConnectionManager, prefix: &str) -> usize {
    let keys = scan(redis, &format!("{prefix}:*")).await;
    for chunk in keys.chunks(500) {
        let _: i64 = redis::cmd("DEL")
            .arg(chunk)
            .query_async(redis)
            .await
            .unwrap();
    }
    keys.len()
}

/// The end state every run must reach (the invariants), from what the systems hold.
pub(crate) struct Books<'a> {
    pub(crate) records: &'a [WorkloadRecord],
    pub(crate) expected: &'a BTreeMap<Position, Expected>,
    pub(crate) results: &'a [ResultRecord],
    pub(crate) dead_letters: &'a [OwnedMessage],
    pub(crate) ledger: &'a [LedgerEntry],
    pub(crate) rows: &'a HashMap<String, PaymentRow>,
    pub(crate) tokens: &'a HashMap<String, String>,
}

impl Books<'_> {
    pub(crate) fn check(&self) {
        // The topic holds exactly the generated workload.
        assert_eq!(
            self.expected.len(),
            self.records.len(),
            "commands on the topic"
        );
        let invalid: BTreeMap<&Position, &Expected> = self
            .expected
            .iter()
            .filter(|(_, e)| matches!(e, Expected::Invalid { .. }))
            .collect();
        assert_eq!(
            invalid.len(),
            self.records
                .iter()
                .filter(|r| r.kind == RecordKind::Invalid)
                .count(),
            "every generated invalid record, and only those, fails validation"
        );
        let valid_keys: HashSet<&str> = self
            .expected
            .values()
            .filter_map(|e| match e {
                Expected::Valid { key, .. } => Some(key.as_str()),
                Expected::Invalid { .. } => None,
            })
            .collect();
        let generated_keys: HashSet<String> = self
            .records
            .iter()
            .filter(|r| r.kind == RecordKind::Valid)
            .map(|r| String::from_utf8(r.key.clone().unwrap()).unwrap())
            .collect();
        assert_eq!(
            valid_keys,
            generated_keys.iter().map(String::as_str).collect(),
            "valid keys"
        );

        // I1: the ledger holds one charge per valid key, and nothing else.
        let mut charges: HashMap<&str, Vec<&LedgerEntry>> = HashMap::new();
        for entry in self.ledger {
            charges
                .entry(entry.idempotency_key.as_str())
                .or_default()
                .push(entry);
        }
        let doubles: Vec<(&&str, usize)> = charges
            .iter()
            .filter(|(_, c)| c.len() > 1)
            .map(|(k, c)| (k, c.len()))
            .collect();
        assert!(
            doubles.is_empty(),
            "keys charged more than once: {doubles:?}"
        );
        let charged: HashSet<&str> = charges.keys().copied().collect();
        let never_charged: Vec<_> = valid_keys.difference(&charged).take(10).collect();
        assert!(
            never_charged.is_empty(),
            "valid keys never charged (lost commands): {never_charged:?}"
        );
        let unexpected: Vec<_> = charged.difference(&valid_keys).take(10).collect();
        assert!(
            unexpected.is_empty(),
            "charges for keys that are no valid command: {unexpected:?}"
        );

        // I7: ledger = books, row by row; no row left `processing`.
        assert_eq!(
            self.rows.len(),
            self.ledger.len(),
            "one payment row per charge"
        );
        for entry in self.ledger {
            let row = self.rows.get(&entry.idempotency_key).unwrap_or_else(|| {
                panic!("charge of {} has no payment row", entry.idempotency_key)
            });
            let status = match entry.status {
                ChargeStatus::Approved => "succeeded",
                ChargeStatus::Declined => "declined",
            };
            assert_eq!(
                row.status, status,
                "row status of {}",
                entry.idempotency_key
            );
            assert_eq!(
                row.transaction_id.as_deref(),
                Some(entry.transaction_id.as_str()),
                "{}",
                entry.idempotency_key
            );
        }

        // I2: every position answered; a repeated answer is only ever `duplicate`
        // (or the same rejection); every answer names the one payment of its key.
        let answers = by_position(self.results);
        let mut finals: HashMap<&str, Vec<&ResultRecord>> = HashMap::new();
        for (position, expected) in self.expected {
            let list = answers
                .get(position)
                .unwrap_or_else(|| panic!("command at {position:?} has no result"));
            match expected {
                Expected::Valid { key, fingerprint } => {
                    let row = self
                        .rows
                        .get(key)
                        .unwrap_or_else(|| panic!("{key} has no payment row"));
                    assert_eq!(
                        &row.fingerprint, fingerprint,
                        "the row of {key} is this command's"
                    );
                    let mut first = 0;
                    for answer in list {
                        assert_eq!(
                            answer.idempotency_key.as_deref(),
                            Some(key.as_str()),
                            "{answer:?}"
                        );
                        assert_eq!(
                            answer.payment_id,
                            Some(row.id),
                            "answer names the payment: {answer:?}"
                        );
                        match answer.outcome.as_str() {
                            "duplicate" => {}
                            "succeeded" | "declined" => {
                                first += 1;
                                finals.entry(key.as_str()).or_default().push(answer);
                            }
                            other => {
                                panic!("valid command at {position:?} answered {other}: {list:?}")
                            }
                        }
                    }
                    assert!(
                        first <= 1,
                        "{position:?} answered as first processing twice: {list:?}"
                    );
                }
                Expected::Invalid { .. } => {
                    assert!(
                        list.iter()
                            .all(|a| a.outcome == "rejected" && a.reason == list[0].reason),
                        "an invalid command is rejected, the same way each time: {list:?}"
                    );
                    let reason = list[0].reason.as_deref().unwrap_or_default();
                    assert!(reason.starts_with("invalid"), "{reason}");
                }
            }
        }
        // A key's final answer (at most one over all its positions) matches its charge.
        for (key, list) in &finals {
            assert_eq!(
                list.len(),
                1,
                "{key} answered as first processing more than once: {list:?}"
            );
            let charge = charges[key][0];
            assert_eq!(
                list[0].gateway_transaction_id.as_deref(),
                Some(charge.transaction_id.as_str())
            );
        }

        // Every invalid record is in the DLQ, unchanged, with its reason.
        let mut lettered: HashSet<Position> = HashSet::new();
        for letter in self.dead_letters {
            let position: Position = (
                header(letter, "x-source-partition")
                    .unwrap()
                    .parse()
                    .unwrap(),
                header(letter, "x-source-offset").unwrap().parse().unwrap(),
            );
            let Some(Expected::Invalid { key, value }) = self.expected.get(&position) else {
                panic!("dead letter for {position:?}, which is not an invalid command");
            };
            assert_eq!(header(letter, "x-error-kind").as_deref(), Some("invalid"));
            assert!(!header(letter, "x-error-reason")
                .unwrap_or_default()
                .is_empty());
            assert_eq!(letter.key().map(<[u8]>::to_vec), *key, "original key kept");
            // The original value, but a card number in it masked (all but its last four).
            let kept = match header(letter, "x-payload-redacted").as_deref() {
                Some("card_number") => value.as_deref().map(|v| {
                    payment_worker::payment::mask_card_numbers(&String::from_utf8_lossy(v))
                        .into_owned()
                        .into_bytes()
                }),
                _ => value.clone(),
            };
            assert_eq!(
                letter.payload().map(<[u8]>::to_vec),
                kept,
                "original value kept"
            );
            lettered.insert(position);
        }
        let missing: Vec<_> = invalid.keys().filter(|p| !lettered.contains(p)).collect();
        assert!(
            missing.is_empty(),
            "invalid commands without a dead letter: {missing:?}"
        );

        // I4: no token left `processing`.
        let stuck: Vec<_> = self
            .tokens
            .iter()
            .filter(|(_, s)| *s == "processing")
            .take(10)
            .collect();
        assert!(stuck.is_empty(), "tokens left processing: {stuck:?}");
    }
}

/// Payments decided under a reservation that was not the key's first (a takeover
/// after a kill, a retry after a restore): evidence the faults hit work in flight.
async fn later_reservations(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM payments WHERE fence > 1")
        .fetch_one(pool)
        .await
        .unwrap()
}

pub(crate) fn answered(results: &[ResultRecord]) -> usize {
    results
        .iter()
        .map(|r| (r.source.partition, r.source.offset))
        .collect::<HashSet<_>>()
        .len()
}

// ---------------------------------------------------------------------------

/// SIGKILL one of three worker processes mid-run, restart it later.
///
/// The simulator ignores idempotency keys here, so a second POST for a key would
/// be a second ledger entry: "charged once" is observed, not granted by the gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_process_killed_mid_run_loses_nothing_and_charges_nothing_twice() {
    let started = Instant::now();
    let db = TestDb::new().await;
    let mut redis = TestRedis::new().await;
    let mut deployment = Deployment::start(
        PARTITIONS,
        &db.url,
        &redis.prefix,
        &[
            "--ignore-idempotency-key",
            "--error-rate",
            "0.02",
            "--latency-ms",
            "5",
            "--seed",
            "4",
        ],
        &[],
    )
    .await;
    let spec = WorkloadSpec {
        count: 2000,
        duplicate_ratio: 0.25,
        invalid_ratio: 0.05,
        decline_ratio: 0.05,
        seed: 44,
    };
    let records = operator::generate(&spec, &unique("mp"));

    deployment.start_workers();
    deployment
        .wait_for_stable_group(Duration::from_secs(90))
        .await;

    // The workload arrives over several seconds, so the kill lands while commands
    // are still coming in and in flight.
    let producer = deployment.produce_paced(&records, 50);

    let victim = 1;
    let deadline = Instant::now() + Duration::from_secs(120);
    let at_kill = loop {
        deployment.assert_workers_running();
        let done = answered(&deployment.results().await);
        if done >= 400 {
            break done;
        }
        assert!(Instant::now() < deadline, "only {done} commands answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    deployment.kill(victim);
    assert!(
        at_kill < records.len(),
        "the kill came mid-run ({at_kill} of {} answered)",
        records.len()
    );

    // The survivors take over once the dead member's session expired; then restart.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        deployment.assert_workers_running_except(Some(victim));
        let done = answered(&deployment.results().await);
        if done >= (at_kill + 600).min(records.len()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the survivors did not go on ({done} answered)"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    deployment.restart(victim);
    producer.await.unwrap();

    let results = deployment
        .wait_until_settled(records.len(), HashMap::new(), Duration::from_secs(180))
        .await;
    deployment.stop_workers().await;

    let commands = deployment.commands().await;
    let expected = expectations(&commands);
    let dead_letters = deployment.dead_letters().await;
    let ledger = deployment.ledger().await;
    let rows = payment_rows(&db.pool).await;
    let tokens = token_statuses(&mut redis.conn, &redis.prefix).await;
    Books {
        records: &records,
        expected: &expected,
        results: &results,
        dead_letters: &dead_letters,
        ledger: &ledger,
        rows: &rows,
        tokens: &tokens,
    }
    .check();
    let repeated = by_position(&results)
        .values()
        .filter(|l| l.len() > 1)
        .count();
    eprintln!(
        "multiprocess: 1 SIGKILL at {at_kill} answered; {} results for {} commands ({repeated} answered again), \
         {} charges, {} payments under a later reservation; {:?}",
        results.len(),
        records.len(),
        ledger.len(),
        later_reservations(&db.pool).await,
        started.elapsed()
    );
    flush_prefix(&mut redis.conn, &redis.prefix).await;
}

impl Deployment {
    /// Waits until the results topic holds `count` records (repeats included).
    async fn wait_for_results(&mut self, count: i64, within: Duration) {
        let deadline = Instant::now() + within;
        let topic = self.settings.results_topic.clone();
        loop {
            self.assert_workers_running();
            let so_far: i64 = self.high_watermarks(&topic).await.values().sum();
            if so_far >= count {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "only {so_far} of {count} results after {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Chaos sizes: CI-sized by default, `CHAOS_LARGE=1` for the long run.
struct ChaosSize {
    commands: usize,
    kills: usize,
}

fn chaos_size() -> ChaosSize {
    if std::env::var("CHAOS_LARGE").is_ok_and(|v| v == "1") {
        ChaosSize {
            commands: 10_000,
            kills: 50,
        }
    } else {
        ChaosSize {
            commands: 2000,
            kills: 10,
        }
    }
}

fn chaos_seed() -> u64 {
    match std::env::var("CHAOS_SEED") {
        Ok(seed) => seed.parse().expect("CHAOS_SEED must be a number"),
        Err(_) => 20_261_129,
    }
}

/// The chaos run. Random SIGKILLs of workers (restarted each time), Redis
/// losing every key twice, a Postgres restart, all while commands flow; then the
/// whole topic is replayed. Postgres is a private server so that its restart does
/// not disturb the tests sharing the machine's Postgres.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_kills_redis_loss_and_a_postgres_restart_never_charge_twice_nor_lose_a_command() {
    let started = Instant::now();
    let seed = chaos_seed();
    let size = chaos_size();
    eprintln!(
        "chaos: seed {seed} (CHAOS_SEED), {} commands, {} kills",
        size.commands, size.kills
    );
    let mut rng = StdRng::seed_from_u64(seed);

    let mut postgres = PrivatePostgres::start().await;
    let database_url = postgres.url("pw_chaos");
    // Created here, before three workers race to create it.
    let pool =
        payment_worker::startup::connect_and_migrate(&DatabaseSettings::with_url(&database_url))
            .await
            .unwrap();
    let mut redis = TestRedis::new().await;
    let gateway_seed = seed.to_string();
    let mut deployment = Deployment::start(
        PARTITIONS,
        &database_url,
        &redis.prefix,
        &[
            "--error-rate",
            "0.05",
            "--decline-rate",
            "0.05",
            "--timeout-after-charge-rate",
            "0.02",
            "--late-by-ms",
            "1500",
            // Every charge is in flight for a while, so a kill interrupts some.
            "--latency-ms",
            "100",
            "--seed",
            &gateway_seed,
        ],
        &[("GATEWAY_TIMEOUT", "500ms")],
    )
    .await;
    let spec = WorkloadSpec {
        count: size.commands,
        duplicate_ratio: 0.25,
        invalid_ratio: 0.05,
        decline_ratio: 0.05,
        seed,
    };
    let records = operator::generate(&spec, &unique("chaos"));

    deployment.start_workers();
    deployment
        .wait_for_stable_group(Duration::from_secs(90))
        .await;

    // The events, drawn from the seed: which rounds lose Redis, which one restarts
    // Postgres. Each round waits for the whole group to work again (after a kill it
    // stalls until the dead member's session expired), publishes its share of the
    // workload, and strikes at a random point while that share is being processed,
    // so every strike interrupts commands in flight.
    let mut rounds: Vec<usize> = (0..size.kills).collect();
    let mut pick = |rng: &mut StdRng| rounds.remove(rng.random_range(0..rounds.len()));
    let flush_rounds = [pick(&mut rng), pick(&mut rng)];
    let postgres_round = pick(&mut rng);
    let results_topic = deployment.settings.results_topic.clone();
    let mut flushed = Vec::new();
    for (round, share) in records
        .chunks(records.len().div_ceil(size.kills))
        .enumerate()
    {
        deployment
            .wait_for_stable_group(Duration::from_secs(90))
            .await;
        let before: i64 = deployment
            .high_watermarks(&results_topic)
            .await
            .values()
            .sum();
        let strike_at = before + (share.len() as f64 * rng.random_range(0.1..0.7)) as i64;
        deployment.produce_paced(share, 50).await.unwrap();
        deployment
            .wait_for_results(strike_at, Duration::from_secs(180))
            .await;
        let mut events = Vec::new();
        if flush_rounds.contains(&round) {
            let keys = flush_prefix(&mut redis.conn, &redis.prefix).await;
            events.push(format!("Redis lost {keys} keys"));
            flushed.push(keys);
        }
        if round == postgres_round {
            let down_for = Duration::from_millis(rng.random_range(200..1500));
            postgres.restart(down_for).await;
            events.push(format!("Postgres restarted ({down_for:?} down)"));
        }
        let victim = rng.random_range(0..WORKERS);
        deployment.kill(victim);
        events.push(format!("SIGKILL slot {victim}"));
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..2000))).await;
        deployment.restart(victim);
        eprintln!(
            "chaos: round {round} at {strike_at} results: {}; {:?}",
            events.join(", "),
            started.elapsed()
        );
    }
    assert_eq!(deployment.kills, size.kills);
    assert_eq!(flushed.len(), 2, "Redis lost its data twice");
    assert_eq!(postgres.restarts, 1, "Postgres restarted once");

    let first_pass = deployment
        .wait_until_settled(records.len(), HashMap::new(), Duration::from_secs(240))
        .await;
    eprintln!("chaos: settled after {:?}", started.elapsed());

    // Replay from 0: workers stopped, the group rewound by `replay`, workers again.
    deployment.stop_workers().await;
    let ledger_before = deployment.ledger().await;
    let results_end = deployment
        .high_watermarks(&deployment.settings.results_topic.clone())
        .await;
    let replay_env: HashMap<String, String> = [
        ("KAFKA_BROKERS", deployment.settings.brokers.as_str()),
        ("KAFKA_SESSION_TIMEOUT", SESSION_TIMEOUT),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let (status, output) = procs::run_to_end(
        "replay",
        procs::binary(
            &[
                "replay",
                "--to-beginning",
                "--group",
                &deployment.settings.group_id,
            ],
            &replay_env,
        ),
        Duration::from_secs(120),
    )
    .await;
    assert!(status.success(), "replay failed:\n{}", output.join("\n"));
    let rewound = deployment.committed().await;
    assert!(
        rewound.values().all(|o| *o == 0),
        "the group starts over at 0: {rewound:?}"
    );
    deployment.start_workers();
    let replayed = deployment
        .wait_until_settled(records.len(), results_end, Duration::from_secs(180))
        .await;
    deployment.stop_workers().await;

    // The replay charged nothing (not even a POST the gateway deduplicated) and
    // answered every command as a duplicate (or the same rejection).
    let ledger = deployment.ledger().await;
    assert_eq!(ledger, ledger_before, "the replay reached the gateway");
    let commands = deployment.commands().await;
    let expected = expectations(&commands);
    for (position, answers) in by_position(&replayed) {
        let outcome_ok = match &expected[&position] {
            Expected::Valid { .. } => answers.iter().all(|a| a.outcome == "duplicate"),
            Expected::Invalid { .. } => answers.iter().all(|a| a.outcome == "rejected"),
        };
        assert!(outcome_ok, "replayed {position:?} answered {answers:?}");
    }

    // The replay passed over every key after the last fault and nothing runs now, so
    // a token still `processing` (expired lease or not) would be stuck for good.
    let mut results = first_pass;
    results.extend(replayed);
    let dead_letters = deployment.dead_letters().await;
    let rows = payment_rows(&pool).await;
    let tokens = token_statuses(&mut redis.conn, &redis.prefix).await;
    Books {
        records: &records,
        expected: &expected,
        results: &results,
        dead_letters: &dead_letters,
        ledger: &ledger,
        rows: &rows,
        tokens: &tokens,
    }
    .check();

    // The operator's audit agrees.
    let mut audit_env = deployment.worker_env.clone();
    audit_env.retain(|k, _| {
        [
            "DATABASE_URL",
            "REDIS_URL",
            "REDIS_KEY_PREFIX",
            "GATEWAY_URL",
            "LEASE",
        ]
        .contains(&k.as_str())
    });
    let (status, output) = procs::run_to_end(
        "audit",
        procs::binary(&["audit"], &audit_env),
        Duration::from_secs(120),
    )
    .await;
    assert!(status.success(), "audit failed:\n{}", output.join("\n"));

    eprintln!(
        "chaos: seed {seed}: {} kills, Redis flushed twice ({flushed:?} keys), Postgres restarted once; \
         {} commands, {} charges ({} POSTed more than once), {} payments under a later reservation, \
         {} dead letters; took {:?}",
        deployment.kills,
        records.len(),
        ledger.len(),
        ledger.iter().filter(|e| e.attempts > 1).count(),
        later_reservations(&pool).await,
        dead_letters.len(),
        started.elapsed()
    );
    pool.close().await;
    flush_prefix(&mut redis.conn, &redis.prefix).await;
}

/// A worker pauses a partition when more records arrive than it can hold (back
/// pressure). librdkafka keeps that pause across a rebalance, so a partition revoked
/// while paused and assigned again must be resumed, or it stalls for good: nothing
/// processed, its offset never committed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partition_paused_for_back_pressure_is_consumed_again_after_a_rebalance() {
    let db = TestDb::new().await;
    let mut redis = TestRedis::new().await;
    let spec = WorkloadSpec {
        count: 1100,
        duplicate_ratio: 0.0,
        invalid_ratio: 0.0,
        decline_ratio: 0.0,
        seed: 3,
    };
    let records = operator::generate(&spec, &unique("pause"));
    // The first command's charge is held for 20 s and one command runs at a time, so
    // the rest pile up beyond what the worker holds and the partition is paused.
    let held = format!(
        "{}=20000",
        String::from_utf8(records[0].key.clone().unwrap()).unwrap()
    );
    let mut deployment = Deployment::start(
        1,
        &db.url,
        &redis.prefix,
        &["--slow-key", &held],
        &[
            ("MAX_IN_FLIGHT", "1"),
            ("GATEWAY_TIMEOUT", "60s"),
            // librdkafka's own log line is the only outside sign of a pause.
            ("KAFKA_CONFIG_DEBUG", "topic"),
            ("RUST_LOG", "info,librdkafka=debug"),
        ],
    )
    .await;
    deployment.add_worker();
    deployment
        .wait_for_stable_group(Duration::from_secs(60))
        .await;
    deployment
        .produce_paced(&records, records.len())
        .await
        .unwrap();
    deployment.workers[0]
        .wait_for(Duration::from_secs(60), |l| {
            l.contains("Application pausing").then_some(())
        })
        .await;

    // A second member joins (every partition is revoked, the paused one included)
    // and leaves again, so the first member owns the partition once more.
    deployment.add_worker();
    let deadline = Instant::now() + Duration::from_secs(60);
    while current_membership(&deployment.workers[1]).is_none() {
        deployment.assert_workers_running();
        assert!(Instant::now() < deadline, "the second member never joined");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut second = deployment.workers.pop().unwrap();
    second.stop(Duration::from_secs(30)).await;

    deployment
        .wait_until_settled(records.len(), HashMap::new(), Duration::from_secs(120))
        .await;
    deployment.stop_workers().await;
    assert_eq!(
        deployment.ledger().await.len(),
        records.len(),
        "every command charged"
    );
    flush_prefix(&mut redis.conn, &redis.prefix).await;
}

/// The same deployment on the Postgres token store, and on a Redis paused
/// mid-run (a child module, so it shares this file's fixture).
#[path = "stores.rs"]
mod stores;
