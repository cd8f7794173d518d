//! The deployment of one crash test: a Kafka process (dev-kafka or txn-broker), a
//! gateway-sim process and the worker processes of one consumer group, sharing one
//! database and Redis prefix.
//!
//! `PW_TEST_KAFKA_BROKERS=host:port` runs the same tests against a broker started
//! elsewhere (`scripts/interop-tansu`): no dev-kafka is started, and each test
//! creates its own three topics on that broker, under names no other test or run
//! uses, through the broker's CreateTopics API.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use payment_worker::configuration::KafkaSettings;
use payment_worker::gateway::{HttpGateway, LedgerEntry, PaymentGateway};
use payment_worker::operator;
use payment_worker::operator::WorkloadRecord;
use payment_worker::worker::{self, ResultRecord};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Message, OwnedMessage};

use crate::support::audit::{run_audit, AuditVerdict};
use crate::support::books::{expectations, payment_rows, Holdings};
use crate::support::helpers::{unique, REDIS_URL};
use crate::support::procs::{self, current_membership, Membership, Proc};

pub(crate) const PARTITIONS: i32 = 6;
pub(crate) const WORKERS: usize = 3;
/// Workers ask for this; the group's first assignment after a SIGKILL waits for it.
pub(crate) const SESSION_TIMEOUT: &str = "6s";
/// Names the bootstrap of an external broker to run the deployments against.
pub(crate) const EXTERNAL_KAFKA: &str = "PW_TEST_KAFKA_BROKERS";

/// The gateway of a deployment: what keeps it alive, how the workers reach it,
/// and the client the test reads its ledger with.
pub(crate) struct DeployedGateway {
    pub(crate) keep: Box<dyn std::any::Any + Send>,
    /// `GATEWAY_URL`, `GATEWAY_KIND` and whatever else the workers need for it.
    pub(crate) env: Vec<(String, String)>,
    pub(crate) client: Arc<dyn PaymentGateway>,
}

/// The deployment of one test: a dev-kafka process, a gateway-sim process and the
/// worker processes of one consumer group, all sharing one database and Redis prefix.
pub(crate) struct Deployment {
    pub(crate) partitions: i32,
    /// The dev-kafka (or txn-broker) of this test; none on an external broker.
    pub(crate) kafka: Option<Proc>,
    /// Keeps the gateway (its process or server) alive.
    pub(crate) _gateway: Box<dyn std::any::Any + Send>,
    pub(crate) settings: KafkaSettings,
    pub(crate) gateway: Arc<dyn PaymentGateway>,
    pub(crate) worker_env: HashMap<String, String>,
    pub(crate) workers: Vec<Proc>,
    pub(crate) started: usize,
    pub(crate) kills: usize,
}

impl Deployment {
    pub(crate) async fn start(
        partitions: i32,
        database_url: &str,
        redis_prefix: &str,
        gateway_flags: &[&str],
        extra_env: &[(&str, &str)],
    ) -> Self {
        let (kafka, settings) = match std::env::var(EXTERNAL_KAFKA) {
            Ok(bootstrap) if !bootstrap.is_empty() => {
                (None, external_topics(&bootstrap, partitions).await)
            }
            _ => {
                let (kafka, bootstrap) = procs::dev_kafka(partitions).await;
                (
                    Some(kafka),
                    KafkaSettings::local(bootstrap, unique("group")),
                )
            }
        };
        Self::assemble(
            kafka,
            settings,
            partitions,
            database_url,
            redis_prefix,
            gateway_flags,
            extra_env,
        )
        .await
    }

    /// As `start`, on a Kafka the caller started: its process and bootstrap address.
    pub(crate) async fn start_on(
        (kafka, bootstrap): (Proc, String),
        partitions: i32,
        database_url: &str,
        redis_prefix: &str,
        gateway_flags: &[&str],
        extra_env: &[(&str, &str)],
    ) -> Self {
        Self::assemble(
            Some(kafka),
            KafkaSettings::local(bootstrap, unique("group")),
            partitions,
            database_url,
            redis_prefix,
            gateway_flags,
            extra_env,
        )
        .await
    }

