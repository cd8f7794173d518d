//! The simulator's fault injection: rates, delays and a seed, from flags.

use std::str::FromStr;
use std::time::Duration;

use payment_worker::token::IdempotencyKey;

/// Fault injection for the simulator (`payment-worker gateway-sim …`).
#[derive(Debug, Clone, clap::Args)]
pub struct SimulatorConfig {
    /// Delay before every charge, refund and look-up is handled, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub latency_ms: u64,

    /// Share of POSTs answered 503 without charging or refunding (0 to 1).
    #[arg(long, value_name = "RATE", default_value_t = 0.0, value_parser = parse_rate)]
    pub error_rate: f64,

    /// Share of new charges and refunds declined (0 to 1).
    #[arg(long, value_name = "RATE", default_value_t = 0.0, value_parser = parse_rate)]
    pub decline_rate: f64,

    /// Share of POSTs that charge (or refund), then answer only after `--late-by-ms` (0 to 1).
    #[arg(long, value_name = "RATE", default_value_t = 0.0, value_parser = parse_rate)]
    pub timeout_after_charge_rate: f64,

    /// Share of POSTs that charge (or refund), then answer 502 or 504 (half each), as a proxy
    /// in front of a gateway that did its work does (0 to 1).
    #[arg(long = "5xx-after-charge-rate", value_name = "RATE", default_value_t = 0.0, value_parser = parse_rate)]
    pub five_xx_after_charge_rate: f64,

    /// How late a `--timeout-after-charge-rate` answer comes, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    pub late_by_ms: u64,

    /// Behave like a gateway without idempotency support: every POST is a new
    /// charge (or refund) with a new transaction id; a look-up by key returns the latest.
    #[arg(long)]
    pub ignore_idempotency_key: bool,

    /// Seed of the fault-injection RNG, for reproducible runs (default: random,
    /// logged at start-up).
    #[arg(long)]
    pub seed: Option<u64>,

    /// `KEY=MS`: POSTs with this idempotency key charge at once but answer only
    /// after MS milliseconds (repeatable). Lets a test hold one key in flight.
    #[arg(long = "slow-key", value_name = "KEY=MS")]
    pub slow_keys: Vec<SlowKey>,
}

impl Default for SimulatorConfig {
    fn default() -> Self {
        Self {
            latency_ms: 0,
            error_rate: 0.0,
            decline_rate: 0.0,
            timeout_after_charge_rate: 0.0,
            five_xx_after_charge_rate: 0.0,
            late_by_ms: 30_000,
            ignore_idempotency_key: false,
            seed: None,
            slow_keys: Vec::new(),
        }
    }
}

impl SimulatorConfig {
    pub(super) fn validate(&self) -> anyhow::Result<()> {
        for (name, rate) in [
            ("error-rate", self.error_rate),
            ("decline-rate", self.decline_rate),
            ("timeout-after-charge-rate", self.timeout_after_charge_rate),
            ("5xx-after-charge-rate", self.five_xx_after_charge_rate),
        ] {
            anyhow::ensure!(
                (0.0..=1.0).contains(&rate),
                "--{name} must be between 0 and 1, got {rate}"
            );
        }
        Ok(())
    }
}

/// One `--slow-key KEY=MS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlowKey {
    /// The key whose charges are slowed.
    pub key: IdempotencyKey,
    /// How much longer its charges take.
    pub delay: Duration,
}

impl FromStr for SlowKey {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (key, ms) = s
            .split_once('=')
            .ok_or_else(|| format!("expected KEY=MS, got {s:?}"))?;
        let key = IdempotencyKey::try_from(key).map_err(|e| e.to_string())?;
        let ms: u64 = ms
            .parse()
            .map_err(|_| format!("expected a number of milliseconds after '=', got {ms:?}"))?;
        Ok(Self {
            key,
            delay: Duration::from_millis(ms),
        })
    }
}

fn parse_rate(s: &str) -> Result<f64, String> {
    let rate: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if (0.0..=1.0).contains(&rate) {
        Ok(rate)
    } else {
        Err(format!("{rate} is not between 0 and 1"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        config: SimulatorConfig,
    }

    #[test]
    fn flags_parse() {
        let cli = Cli::try_parse_from([
            "sim",
            "--latency-ms",
            "20",
            "--error-rate",
            "0.5",
            "--decline-rate",
            "1",
            "--timeout-after-charge-rate",
            "0.25",
            "--late-by-ms",
            "2000",
            "--5xx-after-charge-rate",
            "0.125",
            "--ignore-idempotency-key",
            "--seed",
            "7",
            "--slow-key",
            "k-1=500",
            "--slow-key",
            "k-2=0",
        ])
        .unwrap();
        let c = cli.config;
        assert_eq!(c.latency_ms, 20);
        assert_eq!(c.error_rate, 0.5);
        assert_eq!(c.decline_rate, 1.0);
        assert_eq!(c.timeout_after_charge_rate, 0.25);
        assert_eq!(c.late_by_ms, 2000);
        assert_eq!(c.five_xx_after_charge_rate, 0.125);
        assert!(c.ignore_idempotency_key);
        assert_eq!(c.seed, Some(7));
        assert_eq!(c.slow_keys.len(), 2);
        assert_eq!(c.slow_keys[0].key.as_str(), "k-1");
        assert_eq!(c.slow_keys[0].delay, Duration::from_millis(500));

        let defaults = Cli::try_parse_from(["sim"]).unwrap().config;
        assert_eq!(defaults.late_by_ms, SimulatorConfig::default().late_by_ms);
        assert_eq!(defaults.seed, None);

        for bad in [
            vec!["sim", "--error-rate", "1.5"],
            vec!["sim", "--decline-rate", "-0.1"],
            vec!["sim", "--5xx-after-charge-rate", "2"],
            vec!["sim", "--error-rate", "NaN"],
            vec!["sim", "--slow-key", "nokey"],
            vec!["sim", "--slow-key", "a b=10"],
            vec!["sim", "--slow-key", "k=soon"],
        ] {
            assert!(Cli::try_parse_from(&bad).is_err(), "{bad:?}");
        }
    }
}
