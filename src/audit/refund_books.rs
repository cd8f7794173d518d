//! The refund side of the books: the gateway's refunds against the `refunds` rows,
//! and no payment given back past what it charged, by either side's count.

use std::collections::{BTreeMap, HashMap};

use anyhow::Context;
use sqlx::PgPool;

use super::refund_rows::{overdrawn_payments, refund_rows, Overdrawn, RefundRow};
use super::report::AuditReport;
use crate::gateway::{ChargeStatus, LedgerEntry, PaymentGateway, RefundEntry};
use crate::payment::{RefundStatus, UnresolvedCharge};

/// What the refund side is reconciled from.
pub(super) struct RefundSources {
    /// Every refund the gateway holds (not only the audited keys': a charge's
    /// refunds are summed whatever their keys).
    pub entries: Vec<RefundEntry>,
    /// The refund rows of the audited keys.
    pub rows: Vec<RefundRow>,
    /// Payments whose rows refund (or reserve) more than was charged.
    pub overdrawn: Vec<Overdrawn>,
}

/// Reads the refund rows, then the gateway's refunds: a refund finishing during the
/// audit shows up as a gateway refund without its row at worst, never as a row
/// without its refund.
pub(super) async fn read_refunds(
    pool: &PgPool,
    gateway: &dyn PaymentGateway,
    prefix: &str,
    lease: std::time::Duration,
) -> anyhow::Result<RefundSources> {
    let rows = refund_rows(pool, prefix, lease)
        .await
        .context("reading refund rows")?;
    let overdrawn = overdrawn_payments(pool, prefix)
        .await
        .context("summing the refunds of each payment")?;
    let entries = gateway
        .refunds()
        .await
        .context("reading the gateway's refunds")?;
    Ok(RefundSources {
        entries,
        rows,
        overdrawn,
    })
}

/// Whether `row` records `entry`: same refund id, status, charge, amount and currency.
fn records(row: &RefundRow, entry: &RefundEntry) -> bool {
    row.status == RefundStatus::from(entry.status)
        && row.gateway_transaction_id.as_deref() == Some(entry.transaction_id.as_str())
        && row.payment_transaction_id.as_deref() == Some(entry.payment_transaction_id.as_str())
        && row.amount_minor == entry.amount_minor
        && row.currency == entry.currency
}

fn describe_entry(entry: &RefundEntry) -> String {
    format!(
        "{} {} {} {} of charge {}",
        entry.transaction_id,
        RefundStatus::from(entry.status).as_str(),
        entry.amount_minor,
        entry.currency,
        entry.payment_transaction_id
    )
}

fn describe_row(row: &RefundRow) -> String {
    format!(
        "{} {} {} {} of payment {}",
        row.gateway_transaction_id.as_deref().unwrap_or("-"),
        row.status.as_str(),
        row.amount_minor,
        row.currency,
        row.payment_key
    )
}

/// Reconciles the refund side of the keys starting with `prefix` into `report`;
/// `audited` are the ledger's charges of those keys.
pub(super) fn report_refunds(
    report: &mut AuditReport,
    sources: &RefundSources,
    prefix: &str,
    audited: &[LedgerEntry],
) {
    let audited_entries: Vec<&RefundEntry> = sources
        .entries
        .iter()
        .filter(|e| e.idempotency_key.starts_with(prefix))
        .collect();
    report.refund_entries = audited_entries.len();
    report.refund_rows = sources.rows.len();
    let rows: HashMap<&str, &RefundRow> = sources
        .rows
        .iter()
        .map(|row| (row.idempotency_key.as_str(), row))
        .collect();
    let mut by_key: BTreeMap<&str, Vec<&RefundEntry>> = BTreeMap::new();
    for entry in &audited_entries {
        by_key
            .entry(entry.idempotency_key.as_str())
            .or_default()
            .push(entry);
    }
    for entry in &audited_entries {
        let row = rows.get(entry.idempotency_key.as_str());
        if !row.is_some_and(|row| records(row, entry)) {
            let row_side = row.map_or_else(|| "no row".to_owned(), |row| describe_row(row));
            report.refunds_unbooked.push(
                &entry.idempotency_key,
                format!("gateway {}; row: {row_side}", describe_entry(entry)),
            );
        }
    }
    report_rows(report, &sources.rows, &by_key);
    report_past_charge(report, &sources.entries, audited, &sources.overdrawn);
}

