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
    let (stdout, stderr) = demo(&["--count", "400", "--refund-share", "0.3"]).await;
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
    the_refunds_add_up(&stdout);
}

/// The number just before `word` on the line that starts with `start`.
fn number_before(stdout: &str, start: &str, word: &str) -> i64 {
    let line = stdout
        .lines()
        .find(|line| line.trim_start().starts_with(start))
        .unwrap_or_else(|| panic!("no line {start:?}: {stdout}"));
    let before = line
        .split(word)
        .next()
        .filter(|before| before.len() < line.len())
        .unwrap_or_else(|| panic!("no {word:?} in {line:?}"));
    let digits: String = before
        .trim_end()
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.chars().rev().collect::<String>().parse().unwrap()
}

/// The refund part of the report: the refunds the results topic answered
/// `refunded` are the refunds the gateway made, every `refunded` of the pass was a
/// refund's, the over-refunds were refused by the worker, not the gateway.
fn the_refunds_add_up(stdout: &str) {
    let refunded = number_before(stdout, "refunds (results topic", " refunded");
    let exceeding = number_before(stdout, "refunds (results topic", " refused (exceeds)");
    let repeated = number_before(stdout, "refunds (results topic", " duplicates");
    let made = number_before(stdout, "refund audit: ", " refunds made at the gateway");
    let refunded_minor = number_before(stdout, "refund audit: ", " minor units refunded");
    let charged_minor = number_before(stdout, "refund audit: ", " charged");
    // The tally of every outcome of pass 1: each `refunded` was a refund's.
    let pass1 = stdout
        .lines()
        .find(|line| line.starts_with("pass 1: ") && line.contains(" results in "))
        .unwrap_or_default();
    assert!(
        pass1.contains(&format!("\"refunded\": {refunded},")),
        "pass 1 counts {refunded} refunded: {stdout}"
    );
    assert!(refunded > 0 && exceeding > 0 && repeated > 0, "{stdout}");
    assert_eq!(
        made, refunded,
        "the gateway made each refund once: {stdout}"
    );
    assert!(
        0 < refunded_minor && refunded_minor < charged_minor,
        "{stdout}"
    );
    for line in [
        "payments refunded past their amount: 0",
        "refunds the gateway refused:         0",
        "new refunds during replay:           0",
        "refund audit: OK",
    ] {
        assert!(stdout.contains(line), "{line}: {stdout}");
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
