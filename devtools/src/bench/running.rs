//! The worker under test in an end-to-end phase: in this process or a child
//! process, waited on until it owns its partitions and answers, and stopped as in
//! production (SIGTERM for a child). Apart from `e2e.rs`, which sets phases up.

use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::ProgressBar;

use super::load::now_ms;
use super::results::ResultsReader;
use payment_worker::worker::RunningWorker;

/// How long a phase may stand still before it is called stuck.
const STALL: Duration = Duration::from_secs(60);

/// This binary. A rebuild while the bench runs replaces the file, and the link
/// then names the old one as deleted; the new one is the same program.
pub(super) fn worker_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the payment-worker binary")?;
    if exe.exists() {
        return Ok(exe);
    }
    let text = exe.to_string_lossy();
    let rebuilt = PathBuf::from(text.trim_end_matches(" (deleted)"));
    anyhow::ensure!(
        rebuilt.exists(),
        "the payment-worker binary {} is gone",
        exe.display()
    );
    Ok(rebuilt)
}

/// The worker of a phase.
pub(super) enum Running {
    InProcess(RunningWorker),
    Process { child: Child, log: PathBuf },
}

pub(super) fn check_alive(running: &mut Running) -> anyhow::Result<()> {
    if let Running::Process { child, log } = running {
        if let Some(status) = child.try_wait()? {
            anyhow::bail!(
                "the worker process exited early ({status}); see {}",
                log.display()
            );
        }
    }
    Ok(())
}

pub(super) async fn wait_for_assignment(
    running: &Running,
    partitions: usize,
) -> anyhow::Result<()> {
    let Running::InProcess(worker) = running else {
        anyhow::bail!("paced phases run the worker in process");
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut stable_since: Option<Instant> = None;
    loop {
        if worker.assigned_partitions() == partitions {
            let since = *stable_since.get_or_insert_with(Instant::now);
            if since.elapsed() > Duration::from_secs(1) {
                return Ok(());
            }
        } else {
            stable_since = None;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the worker never owned all {partitions} partitions"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The moment (Unix ms) an in-process worker first owns all `partitions`; it may
/// already be processing them.
pub(super) async fn wait_until_owned(running: &Running, partitions: usize) -> anyhow::Result<i64> {
    let Running::InProcess(worker) = running else {
        anyhow::bail!("the backlog phase runs the worker in process");
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while worker.assigned_partitions() < partitions {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the worker never owned all {partitions} partitions"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(now_ms())
}

pub(super) async fn wait_for_answers(
    reader: &ResultsReader,
    target: usize,
    bar: &ProgressBar,
    running: &mut Running,
) -> anyhow::Result<()> {
    let answered = || async { Ok(reader.answered()) };
    wait_for_progress(
        target,
        "commands answered",
        Duration::from_millis(50),
        bar,
        running,
        answered,
    )
    .await
}

/// Polls `count` every `every` until it reaches `target`, showing it on the bar; fails
/// when it stands still for [`STALL`] or the worker process has exited.
pub(super) async fn wait_for_progress<F, Fut>(
    target: usize,
    what: &str,
    every: Duration,
    bar: &ProgressBar,
    running: &mut Running,
    mut count: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<usize>>,
{
    let mut last = 0usize;
    let mut last_progress = Instant::now();
    loop {
        let done = count().await?;
        bar.set_position(done as u64);
        if done >= target {
            return Ok(());
        }
        if done != last {
            last = done;
            last_progress = Instant::now();
        }
        anyhow::ensure!(
            last_progress.elapsed() < STALL,
            "no progress for {STALL:?}: {done} of {target} {what}"
        );
        check_alive(running)?;
        tokio::time::sleep(every).await;
    }
}

pub(super) async fn stop(running: Running) -> anyhow::Result<()> {
    match running {
        Running::InProcess(worker) => worker.stop().await,
        Running::Process { mut child, log } => {
            // SIGTERM lets it drain and leave the group, as in production.
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if let Some(status) = child.try_wait()? {
                    anyhow::ensure!(
                        status.success(),
                        "the worker process failed ({status}); see {}",
                        log.display()
                    );
                    return Ok(());
                }
                if Instant::now() > deadline {
                    child.kill()?;
                    child.wait()?;
                    anyhow::bail!(
                        "the worker process did not stop after SIGTERM; see {}",
                        log.display()
                    );
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
