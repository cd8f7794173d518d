//! The README's "First five minutes" is executable. Its shell block is
//! run by bash as it stands — dev-kafka, gateway-sim, run, produce, replay
//! --dry-run, audit — with `payment-worker` on the PATH, in a scratch directory,
//! against a database, Redis prefix and gateway port of its own.

use std::time::Duration;

use crate::support::helpers::{ensure_services, unique, PG_ADDR};
use crate::support::procs::free_port;

/// The first `sh` block after the "First five minutes" heading.
fn walkthrough_script() -> String {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = &readme[readme
        .find("## First five minutes")
        .expect("README has a First five minutes section")..];
    let mut blocks = section.split("```sh\n").skip(1);
    blocks
        .find(|b| b.contains("dev-kafka"))
        .and_then(|b| b.split("```").next())
        .expect("the walk-through block")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_walkthrough_runs_as_written() {
    ensure_services();
    let script = walkthrough_script();
    let dir = std::env::temp_dir().join(unique("pw_walkthrough"));
    std::fs::create_dir_all(&dir).unwrap();
    let binary_dir = std::path::Path::new(crate::support::procs::BINARY)
        .parent()
        .unwrap()
        .to_owned();
    let path = format!(
        "{}:{}",
        binary_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let port = free_port();
    let database = format!("postgres://postgres@{PG_ADDR}/{}", unique("pw_walk"));
    let mut command = tokio::process::Command::new("bash");
    command
        .args(["-e", "-c", &script])
        .current_dir(&dir)
        .env("PATH", path)
        .env("DATABASE_URL", &database)
        .env("REDIS_KEY_PREFIX", unique("walk"))
        .env("GATEWAY_SIM_LISTEN", format!("127.0.0.1:{port}"))
        .env("GATEWAY_URL", format!("http://127.0.0.1:{port}"))
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    for inherited in [
        "KAFKA_BROKERS",
        "KAFKA_GROUP_ID",
        "COMMANDS_TOPIC",
        "TOKEN_MODE",
    ] {
        command.env_remove(inherited);
    }
    let child = command.spawn().unwrap();
    let group = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    let finished = tokio::time::timeout(Duration::from_secs(180), child.wait_with_output()).await;
    // Whatever happened, nothing the script started outlives the test.
    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
    let _ = std::fs::remove_dir_all(&dir);
    let output = finished
        .expect("the walk-through finished within 3 minutes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the walk-through failed: {:?}\n{stdout}\n{stderr}",
        output.status
    );
    for expected in [
        "dev-kafka bootstrap 127.0.0.1:",
        "gateway-sim listening on",
        "produced 200 records to payments.commands (keys cmd-",
        "dry run: replaying payments.commands from the beginning (200 records)",
        "result: CLEAN",
    ] {
        assert!(stdout.contains(expected), "{expected:?} missing:\n{stdout}");
    }
    // Every command had been answered when the dry run looked: nothing would be
    // charged twice.
    let charge_line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("would_charge "))
        .expect("would_charge counted");
    assert_eq!(charge_line.split_whitespace().nth(1), Some("0"), "{stdout}");
}
