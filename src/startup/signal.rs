//! Shutdown on a signal.

use std::future::Future;

use anyhow::Context;

/// The exit status after a SIGINT while stopping (listed with the others in
/// `cli::exit_status`): 128 + SIGINT, as shells report an interrupted command.
pub const INTERRUPTED_EXIT_STATUS: u8 = 130;

/// Installs the SIGTERM and SIGINT handlers now and returns a future that resolves
/// on either. Call it first thing: until the handlers exist, a SIGTERM (an
/// orchestrator stopping a process that is still starting) kills the process
/// outright instead of letting it stop cleanly.
#[cfg(unix)]
pub fn shutdown_signal() -> anyhow::Result<impl Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate =
        signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
        // The handlers stay installed for the life of the process, so without this
        // a Ctrl-C would do nothing while the drain and the final commit take their
        // time: an operator's Ctrl-C after the stop began ends the process at once.
        // What was not committed is delivered again, as after any crash. Another
        // SIGTERM changes nothing: orchestrators and scripts repeat it, and it asks
        // for the same clean stop.
        tokio::spawn(async move {
            let _ = interrupt.recv().await;
            eprintln!("interrupted while stopping: stopping at once");
            std::process::exit(i32::from(INTERRUPTED_EXIT_STATUS));
        });
        drop(terminate);
    })
}

/// Resolves on Ctrl-C.
#[cfg(not(unix))]
pub fn shutdown_signal() -> anyhow::Result<impl Future<Output = ()> + Send + 'static> {
    Ok(async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    })
}
