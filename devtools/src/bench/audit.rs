//! The benchmark must never charge twice (I1) and must leave ledger = books (I7):
//! each phase's gateway ledger is reconciled against its payment rows.

use std::time::Duration;

use serde::Serialize;
use sqlx::PgPool;

use crate::refund_books::RefundBooks;
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
    /// Refunds the workload meant to be made.
    pub refunds_expected: usize,
    /// Refunds the gateway made.
    pub refunds: usize,
    /// Charges refunded past their amount, or refunds of no charge.
    pub over_refunded: usize,
    /// Refund requests the gateway refused (the worker asked for too much).
    pub refund_refusals: usize,
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
        self.refunds_expected += other.refunds_expected;
        self.refunds += other.refunds;
        self.over_refunded += other.over_refunded;
        self.refund_refusals += other.refund_refusals;
        self.ok = self.unanswered == 0
            && self.double_charged_keys == 0
            && self.charges_without_row == 0
            && self.rows_without_charge == 0
            && self.refunds == self.refunds_expected
            && self.over_refunded == 0
            && self.refund_refusals == 0;
    }

    /// The phase's refunds: made by the gateway (`books`) against what the
    /// workload meant (`expected`), and the requests the gateway refused.
    pub fn with_refunds(mut self, books: RefundBooks, expected: usize, refusals: usize) -> Self {
        self.refunds_expected = expected;
        self.refunds = books.refunds;
        self.over_refunded = books.over_refunded;
        self.refund_refusals = refusals;
        self.add(&AuditReport::default());
        self
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
        // Filled by `with_refunds` for a phase with refunds.
        ..AuditReport::default()
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
    fn a_refund_missing_past_its_charge_or_refused_fails() {
        let balanced = || reconcile(&[entry("a", "t1")], &[row("a", "t1")], 3, 3);
        let books = |refunds, over_refunded| RefundBooks {
            refunds,
            over_refunded,
            ..RefundBooks::default()
        };
        assert!(balanced().with_refunds(books(2, 0), 2, 0).ok);
        assert!(
            !balanced().with_refunds(books(1, 0), 2, 0).ok,
            "one refund missing"
        );
        assert!(
            !balanced().with_refunds(books(2, 1), 2, 0).ok,
            "past its charge"
        );
        let refused = balanced().with_refunds(books(2, 0), 2, 1);
        assert!(!refused.ok);
        let mut run = AuditReport::default();
        run.add(&refused);
        assert_eq!((run.refund_refusals, run.ok), (1, false));
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
