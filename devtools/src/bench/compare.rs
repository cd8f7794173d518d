//! `bench --compare`: one run's figures against an earlier run's `--json` report
//! (the last release's is `docs/bench-baseline.json`). Only *counted* figures can
//! fail `--strict`: CPU time and round trips per payment follow the code, not the
//! machine's load, while throughput and latency move with whatever else shares the
//! cores and are shown but never gate. Pure apart from [`read_report`] and
//! [`compare_files`], so the rules are unit-tested on plain JSON.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use serde_json::Value;

/// The last release's report, committed (a release build on a quiet machine).
pub const BASELINE_PATH: &str = "docs/bench-baseline.json";

/// How much worse than its baseline a counted figure may get before `--strict` fails.
pub const MAX_COUNTED_GROWTH: f64 = 0.10;

/// Floating-point slack in the 10 % rule: 4.4 round trips against 4.0 is exactly
/// 10 %, which the rule allows, but `(4.4 - 4.0) / 4.0` comes out a hair above 0.1.
const EPSILON: f64 = 1e-9;

/// Whether a figure can gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Deterministic enough to gate: what one payment costs in CPU and round trips.
    Counted,
    /// Throughput, latency and peak memory: they follow the machine's load (peak RSS
    /// too, through how far the backlog runs ahead of the worker); shown only.
    Timed,
}

/// Which way a figure gets better.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    Lower,
    Higher,
}

/// One figure of the report, by its path (`round_trips.redis` is
/// `report["round_trips"]["redis"]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figure {
    pub name: &'static str,
    pub kind: Kind,
    pub better: Better,
}

const fn figure(name: &'static str, kind: Kind, better: Better) -> Figure {
    Figure { name, kind, better }
}

use Better::{Higher, Lower};
use Kind::{Counted, Timed};

/// Every figure compared, in the order printed: counted first. Inputs (the
/// half-load rate, the sequential bound) and the bounds derived from other figures
/// are left out: they say nothing about the code measured.
pub const FIGURES: &[Figure] = &[
    figure("worker_cpu_ms_per_payment", Counted, Lower),
    figure("round_trips.postgres", Counted, Lower),
    figure("round_trips.redis", Counted, Lower),
    figure("round_trips.gateway", Counted, Lower),
    figure("ceiling_tps", Timed, Higher),
    figure("token_round_trips_per_s", Timed, Higher),
    figure("e2e_tps_0ms", Timed, Higher),
    figure("ratio_0ms", Timed, Higher),
    figure("ratio_0ms_postgres_cpu_estimate", Timed, Higher),
    figure("e2e_tps_0ms_mixed", Timed, Higher),
    figure("ratio_mixed_to_charges", Timed, Higher),
    figure("e2e_tps_20ms", Timed, Higher),
    figure("ratio_20ms_to_sequential", Timed, Higher),
    figure("p50_ms_half_load", Timed, Lower),
    figure("p95_ms_half_load", Timed, Lower),
    figure("p99_ms_half_load", Timed, Lower),
    figure("p99_ms_half_load_observed", Timed, Lower),
    figure("p999_ms_half_load", Timed, Lower),
    figure("backlog_makespan_s", Timed, Lower),
    figure("backlog_makespan_over_bound", Timed, Lower),
    figure("backlog_max_latency_ms", Timed, Lower),
    figure("duplicate_wake_ms_p99", Timed, Lower),
    figure("peak_rss_mib", Timed, Lower),
    figure("worker_process_tps_0ms", Timed, Higher),
    figure("bench_process_peak_rss_mib", Timed, Lower),
    figure("e2e_tps_0ms_postgres_tokens", Timed, Higher),
    figure("ratio_postgres_tokens_to_redis", Timed, Higher),
    figure("e2e_tps_0ms_postgres_tokens_purging", Timed, Higher),
    figure("ratio_purging_to_postgres_tokens", Timed, Higher),
    figure("baseline_tps_20ms", Timed, Higher),
    figure("baseline_multiple_20ms", Timed, Higher),
    figure("eos_tps_0ms", Timed, Higher),
    figure("eos_ratio_0ms", Timed, Higher),
    figure("eos_tps_20ms", Timed, Higher),
    figure("eos_ratio_20ms", Timed, Higher),
    figure("stripe_tps", Timed, Higher),
    figure("ratio_stripe_to_charges", Timed, Higher),
];

