//! How one worker process admits, retries and drains commands, and how results leave it.

use std::time::Duration;

use super::{parse_duration, KeyHashSettings};

/// How one worker process admits, retries and drains commands.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerSettings {
    /// Commands admitted at once per partition (different keys run in parallel,
    /// one key strictly in order).
    #[arg(long = "max-in-flight", env = "MAX_IN_FLIGHT", default_value_t = 32, value_parser = parse_max_in_flight)]
    pub max_in_flight: usize,
    /// Transient failures are retried this long before dead-lettering.
    #[arg(long = "retry-budget", env = "RETRY_BUDGET", default_value = "5m", value_parser = parse_duration)]
    pub retry_budget: Duration,
    /// On revoke or shutdown, in-flight commands get this long to finish. Must stay
    /// below the session timeout so the member is not evicted while draining.
    #[arg(long = "drain-deadline", env = "DRAIN_DEADLINE", default_value = "4s", value_parser = parse_duration)]
    pub drain_deadline: Duration,
    /// Serve `/healthz` and `/readyz` on this address.
    #[arg(long = "health-listen", env = "HEALTH_LISTEN")]
    pub health_listen: Option<std::net::SocketAddr>,
    /// Identifies this member in token owners and logs: 1–64 of [A-Za-z0-9._:-] (default: host:pid).
    #[arg(long = "worker-id", env = "WORKER_ID", value_parser = super::names::parse_name)]
    pub worker_id: Option<String>,
    /// How results, dead letters and offsets leave the worker. `at-least-once`: each
    /// is acknowledged, then the offset is committed (a crash in between answers a
    /// command again, as a `duplicate`). `exactly-once`: they are produced in Kafka
    /// transactions together with the offsets, so a `read_committed` reader sees
    /// one result per command (needs brokers with transactions).
    #[arg(
        long = "results",
        env = "RESULTS_MODE",
        value_enum,
        default_value = "at-least-once"
    )]
    pub results: ResultsMode,
    /// `exactly-once`: an open transaction is committed at least this often
    /// (results become visible to `read_committed` readers at commit).
    #[arg(long = "transaction-interval", env = "TRANSACTION_INTERVAL", default_value = "100ms", value_parser = parse_duration)]
    pub transaction_interval: Duration,
    /// `exactly-once`: an open transaction is committed once it holds this many
    /// answered commands, even before `--transaction-interval` passed.
    #[arg(
        long = "transaction-max-records",
        env = "TRANSACTION_MAX_RECORDS",
        default_value_t = 1000,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub transaction_max_records: u64,
    /// The secret of the keyed hash answers carry for a key they echo masked.
    #[command(flatten)]
    pub key_hash: KeyHashSettings,
}

/// How results and offsets leave the worker (docs/ARCHITECTURE.md, "Result delivery").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ResultsMode {
    /// Acknowledged result, then offset commit: a command may be answered again.
    #[default]
    AtLeastOnce,
    /// Results, dead letters and offsets committed in one Kafka transaction.
    ExactlyOnce,
}

impl ResultsMode {
    /// The spelling of the flag's value, as logs and the demo print it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AtLeastOnce => "at-least-once",
            Self::ExactlyOnce => "exactly-once",
        }
    }
}

impl Default for WorkerSettings {
    fn default() -> Self {
        Self {
            max_in_flight: 32,
            retry_budget: Duration::from_secs(300),
            drain_deadline: Duration::from_secs(4),
            health_listen: None,
            worker_id: None,
            results: ResultsMode::AtLeastOnce,
            transaction_interval: Duration::from_millis(100),
            transaction_max_records: 1000,
            key_hash: KeyHashSettings::default(),
        }
    }
}

impl WorkerSettings {
    /// `--worker-id`, or `<hostname>:<pid>` when none is given.
    pub fn worker_id(&self) -> String {
        self.worker_id.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
            super::names::default_worker_id(host.trim(), std::process::id())
        })
    }
}

/// `--max-in-flight`: 1 to 65,536 commands per partition.
fn parse_max_in_flight(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if (1..=65_536).contains(&n) => Ok(n),
        _ => Err(format!("{value:?} is not a number from 1 to 65536")),
    }
}
