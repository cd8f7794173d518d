//! One end-to-end phase as the runner shows it: a progress bar while it runs, one
//! line of figures when it ends, its audit added to the run's.

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};

use super::audit::AuditReport;
use super::e2e::{Bed, Load, PhaseOutcome, WorkerKind};
use super::report::PhaseReport;

pub(super) fn bar(name: &str) -> ProgressBar {
    let style = ProgressStyle::with_template(
        "{prefix:<16} {bar:32.cyan/blue} {pos:>7}/{len:<7} {per_sec:>11} {elapsed:>4} {msg}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    ProgressBar::new(0)
        .with_style(style.progress_chars("=> "))
        .with_prefix(name.to_owned())
}

fn phase_line(report: &PhaseReport) {
    eprintln!(
        "{:<16} {:>9.0} payments/s ({} of {} answered, p50/p95/p99 {}/{}/{} ms{})",
        report.name,
        report.payments_per_s,
        report.answered,
        report.commands,
        report.latency.p50_ms,
        report.latency.p95_ms,
        report.latency.p99_ms,
        report
            .worker_peak_rss_mib
            .map_or(String::new(), |m| format!(", worker peak RSS {m:.1} MiB")),
    );
}

pub(super) async fn phase(
    bed: &Bed,
    name: &str,
    latency_ms: u64,
    load: Load,
    kind: WorkerKind,
    audit: &mut AuditReport,
) -> anyhow::Result<PhaseReport> {
    let progress = bar(name);
    let PhaseOutcome {
        report,
        audit: phase_audit,
    } = bed
        .run_phase(name, latency_ms, load, kind, &progress)
        .await
        .with_context(|| format!("phase {name}"))?;
    progress.finish_and_clear();
    phase_line(&report);
    if !phase_audit.ok {
        eprintln!("{name:<16} AUDIT VIOLATED: {phase_audit:?}");
    }
    audit.add(&phase_audit);
    Ok(report)
}
