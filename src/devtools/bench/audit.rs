//! The benchmark must never charge twice (I1) and must leave ledger = books (I7):
//! each phase's gateway ledger is reconciled against its payment rows.

use std::collections::{HashMap, HashSet};

use serde::Serialize;
use sqlx::PgPool;

use crate::gateway::{ChargeStatus, LedgerEntry};

#[derive(Debug, Clone, Default, Serialize)]
pub struct AuditReport {
    pub phases: usize,
    pub commands: usize,
    /// Commands without any result record (I2).
    pub unanswered: usize,
    pub charges: usize,
    pub rows: usize,
    /// Keys with more than one ledger entry (I1).
    pub double_charged_keys: usize,
    /// Ledger entries without a row of the matching status and transaction id.
    pub charges_without_row: usize,
    /// Rows whose key and transaction id are not in the ledger.
    pub rows_without_charge: usize,
    pub ok: bool,
}

impl AuditReport {
    pub fn add(&mut self, other: &AuditReport) {
        self.phases += other.phases;
        self.commands += other.commands;
        self.unanswered += other.unanswered;
        self.charges += other.charges;
        self.rows += other.rows;
        self.double_charged_keys += other.double_charged_keys;
        self.charges_without_row += other.charges_without_row;
        self.rows_without_charge += other.rows_without_charge;
        self.ok = self.unanswered == 0
            && self.double_charged_keys == 0
            && self.charges_without_row == 0
            && self.rows_without_charge == 0;
    }
}

/// (idempotency key, status, gateway transaction id)
pub type Row = (String, String, Option<String>);

pub async fn rows_with_prefix(pool: &PgPool, key_prefix: &str) -> anyhow::Result<Vec<Row>> {
    Ok(sqlx::query_as(
        "SELECT idempotency_key, status, gateway_transaction_id FROM payments
         WHERE starts_with(idempotency_key, $1)",
    )
    .bind(key_prefix)
    .fetch_all(pool)
    .await?)
}

/// Reconciles one phase: its simulator's ledger against the rows of its keys.
pub fn reconcile(
    ledger: &[LedgerEntry],
    rows: &[Row],
    commands: usize,
    answered: usize,
) -> AuditReport {
    let mut per_key: HashMap<&str, usize> = HashMap::new();
    for entry in ledger {
        *per_key.entry(entry.idempotency_key.as_str()).or_default() += 1;
    }
    let by_key: HashMap<&str, (&str, Option<&str>)> = rows
        .iter()
        .map(|(k, s, t)| (k.as_str(), (s.as_str(), t.as_deref())))
        .collect();
    let charged: HashSet<(&str, &str)> = ledger
        .iter()
        .map(|e| (e.idempotency_key.as_str(), e.transaction_id.as_str()))
        .collect();
    let charges_without_row = ledger
        .iter()
        .filter(|entry| {
            let expected = match entry.status {
                ChargeStatus::Approved => "succeeded",
                ChargeStatus::Declined => "declined",
            };
            by_key.get(entry.idempotency_key.as_str())
                != Some(&(expected, Some(entry.transaction_id.as_str())))
        })
        .count();
    let rows_without_charge = rows
        .iter()
        .filter(|(key, _, txn)| match txn {
            Some(txn) => !charged.contains(&(key.as_str(), txn.as_str())),
            None => true,
        })
        .count();
    let mut report = AuditReport {
        phases: 1,
        commands,
        unanswered: commands.saturating_sub(answered),
        charges: ledger.len(),
        rows: rows.len(),
        double_charged_keys: per_key.values().filter(|n| **n > 1).count(),
        charges_without_row,
        rows_without_charge,
        ok: false,
    };
    report.add(&AuditReport::default());
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, txn: &str) -> LedgerEntry {
        LedgerEntry {
            idempotency_key: key.into(),
            transaction_id: txn.into(),
            amount_minor: 100,
            currency: "USD".into(),
            status: ChargeStatus::Approved,
            charged_at: chrono::Utc::now(),
            attempts: 1,
        }
    }

    fn row(key: &str, txn: &str) -> Row {
        (key.into(), "succeeded".into(), Some(txn.into()))
    }

    #[test]
    fn balanced_books_pass() {
        let report = reconcile(
            &[entry("a", "t1"), entry("b", "t2")],
            &[row("a", "t1"), row("b", "t2")],
            2,
            2,
        );
        assert!(report.ok, "{report:?}");
    }

    #[test]
    fn a_second_charge_for_a_key_fails() {
        let report = reconcile(
            &[entry("a", "t1"), entry("a", "t9")],
            &[row("a", "t1")],
            1,
            1,
        );
        assert_eq!(report.double_charged_keys, 1);
        assert_eq!(report.charges_without_row, 1, "t9 has no row");
        assert!(!report.ok);
    }

    #[test]
    fn a_row_without_a_charge_or_a_lost_command_fails() {
        let report = reconcile(&[entry("a", "t1")], &[row("a", "t1"), row("b", "t2")], 2, 2);
        assert_eq!(report.rows_without_charge, 1);
        assert!(!report.ok);
        let report = reconcile(&[entry("a", "t1")], &[row("a", "t1")], 2, 1);
        assert_eq!(report.unanswered, 1);
        assert!(!report.ok);
    }

    #[test]
    fn a_row_with_another_transaction_id_fails() {
        let report = reconcile(&[entry("a", "t1")], &[row("a", "t2")], 1, 1);
        assert_eq!(
            (report.charges_without_row, report.rows_without_charge),
            (1, 1)
        );
        assert!(!report.ok);
    }
}
