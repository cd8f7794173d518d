//! localstripe (PyPI), a stateful Stripe fake, as a private child process on a
//! free port: for the Stripe adapter's tests and the bench's `stripe` phase.
//! It is started with its store kept in memory only: localstripe pickles its whole
//! store to one fixed file (`/tmp/localstripe.pickle`) after every write, which
//! makes each request slower than the last and has parallel instances overwrite
//! each other's file.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;

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
    /// Starts localstripe on a free port and waits until it answers.
    pub async fn start() -> anyhow::Result<Self> {
        let mut last_error = None;
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            let mut command = tokio::process::Command::new("python3");
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
                .context("starting localstripe (python3 with the localstripe package)")?;
            let mut running = Self { child, port };
            match running.wait_ready().await {
                Ok(()) => return Ok(running),
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("localstripe did not start")))
            .with_context(|| {
                format!(
                    "localstripe did not start (install it: pip install localstripe=={LOCALSTRIPE_VERSION})"
                )
            })
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
