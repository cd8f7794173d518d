//! End-to-end phases: local Kafka → worker → Redis → Postgres → gateway simulator
//! (over HTTP) → results topic. Each phase gets its own topics, consumer group,
//! simulator and key prefix, so phases cannot see each other's records and each is
//! audited on its own.
//!
//! Latency is read from Kafka timestamps: every command carries the wall-clock
//! time it was produced, every result the time the worker produced it (CreateTime),
//! and a result names its command by source partition and offset.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::ProgressBar;
use rdkafka::producer::{FutureProducer, Producer};
use sqlx::PgPool;

use super::audit::{self, AuditReport};
use super::cpu;
use super::load::{
    now_ms, produce_backlog, produce_duplicated_backlog, produce_mixed_backlog, produce_paced,
};
use super::report::PhaseReport;
use super::results::{
    summarize, write_samples, ResultsReader, MOCK_FETCH_WAIT_MS, RESULTS_KEPT_PER_PARTITION,
};
use super::rss::read_memory;
use super::running::{
    check_alive, stop, wait_for_answers, wait_for_assignment, wait_for_progress, wait_until_owned,
    worker_binary, Running,
};
use crate::{GatewaySimulator, LocalKafka, RunningSimulator, SimulatorConfig};
use payment_worker::configuration::{KafkaSettings, WorkerSettings};
use payment_worker::gateway::{HttpGateway, PaymentGateway};
use payment_worker::payment::{GatewayLookup, Processor};
use payment_worker::token::TokenStore;
use payment_worker::worker::{self, RunningWorker};

