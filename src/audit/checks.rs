//! The reconciliation itself: ledger against rows, rows against the ledger, and the
//! token store against both.

use std::collections::{BTreeMap, HashMap, HashSet};

use anyhow::Context;
use sqlx::PgPool;

use super::books::{reconcile, Books};
use super::refund_books::{describe_unresolved_refund, read_refunds, report_refunds};
use super::refund_repair::repair_stuck_refunds;
use super::repair::{cancel_orphan, repair_stuck_token};
use super::report::AuditReport;
use crate::gateway::{LedgerEntry, PaymentGateway, RefundEntry, Unconfirmed};
use crate::payment::{
    booked_payments, unresolved_charges, BookedPayment, PaymentStatus, RefundStatus,
    UnresolvedCharge,
};
use crate::token::{IdempotencyKey, TokenState, TokenStore};

/// Most stuck tokens listed (and repaired) in one run.
const MAX_STUCK_TOKENS: usize = 100_000;

/// The ledger's entries by key, as [`Books::charges`].
type Charges<'a> = BTreeMap<&'a str, Vec<&'a LedgerEntry>>;
/// The rows by key, as [`Books::rows`].
type Rows<'a> = HashMap<&'a str, &'a BookedPayment>;

/// What an audit covers and whether it repairs.
#[derive(Debug, Clone, Default)]
pub struct AuditOptions {
    /// Settle tokens stuck in `processing` where that is safe.
    pub repair: bool,
    /// Audit only idempotency keys starting with this (a shared ledger or database).
    pub key_prefix: Option<String>,
    /// An unconfirmed charge older than the lease plus this is an orphan.
    pub orphan_margin: std::time::Duration,
}

impl AuditOptions {
    fn wants(&self, key: &str) -> bool {
        self.key_prefix
            .as_deref()
            .is_none_or(|p| key.starts_with(p))
    }
}

/// Reconciles the ledger, Postgres and the token store; with `options.repair`,
/// settles stuck tokens first-hand (see `repair.rs`). Errors only when a source
/// cannot be read; violations are in the report.
pub async fn audit(
    pool: &PgPool,
    tokens: &dyn TokenStore,
    gateway: &dyn PaymentGateway,
    options: &AuditOptions,
) -> anyhow::Result<AuditReport> {
    let lease = tokens.policy().lease;
    let prefix = options.key_prefix.as_deref().unwrap_or_default();
    // Stuck refunds are settled before anything is read, so the report shows what
    // is left of them (a refund the gateway does not show stays listed).
    let refund_repairs = if options.repair {
        repair_stuck_refunds(pool, gateway, prefix, lease)
            .await
            .context("settling stuck refunds")?
    } else {
        Vec::new()
    };
    let sources = read_sources(pool, gateway, options, lease).await?;
    let refunds = read_refunds(pool, gateway, prefix, lease).await?;
    let mut report = AuditReport {
        key_prefix: options.key_prefix.clone(),
        ledger_entries: sources.ledger.len(),
        payment_rows: sources.rows.len(),
        ..AuditReport::default()
    };

    let books = reconcile(&sources.ledger, &sources.rows);
    report_books(&mut report, &books);
    report_refunds(&mut report, &refunds, prefix, &sources.ledger);
    report_unresolved(
        &mut report,
        &sources.unresolved,
        &books.charges,
        &refunds.entries,
    );

    let orphans = list_orphans(gateway, options, lease).await?;
    report_orphans(&mut report, &orphans);
    report_tombstones_without_row(&mut report, &books, tokens).await?;

    let stuck = list_stuck_tokens(&mut report, tokens, options).await?;
    let unsafe_keys = report_stuck_tokens(&mut report, &stuck, &books.rows, &refunds.statuses());
    report.token_table = tokens
        .housekeeping()
        .await
        .context("reading the token table's size")?;

    report.stuck_refunds_repaired = refund_repairs
        .iter()
        .filter(|r| r.action == super::RepairAction::Recorded)
        .count();
    report.repairs.extend(refund_repairs);
    if options.repair {
        repair_stuck_tokens(
            &mut report,
            &stuck,
            &unsafe_keys,
            &books,
            pool,
            tokens,
            gateway,
        )
        .await;
        cancel_orphans(&mut report, &orphans, &books.rows, tokens, gateway).await;
        report.token_inconsistencies_repaired = report
            .repairs
            .iter()
            .filter(|r| {
                matches!(
                    r.action,
                    super::RepairAction::Completed | super::RepairAction::Restored
                )
            })
            .count();
    }
    Ok(report)
}

/// What the books are reconciled from, read in this order.
struct Sources {
    rows: Vec<BookedPayment>,
    unresolved: Vec<UnresolvedCharge>,
    ledger: Vec<LedgerEntry>,
}

