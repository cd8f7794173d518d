//! `payment-worker-devtools bench`: runs the phases in order, audits, prints the table and
//! writes the JSON report.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use rdkafka::producer::FutureProducer;

use super::audit::AuditReport;
use super::ceiling;
use super::cleanup::clean_up_unless_kept;
use super::compare::{self, BASELINE_PATH};
use super::e2e::{Bed, Load, WorkerKind};
use super::phase::{bar, phase};
use super::report::{BenchReport, LoopReport, PhaseReport, Settings};
use super::rss::read_memory;
use crate::LocalKafka;
use payment_worker::configuration::{
    DatabaseSettings, KafkaSettings, WorkerSettings, DEFAULT_REDIS_URL,
};
use payment_worker::redaction::redact_url;
use payment_worker::token::{RedisTokenStore, TokenPolicy, TokenStore};
use payment_worker::worker;

/// Loopback without TLS: a server with `ssl = on` (Debian's default) would otherwise
/// be reached over TLS (sqlx's `sslmode=prefer`), and every phase, the ceiling too,
/// would measure the encryption of loopback traffic. Pass a URL with
/// `sslmode=require` to measure with it.
pub const DEFAULT_BENCH_DATABASE_URL: &str =
    "postgres://postgres@127.0.0.1:5432/payments_bench?sslmode=disable";

/// The latency of the slow-gateway phase, fixed by the performance targets.
const SLOW_GATEWAY_MS: u64 = 20;

/// Commands waiting when the backlog phase's worker starts, fixed by the targets.
const BACKLOG_PHASE_COMMANDS: usize = 5_000;

/// `payment-worker-devtools bench`: how long, how much, and where.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// Also draw throughput and latency per phase, against the ceiling and the
    /// baseline, as an SVG picture in this file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// A short run (about two minutes) for smoke checks; its figures are noisier.
    #[arg(long)]
    pub quick: bool,
    /// The bench's own Postgres database (created and migrated when missing).
    #[arg(id = "bench_database_url", long = "database-url", env = "BENCH_DATABASE_URL", default_value = DEFAULT_BENCH_DATABASE_URL, hide_env_values = true)]
    pub database_url: String,
    /// Redis for the bench's token store (its keys are removed afterwards).
    #[arg(id = "bench_redis_url", long = "redis-url", env = "BENCH_REDIS_URL", default_value = DEFAULT_REDIS_URL, hide_env_values = true)]
    pub redis_url: String,
    /// Partitions of the bench's commands topic (one worker owns them all).
    #[arg(long, default_value_t = 3)]
    pub partitions: i32,
    /// Commands admitted at once per partition (default: the worker's default).
    #[arg(long, env = "MAX_IN_FLIGHT")]
    pub max_in_flight: Option<usize>,
    /// Postgres pool size of the worker and of the ceiling (default: the worker's).
    #[arg(long, env = "DATABASE_MAX_CONNECTIONS")]
    pub database_max_connections: Option<u32>,
    /// Commands on the topic before the worker process starts; its peak RSS is
    /// measured over them [default: 100000, --quick 10000].
    #[arg(long)]
    pub backlog: Option<usize>,
    /// Commands of each in-process backlog phase [default: 30000, --quick 5000].
    #[arg(long)]
    pub e2e_commands: Option<usize>,
    /// Ceiling transactions, and token reserve + confirm pairs [default: 20000, --quick 3000].
    #[arg(long)]
    pub ceiling_transactions: Option<usize>,
    /// Share (0 to 1) of the mixed phase's charges also refunded: the 0 ms phase
    /// again with refunds among its commands (0: no mixed phase).
    #[arg(long, default_value_t = 0.1, value_parser = parse_share)]
    pub refund_share: f64,
    /// Measured seconds of the half-load phase [default: 20, --quick 5].
    #[arg(long)]
    pub half_load_seconds: Option<u64>,
    /// Offer this rate in the half-load phase instead of half the measured peak
    /// (for latency-versus-load curves; the p99 target is judged at half the peak).
    #[arg(long, value_name = "PER_SECOND")]
    pub half_load_rate: Option<f64>,
    /// `RUST_LOG` of the worker process (`run` defaults to info as well).
    #[arg(long, value_name = "FILTER", default_value = "info")]
    pub worker_log_filter: String,
    /// Write every phase's per-command timings to DIR/<phase>.csv (profiling).
    #[arg(long, value_name = "DIR")]
    pub samples_dir: Option<PathBuf>,
    /// Exit non-zero when a performance target is missed too (the audit always does),
    /// and with --compare when a counted figure is more than 10 % worse than its baseline.
    #[arg(long)]
    pub strict: bool,
    /// After the run, print each figure against this earlier --json report: baseline,
    /// now, change, and whether it is counted (CPU and round trips per payment, which
    /// --strict gates) or timed (shown only). Without FILE: docs/bench-baseline.json,
    /// the last release's.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = BASELINE_PATH)]
    pub compare: Option<PathBuf>,
    /// Run nothing: compare this saved --json report with --compare's (for CI).
    #[arg(long, value_name = "FILE", requires = "compare", conflicts_with_all = ["json", "plot", "quick", "samples_dir", "keep_data"])]
    pub against: Option<PathBuf>,
    /// The Python that has localstripe (a virtual environment's bin/python), its
    /// `localstripe` executable, or the virtual environment; default: python3, then
    /// $VIRTUAL_ENV/bin/python.
    #[arg(long, env = "LOCALSTRIPE", value_name = "PATH")]
    pub localstripe: Option<PathBuf>,
    /// Keep this run's payment rows and Redis tokens instead of deleting them.
    #[arg(long)]
    pub keep_data: bool,
}