/// A figure's value in `report`: `None` when absent or null (an older report, a
/// phase that did not run); an error when it is there but not a number, which is
/// not a report this bench wrote.
fn value_of(report: &Value, name: &str) -> Result<Option<f64>, String> {
    let pointer = format!("/{}", name.replace('.', "/"));
    match report.pointer(&pointer) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_f64()
            .map(Some)
            .ok_or_else(|| format!("`{name}` is not a number: {value}")),
    }
}

/// Every figure of [`FIGURES`] in `report` (named `which` in errors), in order.
fn figure_values(report: &Value, which: &str) -> anyhow::Result<Vec<Option<f64>>> {
    anyhow::ensure!(
        report.is_object(),
        "{which} is not a JSON object (is it a `bench --json` report?)"
    );
    let values = FIGURES
        .iter()
        .map(|f| value_of(report, f.name))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("{which}: {e}"))?;
    anyhow::ensure!(
        values.iter().any(Option::is_some),
        "{which} holds none of the bench's figures (is it a `bench --json` report?)"
    );
    Ok(values)
}

/// One figure found in both reports.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub figure: Figure,
    pub baseline: f64,
    pub now: f64,
}

impl Row {
    /// `now` against `baseline` as a fraction (+0.2 = 20 % more); `None` when the
    /// baseline is 0 and now is not, where no percentage means anything.
    pub fn change(&self) -> Option<f64> {
        if self.baseline == 0.0 {
            return (self.now == 0.0).then_some(0.0);
        }
        Some((self.now - self.baseline) / self.baseline.abs())
    }

    /// The change in the direction that is worse for this figure (+0.2 = 20 % worse).
    fn worsening(&self) -> Option<f64> {
        self.change().map(|change| match self.figure.better {
            Lower => change,
            Higher => -change,
        })
    }

    /// A counted figure more than 10 % worse than its baseline.
    pub fn regressed(&self) -> bool {
        self.figure.kind == Counted
            && self
                .worsening()
                .is_some_and(|worse| worse > MAX_COUNTED_GROWTH + EPSILON)
    }

    fn verdict(&self) -> &'static str {
        match self.worsening() {
            _ if self.regressed() => "REGRESSED",
            None => "no baseline",
            Some(worse) if worse.abs() < 0.0005 => "same",
            Some(worse) if worse > 0.0 => "worse",
            Some(_) => "better",
        }
    }
}

/// Two reports side by side.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Comparison {
    pub rows: Vec<Row>,
    /// Figures only the baseline has (a phase skipped now, a figure removed).
    pub only_in_baseline: Vec<&'static str>,
    /// Figures only the new report has (a phase skipped then, a figure added).
    pub only_in_now: Vec<&'static str>,
}

/// Compares `now` with `baseline`, figure by figure. Fails only on a report that is
/// not one: not a JSON object, a figure that is not a number, or none of the
/// bench's figures at all.
pub fn compare(baseline: &Value, now: &Value) -> anyhow::Result<Comparison> {
    let before = figure_values(baseline, "the baseline report")?;
    let after = figure_values(now, "the new report")?;
    let mut comparison = Comparison::default();
    for ((figure, before), after) in FIGURES.iter().zip(before).zip(after) {
        match (before, after) {
            (Some(baseline), Some(now)) => comparison.rows.push(Row {
                figure: *figure,
                baseline,
                now,
            }),
            (Some(_), None) => comparison.only_in_baseline.push(figure.name),
            (None, Some(_)) => comparison.only_in_now.push(figure.name),
            (None, None) => {}
        }
    }
    Ok(comparison)
}

