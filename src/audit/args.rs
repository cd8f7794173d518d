//! The `audit` subcommand: flags, wiring, output and exit status.

use std::time::Duration;

use crate::configuration::StoreSettings;
use crate::gateway::HttpGateway;

use super::checks::{audit, AuditOptions};

/// `payment-worker audit`: where the books are, what to audit and whether to repair.
#[derive(Debug, Clone, clap::Args)]
pub struct AuditArgs {
    /// Where payments and tokens live.
    #[command(flatten)]
    pub stores: StoreSettings,
    /// The gateway whose ledger (`GET /charges`) is reconciled.
    #[arg(
        id = "gateway_url",
        long = "gateway-url",
        env = "GATEWAY_URL",
        default_value = "http://127.0.0.1:8080",
        hide_env_values = true
    )]
    pub gateway_url: String,
    /// Settle tokens stuck in `processing` where it is safe (committed payment →
    /// completed; no row and no charge → pending).
    #[arg(long)]
    pub repair: bool,
    /// Audit only idempotency keys that start with this.
    #[arg(long = "key-prefix")]
    pub key_prefix: Option<String>,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Prints the report; fails (non-zero exit) when any invariant (docs/CONTRACT.md) is violated.
pub async fn run(args: AuditArgs) -> anyhow::Result<()> {
    let (pool, tokens) = crate::startup::open_existing_stores(&args.stores).await?;
    let gateway = HttpGateway::new(
        &args.gateway_url,
        Duration::from_secs(10),
        Duration::from_secs(2),
    )?;
    let options = AuditOptions {
        repair: args.repair,
        key_prefix: args.key_prefix.clone(),
    };
    let report = audit(&pool, tokens.as_ref(), &gateway, &options).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.to_table());
    }
    match report.violations() {
        0 => Ok(()),
        violations => Err(ViolationsFound(violations).into()),
    }
}

/// `audit` found invariant violations (exit code 3, told apart from failing to run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("audit found {0} invariant violation(s)")]
pub struct ViolationsFound(pub usize);