/// Reads the payment rows, the commands dead-lettered with their charge unknown and
/// the ledger, each narrowed to the audited keys.
async fn read_sources(
    pool: &PgPool,
    gateway: &dyn PaymentGateway,
    options: &AuditOptions,
    lease: std::time::Duration,
) -> anyhow::Result<Sources> {
    // Rows first: a command finishing during the audit then shows up as a charge
    // without a row at worst, never as a row without its charge.
    let rows = booked_payments(
        pool,
        options.key_prefix.as_deref().unwrap_or_default(),
        lease,
    )
    .await
    .context("reading payment rows")?;
    let unresolved = unresolved_charges(pool, options.key_prefix.as_deref().unwrap_or_default())
        .await
        .context("reading the commands dead-lettered with their charge unknown")?;
    let ledger: Vec<LedgerEntry> = gateway
        .ledger()
        .await
        .context("reading the gateway ledger")?
        .into_iter()
        .filter(|entry| options.wants(&entry.idempotency_key))
        .collect();
    Ok(Sources {
        rows,
        unresolved,
        ledger,
    })
}

/// The ledger against the rows: double charges, charges without a row, stale
/// `processing` rows, rows without a charge and rows the ledger disagrees with.
fn report_books(report: &mut AuditReport, books: &Books<'_>) {
    let charges = &books.charges;
    for key in &books.double_charged {
        let entries = &charges[key];
        let ids: Vec<&str> = entries.iter().map(|e| e.transaction_id.as_str()).collect();
        report.double_charges.push(
            key,
            format!("{} charges: {}", entries.len(), ids.join(", ")),
        );
    }
    for key in &books.charged_without_row {
        let entry = charges[key][0];
        report.charges_without_row.push(
            key,
            format!(
                "{} {} {} {}",
                entry.transaction_id,
                entry.status.as_str(),
                entry.amount_minor,
                entry.currency
            ),
        );
    }
    for row in books.rows_processing.iter().filter(|row| row.stale) {
        report.stale_processing_rows.push(
            &row.idempotency_key,
            "committed in processing for longer than a lease",
        );
    }
    for row in &books.rows_without_charge {
        report.rows_without_charge.push(
            &row.idempotency_key,
            format!(
                "{} {}",
                row.status.as_str(),
                row.gateway_transaction_id.as_deref().unwrap_or("-")
            ),
        );
    }
    for row in &books.rows_disagreeing {
        let ledger_side: Vec<String> = charges[row.idempotency_key.as_str()]
            .iter()
            .map(|e| {
                format!(
                    "{} {}",
                    PaymentStatus::from(e.status).as_str(),
                    e.transaction_id
                )
            })
            .collect();
        report.rows_disagreeing.push(
            &row.idempotency_key,
            format!(
                "row {} {}, ledger {}",
                row.status.as_str(),
                row.gateway_transaction_id.as_deref().unwrap_or("-"),
                ledger_side.join(" / ")
            ),
        );
    }
}

/// Every command dead-lettered with its charge unknown, against what the ledger
/// (a refund: the gateway's refunds) holds for its key.
fn report_unresolved(
    report: &mut AuditReport,
    unresolved: &[UnresolvedCharge],
    charges: &Charges<'_>,
    refunds: &[RefundEntry],
) {
    for given_up in unresolved {
        if given_up.kind == crate::payment::CommandKind::Refund.as_str() {
            report.unresolved_charges.push(
                &given_up.idempotency_key,
                describe_unresolved_refund(given_up, refunds),
            );
            continue;
        }
        let ledger_side = charges
            .get(given_up.idempotency_key.as_str())
            .map(|entries| entries.as_slice())
            .unwrap_or_default();
        report.unresolved_charges.push(
            &given_up.idempotency_key,
            describe_unresolved(given_up, ledger_side),
        );
    }
}

/// The gateway's unconfirmed charges of the audited keys that are orphans.
async fn list_orphans(
    gateway: &dyn PaymentGateway,
    options: &AuditOptions,
    lease: std::time::Duration,
) -> anyhow::Result<Vec<Unconfirmed>> {
    // Charges made ready and never confirmed: an orphan once it is older than any
    // attempt that may still confirm it.
    let orphan_before = chrono::Utc::now()
        - chrono::Duration::from_std(lease + options.orphan_margin).unwrap_or_default();
    Ok(gateway
        .unconfirmed()
        .await
        .context("listing the gateway's unconfirmed charges")?
        .into_iter()
        .filter(|u| options.wants(&u.idempotency_key) && u.created_at < orphan_before)
        .collect())
}