    async fn assemble(
        kafka: Option<Proc>,
        settings: KafkaSettings,
        partitions: i32,
        database_url: &str,
        redis_prefix: &str,
        gateway_flags: &[&str],
        extra_env: &[(&str, &str)],
    ) -> Self {
        let (gateway_proc, gateway_url) = procs::gateway_sim(gateway_flags).await;
        let client = HttpGateway::new(
            &gateway_url,
            Duration::from_secs(30),
            Duration::from_secs(2),
        )
        .unwrap();
        let gateway = DeployedGateway {
            keep: Box::new(gateway_proc),
            env: vec![("GATEWAY_URL".to_owned(), gateway_url)],
            client: Arc::new(client),
        };
        Self::with_gateway(
            kafka,
            settings,
            partitions,
            database_url,
            redis_prefix,
            gateway,
            extra_env,
        )
    }

    /// As `start_on`, with a gateway the caller started.
    pub(crate) fn start_with_gateway(
        (kafka, bootstrap): (Proc, String),
        partitions: i32,
        database_url: &str,
        redis_prefix: &str,
        gateway: DeployedGateway,
        extra_env: &[(&str, &str)],
    ) -> Self {
        Self::with_gateway(
            Some(kafka),
            KafkaSettings::local(bootstrap, unique("group")),
            partitions,
            database_url,
            redis_prefix,
            gateway,
            extra_env,
        )
    }

