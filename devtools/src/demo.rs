//! `payment-worker-devtools demo`: the whole product on one machine. A local Kafka (mock
//! cluster), the gateway simulator, Redis and Postgres at their default URLs; a
//! workload with duplicates and bad input; a worker group; a full replay; a report.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::FutureProducer;

use crate::demo_refunds::{refund_keys, refund_part, RefundReport, RefundTally};
use crate::refund_books::refund_books;
use crate::{GatewaySimulator, LocalKafka, SimulatorConfig};
use payment_worker::configuration::{
    DatabaseSettings, KafkaSettings, RedisSettings, TokenSettings, WorkerSettings,
};
use payment_worker::gateway::{HttpGateway, PaymentGateway};
use payment_worker::operator::{self, WorkloadSpec};
use payment_worker::payment::{GatewayLookup, Processor};
use payment_worker::retry::RetryPolicy;
use payment_worker::startup;
use payment_worker::worker::{self, Handler, Publisher, ResultRecord};

/// `payment-worker-devtools demo`: the workload's size and the services to use.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Commands in the workload.
    #[arg(long, default_value_t = 2000)]
    pub count: usize,
    /// Workers in the demo's consumer group.
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
    /// Partitions of the demo's commands topic.
    #[arg(long, default_value_t = 6)]
    pub partitions: i32,
    /// Simulated gateway latency.
    #[arg(long, default_value_t = 5)]
    pub gateway_latency_ms: u64,
    /// Share (0 to 1) of the approved charges also refunded: refunds keyed by the
    /// payment's key, published after the charges, counted in --count.
    #[arg(long, default_value_t = 0.1, value_parser = parse_share)]
    pub refund_share: f64,
    /// How the workers deliver results (see `run --results`).
    #[arg(long, value_enum, default_value = "at-least-once")]
    pub results: payment_worker::configuration::ResultsMode,
    /// The database the demo's payments go to (created and migrated when missing).
    #[command(flatten)]
    pub database: DatabaseSettings,
    /// The Redis the demo's tokens go to (under a key prefix of this run).
    #[command(flatten)]
    pub redis: RedisSettings,
}

/// A share is a number from 0 to 1.
fn parse_share(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(share) if (0.0..=1.0).contains(&share) => Ok(share),
        _ => Err(format!("{text:?} is not a share from 0 to 1")),
    }
}

/// Outcome counts per pass, filled by a reader of the results topic.
#[derive(Default)]
struct Tally {
    /// Commands answered; a rebalance may answer one twice, counted once.
    results: usize,
    by_outcome: BTreeMap<String, usize>,
    answered: std::collections::HashSet<(i32, i64)>,
    /// Every result read (repeats included), per command position.
    per_position: HashMap<(i32, i64), usize>,
    /// The outcomes of the refunds among the results.
    refunds: RefundTally,
}

impl Tally {
    /// "exactly 1", or the range seen, from what the `read_committed` reader counted.
    fn results_per_command(&self) -> String {
        let most = self.per_position.values().copied().max().unwrap_or(0);
        let fewest = self.per_position.values().copied().min().unwrap_or(0);
        if most == 1 && fewest == 1 {
            "exactly 1".to_owned()
        } else {
            let repeated = self.per_position.values().filter(|n| **n > 1).count();
            format!("{fewest} to {most} ({repeated} commands answered more than once)")
        }
    }
}

fn start_results_reader(
    kafka: &KafkaSettings,
    tally: Arc<Mutex<Tally>>,
    refund_keys: HashSet<String>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    let mut config = worker::base_config(kafka);
    config
        .set(
            "group.id",
            format!("demo-results-{}", uuid::Uuid::new_v4().simple()),
        )
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed");
    let consumer: BaseConsumer = worker::create_client(&config)?;
    consumer.subscribe(&[kafka.results_topic.as_str()])?;
    Ok(std::thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            if let Some(Ok(message)) = consumer.poll(Duration::from_millis(100)) {
                let parsed = message
                    .payload()
                    .and_then(|p| serde_json::from_slice::<ResultRecord>(p).ok());
                let mut tally = tally.lock().unwrap_or_else(|p| p.into_inner());
                let Some(result) = parsed else {
                    *tally.by_outcome.entry("unreadable".to_owned()).or_default() += 1;
                    continue;
                };
                *tally
                    .per_position
                    .entry((result.source.partition, result.source.offset))
                    .or_default() += 1;
                if tally
                    .answered
                    .insert((result.source.partition, result.source.offset))
                {
                    tally.results += 1;
                    tally.refunds.count_if_refund(&refund_keys, &result);
                    *tally.by_outcome.entry(result.outcome).or_default() += 1;
                }
            }
        }
        drop(consumer);
    }))
}

