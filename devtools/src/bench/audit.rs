//! The benchmark must never charge twice (I1) and must leave ledger = books (I7):
//! each phase's gateway ledger is reconciled against its payment rows.

use std::time::Duration;

use serde::Serialize;
use sqlx::PgPool;

use payment_worker::gateway::LedgerEntry;
use payment_worker::payment::{booked_payments, BookedPayment};

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
    /// Ledger entries without a row of the matching status and transaction id
    /// (`Books::unbooked_charges`).
    pub charges_without_row: usize,
    /// Rows no ledger entry backs (`Books::rows_unbacked`).
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

/// This phase's rows: those whose key starts with `key_prefix`.
pub async fn rows_with_prefix(
    pool: &PgPool,
    key_prefix: &str,
) -> anyhow::Result<Vec<BookedPayment>> {
    // The lease only marks stale `processing` rows, which the bench counts anyway.
    Ok(booked_payments(pool, key_prefix, Duration::ZERO).await?)
}

/// Reconciles one phase: its simulator's ledger against the rows of its keys
/// (`audit::reconcile`), and its commands against the results seen.
pub fn reconcile(
    ledger: &[LedgerEntry],
    rows: &[BookedPayment],
    commands: usize,
    answered: usize,
) -> AuditReport {
    let books = payment_worker::audit::reconcile(ledger, rows);
    let mut report = AuditReport {
        phases: 1,
        commands,
        unanswered: commands.saturating_sub(answered),
        charges: ledger.len(),
        rows: rows.len(),
        double_charged_keys: books.double_charged.len(),
        charges_without_row: books.unbooked_charges,
        rows_without_charge: books.rows_unbacked(),
        ok: false,
    };
    report.add(&AuditReport::default());
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use payment_worker::gateway::ChargeStatus;
    use payment_worker::payment::PaymentStatus;

    fn entry(key: &str, txn: &str) -> LedgerEntry {
        LedgerEntry {
            idempotency_key: key.into(),
            transaction_id: txn.into(),
            amount_minor: 100,
            currency: "USD".into(),
            status: ChargeStatus::Approved,
            charged_at: chrono::Utc::now(),
            attempts: 1,
            decline_code: None,
        }
    }

    fn row(key: &str, txn: &str) -> BookedPayment {
        BookedPayment {
            idempotency_key: key.into(),
            status: PaymentStatus::Succeeded,
            gateway_transaction_id: Some(txn.into()),
            stale: false,
        }
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