/// A figure as printed: at most three decimals, no trailing zeros.
fn number(value: f64) -> String {
    let text = format!("{value:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" {
        "0".to_owned()
    } else {
        text.to_owned()
    }
}

impl Comparison {
    /// The counted figures that grew more than 10 % (in their worse direction).
    pub fn regressions(&self) -> Vec<&Row> {
        self.rows.iter().filter(|row| row.regressed()).collect()
    }

    /// The printed table: one row per figure in both reports, then the figures
    /// only one of them has.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:<36} {:<7} {:<6} {:>12} {:>12} {:>9}  verdict\n",
            "figure", "kind", "better", "baseline", "now", "change"
        );
        for row in &self.rows {
            let change = row
                .change()
                .map_or_else(|| "n/a".to_owned(), |c| format!("{:+.1} %", c * 100.0));
            let kind = match row.figure.kind {
                Counted => "counted",
                Timed => "timed",
            };
            let better = match row.figure.better {
                Lower => "lower",
                Higher => "higher",
            };
            let _ = writeln!(
                out,
                "{:<36} {kind:<7} {better:<6} {:>12} {:>12} {change:>9}  {}",
                row.figure.name,
                number(row.baseline),
                number(row.now),
                row.verdict()
            );
        }
        for (names, which) in [
            (&self.only_in_baseline, "the baseline"),
            (&self.only_in_now, "the new report"),
        ] {
            if !names.is_empty() {
                let _ = writeln!(out, "only in {which}: {}", names.join(", "));
            }
        }
        out
    }

    /// What `--strict` says: `Err` naming every counted figure that grew more
    /// than 10 % over `baseline`.
    pub fn gate(&self, baseline: &Path) -> anyhow::Result<()> {
        let regressed: Vec<String> = self
            .regressions()
            .iter()
            .map(|row| {
                let change = row.change().unwrap_or(0.0) * 100.0;
                format!("{} ({:+.1} %)", row.figure.name, change)
            })
            .collect();
        anyhow::ensure!(
            regressed.is_empty(),
            "counted figures more than {:.0} % worse than {} (--strict): {}",
            MAX_COUNTED_GROWTH * 100.0,
            baseline.display(),
            regressed.join(", ")
        );
        Ok(())
    }
}

/// A `--json` report from a file, checked to be one: the baseline is read before
/// anything is run, so a wrong path fails at once rather than after the whole bench.
pub fn read_report(path: &Path) -> anyhow::Result<Value> {
    let text = std::fs::read(path).with_context(|| {
        let hint = if path == Path::new(BASELINE_PATH) {
            " (the last release's: `bench --json docs/bench-baseline.json`, release build, quiet machine)"
        } else {
            ""
        };
        format!("reading the report {}{hint}", path.display())
    })?;
    let report = serde_json::from_slice(&text)
        .with_context(|| format!("{} is not JSON (a `bench --json` report)", path.display()))?;
    figure_values(&report, &path.display().to_string())?;
    Ok(report)
}

/// Prints `now` (called `now_name`) against `baseline` (read from
/// `baseline_path`); with `strict`, fails on a counted figure grown more than 10 %.
pub fn print_comparison(
    baseline: &Value,
    baseline_path: &Path,
    (now, now_name): (&Value, &str),
    strict: bool,
) -> anyhow::Result<()> {
    let comparison = compare(baseline, now)
        .with_context(|| format!("comparing with {}", baseline_path.display()))?;
    println!("{now_name} against {}:", baseline_path.display());
    print!("{}", comparison.table());
    if strict {
        comparison.gate(baseline_path)?;
    }
    Ok(())
}

/// The end of a run: `report` printed against the baseline (with the file it was
/// read from) when `--compare` gave one; under `strict`, an error naming every
/// regressed counted figure and saying whether a performance target
/// (`report.all_pass`) was missed too.
pub fn verdict(
    report: &Value,
    baseline: Option<(&Value, &Path)>,
    strict: bool,
) -> anyhow::Result<()> {
    let missed = strict && report["all_pass"] != Value::Bool(true);
    let compared = baseline.map_or(Ok(()), |(baseline, path)| {
        print_comparison(baseline, path, (report, "this run"), strict)
    });
    match compared {
        Err(error) if missed => {
            Err(error.context("a performance target was missed too (--strict)"))
        }
        Err(error) => Err(error),
        Ok(()) => {
            anyhow::ensure!(!missed, "a performance target was missed (--strict)");
            Ok(())
        }
    }
}

