//! `healthcheck`: asks a running worker's health endpoint whether it is live (or
//! ready), so a container image needs no shell tools (curl, wget) for its check.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use anyhow::Context;

use crate::configuration::parse_duration;

/// Which question to ask the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Probe {
    /// `/healthz`: the poll loop polled within the session timeout (restart when not).
    #[default]
    Healthz,
    /// `/readyz`: a member of its group, not draining, and both stores answer.
    Readyz,
}

impl Probe {
    fn path(self) -> &'static str {
        match self {
            Self::Healthz => "/healthz",
            Self::Readyz => "/readyz",
        }
    }
}

/// Flags of `healthcheck`.
#[derive(Debug, clap::Args)]
pub struct HealthcheckArgs {
    /// The worker's health listener: the same setting the worker serves on. An
    /// unspecified address (0.0.0.0, [::]) is asked on loopback.
    #[arg(long = "health-listen", env = "HEALTH_LISTEN")]
    pub health_listen: Option<SocketAddr>,
    /// Which endpoint to ask.
    #[arg(long, value_enum, default_value_t = Probe::Healthz)]
    pub probe: Probe,
    /// How long the worker may take to answer.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// The address to ask: a listener bound to every address answers on loopback.
fn probe_address(listen: SocketAddr) -> SocketAddr {
    let ip = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, listen.port())
}

/// Succeeds when the endpoint answers 2xx within the timeout; any other answer, or
/// none, is an error (exit status 1).
pub async fn healthcheck(args: HealthcheckArgs) -> anyhow::Result<()> {
    let listen = args.health_listen.context(
        "HEALTH_LISTEN (or --health-listen) is not set: a worker without it serves no health endpoint",
    )?;
    let url = format!("http://{}{}", probe_address(listen), args.probe.path());
    let client = reqwest::Client::builder()
        .timeout(args.timeout)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .context("building the health-check client")?;
    let response = client
        .get(&url)
        .send()
        .await
        .with_context(|| format!("{url}: no answer"))?;
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    let body = body.trim();
    anyhow::ensure!(status.is_success(), "{url}: HTTP {status}: {body}");
    println!("{url}: HTTP {status}: {body}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unspecified_listener_is_asked_on_loopback() {
        let asked = |listen: &str| probe_address(listen.parse().unwrap()).to_string();
        assert_eq!(asked("0.0.0.0:8081"), "127.0.0.1:8081");
        assert_eq!(asked("[::]:8081"), "[::1]:8081");
        assert_eq!(asked("10.1.2.3:9000"), "10.1.2.3:9000");
    }
}
