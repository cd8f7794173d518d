//! `bench --compare BASE --against NEW`, as CI runs it on two saved reports: the
//! binary prints every figure's change and, with `--strict`, fails when a counted
//! figure (CPU, round trips per payment) grew more than 10 %, and only then. Nothing
//! is measured, so no service is needed.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::json;

/// A report with the figures `bench --json` writes at the top (a few of them).
fn report(cpu: f64, postgres: f64, tps: f64) -> serde_json::Value {
    json!({
        "run_id": "test",
        "worker_cpu_ms_per_payment": cpu,
        "round_trips": {"postgres": postgres, "redis": 2.0, "gateway": 1.0},
        "e2e_tps_0ms": tps,
        "p99_ms_half_load": 24,
        "stripe_skipped": null,
    })
}

/// Writes `content` to a file of its own in the temporary directory.
fn file(name: &str, content: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "bench-compare-{}-{name}.json",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(&path, content).unwrap();
    path
}

fn compare(baseline: &serde_json::Value, now: &str, strict: bool) -> (Output, String, String) {
    let base = file("base", &baseline.to_string());
    let new = file("new", now);
    let mut command = Command::new(env!("CARGO_BIN_EXE_payment-worker-devtools"));
    command
        .args(["bench", "--compare"])
        .arg(&base)
        .arg("--against")
        .arg(&new);
    if strict {
        command.arg("--strict");
    }
    let output = command.env("RUST_LOG", "error").output().unwrap();
    let _ = std::fs::remove_file(base);
    let _ = std::fs::remove_file(new);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output, stdout, stderr)
}

#[test]
fn strict_passes_when_counted_figures_hold_however_the_timed_ones_move() {
    // Throughput halved, CPU 10 % up (the limit), round trips the same.
    let now = report(0.33, 4.0, 500.0).to_string();
    let (output, stdout, stderr) = compare(&report(0.3, 4.0, 1000.0), &now, true);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let cpu = stdout
        .lines()
        .find(|l| l.starts_with("worker_cpu_ms_per_payment"))
        .unwrap_or_else(|| panic!("no CPU row: {stdout}"));
    for said in ["counted", "lower", "0.3", "0.33", "+10.0 %", "worse"] {
        assert!(cpu.contains(said), "{said:?} not in {cpu:?}");
    }
    let tps = stdout
        .lines()
        .find(|l| l.starts_with("e2e_tps_0ms"))
        .unwrap_or_else(|| panic!("no throughput row: {stdout}"));
    for said in ["timed", "higher", "1000", "500", "-50.0 %", "worse"] {
        assert!(tps.contains(said), "{said:?} not in {tps:?}");
    }
    assert!(!stdout.contains("REGRESSED"), "{stdout}");
}

#[test]
fn strict_fails_naming_the_counted_figures_that_grew() {
    let now = report(0.3, 5.0, 2000.0).to_string();
    let (output, stdout, stderr) = compare(&report(0.3, 4.0, 1000.0), &now, true);
    assert_eq!(output.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("round_trips.postgres") && l.contains("REGRESSED")),
        "{stdout}"
    );
    assert!(
        stderr.contains("round_trips.postgres (+25.0 %)") && stderr.contains("--strict"),
        "{stderr}"
    );
    assert!(!stderr.contains("worker_cpu_ms_per_payment"), "{stderr}");

    // Without --strict the same comparison is only shown.
    let (output, stdout, stderr) = compare(&report(0.3, 4.0, 1000.0), &now, false);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("REGRESSED"), "{stdout}");
}

#[test]
fn a_missing_figure_is_listed_and_a_malformed_file_refused() {
    let mut now = report(0.3, 4.0, 1000.0);
    now["round_trips"] = serde_json::Value::Null;
    let (output, stdout, stderr) = compare(&report(0.3, 4.0, 1000.0), &now.to_string(), true);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("only in the baseline: round_trips.postgres, round_trips.redis"),
        "{stdout}"
    );

    let (output, stdout, stderr) = compare(&report(0.3, 4.0, 1000.0), "{\"truncated\": ", true);
    assert_eq!(output.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stderr.contains("is not JSON"), "{stderr}");
    let (output, _, stderr) = compare(&report(0.3, 4.0, 1000.0), "{\"name\": 1}", false);
    assert!(!output.status.success());
    assert!(
        stderr.contains("holds none of the bench's figures"),
        "{stderr}"
    );
}

#[test]
fn against_needs_a_baseline() {
    let output = Command::new(env!("CARGO_BIN_EXE_payment-worker-devtools"))
        .args(["bench", "--against", "new.json"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "a usage error");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--compare"), "{stderr}");
}
