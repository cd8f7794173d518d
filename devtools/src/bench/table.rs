//! The table `bench` prints at the end: one line per figure with its target and
//! verdict, then where the CPU went in each phase.

use std::fmt::Write as _;

use super::report::{
    BenchReport, TARGET_BACKLOG_MAKESPAN_OVER_BOUND, TARGET_BACKLOG_MAX_LATENCY_MS,
    TARGET_BASELINE_MULTIPLE_20MS, TARGET_DUPLICATE_WAKE_P99_MS, TARGET_EOS_RATIO,
    TARGET_P999_HALF_LOAD_MS, TARGET_P99_HALF_LOAD_MS, TARGET_PEAK_RSS_MIB, TARGET_RATIO_0MS,
    TARGET_RATIO_POSTGRES_TOKENS, TARGET_RATIO_PURGING, TARGET_ROUND_TRIPS, TARGET_TPS_20MS,
    TARGET_WORKER_CPU_MS,
};

impl BenchReport {
    /// The human-readable summary: one line per figure with its target and verdict.
    pub fn table(&self) -> String {
        let verdict = |pass: bool| if pass { "PASS" } else { "MISS" };
        let s = &self.settings;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "payment-worker bench {} (run {}, {} build, {} CPUs, {} partitions, max-in-flight {}, pool {}{})",
            self.version,
            self.run_id,
            if s.release_build { "release" } else { "DEBUG: not representative" },
            s.cpus,
            s.partitions,
            s.max_in_flight,
            s.database_max_connections,
            if s.quick { ", --quick" } else { "" },
        );
        let _ = writeln!(
            out,
            "load average {:.2} at the start, {:.2} at the end",
            s.load_average_start, s.load_average_end
        );
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:<58} {:>12} {:>10}  verdict",
            "measure", "value", "target"
        );
        let mut row = |name: &str, value: String, target: &str, verdict: &str| {
            let _ = writeln!(out, "{name:<58} {value:>12} {target:>10}  {verdict}");
        };
        row(
            "Postgres ceiling, worker's transaction shape (tx/s)",
            format!("{:.0}", self.ceiling_tps),
            "",
            "",
        );
        row(
            "  before / after the 0 ms phase (tx/s)",
            format!(
                "{:.0} / {:.0}",
                self.ceiling_tps_before, self.ceiling_tps_after
            ),
            "",
            "",
        );
        row(
            "Redis reserve + confirm (round trip pairs/s)",
            format!("{:.0}", self.token_round_trips_per_s),
            "",
            "",
        );
        row(
            "end to end, 0 ms gateway (payments/s)",
            format!("{:.0}", self.e2e_tps_0ms),
            "",
            "",
        );
        if self.refund_share > 0.0 {
            row(
                &format!(
                    "  same with refunds of {:.0}% of charges (commands/s)",
                    self.refund_share * 100.0
                ),
                format!("{:.0}", self.e2e_tps_0ms_mixed),
                "",
                "",
            );
            row(
                "  ratio: with refunds ÷ charges only",
                format!("{:.2}", self.ratio_mixed_to_charges),
                "",
                "",
            );
        }
        row(
            "  ratio: end to end ÷ ceiling at 0 ms",
            format!("{:.2}", self.ratio_0ms),
            &format!(">= {TARGET_RATIO_0MS:.2}"),
            verdict(self.pass_ratio_0ms),
        );
        row(
            "  estimate: same, were Postgres alone on its cores (CPU ratio)",
            format!("{:.2}", self.ratio_0ms_postgres_cpu_estimate),
            "",
            "",
        );
        row(
            "end to end, 0 ms, Postgres token store (payments/s)",
            format!("{:.0}", self.e2e_tps_0ms_postgres_tokens),
            "",
            "",
        );
        row(
            "  ratio: Postgres token store ÷ Redis token store",
            format!("{:.2}", self.ratio_postgres_tokens_to_redis),
            &format!(">= {TARGET_RATIO_POSTGRES_TOKENS:.2}"),
            verdict(self.pass_ratio_postgres_tokens),
        );
        row(
            &format!(
                "  same while purging {} expired rows in {:.1} s (payments/s)",
                self.purge.purged_rows, self.purge.purge_s
            ),
            format!("{:.0}", self.e2e_tps_0ms_postgres_tokens_purging),
            "",
            "",
        );
        row(
            "  ratio: purging ÷ not purging",
            format!("{:.2}", self.ratio_purging_to_postgres_tokens),
            &format!(">= {TARGET_RATIO_PURGING:.2}"),
            verdict(self.pass_ratio_purging),
        );
        row(
            &format!(
                "end to end, 20 ms gateway, {} partitions (payments/s)",
                s.partitions
            ),
            format!("{:.0}", self.e2e_tps_20ms),
            &format!(">= {TARGET_TPS_20MS:.0}"),
            verdict(self.pass_tps_20ms),
        );
        row(
            &format!(
                "  ratio: ÷ partition-sequential bound ({:.0}/s)",
                self.sequential_bound_20ms
            ),
            format!("{:.2}", self.ratio_20ms_to_sequential),
            "",
            "",
        );
        row(
            &format!(
                "p99 produce→result at half the peak rate ({:.0}/s) (ms)",
                self.half_load_rate
            ),
            self.p99_ms_half_load.to_string(),
            &format!("<= {TARGET_P99_HALF_LOAD_MS:.0}"),
            verdict(self.pass_p99_half_load),
        );
        row(
            "  p99.9 at half the peak rate (ms)",
            self.p999_ms_half_load.to_string(),
            &format!("<= {TARGET_P999_HALF_LOAD_MS:.0}"),
            verdict(self.pass_p999_half_load),
        );
        row(
            &format!(
                "backlog of 5,000 (25 % duplicates), 20 ms: drained in (s), bound {:.2} s",
                self.backlog_bound_s
            ),
            format!("{:.2}", self.backlog_makespan_s),
            "",
            "",
        );
        row(
            "  ratio: backlog drain time ÷ steady-rate bound",
            format!("{:.2}", self.backlog_makespan_over_bound),
            &format!("<= {TARGET_BACKLOG_MAKESPAN_OVER_BOUND:.1}"),
            verdict(self.pass_backlog_makespan),
        );
        row(
            "  longest wait from read to answer (ms)",
            self.backlog_max_latency_ms.to_string(),
            &format!("<= {TARGET_BACKLOG_MAX_LATENCY_MS:.0}"),
            verdict(self.pass_backlog_max_latency),
        );
        row(
            "  duplicate answered after its original settled, p99 (ms)",
            self.duplicate_wake_ms_p99.to_string(),
            &format!("<= {TARGET_DUPLICATE_WAKE_P99_MS:.0}"),
            verdict(self.pass_duplicate_wake),
        );
        row(
            &format!("worker process peak RSS, backlog of {} (MiB)", s.backlog),
            format!("{:.1}", self.peak_rss_mib),
            &format!("<= {TARGET_PEAK_RSS_MIB:.0}"),
            verdict(self.pass_peak_rss),
        );
        row(
            "  that worker process's throughput (payments/s)",
            format!("{:.0}", self.worker_process_tps_0ms),
            "",
            "",
        );
        row(
            "  that worker process's CPU per payment (ms)",
            format!("{:.3}", self.worker_cpu_ms_per_payment),
            &format!("<= {TARGET_WORKER_CPU_MS:.1}"),
            verdict(self.pass_worker_cpu),
        );
        let trips = &self.round_trips;
        let target = &TARGET_ROUND_TRIPS;
        row(
            "round trips per fresh payment: Postgres / Redis / gateway",
            format!(
                "{:.1} / {:.1} / {:.1}",
                trips.postgres, trips.redis, trips.gateway
            ),
            &format!(
                "<= {:.0}/{:.0}/{:.0}",
                target.postgres, target.redis, target.gateway
            ),
            verdict(self.pass_round_trips),
        );
        row(
            "baseline: one record per partition at a time, 20 ms (payments/s)",
            format!("{:.0}", self.baseline_tps_20ms),
            "",
            "",
        );
        row(
            "  ratio: end to end at 20 ms ÷ baseline",
            format!("{:.1}", self.baseline_multiple_20ms),
            &format!(">= {TARGET_BASELINE_MULTIPLE_20MS:.0}"),
            verdict(self.pass_baseline_multiple),
        );
        for (latency, tps, share) in [
            ("0", self.eos_tps_0ms, self.eos_ratio_0ms),
            ("20", self.eos_tps_20ms, self.eos_ratio_20ms),
        ] {
            row(
                &format!("exactly-once results, {latency} ms (payments/s)"),
                format!("{tps:.0}"),
                "",
                "",
            );
            row(
                &format!("  ratio: exactly-once ÷ at-least-once at {latency} ms"),
                format!("{share:.2}"),
                &format!(">= {TARGET_EOS_RATIO:.1}"),
                verdict(share >= TARGET_EOS_RATIO),
            );
        }
        match &self.stripe_skipped {
            None => {
                row(
                    "stripe adapter against localstripe (payments/s)",
                    format!("{:.0}", self.stripe_tps),
                    "",
                    "",
                );
                row(
                    "  ratio: stripe ÷ charges at 0 ms (localstripe is serial)",
                    format!("{:.3}", self.ratio_stripe_to_charges),
                    "",
                    "",
                );
            }
            Some(_) => row(
                "stripe adapter against localstripe",
                "skipped".to_owned(),
                "",
                "",
            ),
        }
        row(
            "bench process peak RSS, all in one (MiB)",
            format!("{:.1}", self.bench_process_peak_rss_mib),
            "",
            "",
        );
        row(
            "ledger audit (≤ 1 charge per key, ledger = rows)",
            if self.audit.ok {
                "OK".into()
            } else {
                "VIOLATED".into()
            },
            "",
            verdict(self.audit.ok),
        );
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:<26} {:>8} {:>9} {:>11} {:>6} {:>6} {:>6} {:>6}   observed p99",
            "phase", "commands", "answered", "payments/s", "p50", "p95", "p99", "max"
        );
        for phase in &self.phases {
            let _ = writeln!(
                out,
                "{:<26} {:>8} {:>9} {:>11.0} {:>6} {:>6} {:>6} {:>6}   {}",
                phase.name,
                phase.commands,
                phase.answered,
                phase.payments_per_s,
                phase.latency.p50_ms,
                phase.latency.p95_ms,
                phase.latency.p99_ms,
                phase.latency.max_ms,
                phase.observed_latency.p99_ms,
            );
        }
        let _ = writeln!(
            out,
            "(latencies in ms, produce → result record; backlog phases include the wait in the backlog)"
        );
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "CPU ms per payment (per transaction for the ceiling), by process:"
        );
        let costs = [
            ("pg-ceiling", self.ceiling.cpu.as_ref()),
            ("pg-ceiling-after", self.ceiling_after.cpu.as_ref()),
        ]
        .into_iter()
        .chain(
            self.phases
                .iter()
                .map(|p| (p.name.as_str(), p.cpu.as_ref())),
        );
        for (name, cost) in costs {
            let Some(cost) = cost else { continue };
            let parts: Vec<String> = cost
                .ms_per_operation
                .iter()
                .map(|(party, ms)| format!("{party} {ms:.3}"))
                .collect();
            let _ = writeln!(
                out,
                "  {name:<16} {} (machine idle {:.0}%)",
                parts.join(", "),
                cost.machine_idle_share * 100.0
            );
            let threads: Vec<String> = cost
                .bench_threads_ms_per_operation
                .iter()
                .filter(|(_, ms)| **ms > 0.0)
                .map(|(role, ms)| format!("{role} {ms:.3}"))
                .collect();
            if !threads.is_empty() {
                let _ = writeln!(out, "  {:<16} bench process: {}", "", threads.join(", "));
            }
        }
        out
    }
}