/// Every orphaned charge, with its id, amount and age.
fn report_orphans(report: &mut AuditReport, orphans: &[Unconfirmed]) {
    for orphan in orphans {
        report.orphaned_charges.push(
            &orphan.idempotency_key,
            format!(
                "{} {} {} created {}, never confirmed",
                orphan.id,
                orphan.amount_minor,
                orphan.currency,
                orphan
                    .created_at
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
        );
    }
}

/// Completed tokens whose key was charged but has no row.
async fn report_tombstones_without_row(
    report: &mut AuditReport,
    books: &Books<'_>,
    tokens: &dyn TokenStore,
) -> anyhow::Result<()> {
    // Tombstones can only lack their row where a key was charged without one (a row
    // is written before every charge and only committed final).
    for key in books
        .charges
        .keys()
        .filter(|k| !books.rows.contains_key(*k))
    {
        let Ok(key) = IdempotencyKey::try_from(*key) else {
            continue;
        };
        if let Some(view) = tokens.show(&key).await.context("reading a token")? {
            if view.state == TokenState::Completed {
                let payment = view.payment_id.map(|id| id.to_string()).unwrap_or_default();
                report
                    .tombstones_without_row
                    .push(key.as_str(), format!("tombstone for payment {payment}"));
            }
        }
    }
    Ok(())
}

/// The audited keys of tokens whose lease expired in `processing`; notes in the
/// report whether the store listed as many as it was asked for.
async fn list_stuck_tokens(
    report: &mut AuditReport,
    tokens: &dyn TokenStore,
    options: &AuditOptions,
) -> anyhow::Result<Vec<IdempotencyKey>> {
    let stuck = tokens
        .expired_leases(MAX_STUCK_TOKENS)
        .await
        .context("listing tokens whose lease expired")?;
    report.stuck_tokens_truncated = stuck.len() >= MAX_STUCK_TOKENS;
    Ok(stuck
        .into_iter()
        .filter(|k| options.wants(k.as_str()))
        .collect())
}

/// Sorts the stuck tokens into harmless ones and violations; returns the keys of
/// the violations.
fn report_stuck_tokens(
    report: &mut AuditReport,
    stuck: &[IdempotencyKey],
    rows_by_key: &Rows<'_>,
    refunds_by_key: &HashMap<&str, RefundStatus>,
) -> HashSet<String> {
    // A token left to its lease with a final row (a payment's, or a refund's) is
    // harmless: the next delivery (or `--repair`) finds the row and settles it.
    // Without a final row nobody knows yet whether a charge (or refund) happened:
    // that one is a violation until settled.
    let mut unsafe_keys = HashSet::new();
    for key in stuck {
        let payment = rows_by_key.get(key.as_str()).map(|row| row.status);
        let refund = refunds_by_key.get(key.as_str()).copied();
        let final_row = match (payment, refund) {
            (Some(status), _) if status != PaymentStatus::Processing => Some(status.as_str()),
            (_, Some(status)) if status != RefundStatus::Processing => Some(status.as_str()),
            _ => None,
        };
        if let Some(status) = final_row {
            report.lease_left_tokens.push(
                key.as_str(),
                format!("processing past its lease, {status} row committed: settled on next touch"),
            );
            continue;
        }
        let row = match (payment, refund) {
            (Some(status), _) => status.as_str(),
            (None, Some(_)) => "refund processing",
            (None, None) => "no payment row",
        };
        unsafe_keys.insert(key.as_str().to_owned());
        report.stuck_tokens.push(
            key.as_str(),
            format!("processing past its lease; row: {row}"),
        );
    }
    unsafe_keys
}

/// `--repair` of every stuck token, one after the other; counts the violations
/// it settled.
async fn repair_stuck_tokens(
    report: &mut AuditReport,
    stuck: &[IdempotencyKey],
    unsafe_keys: &HashSet<String>,
    books: &Books<'_>,
    pool: &PgPool,
    tokens: &dyn TokenStore,
    gateway: &dyn PaymentGateway,
) {
    for key in stuck {
        let charged_without_row =
            books.charges.contains_key(key.as_str()) && !books.rows.contains_key(key.as_str());
        let repair = repair_stuck_token(key, charged_without_row, pool, tokens, gateway).await;
        report.repairs.push(repair);
    }
    report.stuck_tokens_repaired = report
        .repairs
        .iter()
        .filter(|r| r.action.resolves() && unsafe_keys.contains(&r.idempotency_key))
        .count();
}

/// `--repair` of every orphaned charge, one after the other.
async fn cancel_orphans(
    report: &mut AuditReport,
    orphans: &[Unconfirmed],
    rows_by_key: &Rows<'_>,
    tokens: &dyn TokenStore,
    gateway: &dyn PaymentGateway,
) {
    for orphan in orphans {
        let final_row = rows_by_key
            .get(orphan.idempotency_key.as_str())
            .is_some_and(|row| row.status != PaymentStatus::Processing);
        let repair = cancel_orphan(orphan, final_row, tokens, gateway).await;
        if repair.action == super::RepairAction::Cancelled {
            report.orphans_cancelled += 1;
        }
        report.repairs.push(repair);
    }
}

/// One unresolved command against what the ledger holds for its key.
fn describe_unresolved(given_up: &UnresolvedCharge, ledger: &[&LedgerEntry]) -> String {
    let when = given_up
        .dead_lettered_at
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let asked = format!("{} {}", given_up.amount_minor, given_up.currency);
    match ledger {
        [] => format!(
            "dead-lettered {when} ({asked}); the ledger holds no charge for it: redrive to charge"
        ),
        entries => {
            let listed: Vec<String> = entries
                .iter()
                .map(|e| {
                    format!(
                        "{} {} {} {}",
                        e.status.as_str(),
                        e.transaction_id,
                        e.amount_minor,
                        e.currency
                    )
                })
                .collect();
            format!(
                "dead-lettered {when} ({asked}); the ledger holds {}: charged, not booked, redrive to record it",
                listed.join(" / ")
            )
        }
    }
}