/// How often a pass reports its progress when stderr is not a terminal: a log file
/// or a pipe gets a plain line at this steady pace instead of redraws.
const PLAIN_PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// A pass's progress on stderr: a progress bar on a terminal; elsewhere a plain
/// line every [`PLAIN_PROGRESS_EVERY`] and one when the pass is done.
enum PassProgress {
    Bar(indicatif::ProgressBar),
    Lines { last: Option<Instant> },
}

impl PassProgress {
    fn new(label: &str, target: usize) -> Self {
        if !std::io::stderr().is_terminal() {
            return Self::Lines { last: None };
        }
        let bar = indicatif::ProgressBar::new(target as u64);
        let style = indicatif::ProgressStyle::with_template(
            "  {prefix}: [{bar:30.green/dim}] {pos}/{len} results ({elapsed})",
        )
        .map(|style| style.progress_chars("=> "))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_prefix(label.to_owned());
        Self::Bar(bar)
    }

    fn update(&mut self, label: &str, done: usize, target: usize, elapsed: Duration) {
        match self {
            Self::Bar(bar) => bar.set_position(done as u64),
            Self::Lines { last } => {
                let due = last.is_none_or(|at| at.elapsed() >= PLAIN_PROGRESS_EVERY);
                if due && done < target {
                    eprintln!(
                        "  {label}: {done}/{target} results ({:.1}s)",
                        elapsed.as_secs_f64()
                    );
                    *last = Some(Instant::now());
                }
            }
        }
    }

    fn finish(self, label: &str, done: usize, target: usize, elapsed: Duration) {
        match self {
            Self::Bar(bar) => {
                bar.set_position(done as u64);
                bar.finish();
            }
            Self::Lines { .. } => eprintln!(
                "  {label}: {done}/{target} results in {:.1}s",
                elapsed.as_secs_f64()
            ),
        }
    }
}

