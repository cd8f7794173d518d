//! A deployment whose workers reach Redis, Postgres and the gateway only through a
//! fault proxy each, a paced workload, and the figures of one fault: how long after
//! the heal throughput came back, and the longest any command waited.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use payment_worker::operator::{self, WorkloadRecord, WorkloadSpec};
use payment_worker::worker::ResultRecord;
use rdkafka::message::{Message, OwnedMessage};

use crate::support::books::{self, by_position};
use crate::support::deployment::Deployment;
use crate::support::fault_proxy::FaultProxy;
use crate::support::helpers::{observer_connection, unique, TestDb, REDIS_URL};

/// Partitions of the commands topic in every fault run.
const PARTITIONS: i32 = 4;
/// Records published per 200 ms tick: 50 a second, for the whole run.
const PER_TICK: usize = 10;

pub(crate) struct FaultRig {
    pub(crate) db: TestDb,
    pub(crate) prefix: String,
    pub(crate) deployment: Deployment,
    pub(crate) redis: FaultProxy,
    pub(crate) postgres: FaultProxy,
    pub(crate) gateway: FaultProxy,
}

/// When a fault began and healed, as the test applied it.
pub(crate) struct Window {
    pub(crate) name: &'static str,
    pub(crate) began: Instant,
    pub(crate) healed: Instant,
}

impl FaultRig {
    /// Two workers behind the three proxies; a gateway answering in 20 ms.
    pub(crate) async fn start(extra_env: &[(&str, &str)]) -> Self {
        let db = TestDb::new().await;
        let prefix = unique("faults");
        let mut deployment = Deployment::start(
            PARTITIONS,
            &db.url,
            &prefix,
            &["--latency-ms", "20", "--seed", "29"],
            extra_env,
        )
        .await;
        let redis = FaultProxy::start("127.0.0.1:6379".parse().unwrap()).await;
        let postgres = FaultProxy::start("127.0.0.1:5432".parse().unwrap()).await;
        let gateway_addr = deployment.worker_env["GATEWAY_URL"]
            .trim_start_matches("http://")
            .parse()
            .expect("the simulator's address");
        let gateway = FaultProxy::start(gateway_addr).await;
        let proxied = [
            (
                "DATABASE_URL",
                format!("postgres://postgres@{}/{}", postgres.addr(), db.name),
            ),
            ("REDIS_URL", format!("redis://{}", redis.addr())),
            ("GATEWAY_URL", format!("http://{}", gateway.addr())),
            ("DATABASE_MAX_CONNECTIONS", "12".to_owned()),
        ];
        for (name, value) in proxied {
            deployment.worker_env.insert(name.to_owned(), value);
        }
        Self {
            db,
            prefix,
            deployment,
            redis,
            postgres,
            gateway,
        }
    }

    pub(crate) fn workload(&self, count: usize) -> Vec<WorkloadRecord> {
        operator::generate(
            &WorkloadSpec {
                count,
                duplicate_ratio: 0.2,
                invalid_ratio: 0.0,
                decline_ratio: 0.05,
                seed: 29,
            },
            &self.prefix,
        )
    }

    /// Starts two workers and the paced producer of `records`; returns once the group
    /// is stable and `warm_up` records were answered.
    pub(crate) async fn run(
        &mut self,
        records: &[WorkloadRecord],
        warm_up: usize,
    ) -> tokio::task::JoinHandle<()> {
        self.deployment.add_worker();
        self.deployment.add_worker();
        self.deployment
            .wait_for_stable_group(Duration::from_secs(90))
            .await;
        let producer = self.deployment.produce_paced(records, PER_TICK);
        self.wait_answered(warm_up, Duration::from_secs(60)).await;
        producer
    }

    pub(crate) async fn answered(&self) -> usize {
        books::by_position(&self.deployment.results().await).len()
    }