/// `bench --compare BASE --against NEW`: two saved reports, nothing run.
pub fn compare_files(baseline: &Path, now: &Path, strict: bool) -> anyhow::Result<()> {
    let (before, after) = (read_report(baseline)?, read_report(now)?);
    let name = now.display().to_string();
    print_comparison(&before, baseline, (&after, &name), strict)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn report(cpu: f64, postgres: f64, tps: f64) -> Value {
        json!({
            "worker_cpu_ms_per_payment": cpu,
            "round_trips": {"postgres": postgres, "redis": 2.0, "gateway": 1.0},
            "e2e_tps_0ms": tps,
            "p99_ms_half_load": 20,
        })
    }

    fn row<'a>(comparison: &'a Comparison, name: &str) -> &'a Row {
        comparison
            .rows
            .iter()
            .find(|r| r.figure.name == name)
            .unwrap_or_else(|| panic!("{name} not compared: {comparison:?}"))
    }

    #[test]
    fn figures_are_read_from_the_top_and_from_nested_objects() {
        let comparison = compare(&report(0.3, 4.0, 1000.0), &report(0.3, 4.0, 900.0)).unwrap();
        let names: Vec<&str> = comparison.rows.iter().map(|r| r.figure.name).collect();
        assert_eq!(
            names,
            [
                "worker_cpu_ms_per_payment",
                "round_trips.postgres",
                "round_trips.redis",
                "round_trips.gateway",
                "e2e_tps_0ms",
                "p99_ms_half_load",
            ]
        );
        assert_eq!(row(&comparison, "p99_ms_half_load").now, 20.0);
    }

    #[test]
    fn only_cpu_and_round_trips_are_counted() {
        let counted: Vec<&str> = FIGURES
            .iter()
            .filter(|f| f.kind == Counted)
            .map(|f| f.name)
            .collect();
        assert_eq!(
            counted,
            [
                "worker_cpu_ms_per_payment",
                "round_trips.postgres",
                "round_trips.redis",
                "round_trips.gateway"
            ]
        );
        // Every counted figure is a cost: less is better.
        assert!(FIGURES.iter().all(|f| f.kind == Timed || f.better == Lower));
        let better = |name: &str| FIGURES.iter().find(|f| f.name == name).map(|f| f.better);
        assert_eq!(better("e2e_tps_20ms"), Some(Higher));
        assert_eq!(better("ratio_0ms"), Some(Higher));
        assert_eq!(better("e2e_tps_0ms_mixed"), Some(Higher));
        assert_eq!(better("ratio_mixed_to_charges"), Some(Higher));
        assert_eq!(better("p99_ms_half_load"), Some(Lower));
        assert_eq!(better("peak_rss_mib"), Some(Lower));
    }

    #[test]
    fn direction_decides_better_or_worse() {
        let comparison = compare(&report(0.3, 4.0, 1000.0), &report(0.27, 4.0, 900.0)).unwrap();
        let cpu = row(&comparison, "worker_cpu_ms_per_payment");
        assert!((cpu.change().unwrap() + 0.1).abs() < 1e-9);
        assert_eq!(cpu.verdict(), "better", "less CPU is better");
        let tps = row(&comparison, "e2e_tps_0ms");
        assert_eq!(tps.verdict(), "worse", "less throughput is worse");
        assert!(!tps.regressed(), "timed figures never gate");
        let comparison = compare(&report(0.3, 4.0, 1000.0), &report(0.3, 4.0, 1100.0)).unwrap();
        assert_eq!(row(&comparison, "e2e_tps_0ms").verdict(), "better");
        assert_eq!(row(&comparison, "round_trips.redis").verdict(), "same");
    }

    #[test]
    fn a_counted_figure_fails_past_ten_percent_not_at_it() {
        let base = report(0.3, 4.0, 1000.0);
        let at_limit = compare(&base, &report(0.33, 4.4, 100.0)).unwrap();
        assert!(at_limit.regressions().is_empty(), "{}", at_limit.table());
        assert!(at_limit.gate(Path::new("base.json")).is_ok());
        let past = compare(&base, &report(0.331, 5.0, 1000.0)).unwrap();
        let names: Vec<&str> = past.regressions().iter().map(|r| r.figure.name).collect();
        assert_eq!(names, ["worker_cpu_ms_per_payment", "round_trips.postgres"]);
        let error = past.gate(Path::new("base.json")).unwrap_err().to_string();
        assert!(
            error.contains("worker_cpu_ms_per_payment (+10.3 %)")
                && error.contains("round_trips.postgres (+25.0 %)")
                && error.contains("base.json"),
            "{error}"
        );
        assert!(past.table().contains("REGRESSED"), "{}", past.table());
    }

    #[test]
    fn missing_figures_are_listed_not_fatal() {
        let mut base = report(0.3, 4.0, 1000.0);
        base["stripe_tps"] = json!(120.0);
        let mut now = report(0.3, 4.0, 1000.0);
        now["round_trips"] = Value::Null;
        now["eos_tps_0ms"] = json!(900.0);
        let comparison = compare(&base, &now).unwrap();
        assert_eq!(
            comparison.only_in_baseline,
            [
                "round_trips.postgres",
                "round_trips.redis",
                "round_trips.gateway",
                "stripe_tps"
            ]
        );
        assert_eq!(comparison.only_in_now, ["eos_tps_0ms"]);
        let table = comparison.table();
        assert!(
            table.contains("only in the baseline: round_trips.postgres")
                && table.contains("only in the new report: eos_tps_0ms"),
            "{table}"
        );
    }

    #[test]
    fn a_zero_baseline_has_no_percentage_and_never_gates() {
        let comparison = compare(&report(0.0, 4.0, 0.0), &report(0.5, 4.0, 0.0)).unwrap();
        let cpu = row(&comparison, "worker_cpu_ms_per_payment");
        assert_eq!((cpu.change(), cpu.regressed()), (None, false));
        assert_eq!(row(&comparison, "e2e_tps_0ms").change(), Some(0.0));
        assert!(comparison.table().contains("n/a"));
    }

    #[test]
    fn a_malformed_report_is_a_clear_error() {
        let good = report(0.3, 4.0, 1000.0);
        let not_object = compare(&json!([1, 2]), &good).unwrap_err().to_string();
        assert!(not_object.contains("the baseline report is not a JSON object"));
        let foreign = compare(&good, &json!({"name": "x"}))
            .unwrap_err()
            .to_string();
        assert!(foreign.contains("the new report holds none of the bench's figures"));
        let mut wrong = good.clone();
        wrong["round_trips"]["redis"] = json!("two");
        let error = compare(&good, &wrong).unwrap_err().to_string();
        assert!(
            error.contains("`round_trips.redis` is not a number"),
            "{error}"
        );
    }

    #[test]
    fn a_run_names_regressions_and_missed_targets_together() {
        let mut now = report(0.3, 5.0, 1000.0);
        now["all_pass"] = json!(false);
        let base = report(0.3, 4.0, 1000.0);
        let path = Path::new("base.json");
        let error = verdict(&now, Some((&base, path)), true).unwrap_err();
        let error = format!("{error:#}");
        assert!(
            error.contains("target was missed too") && error.contains("round_trips.postgres"),
            "{error}"
        );
        assert!(
            verdict(&now, Some((&base, path)), false).is_ok(),
            "not strict"
        );
        let error = verdict(&now, None, true).unwrap_err().to_string();
        assert_eq!(error, "a performance target was missed (--strict)");
        now["all_pass"] = json!(true);
        now["round_trips"]["postgres"] = json!(4.0);
        assert!(verdict(&now, Some((&base, path)), true).is_ok());
    }

    #[test]
    fn numbers_print_without_trailing_zeros() {
        assert_eq!(number(4.0), "4");
        assert_eq!(number(0.3), "0.3");
        assert_eq!(number(1234.5678), "1234.568");
        assert_eq!(number(-0.0001), "0");
    }
}
