//! The `audit` subcommand: flags, wiring, output and exit status.

use std::time::Duration;

use crate::configuration::{parse_duration, GatewayAccess, GatewaySettings, StoreSettings};

use super::checks::{audit, AuditOptions};

/// `payment-worker audit`: where the books are, what to audit and whether to repair.
#[derive(Debug, Clone, clap::Args)]
pub struct AuditArgs {
    /// Where payments and tokens live.
    #[command(flatten)]
    pub stores: StoreSettings,
    /// The gateway whose ledger is reconciled (`charges`: `GET /charges`; `stripe`:
    /// every PaymentIntent whose metadata names a key).
    #[command(flatten)]
    pub gateway: GatewayAccess,
    /// An unconfirmed charge (a Stripe PaymentIntent never confirmed) older than
    /// the lease plus this is listed as an orphan, and cancelled by `--repair`.
    #[arg(long = "orphan-margin", default_value = "1m", value_parser = parse_duration)]
    pub orphan_margin: Duration,
    /// Settle tokens stuck in `processing` where it is safe (committed payment or
    /// refund → completed; no row and no charge → pending), cancel orphaned unconfirmed
    /// charges whose payment is not in progress, and record refunds stuck in
    /// `processing` that the gateway shows (one it does not show stays reserved).
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
    let settings = GatewaySettings {
        access: args.gateway.clone(),
        timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(2),
        lookup: crate::payment::GatewayLookup::default(),
    };
    let gateway = crate::startup::gateway(&settings, &args.stores.database).await?;
    let options = AuditOptions {
        repair: args.repair,
        key_prefix: args.key_prefix.clone(),
        orphan_margin: args.orphan_margin,
    };
    let report = audit(&pool, tokens.as_ref(), gateway.as_ref(), &options).await?;
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