/// A share is a number from 0 to 1.
fn parse_share(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(share) if (0.0..=1.0).contains(&share) => Ok(share),
        _ => Err(format!("{text:?} is not a share from 0 to 1")),
    }
}

fn loop_line(name: &str, report: &LoopReport, unit: &str) {
    eprintln!(
        "{name:<16} {:>9.0} {unit}/s ({} in {:.1}s, concurrency {}, {} failed)",
        report.per_s, report.operations, report.elapsed_s, report.concurrency, report.failures
    );
}

/// The 1-minute load average, 0 where `/proc/loadavg` is missing.
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0)
}

/// A pool of the worker's size with every connection already open, so neither
/// the ceiling nor a phase pays for connecting inside its measurement.
async fn warm_pool(database: &DatabaseSettings) -> anyhow::Result<sqlx::PgPool> {
    let pool = payment_worker::startup::connect(database).await?;
    let mut held = Vec::new();
    for _ in 0..database.max_connections {
        held.push(
            pool.acquire()
                .await
                .context("opening the pool's connections")?,
        );
    }
    drop(held);
    Ok(pool)
}

/// Runs every phase, prints the report (and writes JSON and a picture when asked); fails when the books do not balance.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if let (Some(baseline), Some(now)) = (&args.compare, &args.against) {
        return compare::compare_files(baseline, now, args.strict);
    }
    let baseline = args
        .compare
        .as_deref()
        .map(compare::read_report)
        .transpose()?;
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let run_prefix = format!("bench-{run_id}");
    let pick = |given: Option<usize>, full: usize, quick: usize| {
        given.unwrap_or(if args.quick { quick } else { full })
    };
    let backlog = pick(args.backlog, 100_000, 10_000);
    let e2e_commands = pick(args.e2e_commands, 30_000, 5_000);
    let ceiling_count = pick(args.ceiling_transactions, 20_000, 3_000);
    let half_load_seconds = args
        .half_load_seconds
        .unwrap_or(if args.quick { 5 } else { 20 });
    let warmup = if args.quick { 1.0 } else { 2.0 };
    let max_in_flight = args
        .max_in_flight
        .unwrap_or(WorkerSettings::default().max_in_flight);
    let mut database = DatabaseSettings::with_url(&args.database_url);
    if let Some(size) = args.database_max_connections {
        database.max_connections = size;
    }
    anyhow::ensure!(
        args.partitions > 0 && max_in_flight > 0,
        "partitions and max-in-flight must be positive"
    );
    let concurrency = args.partitions as usize * max_in_flight;
    let database_name = url::Url::parse(&database.url)
        .ok()
        .map(|u| u.path().trim_start_matches('/').to_owned())
        .unwrap_or_default();

    eprintln!(
        "payment-worker bench (run {run_id}): postgres {}, redis {}",
        redact_url(&database.url),
        redact_url(&args.redis_url)
    );
    if cfg!(debug_assertions) {
        eprintln!(
            "warning: a debug build; use `cargo run --release -- bench` for figures worth keeping"
        );
    }
    // Set-up, audit and clean-up share two connections, so the measured pools have
    // the server's connection slots to themselves.
    let admin = payment_worker::startup::connect_and_migrate(&DatabaseSettings {
        max_connections: 2,
        ..database.clone()
    })
    .await?;
    // Every run deletes what it wrote, but the files keep their size: a plain VACUUM
    // only marks the space free (and nothing does where autovacuum is off), so the
    // next run's rows land scattered over a table and index grown by earlier runs,
    // the purging phase's millions of dead rows above all; a Postgres-token phase ran
    // at half speed on such a table. FULL rewrites both tables to what is live, which
    // is little when earlier runs cleaned up.
    if let Err(error) = sqlx::query("VACUUM (FULL, ANALYZE) payments, idempotency_tokens")
        .execute(&admin)
        .await
    {
        tracing::warn!(%error, "VACUUM of the bench database failed");
    }
    let tokens: Arc<dyn TokenStore> = Arc::new(
        RedisTokenStore::connect(&args.redis_url, run_prefix.clone(), TokenPolicy::default())
            .await
            .context("connecting to Redis")?,
    );

    let mut report = BenchReport {
        run_id: run_id.clone(),
        started_at: chrono::Utc::now().to_rfc3339(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        sequential_bound_20ms: f64::from(args.partitions) * 1000.0 / SLOW_GATEWAY_MS as f64,
        settings: Settings {
            quick: args.quick,
            release_build: !cfg!(debug_assertions),
            load_average_start: load_average(),
            load_average_end: 0.0,
            cpus: std::thread::available_parallelism().map_or(1, usize::from),
            partitions: args.partitions,
            max_in_flight,
            database_max_connections: database.max_connections,
            concurrency,
            backlog,
            e2e_commands,
            half_load_seconds,
            database: redact_url(&database.url),
            redis_prefix: run_prefix.clone(),
        },
        ..BenchReport::default()
    };

    let progress = bar("pg ceiling");
    progress.set_length(ceiling_count as u64);
    let pool = warm_pool(&database).await?;
    report.ceiling = ceiling::postgres_ceiling(
        &pool,
        &format!("{run_prefix}-ceiling"),
        ceiling_count,
        concurrency,
        &database_name,
        &progress,
    )
    .await?;
    pool.close().await;
    progress.finish_and_clear();
    loop_line("pg ceiling", &report.ceiling, "tx");

    let progress = bar("redis tokens");
    progress.set_length(ceiling_count as u64);
    report.tokens = ceiling::token_round_trips(
        Arc::clone(&tokens),
        &format!("{run_prefix}-tokens"),
        ceiling_count,
        concurrency,
        &database_name,
        &progress,
    )
    .await?;
    progress.finish_and_clear();
    loop_line("redis tokens", &report.tokens, "pairs");
    report.token_round_trips_per_s = report.tokens.per_s;

    let local = LocalKafka::start(3)?;
    let producer: FutureProducer =
        worker::producer_config(&KafkaSettings::local(local.bootstrap_servers(), "bench"))
            // The local Kafka keeps 5 MiB per partition: compressed, a backlog of
            // 100,000 commands fits in 3 partitions (about 2.5 MiB each).
            .set("compression.type", "lz4")
            .create()
            .context("creating the command producer")?;
    let mut bed = Bed {
        run_id: run_id.clone(),
        local,
        partitions: args.partitions,
        pool: warm_pool(&database).await?,
        admin: admin.clone(),
        tokens,
        producer,
        worker: WorkerSettings {
            max_in_flight,
            ..WorkerSettings::default()
        },
        database_url: database.url.clone(),
        database_name: database_name.clone(),
        database_max_connections: database.max_connections,
        redis_url: args.redis_url.clone(),
        redis_prefix: run_prefix.clone(),
        samples_dir: args.samples_dir.clone(),
        worker_log_filter: args.worker_log_filter.clone(),
        localstripe: args.localstripe.clone(),
    };
    let plan = Plan {
        ceiling_count,
        concurrency,
        e2e_commands,
        backlog,
        half_load_seconds,
        warmup,
        half_load_rate: args.half_load_rate,
        refund_share: args.refund_share,
    };
    let phases = run_phases(&mut bed, &mut report, &plan).await;
    let Bed {
        local, producer, ..
    } = bed;
    // Every client must be gone before the cluster, or they log reconnect errors.
    drop(producer);
    tokio::task::spawn_blocking(move || drop(local)).await?;
    if let Err(error) = phases {
        // A failed run's rows would otherwise stay and slow every later run's
        // statements (the bench database is never truncated).
        clean_up_unless_kept(&args, &admin, &run_id, &run_prefix).await;
        return Err(error);
    }

    report.bench_process_peak_rss_mib = read_memory(None).map_or(0.0, |m| m.peak_mib());
    report.settings.load_average_end = load_average();
    report.judge();
    println!("{}", report.table());
    if let Some(path) = &args.json {
        let json = serde_json::to_vec_pretty(&report)?;
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("report written to {}", path.display());
    }
    if let Some(path) = &args.plot {
        std::fs::write(path, super::plot::svg(&report))
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("picture written to {}", path.display());
    }
    anyhow::ensure!(
        report.audit.ok,
        "ledger audit FAILED: {:?} (rows and tokens of run {run_id} kept for inspection)",
        report.audit
    );
    clean_up_unless_kept(&args, &admin, &run_id, &run_prefix).await;
    let baseline = baseline.as_ref().zip(args.compare.as_deref());
    compare::verdict(&serde_json::to_value(&report)?, baseline, args.strict)
}

