//! What a bench run found: per-phase statistics, the performance targets with their
//! verdicts, and the JSON written for comparisons (the printed table: `table.rs`).

use std::collections::BTreeMap;

use serde::Serialize;

use super::audit::AuditReport;
use super::cpu::CpuCost;
pub use super::summaries::{percentile, BacklogReport, LatencySummary, PurgeReport};

/// The performance targets (docs/CONTRACT.md).
pub const TARGET_RATIO_0MS: f64 = 0.8;
pub const TARGET_TPS_20MS: f64 = 1000.0;
pub const TARGET_P99_HALF_LOAD_MS: f64 = 25.0;
pub const TARGET_PEAK_RSS_MIB: f64 = 150.0;
pub const TARGET_WORKER_CPU_MS: f64 = 0.3;
pub const TARGET_BASELINE_MULTIPLE_20MS: f64 = 8.0;
/// `--results exactly-once` throughput ÷ at-least-once, same run, same latency.
pub const TARGET_EOS_RATIO: f64 = 0.8;
/// Round trips of one fresh payment at most: Postgres, Redis, gateway.
pub const TARGET_ROUND_TRIPS: RoundTripsPerPayment = RoundTripsPerPayment {
    postgres: 4.0,
    redis: 3.0,
    gateway: 1.0,
};

/// Round trips per fresh payment, counted from the client spans of each request.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct RoundTripsPerPayment {
    pub postgres: f64,
    pub redis: f64,
    pub gateway: f64,
}

impl RoundTripsPerPayment {
    fn within(&self, target: &Self) -> bool {
        self.postgres > 0.0
            && self.postgres <= target.postgres
            && self.redis <= target.redis
            && self.gateway <= target.gateway
    }
}
/// Backlog drain time ÷ (commands ÷ the 20 ms throughput), at most.
pub const TARGET_BACKLOG_MAKESPAN_OVER_BOUND: f64 = 1.3;
/// Longest wait of a backlog command between being read and being answered (ms).
pub const TARGET_BACKLOG_MAX_LATENCY_MS: f64 = 2000.0;
/// p99 of a waiting duplicate's answer after its original settled (ms).
pub const TARGET_DUPLICATE_WAKE_P99_MS: f64 = 200.0;
/// p99.9 end-to-end latency at half load (ms).
pub const TARGET_P999_HALF_LOAD_MS: f64 = 100.0;
/// The Postgres token store's end-to-end throughput ÷ the Redis store's.
pub const TARGET_RATIO_POSTGRES_TOKENS: f64 = 0.7;
/// Throughput while the purge runs ÷ without it (at most 10% slower).
pub const TARGET_RATIO_PURGING: f64 = 0.9;

