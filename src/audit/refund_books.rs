//! The refund side of the books: the gateway's refunds against the `refunds` rows,
//! and no payment given back past what it charged, by either side's count.

use std::collections::{BTreeMap, HashMap};

use anyhow::Context;
use sqlx::PgPool;

use super::refund_rows::{overdrawn_payments, refund_rows, refused_keys, Overdrawn, RefundRow};
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
    /// The audited keys whose refund was refused for good (kept `rejected` rows:
    /// final, nothing refunded, so not among `rows`).
    pub refused: Vec<String>,
}

impl RefundSources {
    /// Each audited refund row's status, by its key (a kept refusal's too: a token
    /// left to its lease over one is settled on the next touch, not a violation).
    pub fn statuses(&self) -> HashMap<&str, RefundStatus> {
        self.rows
            .iter()
            .map(|row| (row.idempotency_key.as_str(), row.status))
            .chain(
                self.refused
                    .iter()
                    .map(|key| (key.as_str(), RefundStatus::Rejected)),
            )
            .collect()
    }
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
    let refused = refused_keys(pool, prefix)
        .await
        .context("reading the kept refund refusals")?;
    let entries = gateway
        .refunds()
        .await
        .context("reading the gateway's refunds")?;
    Ok(RefundSources {
        entries,
        rows,
        overdrawn,
        refused,
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
        // The gateway's amounts are not ours to trust: a sum past i64 stays the
        // largest, still past any charge, instead of wrapping below it.
        let sum = refunded
            .entry(entry.payment_transaction_id.as_str())
            .or_default();
        *sum = sum.saturating_add(entry.amount_minor);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, txn: &str, amount: i64, status: ChargeStatus) -> RefundEntry {
        RefundEntry {
            idempotency_key: key.into(),
            transaction_id: txn.into(),
            payment_transaction_id: "txn_1".into(),
            amount_minor: amount,
            currency: "USD".into(),
            status,
            refunded_at: chrono::Utc::now(),
            attempts: 1,
            decline_code: None,
        }
    }

    fn row(key: &str, status: RefundStatus, txn: Option<&str>, amount: i64) -> RefundRow {
        RefundRow {
            id: uuid::Uuid::now_v7(),
            idempotency_key: key.into(),
            payment_key: "pay".into(),
            status,
            gateway_transaction_id: txn.map(str::to_owned),
            payment_transaction_id: Some("txn_1".into()),
            amount_minor: amount,
            currency: "USD".into(),
            stale: false,
        }
    }

    fn charge(amount: i64) -> LedgerEntry {
        LedgerEntry {
            idempotency_key: "pay".into(),
            transaction_id: "txn_1".into(),
            amount_minor: amount,
            currency: "USD".into(),
            status: ChargeStatus::Approved,
            charged_at: chrono::Utc::now(),
            attempts: 1,
            decline_code: None,
        }
    }

    fn reconciled(entries: Vec<RefundEntry>, rows: Vec<RefundRow>, charged: i64) -> AuditReport {
        let sources = RefundSources {
            entries,
            rows,
            overdrawn: Vec::new(),
            refused: Vec::new(),
        };
        let mut report = AuditReport::default();
        report_refunds(&mut report, &sources, "", &[charge(charged)]);
        report
    }

    #[test]
    fn refunded_and_declined_rows_recording_their_refunds_balance() {
        let report = reconciled(
            vec![
                entry("a", "r1", 40, ChargeStatus::Approved),
                entry("b", "r2", 60, ChargeStatus::Declined),
            ],
            vec![
                row("a", RefundStatus::Refunded, Some("r1"), 40),
                row("b", RefundStatus::Declined, Some("r2"), 60),
            ],
            100,
        );
        assert!(report.is_clean(), "{}", report.to_table());
        assert_eq!((report.refund_entries, report.refund_rows), (2, 2));
    }

    #[test]
    fn a_row_of_another_amount_is_wrong_on_both_sides_and_a_declined_refund_gives_nothing_back() {
        let report = reconciled(
            vec![
                entry("a", "r1", 80, ChargeStatus::Approved),
                // Declined: not counted against the charge.
                entry("b", "r2", 80, ChargeStatus::Declined),
            ],
            vec![
                row("a", RefundStatus::Refunded, Some("r1"), 70),
                row("b", RefundStatus::Declined, Some("r2"), 80),
            ],
            100,
        );
        assert_eq!(report.refunds_unbooked.keys(), ["a"]);
        assert_eq!(report.refund_rows_unbacked.keys(), ["a"]);
        assert_eq!(report.refunds_past_charge.count, 0);
    }

    #[test]
    fn approved_refunds_past_the_charge_are_caught_whatever_their_keys() {
        let report = reconciled(
            vec![
                entry("a", "r1", 60, ChargeStatus::Approved),
                entry("b", "r2", 60, ChargeStatus::Approved),
            ],
            vec![
                row("a", RefundStatus::Refunded, Some("r1"), 60),
                row("b", RefundStatus::Refunded, Some("r2"), 60),
            ],
            100,
        );
        assert_eq!(report.refunds_past_charge.keys(), ["pay"]);
        assert_eq!(report.violations(), 1);
    }
}