    fn with_gateway(
        kafka: Option<Proc>,
        settings: KafkaSettings,
        partitions: i32,
        database_url: &str,
        redis_prefix: &str,
        gateway: DeployedGateway,
        extra_env: &[(&str, &str)],
    ) -> Self {
        let mut worker_env: HashMap<String, String> = kafka_env(&settings);
        worker_env.extend(
            [
                ("KAFKA_GROUP_ID", settings.group_id.as_str()),
                ("DRAIN_DEADLINE", "3s"),
                ("DATABASE_URL", database_url),
                ("DATABASE_MAX_CONNECTIONS", "16"),
                ("REDIS_URL", REDIS_URL),
                ("REDIS_KEY_PREFIX", redis_prefix),
                ("LEASE", "5s"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned())),
        );
        worker_env.extend(gateway.env);
        worker_env.extend(
            extra_env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        // `PW_TEST_WORKER_ENV="K=V K=V"`: settings for an experiment (scripts/
        // interop-tansu), e.g. `KAFKA_CONFIG_DEBUG=cgrp` or another session timeout.
        if let Ok(experiment) = std::env::var("PW_TEST_WORKER_ENV") {
            worker_env.extend(experiment.split_whitespace().filter_map(|pair| {
                pair.split_once('=')
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
            }));
        }
        Self {
            partitions,
            kafka,
            _gateway: gateway.keep,
            settings,
            gateway: gateway.client,
            worker_env,
            workers: Vec::new(),
            started: 0,
            kills: 0,
        }
    }

    /// The broker process this test started (txn-broker tests signal it).
    pub(crate) fn kafka_process(&mut self) -> &mut Proc {
        self.kafka
            .as_mut()
            .expect("this test started its own broker process")
    }

    pub(crate) fn spawn_worker(&mut self) -> Proc {
        self.started += 1;
        let name = format!("worker-{}", self.started);
        let mut env = self.worker_env.clone();
        env.insert("WORKER_ID".into(), name.clone());
        Proc::spawn(name, procs::binary(&["run"], &env))
    }

    pub(crate) fn add_worker(&mut self) {
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
    pub(crate) fn kill(&mut self, slot: usize) {
        self.assert_workers_running();
        self.workers[slot].sigkill();
        self.kills += 1;
    }

    pub(crate) fn restart(&mut self, slot: usize) {
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

    pub(crate) fn assert_workers_running_except(&mut self, skip: Option<usize>) {
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
    /// Returns the workers' whole output, worker after worker.
    pub(crate) async fn stop_workers(&mut self) -> Vec<String> {
        for worker in &mut self.workers {
            worker.signal(nix::sys::signal::Signal::SIGTERM);
        }
        let mut lines = Vec::new();
        for worker in &mut self.workers {
            worker.stop(Duration::from_secs(60)).await;
            lines.extend(worker.lines());
        }
        self.workers.clear();
        lines
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

    pub(crate) async fn read(&self, topic: &str, from: HashMap<i32, i64>) -> Vec<OwnedMessage> {
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
    pub(crate) async fn results_from(&self, from: HashMap<i32, i64>) -> Vec<ResultRecord> {
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

    /// Once every offset is committed, every command's result is, too (commit
    /// discipline; checked, not assumed). A `read_committed` reader sees them all only
    /// once no transaction is open before them in a results partition: one a
    /// SIGKILLed exactly-once member left open hides the results written after it
    /// until the broker aborts it at its transaction timeout (10 s in these tests).
    async fn results_once_visible(
        &self,
        positions: usize,
        results_from: &HashMap<i32, i64>,
    ) -> Vec<ResultRecord> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let results = self.results_from(results_from.clone()).await;
            let answered: HashSet<(i32, i64)> = results
                .iter()
                .map(|r| (r.source.partition, r.source.offset))
                .collect();
            if answered.len() == positions {
                return results;
            }
            assert!(
                Instant::now() < deadline,
                "committed offsets reached the end, yet only {} of {positions} commands have a result 30 s later",
                answered.len()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    pub(crate) async fn high_watermarks(&self, topic: &str) -> HashMap<i32, i64> {
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
    pub(crate) async fn committed(&self) -> HashMap<i32, i64> {
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
                return self.results_once_visible(positions, &results_from).await;
            }
            assert!(
                Instant::now() < deadline,
                "after {within:?} the group committed {committed:?}, the partitions end at {high:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// `payment-worker replay --to-beginning` for the group, its workers stopped:
    /// every partition starts over at offset 0.
    pub(crate) async fn rewind_to_beginning(&self) {
        let (status, output) = self.replay_to_beginning().await;
        assert!(status.success(), "replay failed:\n{}", output.join("\n"));
        let rewound = self.committed().await;
        assert!(
            rewound.values().all(|o| *o == 0),
            "the group starts over at 0: {rewound:?}"
        );
    }

    /// `payment-worker replay --to-beginning` for the deployment's group, run to its
    /// end; returns its exit status and output.
    pub(crate) async fn replay_to_beginning(&self) -> (std::process::ExitStatus, Vec<String>) {
        procs::run_to_end(
            "replay",
            procs::binary(
                &[
                    "replay",
                    "--to-beginning",
                    "--group",
                    &self.settings.group_id,
                ],
                &kafka_env(&self.settings),
            ),
            Duration::from_secs(120),
        )
        .await
    }

    pub(crate) async fn ledger(&self) -> Vec<LedgerEntry> {
        self.gateway.ledger().await.expect("the gateway ledger")
    }

    /// What the run left behind: the commands topic read into expectations, the dead
    /// letters, the gateway ledger and the payment rows in `pool`.
    /// `payment-worker audit` over the deployment's stores and gateway; its verdict
    /// (it must exit 0).
    pub(crate) async fn audit(&self) -> AuditVerdict {
        let mut env = self.worker_env.clone();
        env.retain(|k, _| {
            [
                "DATABASE_URL",
                "REDIS_URL",
                "REDIS_KEY_PREFIX",
                "GATEWAY_URL",
                "LEASE",
                "TOKEN_STORE",
                "GATEWAY_KIND",
                "GATEWAY_API_KEY_FILE",
                "STRIPE_COMPAT",
            ]
            .contains(&k.as_str())
        });
        let verdict = run_audit::<&str>(&[], &env).await;
        verdict.assert_success();
        verdict
    }

    /// The end of a settled run, its workers stopped: no token left `processing`
    /// (`tokens`: token key → status, as the token store holds them), the books hold
    /// (`Holdings::check` over `pool`'s rows) and `audit` is clean (warnings
    /// allowed; its verdict is returned for a stricter look).
    pub(crate) async fn check_end_of_run(
        &self,
        pool: &sqlx::PgPool,
        records: &[WorkloadRecord],
        results: &[ResultRecord],
        tokens: &HashMap<String, String>,
    ) -> AuditVerdict {
        let mut stuck: Vec<&String> = tokens
            .iter()
            .filter(|(_, status)| *status == "processing")
            .map(|(key, _)| key)
            .collect();
        stuck.sort();
        assert_eq!(
            stuck.len(),
            0,
            "tokens left processing (stuck), the first: {:?}",
            &stuck[..stuck.len().min(5)]
        );
        self.holdings(pool).await.check(records, results, tokens);
        let audit = self.audit().await;
        audit.assert_clean();
        audit
    }

    pub(crate) async fn holdings(&self, pool: &sqlx::PgPool) -> Holdings {
        let commands = self.commands().await;
        Holdings {
            expected: expectations(&commands),
            dead_letters: self.dead_letters().await,
            ledger: self.ledger().await,
            rows: payment_rows(pool).await,
        }
    }
}

/// The environment any `payment-worker` command needs to reach the deployment's
/// broker and topics (`replay`, `produce`, the workers): brokers, the three topic
/// names and the tests' session timeout.
pub(crate) fn kafka_env(settings: &KafkaSettings) -> HashMap<String, String> {
    [
        ("KAFKA_BROKERS", settings.brokers.as_str()),
        ("COMMANDS_TOPIC", settings.commands_topic.as_str()),
        ("RESULTS_TOPIC", settings.results_topic.as_str()),
        ("DLQ_TOPIC", settings.dlq_topic.as_str()),
        ("KAFKA_SESSION_TIMEOUT", SESSION_TIMEOUT),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// Settings for a test on an external broker: a group and three topics of its own
/// (`partitions` each), created through the broker's CreateTopics API.
async fn external_topics(bootstrap: &str, partitions: i32) -> KafkaSettings {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;

    let mut settings = KafkaSettings::local(bootstrap, unique("group"));
    let run = unique("t");
    settings.commands_topic = format!("{run}.commands");
    settings.results_topic = format!("{run}.results");
    settings.dlq_topic = format!("{run}.dlq");
    let admin: AdminClient<DefaultClientContext> = worker::base_config(&settings).create().unwrap();
    let names = [
        &settings.commands_topic,
        &settings.results_topic,
        &settings.dlq_topic,
    ];
    let topics: Vec<NewTopic> = names
        .iter()
        .map(|name| NewTopic::new(name, partitions, TopicReplication::Fixed(1)))
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let created = admin
        .create_topics(&topics, &options)
        .await
        .unwrap_or_else(|e| panic!("CreateTopics on {bootstrap}: {e}"));
    for outcome in created {
        if let Err((topic, code)) = outcome {
            panic!("creating {topic} on {bootstrap}: {code}");
        }
    }
    // Created means known to the broker's metadata before any client needs it.
    let probe: BaseConsumer = worker::base_config(&settings).create().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    for name in names {
        loop {
            let found = probe
                .fetch_metadata(Some(name), Duration::from_secs(10))
                .ok()
                .and_then(|m| {
                    m.topics()
                        .iter()
                        .find(|t| t.name() == name.as_str())
                        .map(|t| t.partitions().len() as i32)
                });
            if found == Some(partitions) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{name} not in {bootstrap}'s metadata with {partitions} partitions: {found:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    drop(probe);
    settings
}

impl Deployment {
    /// One round of a crash run: waits until the whole group works, publishes
    /// `share`, and returns once `fraction` of the share's results are on the results
    /// topic (counted by its end offsets), so a strike then interrupts commands in
    /// flight. Returns that count of results.
    pub(crate) async fn publish_until(&mut self, share: &[WorkloadRecord], fraction: f64) -> i64 {
        self.wait_for_stable_group(Duration::from_secs(90)).await;
        let topic = self.settings.results_topic.clone();
        let before: i64 = self.high_watermarks(&topic).await.values().sum();
        let strike_at = before + (share.len() as f64 * fraction) as i64;
        self.produce_paced(share, 50).await.unwrap();
        self.wait_for_results(strike_at, Duration::from_secs(180))
            .await;
        strike_at
    }

    /// Waits until the results topic holds `count` records (repeats included).
    pub(crate) async fn wait_for_results(&mut self, count: i64, within: Duration) {
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