/// One end-to-end phase.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PhaseReport {
    pub name: String,
    /// `in-process` (worker::start on the bench's runtime) or `process` (a
    /// `payment-worker run` child).
    pub worker: String,
    pub gateway_latency_ms: u64,
    pub commands: usize,
    /// Commands with at least one result (by source partition and offset).
    pub answered: usize,
    pub outcomes: BTreeMap<String, usize>,
    /// Results per second between the first and the last result (broker timestamps),
    /// so the group join before the first result does not count.
    pub payments_per_s: f64,
    pub first_to_last_result_s: f64,
    /// Paced phases: the rate the producer offered.
    pub offered_per_s: Option<f64>,
    /// Result record timestamp (CreateTime, set when the worker produced it) minus
    /// command record timestamp. Includes any time spent waiting in a backlog.
    pub latency: LatencySummary,
    /// When the bench's reader saw the result, minus the command timestamp: adds
    /// the result's produce acknowledgement and the fetch.
    pub observed_latency: LatencySummary,
    /// `payment-worker run` child only: its VmHWM.
    pub worker_peak_rss_mib: Option<f64>,
    /// The backlog phase only: drain time, read-to-answer waits, duplicate wakes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backlog: Option<BacklogReport>,
    /// CPU per payment by party, from the worker's start to the last result.
    pub cpu: Option<CpuCost>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct LoopReport {
    pub operations: usize,
    pub concurrency: usize,
    pub elapsed_s: f64,
    pub per_s: f64,
    pub failures: usize,
    pub cpu: Option<CpuCost>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Settings {
    pub quick: bool,
    pub release_build: bool,
    /// 1-minute load average when the run started and ended: other work on the
    /// machine shares the cores with everything measured here.
    pub load_average_start: f64,
    pub load_average_end: f64,
    pub cpus: usize,
    pub partitions: i32,
    pub max_in_flight: usize,
    pub database_max_connections: u32,
    /// partitions × max_in_flight: commands one worker runs at once, and the
    /// ceiling's concurrency.
    pub concurrency: usize,
    pub backlog: usize,
    pub e2e_commands: usize,
    pub half_load_seconds: u64,
    pub database: String,
    pub redis_prefix: String,
}

/// The JSON written by `--json`: the headline numbers at the top level so runs can
/// be compared with `jq`, the details below.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BenchReport {
    /// Identifies this run (its key prefix and Redis prefix).
    pub run_id: String,
    /// When the run started (RFC 3339).
    pub started_at: String,
    /// The crate version measured.
    pub version: String,
    /// Mean of the ceiling measured right before and right after the 0 ms phase,
    /// so load that comes and goes on the machine meets both sides of the ratio.
    pub ceiling_tps: f64,
    /// The ceiling measured right before the 0 ms phase (transactions/s).
    pub ceiling_tps_before: f64,
    /// The ceiling measured right after the 0 ms phase (transactions/s).
    pub ceiling_tps_after: f64,
    /// Redis token round trips per second (reserve and confirm, nothing else).
    pub token_round_trips_per_s: f64,
    /// End to end at 0 ms gateway latency (payments/s).
    pub e2e_tps_0ms: f64,
    /// e2e_tps_0ms ÷ ceiling_tps.
    pub ratio_0ms: f64,
    /// The 0 ms phase again with `refund_share` of its charges also refunded
    /// (refunds in the same command count): commands/s. 0 when not run.
    pub e2e_tps_0ms_mixed: f64,
    /// Share of the mixed phase's approved charges that were also refunded.
    pub refund_share: f64,
    /// e2e_tps_0ms_mixed ÷ e2e_tps_0ms, same run.
    pub ratio_mixed_to_charges: f64,
    /// An estimate, not a measurement: Postgres CPU per ceiling transaction ÷
    /// Postgres CPU per end-to-end payment at 0 ms, i.e. the ratio if Postgres had
    /// its cores to itself and nothing else bounded the worker.
    pub ratio_0ms_postgres_cpu_estimate: f64,
    /// End to end at 20 ms gateway latency (payments/s).
    pub e2e_tps_20ms: f64,
    /// partitions × 1000 ÷ 20 ms: what processing each partition sequentially allows.
    pub sequential_bound_20ms: f64,
    /// e2e_tps_20ms ÷ sequential_bound_20ms.
    pub ratio_20ms_to_sequential: f64,
    /// The produce rate of the half-load phase (commands/s).
    pub half_load_rate: f64,
    /// Median latency at half load: command timestamp to result produced (ms).
    pub p50_ms_half_load: i64,
    /// 95th percentile latency at half load (ms).
    pub p95_ms_half_load: i64,
    /// 99th percentile latency at half load (ms), the figure the target is set on.
    pub p99_ms_half_load: i64,
    /// 99th percentile at half load as the bench's reader saw the result (ms).
    pub p99_ms_half_load_observed: i64,
    /// 99.9th percentile latency at half load (ms).
    pub p999_ms_half_load: i64,
    /// `p999_ms_half_load` meets [`TARGET_P999_HALF_LOAD_MS`].
    pub pass_p999_half_load: bool,
    /// The backlog phase (5,000 commands, a quarter duplicates, 20 ms): from the
    /// worker owning its partitions to the last answer (s).
    pub backlog_makespan_s: f64,
    /// The steady-rate bound: the backlog's commands ÷ `e2e_tps_20ms` (s).
    pub backlog_bound_s: f64,
    /// `backlog_makespan_s` ÷ `backlog_bound_s`.
    pub backlog_makespan_over_bound: f64,
    /// `backlog_makespan_over_bound` meets [`TARGET_BACKLOG_MAKESPAN_OVER_BOUND`].
    pub pass_backlog_makespan: bool,
    /// The longest a backlog command waited between being read and answered (ms).
    pub backlog_max_latency_ms: i64,
    /// `backlog_max_latency_ms` meets [`TARGET_BACKLOG_MAX_LATENCY_MS`].
    pub pass_backlog_max_latency: bool,
    /// p99 of how long after its original settled a waiting cross-partition
    /// duplicate was answered (ms).
    pub duplicate_wake_ms_p99: i64,
    /// `duplicate_wake_ms_p99` meets [`TARGET_DUPLICATE_WAKE_P99_MS`].
    pub pass_duplicate_wake: bool,
    /// The backlog phase's details.
    pub backlog: Option<BacklogReport>,
    /// VmHWM of a `payment-worker run` process draining the backlog.
    pub peak_rss_mib: f64,
    /// Throughput of that process over the backlog (a cross-check of e2e_tps_0ms).
    pub worker_process_tps_0ms: f64,
    /// VmHWM of the bench process itself: broker, simulator, reader and the
    /// in-process workers together.
    pub bench_process_peak_rss_mib: f64,
    /// End to end at 0 ms with the Postgres token store (same worker, same pool).
    pub e2e_tps_0ms_postgres_tokens: f64,
    /// e2e_tps_0ms_postgres_tokens ÷ e2e_tps_0ms (the Redis store), same run.
    pub ratio_postgres_tokens_to_redis: f64,
    /// The Postgres-token phase again while the purge deletes expired rows.
    pub e2e_tps_0ms_postgres_tokens_purging: f64,
    /// e2e_tps_0ms_postgres_tokens_purging ÷ e2e_tps_0ms_postgres_tokens.
    pub ratio_purging_to_postgres_tokens: f64,
    /// The purge during the Postgres-token phase.
    pub purge: PurgeReport,
    /// `ratio_postgres_tokens_to_redis` meets [`TARGET_RATIO_POSTGRES_TOKENS`].
    pub pass_ratio_postgres_tokens: bool,
    /// `ratio_purging_to_postgres_tokens` meets [`TARGET_RATIO_PURGING`].
    pub pass_ratio_purging: bool,
    /// `ratio_0ms` meets [`TARGET_RATIO_0MS`].
    pub pass_ratio_0ms: bool,
    /// `e2e_tps_20ms` meets [`TARGET_TPS_20MS`].
    pub pass_tps_20ms: bool,
    /// `p99_ms_half_load` meets [`TARGET_P99_HALF_LOAD_MS`].
    pub pass_p99_half_load: bool,
    /// `peak_rss_mib` meets [`TARGET_PEAK_RSS_MIB`].
    pub pass_peak_rss: bool,
    /// CPU time of the `run` child per payment while it drains the backlog (ms).
    pub worker_cpu_ms_per_payment: f64,
    /// `worker_cpu_ms_per_payment` meets [`TARGET_WORKER_CPU_MS`].
    pub pass_worker_cpu: bool,
    /// Redis, Postgres and gateway round trips per fresh payment.
    pub round_trips: RoundTripsPerPayment,
    /// `round_trips` within [`TARGET_ROUND_TRIPS`].
    pub pass_round_trips: bool,
    /// The same worker with `--max-in-flight 1` (a plain one-record-at-a-time loop)
    /// at 20 ms, and how many times faster the real settings are.
    pub baseline_tps_20ms: f64,
    /// `e2e_tps_20ms` ÷ `baseline_tps_20ms`.
    pub baseline_multiple_20ms: f64,
    /// `baseline_multiple_20ms` meets [`TARGET_BASELINE_MULTIPLE_20MS`].
    pub pass_baseline_multiple: bool,
    /// Exactly-once throughput with the gateway answering at once.
    pub eos_tps_0ms: f64,
    /// `eos_tps_0ms` as a share of `e2e_tps_0ms` (same run).
    pub eos_ratio_0ms: f64,
    /// Exactly-once throughput with 20 ms gateway latency.
    pub eos_tps_20ms: f64,
    /// `eos_tps_20ms` as a share of `e2e_tps_20ms` (same run).
    pub eos_ratio_20ms: f64,
    /// Both exactly-once ratios meet their target (not counted in `all_pass`).
    pub pass_eos_ratio: bool,
    /// The `stripe` phase (the Stripe adapter against localstripe): payments/s.
    pub stripe_tps: f64,
    /// `stripe_tps` as a share of `e2e_tps_0ms`, the `charges` adapter in the same
    /// run. No target: localstripe handles one request at a time.
    pub ratio_stripe_to_charges: f64,
    /// Why the `stripe` phase did not run (localstripe missing), when it did not.
    pub stripe_skipped: Option<String>,
    /// Every phase's books balanced and every command was answered.
    pub audit_ok: bool,
    /// Every `pass_*` above holds.
    pub all_pass: bool,
    /// The settings the run used.
    pub settings: Settings,
    /// The ceiling loop before the 0 ms phase.
    pub ceiling: LoopReport,
    /// The ceiling loop after the 0 ms phase.
    pub ceiling_after: LoopReport,
    /// The Redis token loop.
    pub tokens: LoopReport,
    /// Every end-to-end phase, in the order run.
    pub phases: Vec<PhaseReport>,
    /// The books of every phase together.
    pub audit: AuditReport,
}

