//! localstripe (PyPI), a stateful Stripe fake, as a private child process on a
//! free port: for the Stripe adapter's tests and the bench's `stripe` phase.
//! It is started with its store kept in memory only: localstripe pickles its whole
//! store to one fixed file (`/tmp/localstripe.pickle`) after every write, which
//! makes each request slower than the last and has parallel instances overwrite
//! each other's file.
//!
//! The Python that has localstripe is found where it is installed (`python.rs`):
//! the `LOCALSTRIPE` setting, else `python3`, else an active `VIRTUAL_ENV`'s.

mod python;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;

pub use python::{has_localstripe, PythonSearch, LOCALSTRIPE_ENV};

/// The version the adapter was checked against (`.ci/run` installs it).
pub const LOCALSTRIPE_VERSION: &str = "1.15.10";

/// A test secret key localstripe accepts (it accepts any `sk_…`).
pub const LOCALSTRIPE_KEY: &str = "sk_test_localstripe_worker";

const LAUNCH: &str = "\
import sys
import localstripe.resources as resources
resources.Store.dump_to_disk = lambda self: None
from localstripe.server import start
port = sys.argv[1]
sys.argv = ['localstripe', '--port', port, '--from-scratch']
start()
";

extern "C" {
    // glibc's prctl(2); declared here because `libc` is not a direct dependency.
    fn prctl(option: std::ffi::c_int, ...) -> std::ffi::c_int;
}

/// A running localstripe; killed when dropped (and when this process dies).
pub struct LocalStripe {
    child: tokio::process::Child,
    port: u16,
}

impl LocalStripe {
    /// Starts localstripe on a free port and waits until it answers, with the
    /// Python `LOCALSTRIPE` names or else the first that has it (see [`PythonSearch`]).
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(
            std::env::var_os(LOCALSTRIPE_ENV)
                .map(PathBuf::from)
                .as_deref(),
        )
        .await
    }

    /// [`LocalStripe::start`] with `setting` in place of `LOCALSTRIPE`: a Python
    /// interpreter, a `localstripe` executable, or a virtual environment.
    pub async fn start_with(setting: Option<&Path>) -> anyhow::Result<Self> {
        let search = PythonSearch::new(setting, std::env::var_os("VIRTUAL_ENV").as_deref());
        // Each candidate is asked by running it: blocking, and off the runtime.
        let python =
            tokio::task::spawn_blocking(move || search.choose(python::has_localstripe)).await??;
        Self::start_python(&python).await.with_context(|| {
            format!(
                "localstripe did not start with {} (install it: pip install localstripe=={LOCALSTRIPE_VERSION})",
                python.display()
            )
        })
    }

    async fn start_python(python: &Path) -> anyhow::Result<Self> {
        let mut last_error = None;
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            let mut command = tokio::process::Command::new(python);
            command
                .arg("-c")
                .arg(LAUNCH)
                .arg(port.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true);
            // SAFETY: prctl is async-signal-safe and touches only the child.
            unsafe {
                command.pre_exec(|| {
                    prctl(1 /* PR_SET_PDEATHSIG */, 9 /* SIGKILL */);
                    Ok(())
                });
            }
            let child = command
                .spawn()
                .with_context(|| format!("starting {}", python.display()))?;
            let mut running = Self { child, port };
            match running.wait_ready().await {
                Ok(()) => return Ok(running),
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("no attempt was made")))
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        payment_worker::telemetry::install_crypto_provider();
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait()? {
                anyhow::bail!("localstripe exited at start ({status})");
            }
            let ready = http
                .get(format!("{}/v1/balance", self.url()))
                .bearer_auth(LOCALSTRIPE_KEY)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ready {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "localstripe on port {} did not answer within 30 s",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Kills it now (a test that wants the gateway gone).
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}
