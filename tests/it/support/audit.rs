//! `payment-worker audit` as a process: run it, read its verdict.

use std::collections::HashMap;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use super::helpers::{Stack, REDIS_URL};
use super::procs;

/// How long an `audit` run may take before the test fails.
const AUDIT_WITHIN: Duration = Duration::from_secs(120);

/// What one `payment-worker audit` run ended with.
#[derive(Debug)]
pub(crate) struct AuditVerdict {
    pub(crate) status: ExitStatus,
    /// The report: the table (its last line `result: …`), or the JSON with `--json`.
    pub(crate) stdout: String,
    /// The log, and the reason of a failing exit.
    pub(crate) stderr: String,
}

impl std::fmt::Display for AuditVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "audit {}\n--- stdout\n{}\n--- stderr\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

impl AuditVerdict {
    /// The exit code (-1 when a signal ended it).
    pub(crate) fn code(&self) -> i32 {
        self.status.code().unwrap_or(-1)
    }

    /// The report's lines (stdout).
    pub(crate) fn lines(&self) -> Vec<&str> {
        self.stdout.lines().collect()
    }

    /// Stdout then stderr, for a `contains` over everything it said.
    pub(crate) fn text(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }

    /// The `--json` report; fails the test with the whole output if stdout is not JSON.
    #[track_caller]
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("audit --json printed no JSON ({e}):\n{self}"))
    }

    /// Exit 0, whatever the report says.
    #[track_caller]
    pub(crate) fn assert_success(&self) {
        assert!(self.status.success(), "audit failed:\n{self}");
    }

    /// Exit 0 and a table ending `result: CLEAN` (warnings allowed).
    #[track_caller]
    pub(crate) fn assert_clean(&self) {
        self.assert_success();
        assert!(
            self.lines().iter().any(|l| l.starts_with("result: CLEAN")),
            "audit not clean:\n{self}"
        );
    }

    /// Exit 0 and `result: CLEAN` without warnings.
    #[track_caller]
    pub(crate) fn assert_clean_without_warnings(&self) {
        self.assert_success();
        assert!(
            self.lines()
                .iter()
                .any(|l| l.starts_with("result: CLEAN") && !l.contains("warning")),
            "audit clean, without warnings:\n{self}"
        );
    }
}

/// Runs `payment-worker audit <args>` (the build under test, see `procs::binary`)
/// with exactly `env` and waits for its end (at most two minutes).
pub(crate) async fn run_audit<S: AsRef<str>>(
    args: &[S],
    env: &HashMap<String, String>,
) -> AuditVerdict {
    let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
    let mut argv = vec!["audit"];
    argv.extend_from_slice(&args);
    let mut command = tokio::process::Command::from(procs::binary(&argv, env));
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let output = tokio::time::timeout(AUDIT_WITHIN, command.output())
        .await
        .unwrap_or_else(|_| panic!("audit {args:?} still running after {AUDIT_WITHIN:?}"))
        .expect("audit runs");
    AuditVerdict {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// The flags that point `audit` at a [`Stack`]'s stores and gateway (flags only, so
/// no ambient environment variable can point it elsewhere), with `lease`, then
/// `extra`.
pub(crate) fn stack_audit_args(stack: &Stack, lease: &str, extra: &[&str]) -> Vec<String> {
    let gateway_url = stack.simulator.url();
    let mut args: Vec<String> = [
        "--database-url",
        &stack.db.url,
        "--redis-url",
        REDIS_URL,
        "--redis-key-prefix",
        &stack.redis.prefix,
        "--gateway-url",
        &gateway_url,
        "--lease",
        lease,
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

/// An environment for `audit` that logs only warnings.
pub(crate) fn quiet_env() -> HashMap<String, String> {
    HashMap::from([("RUST_LOG".to_owned(), "warn".to_owned())])
}