impl BenchReport {
    /// Fills the ratios and verdicts from the measured numbers.
    pub fn judge(&mut self) {
        self.ceiling_tps_before = self.ceiling.per_s;
        self.ceiling_tps_after = self.ceiling_after.per_s;
        self.ceiling_tps = if self.ceiling_after.operations > 0 {
            (self.ceiling_tps_before + self.ceiling_tps_after) / 2.0
        } else {
            self.ceiling_tps_before
        };
        self.ratio_0ms = ratio(self.e2e_tps_0ms, self.ceiling_tps);
        self.ratio_20ms_to_sequential = ratio(self.e2e_tps_20ms, self.sequential_bound_20ms);
        self.ratio_stripe_to_charges = ratio(self.stripe_tps, self.e2e_tps_0ms);
        self.ratio_mixed_to_charges = ratio(self.e2e_tps_0ms_mixed, self.e2e_tps_0ms);
        let postgres_ms = |cost: Option<&CpuCost>| {
            cost.and_then(|c| c.ms_per_operation.get("postgres").copied())
                .unwrap_or(0.0)
        };
        let zero_ms = self
            .phases
            .iter()
            .find(|p| p.name == "e2e-0ms")
            .and_then(|p| p.cpu.as_ref());
        let ceilings: Vec<f64> = [&self.ceiling, &self.ceiling_after]
            .iter()
            .filter(|c| c.cpu.is_some())
            .map(|c| postgres_ms(c.cpu.as_ref()))
            .collect();
        let ceiling_postgres_ms = ceilings.iter().sum::<f64>() / ceilings.len().max(1) as f64;
        self.ratio_0ms_postgres_cpu_estimate = ratio(ceiling_postgres_ms, postgres_ms(zero_ms));
        self.ratio_postgres_tokens_to_redis =
            ratio(self.e2e_tps_0ms_postgres_tokens, self.e2e_tps_0ms);
        self.ratio_purging_to_postgres_tokens = ratio(
            self.e2e_tps_0ms_postgres_tokens_purging,
            self.e2e_tps_0ms_postgres_tokens,
        );
        self.pass_ratio_postgres_tokens =
            self.ratio_postgres_tokens_to_redis >= TARGET_RATIO_POSTGRES_TOKENS;
        // Only a purge that ran through the phase says anything about slowing it.
        self.pass_ratio_purging = self.ratio_purging_to_postgres_tokens >= TARGET_RATIO_PURGING
            && self.purge.purge_s >= self.purge.phase_s;
        self.pass_ratio_0ms = self.ratio_0ms >= TARGET_RATIO_0MS;
        self.pass_tps_20ms = self.e2e_tps_20ms >= TARGET_TPS_20MS;
        // A p99 taken at a lower rate (--half-load-rate) does not show the target held.
        self.pass_p99_half_load = self.p99_ms_half_load as f64 <= TARGET_P99_HALF_LOAD_MS
            && self.half_load_rate > 0.0
            && self.half_load_rate >= 0.99 * self.e2e_tps_0ms / 2.0;
        self.pass_peak_rss = self.peak_rss_mib > 0.0 && self.peak_rss_mib <= TARGET_PEAK_RSS_MIB;
        self.worker_cpu_ms_per_payment = self
            .phases
            .iter()
            .find(|p| p.name == "worker-process")
            .and_then(|p| p.cpu.as_ref())
            .and_then(|c| c.ms_per_operation.get("worker_process").copied())
            .unwrap_or(0.0);
        self.pass_worker_cpu = self.worker_cpu_ms_per_payment > 0.0
            && self.worker_cpu_ms_per_payment <= TARGET_WORKER_CPU_MS;
        self.pass_round_trips = self.round_trips.within(&TARGET_ROUND_TRIPS);
        self.baseline_multiple_20ms = ratio(self.e2e_tps_20ms, self.baseline_tps_20ms);
        self.pass_baseline_multiple = self.baseline_multiple_20ms >= TARGET_BASELINE_MULTIPLE_20MS;
        self.eos_ratio_0ms = ratio(self.eos_tps_0ms, self.e2e_tps_0ms);
        self.eos_ratio_20ms = ratio(self.eos_tps_20ms, self.e2e_tps_20ms);
        // Opt-in mode: reported with its verdict, not part of `all_pass`.
        self.pass_eos_ratio =
            self.eos_ratio_0ms >= TARGET_EOS_RATIO && self.eos_ratio_20ms >= TARGET_EOS_RATIO;
        self.pass_p999_half_load =
            self.p999_ms_half_load as f64 <= TARGET_P999_HALF_LOAD_MS && self.half_load_rate > 0.0;
        if let Some(backlog) = &self.backlog {
            self.backlog_makespan_s = backlog.makespan_s;
            self.backlog_bound_s = ratio(backlog.commands as f64, self.e2e_tps_20ms);
            self.backlog_max_latency_ms = backlog.read_to_answer.max_ms;
            self.duplicate_wake_ms_p99 = backlog.duplicate_wake.p99_ms;
        }
        self.backlog_makespan_over_bound = ratio(self.backlog_makespan_s, self.backlog_bound_s);
        let drained = self.backlog.as_ref().is_some_and(|b| b.commands > 0);
        self.pass_backlog_makespan =
            drained && self.backlog_makespan_over_bound <= TARGET_BACKLOG_MAKESPAN_OVER_BOUND;
        self.pass_backlog_max_latency =
            drained && self.backlog_max_latency_ms as f64 <= TARGET_BACKLOG_MAX_LATENCY_MS;
        self.pass_duplicate_wake =
            drained && self.duplicate_wake_ms_p99 as f64 <= TARGET_DUPLICATE_WAKE_P99_MS;
        self.audit_ok = self.audit.ok;
        self.all_pass = self.pass_ratio_0ms
            && self.pass_backlog_makespan
            && self.pass_backlog_max_latency
            && self.pass_duplicate_wake
            && self.pass_p999_half_load
            && self.pass_worker_cpu
            && self.pass_round_trips
            && self.pass_baseline_multiple
            && self.pass_tps_20ms
            && self.pass_p99_half_load
            && self.pass_peak_rss
            && self.audit_ok;
    }
}