async fn wait_for_results(
    tally: &Mutex<Tally>,
    target: usize,
    label: &str,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(600);
    let mut progress = PassProgress::new(label, target);
    loop {
        let done = tally.lock().unwrap_or_else(|p| p.into_inner()).results;
        if done >= target {
            progress.finish(label, done, target, started.elapsed());
            return Ok(started.elapsed());
        }
        progress.update(label, done, target, started.elapsed());
        anyhow::ensure!(
            Instant::now() < deadline,
            "{label} did not finish within 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn start_group(
    count: usize,
    kafka: &KafkaSettings,
    settings: &WorkerSettings,
    processors: &[Arc<Processor>],
) -> anyhow::Result<Vec<worker::RunningWorker>> {
    (0..count)
        .map(|i| {
            let handler = Arc::new(Handler::new(
                Arc::clone(&processors[i % processors.len()]),
                Publisher::for_mode(kafka, settings)?,
                RetryPolicy {
                    budget: Duration::from_secs(60),
                    ..RetryPolicy::default()
                },
            ));
            worker::start(kafka, settings, handler)
        })
        .collect()
}

async fn stop_group(workers: Vec<worker::RunningWorker>) -> anyhow::Result<()> {
    for running in workers {
        running.stop().await?;
    }
    Ok(())
}

/// Runs the demo: two passes over one workload, then the books; fails on any double charge or unbooked charge.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let run_id = &uuid::Uuid::new_v4().simple().to_string()[..8];
    println!("payment-worker demo (run {run_id})");
    println!(
        "  postgres: {}",
        payment_worker::redaction::redact_url(args.database.url())
    );
    println!(
        "  redis:    {}",
        payment_worker::redaction::redact_url(args.redis.url())
    );
    let pool = startup::connect_and_migrate(&args.database).await?;

    let local = LocalKafka::start(3)?;
    let mut kafka = KafkaSettings::local(local.bootstrap_servers(), format!("demo-{run_id}"));
    kafka.commands_topic = format!("demo-{run_id}.commands");
    kafka.results_topic = format!("demo-{run_id}.results");
    kafka.dlq_topic = format!("demo-{run_id}.dlq");
    local.create_payment_topics(&kafka, args.partitions)?;
    println!(
        "  kafka:    local mock cluster at {} ({} partitions)",
        kafka.brokers, args.partitions
    );

    let simulator = GatewaySimulator::bind(
        "127.0.0.1:0".parse()?,
        SimulatorConfig {
            latency_ms: args.gateway_latency_ms,
            error_rate: 0.02,
            ..SimulatorConfig::default()
        },
    )?;
    let gateway_url = format!("http://{}", simulator.local_addr());
    let simulator = simulator.spawn();
    println!("  gateway:  simulator at {gateway_url} (2% transient errors)");
    println!("  results:  {}", args.results.as_str());

    let token_settings = TokenSettings {
        store: payment_worker::configuration::TokenStoreKind::Redis,
        mode: payment_worker::token::TokenMode::Implicit,
        lease: Duration::from_secs(10),
        pending_ttl: Duration::from_secs(3600),
        completed_ttl: Duration::from_secs(3600),
    };
    let redis = RedisSettings {
        key_prefix: format!("demo-{run_id}"),
        ..args.redis.clone()
    };
    let tokens = startup::token_store(&token_settings, &redis, &pool).await?;
    let gateway: Arc<dyn PaymentGateway> = Arc::new(HttpGateway::new(
        &gateway_url,
        Duration::from_secs(5),
        Duration::from_secs(1),
    )?);
    let processors: Vec<Arc<Processor>> = (0..args.workers)
        .map(|i| {
            Arc::new(Processor::new(
                Arc::clone(&tokens),
                Arc::clone(&gateway),
                pool.clone(),
                GatewayLookup::Uncertain,
                format!("demo-worker-{i}"),
            ))
        })
        .collect();

    let spec = WorkloadSpec {
        count: args.count,
        duplicate_ratio: 0.25,
        invalid_ratio: 0.05,
        decline_ratio: 0.05,
        seed: rand::random(),
    };
    let prefix = format!("demo-{run_id}");
    // The refunds take the places of the last charges: --count commands in all,
    // each refund after its charge on the charge's partition.
    let charges = operator::generate(&spec, &prefix);
    let refunds = operator::refunds_for(&charges, args.refund_share, spec.seed, &prefix);
    let records = operator::fit_refunds(&charges, &refunds, args.count);
    let expected_refunds = operator::expected_refunds(&records, refund_part(&records));
    let producer: FutureProducer = worker::create_client(&worker::producer_config(&kafka))?;
    operator::publish_records(&producer, &kafka.commands_topic, args.partitions, &records).await?;
    let mut kinds: HashMap<operator::RecordKind, usize> = HashMap::new();
    for r in &records {
        *kinds.entry(r.kind).or_default() += 1;
    }
    println!(
        "\nproduced {} commands: {} unique, {} duplicates, {} invalid",
        records.len(),
        kinds.get(&operator::RecordKind::Valid).unwrap_or(&0),
        kinds.get(&operator::RecordKind::Duplicate).unwrap_or(&0),
        kinds.get(&operator::RecordKind::Invalid).unwrap_or(&0),
    );
    println!(
        "  refunds ({:.0}% of approved charges): {} refunds, {} of them meant to exceed \
         their charge, {} repeated (counted above), after their charges",
        args.refund_share * 100.0,
        kinds.get(&operator::RecordKind::Refund).unwrap_or(&0),
        expected_refunds.exceeding,
        expected_refunds.repeated,
    );

    let tally = Arc::new(Mutex::new(Tally::default()));
    let stop_reader = Arc::new(AtomicBool::new(false));
    let reader = start_results_reader(
        &kafka,
        Arc::clone(&tally),
        refund_keys(&records),
        Arc::clone(&stop_reader),
    )?;
    let worker_settings = WorkerSettings {
        drain_deadline: Duration::from_secs(4),
        results: args.results,
        ..WorkerSettings::default()
    };

    println!(
        "\npass 1: {} workers in group {}",
        args.workers, kafka.group_id
    );
    let group = start_group(args.workers, &kafka, &worker_settings, &processors)?;
    let first = wait_for_results(&tally, records.len(), "pass 1").await?;
    let pass1 = std::mem::take(&mut *tally.lock().unwrap_or_else(|p| p.into_inner()));
    stop_group(group).await?;

    println!("\npass 2: rewind the group to offset 0 and replay every command");
    let rewind_kafka = kafka.clone();
    tokio::task::spawn_blocking(move || operator::rewind_group(&rewind_kafka, None))
        .await?
        .context("rewinding the group")?;
    let group = start_group(args.workers, &kafka, &worker_settings, &processors)?;
    let second = wait_for_results(&tally, records.len(), "pass 2").await?;
    let pass2 = std::mem::take(&mut *tally.lock().unwrap_or_else(|p| p.into_inner()));
    stop_group(group).await?;
    stop_reader.store(true, Ordering::SeqCst);
    let _ = tokio::task::spawn_blocking(move || reader.join()).await;

    // The books: the gateway ledger against the payments table, for this run's keys.
    let ledger_client = HttpGateway::new(
        &gateway_url,
        Duration::from_secs(10),
        Duration::from_secs(1),
    )?;
    let ledger: Vec<_> = ledger_client
        .ledger()
        .await?
        .into_iter()
        .filter(|e| e.idempotency_key.starts_with(&prefix))
        .collect();
    let rows =
        payment_worker::payment::booked_payments(&pool, &prefix, token_settings.lease).await?;
    let books = payment_worker::audit::reconcile(&ledger, &rows);
    let double_charged = books.double_charged.len();
    let mismatches = books.unbooked_charges;
    let rows_without_charge = books.rows_unbacked();

    println!("\n=== report ===");
    let rate = |n: usize, d: Duration| n as f64 / d.as_secs_f64().max(0.001);
    println!(
        "pass 1: {} results in {:.1}s ({:.0} commands/s): {:?}",
        pass1.results,
        first.as_secs_f64(),
        rate(pass1.results, first),
        pass1.by_outcome
    );
    println!(
        "pass 2 (replay): {} results in {:.1}s ({:.0} commands/s): {:?}",
        pass2.results,
        second.as_secs_f64(),
        rate(pass2.results, second),
        pass2.by_outcome
    );
    if args.results == payment_worker::configuration::ResultsMode::ExactlyOnce {
        // Counted by a read_committed reader of the results topic, never assumed.
        println!(
            "results per command (read_committed): pass 1 {}, pass 2 {}",
            pass1.results_per_command(),
            pass2.results_per_command()
        );
    }
    let new_in_replay = pass2.by_outcome.get("succeeded").unwrap_or(&0)
        + pass2.by_outcome.get("declined").unwrap_or(&0);
    println!(
        "ledger audit: {} charges for {} keys, {} payment rows",
        ledger.len(),
        books.charges.len(),
        rows.len()
    );
    println!("  double charges:               {double_charged}");
    println!("  charges without matching row: {mismatches}");
    println!("  rows without a charge:        {rows_without_charge}");
    println!("  new charges during replay:    {new_in_replay}");
    // The refunds against the charges, both from the gateway; a refused request
    // would mean the worker asked for more than is left of a charge.
    let gateway_refunds: Vec<_> = simulator
        .refunds()
        .into_iter()
        .filter(|e| e.idempotency_key.starts_with(&prefix))
        .collect();
    let refunds_ok = RefundReport {
        expected: expected_refunds,
        first: &pass1.refunds,
        replay: &pass2.refunds,
        books: refund_books(&ledger, &gateway_refunds),
        refusals: &simulator.refund_refusals(),
    }
    .print();
    drop(simulator);
    // Every client must be gone before the cluster, or they log reconnect errors.
    drop(producer);
    tokio::task::spawn_blocking(move || drop(local)).await?;
    anyhow::ensure!(
        double_charged == 0 && mismatches == 0 && rows_without_charge == 0 && new_in_replay == 0,
        "ledger audit FAILED"
    );
    anyhow::ensure!(refunds_ok, "refund audit FAILED");
    println!("ledger audit: OK (0 double charges)");
    Ok(())
}
