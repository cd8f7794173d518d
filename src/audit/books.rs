//! The books: the gateway ledger against the `payments` rows. The one place that
//! decides whether a charge is booked; `audit`, the demo and the bench all read
//! their verdicts from [`reconcile`].

use std::collections::{BTreeMap, HashMap};

use crate::gateway::LedgerEntry;
use crate::payment::{BookedPayment, PaymentStatus};

/// What [`reconcile`] found, by key. Lists keep the ledger's key order (sorted)
/// and the rows' order, so reports come out the same on every run.
#[derive(Debug, Default)]
pub struct Books<'a> {
    /// Every ledger entry, grouped by idempotency key, keys sorted.
    pub charges: BTreeMap<&'a str, Vec<&'a LedgerEntry>>,
    /// Every row, by idempotency key.
    pub rows: HashMap<&'a str, &'a BookedPayment>,
    /// Keys the gateway charged more than once (I1).
    pub double_charged: Vec<&'a str>,
    /// Keys the gateway charged that have no row at all (I7).
    pub charged_without_row: Vec<&'a str>,
    /// Ledger entries no row records with their status and transaction id: those
    /// of `charged_without_row`, every extra charge of a key, and charges whose
    /// row says something else.
    pub unbooked_charges: usize,
    /// Final rows whose key the gateway never charged.
    pub rows_without_charge: Vec<&'a BookedPayment>,
    /// Final rows whose key was charged, but by no entry of the row's status and
    /// transaction id.
    pub rows_disagreeing: Vec<&'a BookedPayment>,
    /// Rows still `processing` (no charge recorded yet).
    pub rows_processing: Vec<&'a BookedPayment>,
}

impl Books<'_> {
    /// Rows that no ledger entry backs: without a charge, disagreeing, or still
    /// `processing` (which a finished run must not leave behind).
    pub fn rows_unbacked(&self) -> usize {
        self.rows_without_charge.len() + self.rows_disagreeing.len() + self.rows_processing.len()
    }

    /// Nothing charged twice, every charge booked, every row backed by a charge.
    pub fn balanced(&self) -> bool {
        self.double_charged.is_empty() && self.unbooked_charges == 0 && self.rows_unbacked() == 0
    }
}

/// Whether `entry` is what `row` records: the status the charge leads to and the
/// same transaction id.
fn records(row: &BookedPayment, entry: &LedgerEntry) -> bool {
    row.status == PaymentStatus::from(entry.status)
        && row.gateway_transaction_id.as_deref() == Some(entry.transaction_id.as_str())
}

/// Reconciles `ledger` against `rows` (both already narrowed to the keys in
/// question).
pub fn reconcile<'a>(ledger: &'a [LedgerEntry], rows: &'a [BookedPayment]) -> Books<'a> {
    let mut books = Books::default();
    for entry in ledger {
        books
            .charges
            .entry(entry.idempotency_key.as_str())
            .or_default()
            .push(entry);
    }
    books.rows = rows
        .iter()
        .map(|row| (row.idempotency_key.as_str(), row))
        .collect();
    for (key, entries) in &books.charges {
        if entries.len() > 1 {
            books.double_charged.push(key);
        }
        match books.rows.get(key) {
            None => {
                books.charged_without_row.push(key);
                books.unbooked_charges += entries.len();
            }
            Some(row) => {
                books.unbooked_charges += entries.iter().filter(|e| !records(row, e)).count();
            }
        }
    }
    for row in rows {
        if row.status == PaymentStatus::Processing {
            books.rows_processing.push(row);
            continue;
        }
        match books.charges.get(row.idempotency_key.as_str()) {
            None => books.rows_without_charge.push(row),
            Some(entries) if !entries.iter().any(|e| records(row, e)) => {
                books.rows_disagreeing.push(row)
            }
            Some(_) => {}
        }
    }
    books
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::ChargeStatus;

    fn entry(key: &str, txn: &str, status: ChargeStatus) -> LedgerEntry {
        LedgerEntry {
            idempotency_key: key.into(),
            transaction_id: txn.into(),
            amount_minor: 100,
            currency: "USD".into(),
            status,
            charged_at: chrono::Utc::now(),
            attempts: 1,
            decline_code: None,
        }
    }

    fn row(key: &str, status: PaymentStatus, txn: Option<&str>) -> BookedPayment {
        BookedPayment {
            idempotency_key: key.into(),
            status,
            gateway_transaction_id: txn.map(str::to_owned),
            stale: false,
        }
    }

    #[test]
    fn balanced_books_balance() {
        let ledger = [
            entry("a", "t1", ChargeStatus::Approved),
            entry("b", "t2", ChargeStatus::Declined),
        ];
        let rows = [
            row("a", PaymentStatus::Succeeded, Some("t1")),
            row("b", PaymentStatus::Declined, Some("t2")),
        ];
        assert!(reconcile(&ledger, &rows).balanced());
    }

    #[test]
    fn each_kind_of_disagreement_is_found_where_it_is() {
        let ledger = [
            entry("twice", "t1", ChargeStatus::Approved),
            entry("twice", "t2", ChargeStatus::Approved),
            entry("no-row", "t3", ChargeStatus::Approved),
            entry("other-status", "t4", ChargeStatus::Declined),
        ];
        let rows = [
            row("twice", PaymentStatus::Succeeded, Some("t1")),
            row("other-status", PaymentStatus::Succeeded, Some("t4")),
            row("no-charge", PaymentStatus::Succeeded, Some("t9")),
            row("in-flight", PaymentStatus::Processing, None),
        ];
        let books = reconcile(&ledger, &rows);
        assert_eq!(books.double_charged, ["twice"]);
        assert_eq!(books.charged_without_row, ["no-row"]);
        // t2 (extra), t3 (no row), t4 (row says succeeded).
        assert_eq!(books.unbooked_charges, 3);
        let keys = |rows: &[&BookedPayment]| -> Vec<String> {
            rows.iter().map(|r| r.idempotency_key.clone()).collect()
        };
        assert_eq!(keys(&books.rows_without_charge), ["no-charge"]);
        assert_eq!(keys(&books.rows_disagreeing), ["other-status"]);
        assert_eq!(keys(&books.rows_processing), ["in-flight"]);
        assert_eq!(books.rows_unbacked(), 3);
        assert!(!books.balanced());
    }
}