/// Final rows the gateway does not back, and `processing` rows nobody settles.
fn report_rows(
    report: &mut AuditReport,
    rows: &[RefundRow],
    by_key: &BTreeMap<&str, Vec<&RefundEntry>>,
) {
    for row in rows {
        let entries = by_key
            .get(row.idempotency_key.as_str())
            .map(Vec::as_slice)
            .unwrap_or_default();
        if row.status == RefundStatus::Processing {
            if row.stale {
                let gateway_side = match entries {
                    [] => "the gateway holds no refund for it yet".to_owned(),
                    found => format!(
                        "the gateway holds {}: --repair records it",
                        found
                            .iter()
                            .map(|e| describe_entry(e))
                            .collect::<Vec<_>>()
                            .join(" / ")
                    ),
                };
                report.stuck_refunds.push(
                    &row.idempotency_key,
                    format!(
                        "processing longer than a lease, {} {} of payment {} reserved; {gateway_side}",
                        row.amount_minor, row.currency, row.payment_key
                    ),
                );
            }
            continue;
        }
        if !entries.iter().any(|e| records(row, e)) {
            let gateway_side = match entries {
                [] => "no refund".to_owned(),
                found => found
                    .iter()
                    .map(|e| describe_entry(e))
                    .collect::<Vec<_>>()
                    .join(" / "),
            };
            report.refund_rows_unbacked.push(
                &row.idempotency_key,
                format!("row {}; gateway: {gateway_side}", describe_row(row)),
            );
        }
    }
}

/// Charges whose approved gateway refunds add up past their amount, and payments
/// whose refunded and reserved rows do.
fn report_past_charge(
    report: &mut AuditReport,
    entries: &[RefundEntry],
    audited: &[LedgerEntry],
    overdrawn: &[Overdrawn],
) {
    let mut refunded: HashMap<&str, i64> = HashMap::new();
    for entry in entries
        .iter()
        .filter(|e| e.status == ChargeStatus::Approved)
    {
        *refunded
            .entry(entry.payment_transaction_id.as_str())
            .or_default() += entry.amount_minor;
    }
    for charge in audited {
        let given_back = refunded
            .get(charge.transaction_id.as_str())
            .copied()
            .unwrap_or_default();
        if given_back > charge.amount_minor {
            report.refunds_past_charge.push(
                &charge.idempotency_key,
                format!(
                    "gateway: {given_back} {} refunded of charge {} for {}",
                    charge.currency, charge.transaction_id, charge.amount_minor
                ),
            );
        }
    }
    for payment in overdrawn {
        report.refunds_past_charge.push(
            &payment.payment_key,
            format!(
                "rows: {} refunded or reserved of {} charged",
                payment.taken, payment.amount_minor
            ),
        );
    }
}

/// One refund dead-lettered with its outcome unknown, against the gateway's
/// refunds under its key.
pub(super) fn describe_unresolved_refund(
    given_up: &UnresolvedCharge,
    entries: &[RefundEntry],
) -> String {
    let when = given_up
        .dead_lettered_at
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let asked = format!("refund {} {}", given_up.amount_minor, given_up.currency);
    let found: Vec<String> = entries
        .iter()
        .filter(|e| e.idempotency_key == given_up.idempotency_key)
        .map(describe_entry)
        .collect();
    if found.is_empty() {
        format!(
            "dead-lettered {when} ({asked}); the gateway holds no refund for it: redrive to refund"
        )
    } else {
        format!(
            "dead-lettered {when} ({asked}); the gateway holds {}: refunded, not booked, redrive to record it",
            found.join(" / ")
        )
    }
}