    async fn wait_answered(&self, count: usize, within: Duration) {
        let deadline = Instant::now() + within;
        while self.answered().await < count {
            assert!(Instant::now() < deadline, "{count} never answered");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits for every command to be answered and committed, stops the workers, and
    /// checks the books (at most one charge per key, ledger = rows, every command
    /// answered once its offset is committed, every unknown flagged, nothing left
    /// `processing`) and `audit`.
    pub(crate) async fn settle_and_check(
        &mut self,
        records: &[WorkloadRecord],
        producer: tokio::task::JoinHandle<()>,
    ) -> Vec<ResultRecord> {
        producer.await.unwrap();
        let results = self
            .deployment
            .wait_until_settled(records.len(), HashMap::new(), Duration::from_secs(240))
            .await;
        self.deployment.stop_workers().await;
        let mut direct = observer_connection(REDIS_URL).await;
        let tokens = books::token_statuses(&mut direct, &self.prefix).await;
        self.deployment
            .check_end_of_run(&self.db.pool, records, &results, &tokens)
            .await;
        results
    }

    /// Each command's wait: from its record's timestamp to its first answer's
    /// (`answers`: the results topic, as read).
    async fn waits(&self, answers: &[OwnedMessage]) -> Vec<(i64, Duration)> {
        let commands: HashMap<(i32, i64), i64> = self
            .deployment
            .commands()
            .await
            .iter()
            .filter_map(|m| Some(((m.partition(), m.offset()), m.timestamp().to_millis()?)))
            .collect();
        let mut first_answer: HashMap<(i32, i64), i64> = HashMap::new();
        for answer in answers {
            let Some(at) = answer.timestamp().to_millis() else {
                continue;
            };
            let Some(record) = answer
                .payload()
                .and_then(|p| serde_json::from_slice::<ResultRecord>(p).ok())
            else {
                continue;
            };
            let position = (record.source.partition, record.source.offset);
            let slot = first_answer.entry(position).or_insert(at);
            *slot = (*slot).min(at);
        }
        commands
            .iter()
            .filter_map(|(position, sent)| {
                let answered = first_answer.get(position)?;
                Some((
                    *sent,
                    Duration::from_millis((answered - sent).max(0) as u64),
                ))
            })
            .collect()
    }

    /// The figures of each fault window, printed for the record (`docs/TESTING.md`):
    /// the longest wait of a command sent during the fault or in the second before
    /// it, and how long after the heal the answers per second were back to 90 % of
    /// their rate before the fault.
    pub(crate) async fn report(&self, windows: &[Window], results: &[ResultRecord]) {
        // The results topic, read once for both figures.
        let answers = self
            .deployment
            .read(&self.deployment.settings.results_topic, HashMap::new())
            .await;
        let waits = self.waits(&answers).await;
        let unix_ms = |at: Instant| {
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as i64;
            now_ms - Instant::now().saturating_duration_since(at).as_millis() as i64
        };
        let answered_at = answer_times(&answers);
        for window in windows {
            let (began, healed) = (unix_ms(window.began), unix_ms(window.healed));
            let longest = waits
                .iter()
                .filter(|(sent, _)| *sent >= began - 1000 && *sent <= healed)
                .map(|(_, wait)| *wait)
                .max()
                .unwrap_or_default();
            let rate = |from: i64, to: i64| {
                answered_at
                    .iter()
                    .filter(|t| **t >= from && **t < to)
                    .count() as f64
                    / ((to - from) as f64 / 1000.0)
            };
            let before = rate(began - 2000, began);
            let recovered_after = (0..200)
                .map(|step| healed + step * 100)
                .find(|from| rate(*from, from + 1000) >= 0.9 * before)
                .map(|from| Duration::from_millis((from - healed) as u64));
            eprintln!(
                "fault {}: {:?} long; rate before {before:.0}/s; back to 90 % {} after the heal; \
                 longest wait of a command sent during it {longest:?}",
                window.name,
                window.healed - window.began,
                recovered_after.map_or("not within 20 s".to_owned(), |d| format!("{d:?}")),
            );
        }
        let repeated = by_position(results)
            .values()
            .filter(|l| l.len() > 1)
            .count();
        eprintln!(
            "faults: {} results, {repeated} positions answered more than once",
            results.len()
        );
    }
}

/// The broker's timestamp of every first answer among `answers` (the results topic,
/// as read), in ms since the epoch.
fn answer_times(answers: &[OwnedMessage]) -> Vec<i64> {
    let mut seen = std::collections::HashSet::new();
    answers
        .iter()
        .filter_map(|m| {
            let record: ResultRecord = serde_json::from_slice(m.payload()?).ok()?;
            seen.insert((record.source.partition, record.source.offset))
                .then(|| m.timestamp().to_millis())
                .flatten()
        })
        .collect()
}
