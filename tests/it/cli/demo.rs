//! The README's first command: `demo` runs the whole product and audits the books.

use crate::support::helpers::{ensure_services, unique, PG_ADDR};

/// `demo <args>` on a database of its own; its stdout and stderr once it succeeded.
async fn demo(args: &[&str]) -> (String, String) {
    ensure_services();
    let database = format!("postgres://postgres@{PG_ADDR}/{}", unique("pw_demo"));
    let output = tokio::process::Command::new(crate::support::procs::devtools_binary())
        .arg("demo")
        .args(args)
        .args(["--database-url", &database])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "demo failed:\n{stdout}\n{stderr}");
    (stdout, stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_charges_once_replays_without_charging_and_audits_clean() {
    let (stdout, stderr) = demo(&["--count", "400"]).await;
    assert!(
        stdout.contains("ledger audit: OK (0 double charges)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("new charges during replay:    0"),
        "{stdout}"
    );
    assert!(stdout.contains("pass 2 (replay): 400 results"), "{stdout}");
    // Output captured by a pipe is plain lines: no redraws, no colours; each pass
    // ends with one line saying it is done.
    for text in [&stdout, &stderr] {
        assert!(
            !text.contains('\r') && !text.contains('\u{1b}'),
            "terminal control characters in piped output: {text:?}"
        );
    }
    for pass in ["pass 1", "pass 2"] {
        assert!(
            stderr.contains(&format!("  {pass}: 400/400 results in ")),
            "{stderr}"
        );
    }
}

/// In exactly-once mode the demo says which mode ran and what a `read_committed`
/// reader counted: one result per command in each pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exactly_once_demo_reports_one_result_per_command() {
    let (stdout, _) = demo(&["--count", "200", "--results", "exactly-once"]).await;
    assert!(stdout.contains("  results:  exactly-once"), "{stdout}");
    assert!(
        stdout.contains("results per command (read_committed): pass 1 exactly 1, pass 2 exactly 1"),
        "{stdout}"
    );
    assert!(
        stdout.contains("ledger audit: OK (0 double charges)"),
        "{stdout}"
    );
}
