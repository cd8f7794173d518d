//! Binding, serving in the background or on a thread of its own, and the
//! `gateway-sim` command.

use std::future::{Future, IntoFuture};
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::serve::ListenerExt as _;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::ledger::Shared;
use super::refunds::RefundRefusal;
use super::routes::router;
use super::SimulatorConfig;
use payment_worker::gateway::{LedgerEntry, RefundEntry};

/// How long requests in flight may finish after shutdown was asked for; a held
/// answer (`--late-by-ms`, `--slow-key`) is cut off rather than waited for.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// A bound, not yet serving, simulator.
pub struct GatewaySimulator {
    listener: std::net::TcpListener,
    local_addr: SocketAddr,
    seed: u64,
    shared: Arc<Shared>,
}

impl GatewaySimulator {
    /// Binds before serving, so `127.0.0.1:0` yields its port to the caller first.
    pub fn bind(addr: SocketAddr, config: SimulatorConfig) -> anyhow::Result<Self> {
        config.validate()?;
        let listener = std::net::TcpListener::bind(addr)
            .with_context(|| format!("gateway simulator cannot listen on {addr}"))?;
        // Tokio adopts it in `serve`; it must not block the runtime there.
        listener
            .set_nonblocking(true)
            .context("setting the simulator listener non-blocking")?;
        let local_addr = listener.local_addr()?;
        let seed = config.seed.unwrap_or_else(rand::random);
        let shared = Arc::new(Shared::new(config, seed));
        Ok(Self {
            listener,
            local_addr,
            seed,
            shared,
        })
    }

    /// The address the simulator is bound to (port 0 resolved).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The RNG seed in use (the `--seed` given, or the random one drawn).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Serves until `shutdown` completes, then lets requests in flight finish for
    /// up to [`SHUTDOWN_GRACE`] before closing their connections.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let listener = tokio::net::TcpListener::from_std(self.listener)
            .context("registering the simulator listener")?
            .tap_io(|tcp| {
                // Small request/response pairs: Nagle would only add latency.
                let _ = tcp.set_nodelay(true);
            });
        let stopping = CancellationToken::new();
        let trigger = stopping.clone();
        let server = axum::serve(listener, router(self.shared))
            .with_graceful_shutdown(async move {
                shutdown.await;
                trigger.cancel();
            })
            .into_future();
        tokio::select! {
            result = server => result.context("gateway simulator server failed"),
            () = async {
                stopping.cancelled().await;
                tokio::time::sleep(SHUTDOWN_GRACE).await;
            } => Ok(()),
        }
    }

    /// Serves on the current Tokio runtime in the background (in-process tests).
    /// The server stops when the returned handle is dropped or shut down. Must be
    /// called inside a Tokio runtime (it spawns a task).
    pub fn spawn(self) -> RunningSimulator {
        let addr = self.local_addr;
        let shared = Arc::clone(&self.shared);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let handle = tokio::spawn(self.serve(async move {
            // A dropped sender means stop too.
            let _ = stopped.await;
        }));
        RunningSimulator {
            addr,
            shared,
            stop: Some(stop),
            handle: Some(handle),
        }
    }
}

impl GatewaySimulator {
    /// Serves on a thread of its own, named `name`, with a single-threaded runtime:
    /// the CPU it spends can then be told from its caller's (the bench reads it per
    /// thread). Stops like [`Self::spawn`]; must be called inside a Tokio runtime.
    pub fn spawn_on_thread(self, name: &str) -> anyhow::Result<RunningSimulator> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("building the simulator's runtime")?;
        let addr = self.local_addr;
        let shared = Arc::clone(&self.shared);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (served, result) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                let outcome = runtime.block_on(self.serve(async move {
                    let _ = stopped.await;
                }));
                let _ = served.send(outcome);
            })
            .context("starting the simulator's thread")?;
        let handle = tokio::spawn(async move {
            result
                .await
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the simulator's thread panicked")))
        });
        Ok(RunningSimulator {
            addr,
            shared,
            stop: Some(stop),
            handle: Some(handle),
        })
    }
}

/// A simulator serving in the background; stops on drop.
pub struct RunningSimulator {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    handle: Option<JoinHandle<anyhow::Result<()>>>,
}

impl RunningSimulator {
    /// The address the running simulator serves on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, ready for [`super::HttpGateway::new`].
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The ledger as `GET /charges` would return it, without HTTP.
    pub fn ledger(&self) -> Vec<LedgerEntry> {
        self.shared.snapshot(None)
    }

    /// The refunds as `GET /refunds` would return them, without HTTP.
    pub fn refunds(&self) -> Vec<RefundEntry> {
        self.shared.refund_snapshot(None)
    }

    /// The refused refund requests as `GET /refund-refusals` would return them.
    pub fn refund_refusals(&self) -> Vec<RefundRefusal> {
        self.shared.refund_refusals()
    }

    /// The `traceparent` header of the first charge request for `key`, if it had one.
    pub fn traceparent_of(&self, key: &str) -> Option<String> {
        self.trace_headers_of(key)
            .into_iter()
            .find(|(name, _)| name == "traceparent")
            .map(|(_, value)| value)
    }

    /// The trace context headers (`traceparent`, `tracestate`, `baggage`) of the first
    /// charge request for `key`, as they came, in that order.
    pub fn trace_headers_of(&self, key: &str) -> Vec<(String, String)> {
        self.shared.trace_headers_of(key)
    }

    /// Stops serving and waits for the server to finish.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.handle.take() {
            Some(handle) => handle.await.context("gateway simulator task failed")?,
            None => Ok(()),
        }
    }
}

impl Drop for RunningSimulator {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl std::fmt::Debug for RunningSimulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningSimulator")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// `payment-worker-devtools gateway-sim --listen ADDR`: binds, prints
/// `gateway-sim listening on ADDR` as the first line on stdout (scripts and tests
/// read the port from it), and serves until SIGTERM or Ctrl-C.
pub async fn run_cli(listen: SocketAddr, config: SimulatorConfig) -> anyhow::Result<()> {
    // Handlers first: a SIGTERM sent right after the line is read must already
    // find them installed.
    let shutdown = payment_worker::startup::shutdown_signal()?;
    let simulator = GatewaySimulator::bind(listen, config)?;
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(
            stdout,
            "gateway-sim listening on {}",
            simulator.local_addr()
        )?;
        stdout.flush()?;
    }
    tracing::info!(
        addr = %simulator.local_addr(),
        seed = simulator.seed(),
        config = ?simulator.shared.config,
        "gateway simulator serving"
    );
    simulator.serve(shutdown).await?;
    tracing::info!("gateway simulator stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_rejects_bad_rates() {
        let config = SimulatorConfig {
            error_rate: 2.0,
            ..SimulatorConfig::default()
        };
        let bound = GatewaySimulator::bind("127.0.0.1:0".parse().unwrap(), config);
        assert!(bound.is_err());
    }
}