/// A phase that makes no progress for this long has failed.
/// How commands reach the topic.
#[derive(Debug, Clone, Copy)]
pub enum Load {
    /// All produced before the worker starts.
    Backlog(usize),
    /// All produced before the worker starts, a quarter of them duplicates of recent
    /// commands, half of those on another partition (the backlog phase).
    DuplicatedBacklog(usize),
    /// All produced before the worker starts: charges, then refunds of
    /// `refund_share` of them in their places (the mixed phase).
    MixedBacklog { count: usize, refund_share: f64 },
    /// Produced at `rate`/s once the worker owns its partitions; commands produced
    /// during the first `warmup` seconds are not measured.
    Paced {
        rate: f64,
        seconds: f64,
        warmup: f64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerKind {
    /// `worker::start` on the bench's runtime.
    InProcess,
    /// A `payment-worker run` child process (its memory is its own).
    Process,
}

pub struct PhaseOutcome {
    pub report: PhaseReport,
    pub audit: AuditReport,
}

/// What every phase shares: one local Kafka, one pool and one token store, as a
/// long-running worker would have them.
pub struct Bed {
    pub run_id: String,
    pub local: LocalKafka,
    pub partitions: i32,
    /// The in-process workers' pool (the worker's size).
    pub pool: PgPool,
    /// Audit queries.
    pub admin: PgPool,
    pub tokens: Arc<dyn TokenStore>,
    pub producer: FutureProducer,
    pub worker: WorkerSettings,
    pub database_url: String,
    /// Its database name, to tell our Postgres backends from other databases'.
    pub database_name: String,
    pub database_max_connections: u32,
    pub redis_url: String,
    pub redis_prefix: String,
    /// Write each phase's per-command timings here as CSV (profiling).
    pub samples_dir: Option<PathBuf>,
    /// `RUST_LOG` of the worker process.
    pub worker_log_filter: String,
    /// `--localstripe` / `LOCALSTRIPE`: where the `stripe` phase finds localstripe.
    pub localstripe: Option<PathBuf>,
}

/// The key prefix of one phase of a run: `bench-<run id>-<phase>`; its keys are
/// `numbered_key(prefix, n, 7)` (`bench-1a2b3c4d-e2e-0ms:0000042`). Phase names
/// start with a letter, so the run id's (at most eight) digits stand alone.
fn phase_key_prefix(run_id: &str, phase: &str) -> String {
    format!("bench-{run_id}-{phase}")
}

impl Bed {
    pub fn key_prefix(&self, phase: &str) -> String {
        phase_key_prefix(&self.run_id, phase)
    }

    pub(super) fn kafka(&self, phase: &str) -> anyhow::Result<KafkaSettings> {
        let name = self.key_prefix(phase);
        let mut kafka = KafkaSettings::local(self.local.bootstrap_servers(), name.clone());
        kafka.commands_topic = format!("{name}.commands");
        kafka.results_topic = format!("{name}.results");
        kafka.dlq_topic = format!("{name}.dlq");
        self.local.create_payment_topics(&kafka, self.partitions)?;
        Ok(kafka)
    }

    fn start_in_process(
        &self,
        kafka: &KafkaSettings,
        simulator: &RunningSimulator,
        phase: &str,
    ) -> anyhow::Result<RunningWorker> {
        let gateway: Arc<dyn PaymentGateway> = Arc::new(HttpGateway::new(
            &simulator.url(),
            Duration::from_secs(5),
            Duration::from_secs(1),
        )?);
        let processor = Arc::new(Processor::new(
            Arc::clone(&self.tokens),
            gateway,
            self.pool.clone(),
            GatewayLookup::Uncertain,
            self.key_prefix(phase),
        ));
        let handler = payment_worker::startup::handler(processor, kafka, &self.worker)?;
        // The consumer only: producers would log the consumer setting as ignored.
        let mut consumer = kafka.clone();
        consumer
            .extra
            .push(("fetch.wait.max.ms".into(), MOCK_FETCH_WAIT_MS.to_string()));
        worker::start(&consumer, &self.worker, handler)
    }

    /// `payment-worker run`, configured through its environment variables.
    fn start_process(
        &self,
        kafka: &KafkaSettings,
        simulator: &RunningSimulator,
        phase: &str,
    ) -> anyhow::Result<Running> {
        let exe = worker_binary()?;
        let log = std::env::temp_dir().join(format!("{}.worker.log", self.key_prefix(phase)));
        let log_file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = std::process::Command::new(exe)
            .arg("run")
            .arg("--kafka-config")
            .arg(format!("fetch.wait.max.ms={MOCK_FETCH_WAIT_MS}"))
            .env("KAFKA_BROKERS", &kafka.brokers)
            .env("KAFKA_GROUP_ID", &kafka.group_id)
            .env("COMMANDS_TOPIC", &kafka.commands_topic)
            .env("RESULTS_TOPIC", &kafka.results_topic)
            .env("DLQ_TOPIC", &kafka.dlq_topic)
            .env(
                "KAFKA_SESSION_TIMEOUT",
                format!("{}ms", kafka.session_timeout.as_millis()),
            )
            .env("DATABASE_URL", &self.database_url)
            .env(
                "DATABASE_MAX_CONNECTIONS",
                self.database_max_connections.to_string(),
            )
            .env("MAX_IN_FLIGHT", self.worker.max_in_flight.to_string())
            .env("REDIS_URL", &self.redis_url)
            .env("REDIS_KEY_PREFIX", &self.redis_prefix)
            .env("TOKEN_STORE", "redis")
            .env("TOKEN_MODE", "implicit")
            .env("GATEWAY_URL", simulator.url())
            .env("WORKER_ID", self.key_prefix(phase))
            .env("RUST_LOG", &self.worker_log_filter)
            .env_remove("HEALTH_LISTEN")
            .env_remove("PAYMENT_WORKER_FAULT")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .context("starting the worker process")?;
        Ok(Running::Process { child, log })
    }

    /// (low, high) watermark of every partition of `topic`.
    async fn watermarks(&self, topic: &str) -> anyhow::Result<Vec<(i64, i64)>> {
        let producer = self.producer.clone();
        let (topic, partitions) = (topic.to_owned(), self.partitions);
        tokio::task::spawn_blocking(move || {
            (0..partitions)
                .map(|partition| {
                    Ok(producer.client().fetch_watermarks(
                        &topic,
                        partition,
                        Duration::from_secs(10),
                    )?)
                })
                .collect()
        })
        .await?
    }

    /// The local Kafka keeps 5 MiB per partition and drops the oldest records
    /// beyond that; a backlog or results it truncated would be measured as lost
    /// commands or answers.
    async fn check_retained(&self, topic: &str) -> anyhow::Result<()> {
        for (partition, (low, high)) in self.watermarks(topic).await?.into_iter().enumerate() {
            anyhow::ensure!(
                low == 0,
                "the local Kafka dropped offsets 0..{low} of {high} in partition {partition} \
                 of {topic} (it keeps 5 MiB per partition): use more --partitions or a \
                 smaller backlog"
            );
        }
        Ok(())
    }

    /// Waits until the results topic holds at least `target` records, reading only
    /// its offsets. A redelivered command can answer twice, so the reader still
    /// checks that every command has its answer.
    async fn wait_for_results(
        &self,
        topic: &str,
        target: usize,
        bar: &ProgressBar,
        running: &mut Running,
    ) -> anyhow::Result<()> {
        let written = || async {
            let held: i64 = self
                .watermarks(topic)
                .await?
                .iter()
                .map(|(_, high)| high)
                .sum();
            Ok(usize::try_from(held).unwrap_or(0))
        };
        wait_for_progress(
            target,
            "results written",
            Duration::from_millis(100),
            bar,
            running,
            written,
        )
        .await
    }

    pub async fn run_phase(
        &self,
        phase: &str,
        gateway_latency_ms: u64,
        load: Load,
        kind: WorkerKind,
        bar: &ProgressBar,
    ) -> anyhow::Result<PhaseOutcome> {
        let kafka = self.kafka(phase)?;
        let key_prefix = self.key_prefix(phase);
        let simulator = GatewaySimulator::bind(
            "127.0.0.1:0".parse()?,
            SimulatorConfig {
                latency_ms: gateway_latency_ms,
                // Transaction ids come from the seed: a fixed one would repeat the
                // ids of earlier phases and runs, which the unique index refuses.
                seed: None,
                ..SimulatorConfig::default()
            },
        )?
        .spawn_on_thread(cpu::SIMULATOR_THREAD)?;
        // A backlog's results are read once it is processed: a reader polling while
        // the worker runs would take CPU from what is measured. Paced phases read as
        // they go, for the latency a consumer of results observes, and so does a
        // backlog whose results the local Kafka would not keep until the end.
        let results_kept = RESULTS_KEPT_PER_PARTITION * self.partitions.max(1) as usize;
        let mut reader = match load {
            Load::Backlog(count)
            | Load::DuplicatedBacklog(count)
            | Load::MixedBacklog { count, .. }
                if count <= results_kept =>
            {
                None
            }
            _ => Some(ResultsReader::start(&kafka, self.partitions)?),
        };
        let start = |this: &Self| -> anyhow::Result<Running> {
            match kind {
                WorkerKind::InProcess => Ok(Running::InProcess(
                    this.start_in_process(&kafka, &simulator, phase)?,
                )),
                WorkerKind::Process => this.start_process(&kafka, &simulator, phase),
            }
        };

        let cpu_before: cpu::CpuSample;
        let processing_since: Instant;
        // The backlog phase: keys sent more than once, and when the worker started
        // and when it owned every partition (Unix ms).
        let mut drain: Option<(Vec<Vec<super::load::Position>>, i64, i64)> = None;
        // The mixed phase: what its refunds should be answered.
        let mut refunds_expected = None;
        let (sent, running, measured_from, offered) = match load {
            Load::Backlog(count)
            | Load::DuplicatedBacklog(count)
            | Load::MixedBacklog { count, .. } => {
                bar.set_length(count as u64);
                bar.set_message("producing the backlog");
                let (sent, repeated) = match load {
                    Load::DuplicatedBacklog(_) => {
                        let (sent, repeated) = produce_duplicated_backlog(
                            &self.producer,
                            &kafka.commands_topic,
                            &key_prefix,
                            count,
                            self.partitions,
                            bar,
                        )
                        .await?;
                        (sent, Some(repeated))
                    }
                    Load::MixedBacklog { refund_share, .. } => {
                        let (sent, expected) = produce_mixed_backlog(
                            &self.producer,
                            &kafka.commands_topic,
                            &key_prefix,
                            count,
                            refund_share,
                            bar,
                        )
                        .await?;
                        refunds_expected = Some(expected);
                        (sent, None)
                    }
                    _ => (
                        produce_backlog(
                            &self.producer,
                            &kafka.commands_topic,
                            &key_prefix,
                            count,
                            bar,
                        )
                        .await?,
                        None,
                    ),
                };
                self.check_retained(&kafka.commands_topic).await?;
                bar.set_position(0);
                bar.reset_elapsed();
                bar.set_message("processing");
                cpu_before = cpu::sample(None, &self.database_name);
                processing_since = Instant::now();
                let started_ms = now_ms();
                let running = start(self)?;
                if let Some(repeated) = repeated {
                    let owned_ms = wait_until_owned(&running, self.partitions as usize).await?;
                    drain = Some((repeated, started_ms, owned_ms));
                }
                (sent, running, i64::MIN, None)
            }
            Load::Paced {
                rate,
                seconds,
                warmup,
            } => {
                let count = (rate * (seconds + warmup)).round().max(1.0) as usize;
                bar.set_length(count as u64);
                let mut running = start(self)?;
                bar.set_message("waiting for the partitions");
                wait_for_assignment(&running, self.partitions as usize).await?;
                bar.set_message(format!("paced at {rate:.0}/s"));
                let measured_from = now_ms() + (warmup * 1000.0) as i64;
                cpu_before = cpu::sample(None, &self.database_name);
                processing_since = Instant::now();
                let producing = produce_paced(
                    &self.producer,
                    &kafka.commands_topic,
                    &key_prefix,
                    count,
                    rate,
                );
                tokio::pin!(producing);
                let sent = loop {
                    tokio::select! {
                        sent = &mut producing => break sent?,
                        _ = tokio::time::sleep(Duration::from_millis(100)) => {
                            bar.set_position(reader.as_ref().map_or(0, ResultsReader::answered) as u64);
                            check_alive(&mut running)?;
                        }
                    }
                };
                (sent, running, measured_from, Some(rate))
            }
        };
        let mut running = running;
        let (child, log) = match &running {
            Running::Process { child, log } => (Some(child.id()), Some(log.clone())),
            Running::InProcess(_) => (None, None),
        };
        // What the phase cost, read as soon as its work is done.
        let cost = |sent: usize| {
            cpu_before.cost_until(
                &cpu::sample(child, &self.database_name),
                sent,
                processing_since.elapsed().as_secs_f64(),
            )
        };
        let (reader, waited, cpu_cost) = match reader.take() {
            Some(reader) => {
                let waited = wait_for_answers(&reader, sent.len(), bar, &mut running).await;
                (reader, waited, cost(sent.len()))
            }
            None => {
                self.wait_for_results(&kafka.results_topic, sent.len(), bar, &mut running)
                    .await?;
                let cpu_cost = cost(sent.len());
                self.check_retained(&kafka.results_topic).await?;
                let reader = ResultsReader::start(&kafka, self.partitions)?;
                let waited = wait_for_answers(&reader, sent.len(), bar, &mut running).await;
                (reader, waited, cpu_cost)
            }
        };
        let worker_memory = child.and_then(|pid| read_memory(Some(pid)));
        stop(running).await?;
        let observations = reader.finish().await?;
        waited?;
        // Kept when anything failed: the worker's own account of it.
        if let Some(log) = log {
            let _ = std::fs::remove_file(log);
        }
        if let Some(dir) = &self.samples_dir {
            write_samples(&dir.join(format!("{phase}.csv")), &sent, &observations)?;
        }

        let rows = audit::rows_with_prefix(&self.admin, &format!("{key_prefix}:")).await?;
        let ledger = simulator.ledger();
        let refund_books = crate::refund_books::refund_books(&ledger, &simulator.refunds());
        let refusals = simulator.refund_refusals().len();
        simulator.shutdown().await?;
        let audit = audit::reconcile(&ledger, &rows, sent.len(), observations.len()).with_refunds(
            refund_books,
            refunds_expected.map_or(0, |e| e.refunded),
            refusals,
        );

        let mut report = summarize(&sent, &observations, measured_from);
        report.name = phase.to_owned();
        report.worker = match kind {
            WorkerKind::InProcess => "in-process".into(),
            WorkerKind::Process => "process".into(),
        };
        report.gateway_latency_ms = gateway_latency_ms;
        report.offered_per_s = offered;
        report.worker_peak_rss_mib = worker_memory.map(|m| m.peak_mib());
        report.cpu = Some(cpu_cost);
        if let Some((repeated, started_ms, owned_ms)) = drain {
            report.backlog = Some(super::backlog::analyse(
                &sent,
                &repeated,
                &observations,
                started_ms,
                owned_ms,
                self.worker.max_in_flight,
            ));
        }
        Ok(PhaseOutcome { report, audit })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use payment_worker::redaction::holds_card_number;

    proptest! {
        #[test]
        fn bench_keys_are_never_card_numbers(
            run_id in "[0-9a-f]{8}",
            phase in proptest::sample::select(vec![
                "e2e-0ms", "e2e-0ms-mixed", "e2e-20ms", "eos-0ms", "eos-20ms", "baseline-20ms", "backlog-20ms",
                "half-load", "roundtrips", "stripe-localstripe", "ceiling", "tokens",
            ]),
            n in 0usize..10_000_000,
        ) {
            let key = payment_worker::operator::numbered_key(&phase_key_prefix(&run_id, phase), n, 7);
            prop_assert!(payment_worker::token::IdempotencyKey::try_from(key.as_str()).is_ok(), "{}", key);
            prop_assert!(!holds_card_number(key.as_bytes()), "{}", key);
        }
    }
}
