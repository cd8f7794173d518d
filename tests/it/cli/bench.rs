//! `payment-worker-devtools bench` on small counts, as a black box: it exits 0, writes the
//! JSON report with every headline figure, every phase answered every command with a
//! payment, the ledger audit found one charge per key and ledger = rows, and the run
//! left no rows or tokens behind. No figure is compared with a target: timing is not
//! a test.

use std::process::Command;

use crate::support::books::scan;
use crate::support::helpers::{unique, TestDb, TestRedis, REDIS_URL};

#[tokio::test(flavor = "multi_thread")]
async fn a_small_bench_run_reports_every_figure_and_audits_clean() {
    let db = TestDb::new().await;
    let mut redis = TestRedis::new().await;
    let json = std::env::temp_dir().join(format!("{}.json", unique("bench")));
    let url = db.url.clone();
    let path = json.clone();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(crate::support::procs::devtools_binary())
            .args([
                "bench",
                "--quick",
                "--ceiling-transactions",
                "200",
                "--e2e-commands",
                "300",
            ])
            .args([
                "--backlog",
                "400",
                "--half-load-seconds",
                "1",
                "--half-load-rate",
                "100",
            ])
            // Small pools: other tests share the server's connection slots.
            .args(["--database-max-connections", "8", "--max-in-flight", "8"])
            .args(["--database-url", &url, "--redis-url", REDIS_URL])
            .arg("--json")
            .arg(&path)
            .env("RUST_LOG", "warn")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "bench failed: {stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("ledger audit"),
        "no table on stdout: {stdout}"
    );

    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    for key in [
        "ceiling_tps",
        "token_round_trips_per_s",
        "e2e_tps_0ms",
        "ratio_0ms",
        "e2e_tps_0ms_mixed",
        "refund_share",
        "ratio_mixed_to_charges",
        "e2e_tps_20ms",
        "p99_ms_half_load",
        "peak_rss_mib",
        "e2e_tps_0ms_postgres_tokens",
        "ratio_postgres_tokens_to_redis",
        "e2e_tps_0ms_postgres_tokens_purging",
        "ratio_purging_to_postgres_tokens",
        "worker_cpu_ms_per_payment",
        "baseline_tps_20ms",
        "baseline_multiple_20ms",
        "eos_tps_0ms",
        "eos_ratio_0ms",
        "eos_tps_20ms",
        "eos_ratio_20ms",
        "stripe_tps",
        "ratio_stripe_to_charges",
        "p999_ms_half_load",
        "backlog_makespan_s",
        "backlog_bound_s",
        "backlog_makespan_over_bound",
        "backlog_max_latency_ms",
    ] {
        assert!(
            report[key].as_f64().is_some_and(|v| v > 0.0),
            "{key}: {}",
            report[key]
        );
    }
    for key in [
        "pass_ratio_0ms",
        "pass_tps_20ms",
        "pass_p99_half_load",
        "pass_peak_rss",
        "pass_ratio_postgres_tokens",
        "pass_ratio_purging",
        "pass_worker_cpu",
        "pass_round_trips",
        "pass_baseline_multiple",
        "pass_eos_ratio",
        "pass_p999_half_load",
        "pass_backlog_makespan",
        "pass_backlog_max_latency",
        "pass_duplicate_wake",
        "audit_ok",
    ] {
        assert!(report[key].is_boolean(), "{key}: {}", report[key]);
    }
    // No duplicate of a small run may wait on another attempt's lease: a number, not
    // necessarily above zero.
    assert!(
        report["duplicate_wake_ms_p99"].is_number(),
        "duplicate_wake_ms_p99: {}",
        report["duplicate_wake_ms_p99"]
    );
    // Counted, not timed: a fresh payment's round trips are the same on any machine.
    assert_eq!(
        report["round_trips"],
        serde_json::json!({"postgres": 4.0, "redis": 2.0, "gateway": 1.0})
    );
    assert_eq!(report["ceiling"]["failures"], 0);
    assert_eq!(report["tokens"]["failures"], 0);

    let phases = report["phases"].as_array().unwrap();
    let names: Vec<&str> = phases.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "e2e-0ms",
            "e2e-0ms-mixed",
            "e2e-0ms-pgtokens",
            "e2e-0ms-pgtokens-purging",
            "e2e-20ms",
            "backlog-20ms",
            "eos-0ms",
            "eos-20ms",
            "baseline-20ms",
            "stripe-localstripe",
            "half-load",
            "worker-process"
        ]
    );
    // The purge ran under the purging phase: it deleted dead rows, all it was given
    // or as many as it could until the phase ended (what it left is deleted with the
    // run's rows, checked below).
    let purge = &report["purge"];
    let expired = purge["expired_rows"].as_u64().unwrap();
    let purged = purge["purged_rows"].as_u64().unwrap();
    assert!(
        expired >= 10_000 && purged > 0 && purged <= expired,
        "{purge}"
    );
    assert!(
        purged == expired
            || purge["purge_s"].as_f64().unwrap() >= purge["phase_s"].as_f64().unwrap(),
        "{purge}"
    );
    let mut commands = 0;
    // Keys: what is charged once each (a duplicate is charged with its original).
    let mut keys = 0;
    let mut refunded = 0;
    for phase in phases {
        let sent = phase["commands"].as_u64().unwrap();
        assert!(sent > 0);
        assert_eq!(phase["answered"], sent, "{phase}");
        if phase["name"] == "e2e-0ms-mixed" {
            let (charged, refunds) = mixed_outcomes(phase);
            commands += sent;
            keys += charged;
            refunded += refunds;
            continue;
        }
        // The backlog phase repeats a quarter of its keys: each repeat is answered
        // as the duplicate of the original's success.
        let duplicates = if phase["name"] == "backlog-20ms" {
            let duplicates = phase["backlog"]["duplicates"].as_u64().unwrap();
            assert!(duplicates > 0, "{phase}");
            assert_eq!(
                phase["outcomes"],
                serde_json::json!({ "succeeded": sent - duplicates, "duplicate": duplicates }),
                "{phase}"
            );
            duplicates
        } else {
            assert_eq!(
                phase["outcomes"],
                serde_json::json!({ "succeeded": sent }),
                "{phase}"
            );
            0
        };
        commands += sent;
        keys += sent - duplicates;
    }
    let worker_process = phases
        .iter()
        .find(|p| p["name"] == "worker-process")
        .unwrap();
    assert!(worker_process["worker_peak_rss_mib"]
        .as_f64()
        .is_some_and(|m| m > 0.0));

    let audit = &report["audit"];
    assert_eq!(audit["ok"], true, "{audit}");
    assert_eq!(report["audit_ok"], true);
    assert_eq!(audit["commands"], commands);
    assert_eq!(audit["unanswered"], 0);
    assert_eq!(audit["double_charged_keys"], 0);
    assert_eq!(audit["charges"], keys, "one charge per key");
    assert_eq!(audit["rows"], keys, "one row per charge");
    // The gateway made every refund the results say was made, and no other;
    // none past its charge, none refused.
    assert_eq!(audit["refunds"], refunded, "{audit}");
    assert_eq!(audit["refunds_expected"], refunded, "{audit}");
    assert_eq!(audit["over_refunded"], 0);
    assert_eq!(audit["refund_refusals"], 0);

    // Cleaned up: no payment rows (ceiling and phases) and no tokens of the run.
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM payments")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(rows, 0, "the run's rows were not deleted");
    let pg_tokens: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotency_tokens")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(pg_tokens, 0, "the run's Postgres tokens were not deleted");
    let refund_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM refunds")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(refund_rows, 0, "the run's refund rows were not deleted");
    let prefix = report["settings"]["redis_prefix"]
        .as_str()
        .unwrap()
        .to_owned();
    let keys = scan(&mut redis.conn, &format!("{prefix}:*")).await;
    assert!(keys.is_empty(), "{} tokens left behind", keys.len());
}

/// The mixed phase's outcomes: charges succeeded, refunds refunded, repeats of a
/// refund answered as duplicates, the second of a pair that exceeds its charge
/// rejected; nothing else. Returns (charges, refunds made).
fn mixed_outcomes(phase: &serde_json::Value) -> (u64, u64) {
    let outcomes = phase["outcomes"].as_object().unwrap();
    let count = |outcome: &str| outcomes.get(outcome).and_then(|n| n.as_u64()).unwrap_or(0);
    for outcome in outcomes.keys() {
        assert!(
            ["succeeded", "refunded", "duplicate", "rejected"].contains(&outcome.as_str()),
            "{phase}"
        );
    }
    let (charged, refunded) = (count("succeeded"), count("refunded"));
    assert!(charged > 0 && refunded > 0, "{phase}");
    assert!(count("rejected") <= refunded, "{phase}");
    assert_eq!(
        outcomes.values().filter_map(|n| n.as_u64()).sum::<u64>(),
        phase["commands"].as_u64().unwrap(),
        "{phase}"
    );
    (charged, refunded)
}
