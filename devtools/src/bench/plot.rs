//! `bench --plot FILE.svg`: throughput per phase against the Postgres ceiling and
//! the one-record-at-a-time baseline, and the latency percentiles per phase, drawn
//! as a plain SVG (no plotting dependency).

use std::fmt::Write;

use super::report::BenchReport;

const WIDTH: f64 = 900.0;
const ROW: f64 = 26.0;
const LABEL: f64 = 190.0;
const BAR: f64 = WIDTH - LABEL - 120.0;

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The picture of `report`, as SVG text.
pub fn svg(report: &BenchReport) -> String {
    let phases = &report.phases;
    let top = phases
        .iter()
        .map(|p| p.payments_per_s)
        .chain([report.ceiling_tps])
        .fold(1.0_f64, f64::max);
    let slowest = phases
        .iter()
        .map(|p| p.latency.p99_ms as f64)
        .fold(1.0_f64, f64::max);
    let throughput_h = 60.0 + ROW * phases.len() as f64;
    let latency_h = 60.0 + ROW * 1.5 * phases.len() as f64;
    let curve = report
        .backlog
        .as_ref()
        .map(|b| b.read_to_answer_curve.as_slice())
        .unwrap_or_default();
    let backlog_h = if curve.is_empty() {
        0.0
    } else {
        50.0 + 16.0 * curve.len() as f64
    };
    let height = throughput_h + latency_h + backlog_h + 40.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="10" y="20" font-size="15" font-weight="bold">payment-worker bench {} (run {}): payments/s per phase</text>"#,
        escape(&report.version),
        escape(&report.run_id)
    );
    let x = |value: f64| LABEL + BAR * value / top;
    for (n, phase) in phases.iter().enumerate() {
        let y = 40.0 + ROW * n as f64;
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text><rect x="{LABEL}" y="{y}" width="{:.1}" height="{}" fill="{}"/><text x="{:.1}" y="{}">{:.0}/s</text>"#,
            LABEL - 6.0,
            y + 14.0,
            escape(&phase.name),
            x(phase.payments_per_s) - LABEL,
            ROW - 8.0,
            if phase.name.starts_with("baseline") {
                "#b0b0b0"
            } else {
                "#4c78a8"
            },
            x(phase.payments_per_s) + 4.0,
            y + 14.0,
            phase.payments_per_s
        );
    }
    let rules = [
        ("Postgres ceiling", report.ceiling_tps, "#e45756"),
        (
            "1,000/s target at 20 ms",
            super::report::TARGET_TPS_20MS,
            "#54a24b",
        ),
    ];
    for (name, value, colour) in rules {
        if value > 0.0 {
            let _ = writeln!(
                out,
                r##"<line x1="{0:.1}" x2="{0:.1}" y1="32" y2="{1}" stroke="{2}" stroke-dasharray="4 3"/><text x="{0:.1}" y="{3}" fill="{2}" text-anchor="middle">{4} {5:.0}/s</text>"##,
                x(value),
                throughput_h - 10.0,
                colour,
                throughput_h + 2.0,
                name,
                value
            );
        }
    }
    let base = throughput_h + 30.0;
    let _ = writeln!(
        out,
        r#"<text x="10" y="{base}" font-size="15" font-weight="bold">latency produce → result per phase (ms): p50, p95, p99</text>"#
    );
    let lx = |ms: f64| BAR * ms / slowest;
    for (n, phase) in phases.iter().enumerate() {
        let y = base + 20.0 + ROW * 1.5 * n as f64;
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            LABEL - 6.0,
            y + 18.0,
            escape(&phase.name)
        );
        let latency = &phase.latency;
        for (k, (label, ms, colour)) in [
            ("p50", latency.p50_ms, "#72b7b2"),
            ("p95", latency.p95_ms, "#f58518"),
            ("p99", latency.p99_ms, "#e45756"),
        ]
        .into_iter()
        .enumerate()
        {
            let yy = y + 11.0 * k as f64;
            let _ = writeln!(
                out,
                r#"<rect x="{LABEL}" y="{yy}" width="{:.1}" height="9" fill="{colour}"/><text x="{:.1}" y="{}" font-size="10">{label} {ms}</text>"#,
                lx(ms as f64).max(1.0),
                LABEL + lx(ms as f64).max(1.0) + 4.0,
                yy + 8.0
            );
        }
    }
    if !curve.is_empty() {
        backlog_distribution(&mut out, curve, throughput_h + latency_h + 30.0);
    }
    let _ = writeln!(out, "</svg>");
    out
}

/// The backlog phase's waits from read to answer, one bar per percentile up to the
/// maximum, so the stragglers show.
fn backlog_distribution(out: &mut String, curve: &[(f64, i64)], base: f64) {
    let longest = curve
        .iter()
        .map(|&(_, ms)| ms as f64)
        .fold(1.0_f64, f64::max);
    let _ = writeln!(
        out,
        r#"<text x="10" y="{base}" font-size="15" font-weight="bold">backlog-20ms: wait from read to answer by percentile, up to the maximum (ms)</text>"#
    );
    for (n, &(p, ms)) in curve.iter().enumerate() {
        let y = base + 14.0 + 16.0 * n as f64;
        let label = if p >= 100.0 {
            "max".to_owned()
        } else {
            format!("p{p}")
        };
        let width = (BAR * ms as f64 / longest).max(1.0);
        let _ = writeln!(
            out,
            r##"<text x="{}" y="{}" text-anchor="end">{label}</text><rect x="{LABEL}" y="{y}" width="{width:.1}" height="12" fill="#9d755d"/><text x="{:.1}" y="{}" font-size="10">{ms}</text>"##,
            LABEL - 6.0,
            y + 10.0,
            LABEL + width + 4.0,
            y + 10.0
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::report::PhaseReport;

    #[test]
    fn every_phase_has_a_bar_and_its_percentiles_and_the_ceiling_a_rule() {
        let mut report = BenchReport {
            run_id: "r1".into(),
            ceiling_tps: 2000.0,
            ..BenchReport::default()
        };
        for (name, tps) in [("e2e-0ms", 1500.0), ("baseline-20ms", 140.0)] {
            let mut phase = PhaseReport {
                name: name.into(),
                payments_per_s: tps,
                ..PhaseReport::default()
            };
            phase.latency.p99_ms = 42;
            report.phases.push(phase);
        }
        let picture = svg(&report);
        assert!(picture.starts_with("<svg") && picture.trim_end().ends_with("</svg>"));
        assert!(picture.contains(">e2e-0ms<") && picture.contains(">baseline-20ms<"));
        assert!(picture.contains("1500/s") && picture.contains("Postgres ceiling 2000/s"));
        assert!(picture.contains("p99 42"));
        assert!(
            !picture.contains("backlog-20ms: wait"),
            "no backlog phase, no panel"
        );
        report.backlog = Some(crate::bench::report::BacklogReport {
            read_to_answer_curve: vec![(50.0, 30), (99.9, 400), (100.0, 1234)],
            ..Default::default()
        });
        let picture = svg(&report);
        assert!(picture.contains("backlog-20ms: wait from read to answer"));
        assert!(
            picture.contains(">p99.9<") && picture.contains(">max<") && picture.contains(">1234<")
        );
    }
}
