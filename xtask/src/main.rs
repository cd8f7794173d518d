//! The repository's own tasks, run as `cargo xtask <task>` (an alias in
//! `.cargo/config.toml`): cargo is all they need.
//!
//! - `cargo xtask test [ARGS…]`: every test of the workspace, under cargo-nextest (a
//!   process per test, deadlines, the test groups of `.config/nextest.toml` that keep
//!   the heavy tests apart). A machine without cargo-nextest gets the pinned version
//!   installed into `target/tools/` (once, from crates.io, about three minutes), not
//!   into the user's `~/.cargo/bin`. ARGS go to `cargo nextest run --workspace`.

use std::env;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

mod package_variables;

/// The cargo-nextest the suite is run with where none is installed.
const NEXTEST_VERSION: &str = "0.9.143";

fn main() -> ExitCode {
    let mut args = env::args_os().skip(1);
    match args
        .next()
        .and_then(|task| task.into_string().ok())
        .as_deref()
    {
        Some("test") => test(args.collect()),
        Some("-h" | "--help") | None => {
            println!("usage: cargo xtask test [ARGS…]   every test (cargo nextest run --workspace ARGS…)");
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("xtask: unknown task `{other}` (tasks: test)");
            ExitCode::from(2)
        }
    }
}

fn cargo() -> OsString {
    env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// The workspace's root: this crate's parent directory.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn test(args: Vec<OsString>) -> ExitCode {
    let root = root();
    let Some(nextest) = nextest(&root) else {
        return ExitCode::FAILURE;
    };
    let mut command = Command::new(nextest);
    command
        .args(["nextest", "run", "--workspace"])
        .args(args)
        .current_dir(&root);
    without_cargo_run_variables(&mut command);
    exit_code_of(command, "cargo nextest run")
}

/// `cargo run` gives this process its own package's variables (`CARGO_MANIFEST_DIR`
/// is `xtask/`, `CARGO_PKG_NAME` is `xtask`, …). Passed on, they would reach the
/// build that nextest starts, where build scripts that watch them (ring's watches
/// `CARGO_MANIFEST_DIR`) would see them change between `cargo xtask test` and a plain
/// `cargo nextest run` or `cargo test`, and rebuild: ring, rustls, sqlx, tonic and
/// everything above them, each time one follows the other. Cargo sets the right
/// values for every crate it builds; none of these is this task's to pass on.
fn without_cargo_run_variables(command: &mut Command) {
    for (name, _) in env::vars_os() {
        let name = name.to_string_lossy();
        if package_variables::set_for_one_package(&name) {
            command.env_remove(name.as_ref());
        }
    }
}

/// A cargo-nextest to run: the one on the PATH (as `cargo nextest`), else the
/// pinned one in `target/tools/`, installed there first when missing.
fn nextest(root: &Path) -> Option<PathBuf> {
    let installed = Command::new(cargo())
        .args(["nextest", "--version"])
        .output()
        .is_ok_and(|output| output.status.success());
    if installed {
        return Some(PathBuf::from("cargo-nextest"));
    }
    let tools = env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
        .join("tools");
    let binary = tools.join("bin").join("cargo-nextest");
    if binary.exists() {
        return Some(binary);
    }
    eprintln!(
        "xtask: installing cargo-nextest {NEXTEST_VERSION} into {} (once)",
        tools.display()
    );
    let mut install = Command::new(cargo());
    install
        .args([
            "install",
            "--locked",
            "cargo-nextest",
            "--version",
            NEXTEST_VERSION,
            "--root",
        ])
        .arg(&tools);
    without_cargo_run_variables(&mut install);
    (exit_code_of(install, "cargo install cargo-nextest") == ExitCode::SUCCESS).then_some(binary)
}

/// Runs `command` to its end; its exit status, or a failure said out loud.
fn exit_code_of(mut command: Command, what: &str) -> ExitCode {
    match command.status() {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        Ok(status) => {
            eprintln!("xtask: {what} failed ({status})");
            status
                .code()
                .and_then(|code| u8::try_from(code).ok())
                .map_or(ExitCode::FAILURE, ExitCode::from)
        }
        Err(error) => {
            eprintln!("xtask: {what} could not start: {error}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variables_cargo_gave_this_process_are_not_passed_on() {
        // Cargo gives a test process the same package variables `cargo run` gives the
        // task, and `CARGO` (the cargo to run), which stays.
        assert!(env::var_os("CARGO_MANIFEST_DIR").is_some());
        assert!(env::var_os("CARGO_PKG_NAME").is_some());
        let mut command = Command::new("cargo");
        without_cargo_run_variables(&mut command);
        let removed: Vec<String> = command
            .get_envs()
            .filter(|(_, value)| value.is_none())
            .map(|(name, _)| name.to_string_lossy().into_owned())
            .collect();
        for name in ["CARGO_MANIFEST_DIR", "CARGO_PKG_NAME"] {
            assert!(
                removed.iter().any(|r| r == name),
                "{name} kept: {removed:?}"
            );
        }
        for kept in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "RUSTFLAGS",
            "PATH",
        ] {
            assert!(!removed.iter().any(|r| r == kept), "{kept} removed");
        }
    }
}
