//! Shutdown on a signal.

use std::future::Future;

use anyhow::Context;

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