/// The ceiling again, between the 0 ms phase and the next, on the workers' pool.
async fn ceiling_after(bed: &Bed, count: usize, concurrency: usize) -> anyhow::Result<LoopReport> {
    let progress = bar("pg ceiling 2");
    progress.set_length(count as u64);
    let report = ceiling::postgres_ceiling(
        &bed.pool,
        &format!("bench-{}-ceilingafter", bed.run_id),
        count,
        concurrency,
        &bed.database_name,
        &progress,
    )
    .await?;
    progress.finish_and_clear();
    loop_line("pg ceiling 2", &report, "tx");
    Ok(report)
}

async fn eos_phases(
    bed: &mut Bed,
    commands: usize,
    audit: &mut AuditReport,
) -> anyhow::Result<(PhaseReport, PhaseReport)> {
    let zero = phase(
        bed,
        "eos-0ms",
        0,
        Load::Backlog(commands),
        WorkerKind::InProcess,
        audit,
    )
    .await?;
    let slow = phase(
        bed,
        "eos-20ms",
        SLOW_GATEWAY_MS,
        Load::Backlog(commands),
        WorkerKind::InProcess,
        audit,
    )
    .await?;
    Ok((zero, slow))
}

/// How much of everything the phases do.
#[derive(Clone, Copy)]
struct Plan {
    ceiling_count: usize,
    concurrency: usize,
    e2e_commands: usize,
    backlog: usize,
    half_load_seconds: u64,
    warmup: f64,
    half_load_rate: Option<f64>,
    refund_share: f64,
}