fn ratio(numerator: f64, denominator: f64) -> f64 {
    if denominator > 0.0 {
        numerator / denominator
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let values: Vec<i64> = (1..=100).collect();
        assert_eq!(percentile(&values, 50.0), 50);
        assert_eq!(percentile(&values, 99.0), 99);
        assert_eq!(percentile(&values, 100.0), 100);
        assert_eq!(percentile(&[7], 99.0), 7);
        assert_eq!(percentile(&[], 99.0), 0);
        let summary = LatencySummary::of(vec![5, 1, 3, 2, 4]);
        assert_eq!((summary.p50_ms, summary.max_ms, summary.samples), (3, 5, 5));
    }

    #[test]
    fn verdicts_follow_the_spec_targets() {
        let ceiling = |per_s| LoopReport {
            operations: 1000,
            per_s,
            ..LoopReport::default()
        };
        let mut report = BenchReport {
            ceiling: ceiling(900.0),
            ceiling_after: ceiling(1100.0),
            e2e_tps_0ms: 800.0,
            e2e_tps_20ms: 1000.0,
            e2e_tps_0ms_mixed: 600.0,
            refund_share: 0.1,
            sequential_bound_20ms: 150.0,
            half_load_rate: 400.0,
            p99_ms_half_load: 25,
            peak_rss_mib: 150.0,
            round_trips: TARGET_ROUND_TRIPS,
            baseline_tps_20ms: 125.0,
            p999_ms_half_load: 100,
            backlog: Some(super::BacklogReport {
                commands: 5000,
                makespan_s: 6.5,
                read_to_answer: LatencySummary {
                    max_ms: 2000,
                    ..LatencySummary::default()
                },
                duplicate_wake: LatencySummary {
                    p99_ms: 200,
                    ..LatencySummary::default()
                },
                ..Default::default()
            }),
            audit: AuditReport {
                ok: true,
                ..AuditReport::default()
            },
            ..BenchReport::default()
        };
        let mut worker = PhaseReport {
            name: "worker-process".into(),
            ..PhaseReport::default()
        };
        worker.cpu = Some(super::super::cpu::CpuCost {
            operations: 100,
            wall_s: 1.0,
            machine_idle_share: 0.0,
            ms_per_operation: [("worker_process".to_owned(), 0.3)].into(),
            ..Default::default()
        });
        report.phases.push(worker);
        report.judge();
        assert!(report.all_pass, "{report:?}");
        assert_eq!(report.worker_cpu_ms_per_payment, 0.3);
        assert_eq!(
            report.ratio_mixed_to_charges, 0.75,
            "timed only, never a verdict"
        );
        assert_eq!(report.baseline_multiple_20ms, 8.0);
        assert_eq!(report.backlog_bound_s, 5.0, "5,000 commands at 1,000/s");
        assert!((report.backlog_makespan_over_bound - 1.3).abs() < 1e-9);
        if let Some(backlog) = report.backlog.as_mut() {
            backlog.makespan_s = 6.6;
            backlog.duplicate_wake.p99_ms = 201;
        }
        report.judge();
        assert!(
            !report.pass_backlog_makespan && !report.pass_duplicate_wake && !report.all_pass,
            "a straggling backlog and a late wake"
        );
        if let Some(backlog) = report.backlog.as_mut() {
            backlog.makespan_s = 6.5;
            backlog.duplicate_wake.p99_ms = 200;
        }
        report.p999_ms_half_load = 101;
        report.judge();
        assert!(!report.pass_p999_half_load && !report.all_pass);
        report.p999_ms_half_load = 100;
        report.judge();
        assert!(report.all_pass);
        report.round_trips.redis = 4.0;
        report.judge();
        assert!(
            !report.pass_round_trips && !report.all_pass,
            "four Redis round trips"
        );
        report.round_trips = TARGET_ROUND_TRIPS;
        assert_eq!(report.ceiling_tps, 1000.0, "the mean of before and after");
        assert!((report.ratio_20ms_to_sequential - 1000.0 / 150.0).abs() < 1e-9);
        report.half_load_rate = 300.0;
        report.judge();
        assert!(
            !report.pass_p99_half_load,
            "a p99 below half the peak rate proves nothing"
        );
        report.half_load_rate = 400.0;
        report.e2e_tps_0ms = 799.0;
        report.audit.ok = false;
        report.judge();
        assert!(!report.pass_ratio_0ms && !report.audit_ok && !report.all_pass);
        assert!(report.pass_tps_20ms && report.pass_p99_half_load && report.pass_peak_rss);
    }

    #[test]
    fn the_json_carries_the_headline_numbers_at_the_top() {
        let mut report = BenchReport::default();
        report.judge();
        let json = serde_json::to_value(&report).unwrap();
        for key in [
            "ceiling_tps",
            "e2e_tps_0ms",
            "ratio_0ms",
            "e2e_tps_20ms",
            "p99_ms_half_load",
            "peak_rss_mib",
            "worker_cpu_ms_per_payment",
            "baseline_tps_20ms",
            "baseline_multiple_20ms",
            "eos_tps_0ms",
            "eos_ratio_0ms",
            "eos_tps_20ms",
            "eos_ratio_20ms",
            "backlog_makespan_s",
            "backlog_bound_s",
            "backlog_makespan_over_bound",
            "backlog_max_latency_ms",
            "duplicate_wake_ms_p99",
            "p999_ms_half_load",
            "e2e_tps_0ms_mixed",
            "refund_share",
            "ratio_mixed_to_charges",
        ] {
            assert!(json[key].is_number(), "{key} missing");
        }
        for key in ["postgres", "redis", "gateway"] {
            assert!(
                json["round_trips"][key].is_number(),
                "round_trips.{key} missing"
            );
        }
        for key in [
            "pass_ratio_0ms",
            "pass_tps_20ms",
            "pass_p99_half_load",
            "pass_peak_rss",
            "audit_ok",
        ] {
            assert!(json[key].is_boolean(), "{key} missing");
        }
    }
}
