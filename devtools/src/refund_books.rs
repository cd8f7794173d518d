//! The refund side of the books, read from the gateway alone: every refund made
//! against the charge it refunds, so no payment is refunded past its amount.

use std::collections::HashMap;

use payment_worker::gateway::{ChargeStatus, LedgerEntry, RefundEntry};

/// What the gateway refunded of what it charged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RefundBooks {
    /// Refunds made (approved).
    pub refunds: usize,
    /// Refunds the gateway declined.
    pub declined: usize,
    /// Minor units refunded, all currencies.
    pub refunded_minor: i64,
    /// Minor units of the approved charges, all currencies.
    pub charged_minor: i64,
    /// Charges refunded past their amount, or refunds of no approved charge.
    pub over_refunded: usize,
}

/// The refunds made against the approved charges of `ledger`.
pub fn refund_books(ledger: &[LedgerEntry], refunds: &[RefundEntry]) -> RefundBooks {
    let charged: HashMap<&str, i64> = ledger
        .iter()
        .filter(|entry| entry.status == ChargeStatus::Approved)
        .map(|entry| (entry.transaction_id.as_str(), entry.amount_minor))
        .collect();
    let mut books = RefundBooks {
        charged_minor: charged.values().sum(),
        ..RefundBooks::default()
    };
    let mut refunded: HashMap<&str, i64> = HashMap::new();
    for refund in refunds {
        if refund.status != ChargeStatus::Approved {
            books.declined += 1;
            continue;
        }
        books.refunds += 1;
        books.refunded_minor += refund.amount_minor;
        *refunded
            .entry(refund.payment_transaction_id.as_str())
            .or_default() += refund.amount_minor;
    }
    books.over_refunded = refunded
        .iter()
        .filter(|(payment, sum)| charged.get(*payment).is_none_or(|amount| **sum > *amount))
        .count();
    books
}

#[cfg(test)]
mod tests {
    use super::*;

    fn charge(txn: &str, amount_minor: i64, status: ChargeStatus) -> LedgerEntry {
        LedgerEntry {
            idempotency_key: format!("k-{txn}"),
            transaction_id: txn.into(),
            amount_minor,
            currency: "USD".into(),
            status,
            charged_at: chrono::Utc::now(),
            attempts: 1,
            decline_code: None,
        }
    }

    fn refund(payment: &str, amount_minor: i64, status: ChargeStatus) -> RefundEntry {
        RefundEntry {
            idempotency_key: format!("r-{payment}-{amount_minor}"),
            transaction_id: format!("re-{payment}-{amount_minor}"),
            payment_transaction_id: payment.into(),
            amount_minor,
            currency: "USD".into(),
            status,
            refunded_at: chrono::Utc::now(),
            attempts: 1,
            decline_code: None,
        }
    }

    #[test]
    fn refunds_up_to_the_charge_balance_and_past_it_do_not() {
        let ledger = [
            charge("t1", 100, ChargeStatus::Approved),
            charge("t2", 50, ChargeStatus::Approved),
            charge("t3", 70, ChargeStatus::Declined),
        ];
        let fine = refund_books(
            &ledger,
            &[
                refund("t1", 60, ChargeStatus::Approved),
                refund("t1", 40, ChargeStatus::Approved),
                refund("t2", 50, ChargeStatus::Declined),
            ],
        );
        assert_eq!(
            fine,
            RefundBooks {
                refunds: 2,
                declined: 1,
                refunded_minor: 100,
                charged_minor: 150,
                over_refunded: 0,
            }
        );
        let past = refund_books(
            &ledger,
            &[
                refund("t1", 60, ChargeStatus::Approved),
                refund("t1", 41, ChargeStatus::Approved),
                refund("t3", 1, ChargeStatus::Approved),
                refund("t9", 1, ChargeStatus::Approved),
            ],
        );
        assert_eq!(past.over_refunded, 3, "{past:?}");
    }
}