async fn run_phases(bed: &mut Bed, report: &mut BenchReport, plan: &Plan) -> anyhow::Result<()> {
    let Plan {
        ceiling_count,
        concurrency,
        e2e_commands,
        backlog,
        half_load_seconds,
        warmup,
        half_load_rate,
        refund_share,
    } = *plan;
    let mut audit = AuditReport {
        ok: true,
        ..AuditReport::default()
    };
    let zero = phase(
        bed,
        "e2e-0ms",
        0,
        Load::Backlog(e2e_commands),
        WorkerKind::InProcess,
        &mut audit,
    )
    .await?;
    report.e2e_tps_0ms = zero.payments_per_s;
    report.phases.push(zero);
    report.ceiling_after = ceiling_after(bed, ceiling_count, concurrency).await?;
    // The 0 ms phase again with refunds among its commands, as many commands.
    report.refund_share = refund_share;
    if refund_share > 0.0 {
        let mixed = phase(
            bed,
            "e2e-0ms-mixed",
            0,
            Load::MixedBacklog {
                count: e2e_commands,
                refund_share,
            },
            WorkerKind::InProcess,
            &mut audit,
        )
        .await?;
        report.e2e_tps_0ms_mixed = mixed.payments_per_s;
        report.phases.push(mixed);
    }
    super::pg_tokens::postgres_token_phases(bed, report, e2e_commands, &mut audit).await?;

    let slow = phase(
        bed,
        "e2e-20ms",
        SLOW_GATEWAY_MS,
        Load::Backlog(e2e_commands),
        WorkerKind::InProcess,
        &mut audit,
    )
    .await?;
    report.e2e_tps_20ms = slow.payments_per_s;
    report.phases.push(slow);

    // A backlog with duplicates, at 20 ms: does it drain at the steady rate, without
    // stragglers, and are duplicates answered as soon as their original settles?
    let drained = phase(
        bed,
        "backlog-20ms",
        SLOW_GATEWAY_MS,
        Load::DuplicatedBacklog(BACKLOG_PHASE_COMMANDS),
        WorkerKind::InProcess,
        &mut audit,
    )
    .await?;
    report.backlog = drained.backlog.clone();
    report.phases.push(drained);

    // The same two phases with results, dead letters and offsets in transactions.
    bed.worker.results = payment_worker::configuration::ResultsMode::ExactlyOnce;
    let eos = eos_phases(bed, e2e_commands, &mut audit).await;
    bed.worker.results = payment_worker::configuration::ResultsMode::AtLeastOnce;
    let (eos_zero, eos_slow) = eos?;
    report.eos_tps_0ms = eos_zero.payments_per_s;
    report.eos_tps_20ms = eos_slow.payments_per_s;
    report.phases.push(eos_zero);
    report.phases.push(eos_slow);

    // What a plain consumer loop would do: one record of a partition at a time.
    let admitted = bed.worker.max_in_flight;
    bed.worker.max_in_flight = 1;
    let baseline = phase(
        bed,
        "baseline-20ms",
        SLOW_GATEWAY_MS,
        Load::Backlog((e2e_commands / 10).max(300)),
        WorkerKind::InProcess,
        &mut audit,
    )
    .await;
    bed.worker.max_in_flight = admitted;
    let baseline = baseline?;
    report.baseline_tps_20ms = baseline.payments_per_s;
    report.phases.push(baseline);

    super::stripe::stripe_phase(
        bed,
        report,
        (e2e_commands / 100).clamp(100, 300),
        &mut audit,
    )
    .await?;

    report.round_trips = super::round_trips::per_fresh_payment(bed, 200).await?;
    eprintln!(
        "{:<16} {:.1} Postgres / {:.1} Redis / {:.1} gateway per fresh payment",
        "round trips",
        report.round_trips.postgres,
        report.round_trips.redis,
        report.round_trips.gateway
    );

    let rate = half_load_rate.unwrap_or(report.e2e_tps_0ms / 2.0).max(1.0);
    let half = phase(
        bed,
        "half-load",
        0,
        Load::Paced {
            rate,
            seconds: half_load_seconds as f64,
            warmup,
        },
        WorkerKind::InProcess,
        &mut audit,
    )
    .await?;
    report.half_load_rate = rate;
    report.p50_ms_half_load = half.latency.p50_ms;
    report.p95_ms_half_load = half.latency.p95_ms;
    report.p99_ms_half_load = half.latency.p99_ms;
    report.p999_ms_half_load = half.latency.p999_ms;
    report.p99_ms_half_load_observed = half.observed_latency.p99_ms;
    report.phases.push(half);

    // The worker process brings its own pool; ours would only hold server slots.
    bed.pool.close().await;
    let process = phase(
        bed,
        "worker-process",
        0,
        Load::Backlog(backlog),
        WorkerKind::Process,
        &mut audit,
    )
    .await?;
    report.peak_rss_mib = process.worker_peak_rss_mib.unwrap_or(0.0);
    report.worker_process_tps_0ms = process.payments_per_s;
    report.phases.push(process);
    report.audit = audit;
    Ok(())
}
