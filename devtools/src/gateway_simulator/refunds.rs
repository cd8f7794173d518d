//! Refunds: every refund made, the refusals, and the decision for each
//! `POST /refunds` (fault, conflict, replay, refusal or new refund), taken under
//! the ledger's lock so a refund is checked against its charge and the charge's
//! other refunds atomically.

use rand::Rng as _;

use super::book::Book;
use super::ledger::{body_hash, Decision, Faults, Shared};
use payment_worker::gateway::{ChargeStatus, RefundEntry, RefundRequest};
use payment_worker::token::IdempotencyKey;

/// One refused `POST /refunds` (`GET /refund-refusals`): nothing was stored for
/// it, but tests must be able to tell that the worker asked for it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RefundRefusal {
    /// The key the refused request came with.
    pub idempotency_key: String,
    /// The charge it asked to refund.
    pub payment_transaction_id: String,
    /// The amount it asked for.
    pub amount_minor: i64,
    /// The error code answered (`charge_not_found`, `charge_not_refundable`,
    /// `currency_mismatch`, `amount_too_large`).
    pub reason: String,
}

/// The refunds of the ledger.
#[derive(Default)]
pub(super) struct RefundBook {
    refunds: Book<RefundEntry>,
    refusals: Vec<RefundRefusal>,
}

impl RefundBook {
    /// What the charge `transaction_id` has had refunded so far (approved only).
    fn refunded(&self, transaction_id: &str) -> i64 {
        self.refunds
            .iter()
            .filter(|entry| {
                entry.payment_transaction_id == transaction_id
                    && entry.status == ChargeStatus::Approved
            })
            .map(|entry| entry.amount_minor)
            .sum()
    }
}

impl Shared {
    /// Check and insert under one lock, so concurrent POSTs of one key refund
    /// once and two keys together never refund more than was charged.
    pub(super) fn decide_refund(&self, key: &IdempotencyKey, request: &RefundRequest) -> Decision {
        let config = &self.config;
        let amount = request.amount_minor.to_string();
        let hash = body_hash(&[&request.payment_transaction_id, &amount, &request.currency]);
        let mut guard = self.lock();
        let ledger = &mut *guard;
        let Faults {
            decline, delivery, ..
        } = match ledger.before_acting(config, key, hash, |ledger| &mut ledger.refunds.refunds) {
            Ok(faults) => faults,
            Err(decided) => return decided,
        };
        let refused = match ledger.charge_by_transaction(&request.payment_transaction_id) {
            None => Some(("charge_not_found", "no charge has this transaction id")),
            Some(charge) if charge.status != ChargeStatus::Approved => Some((
                "charge_not_refundable",
                "the charge was declined; nothing to refund",
            )),
            Some(charge) if charge.currency != request.currency => Some((
                "currency_mismatch",
                "a refund is made in the charge's currency",
            )),
            Some(charge)
                if ledger
                    .refunds
                    .refunded(&charge.transaction_id)
                    .saturating_add(request.amount_minor)
                    > charge.amount_minor =>
            {
                Some((
                    "amount_too_large",
                    "the refunds of this charge would exceed the amount charged",
                ))
            }
            Some(_) => None,
        };
        if let Some((code, message)) = refused {
            ledger.refunds.refusals.push(RefundRefusal {
                idempotency_key: key.as_str().to_owned(),
                payment_transaction_id: request.payment_transaction_id.clone(),
                amount_minor: request.amount_minor,
                reason: code.to_owned(),
            });
            tracing::debug!(idempotency_key = %key, reason = code, "gateway-sim refused a refund");
            return Decision::Refused {
                code,
                message: message.to_owned(),
            };
        }
        let status = if decline {
            ChargeStatus::Declined
        } else {
            ChargeStatus::Approved
        };
        let public = RefundEntry {
            idempotency_key: key.as_str().to_owned(),
            transaction_id: format!("rfd_{:032x}", ledger.rng.random::<u128>()),
            payment_transaction_id: request.payment_transaction_id.clone(),
            amount_minor: request.amount_minor,
            currency: request.currency.clone(),
            status,
            refunded_at: chrono::Utc::now(),
            attempts: 1,
            decline_code: None,
        };
        let charge = public.answer();
        ledger.refunds.refunds.insert(public, hash);
        tracing::debug!(
            idempotency_key = %key,
            transaction_id = %charge.transaction_id,
            status = ?charge.status,
            amount_minor = request.amount_minor,
            "gateway-sim refunded"
        );
        Decision::Answer { charge, delivery }
    }

    pub(super) fn lookup_refund(&self, key: &str) -> Option<RefundEntry> {
        self.lock().refunds.refunds.latest(key)
    }

    pub(super) fn refund_snapshot(&self, key: Option<&str>) -> Vec<RefundEntry> {
        self.lock().refunds.refunds.snapshot(key)
    }

    pub(super) fn refund_refusals(&self) -> Vec<RefundRefusal> {
        self.lock().refunds.refusals.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway_simulator::ledger::Delivery;
    use crate::gateway_simulator::SimulatorConfig;
    use payment_worker::gateway::{Charge, ChargeRequest};

    fn key(text: &str) -> IdempotencyKey {
        IdempotencyKey::try_from(text).unwrap()
    }

    /// A charge of `amount` USD, answered by `shared`, and its transaction id.
    fn charged(shared: &Shared, name: &str, amount: i64, method: &str) -> String {
        let request = ChargeRequest {
            amount_minor: amount,
            currency: "USD".into(),
            payment_method: method.into(),
            payment_id: None,
        };
        match shared.decide(&key(name), &request) {
            Decision::Answer { charge, .. } => charge.transaction_id,
            _ => panic!("the charge was not answered"),
        }
    }

    fn refund(of: &str, amount: i64, currency: &str) -> RefundRequest {
        RefundRequest {
            payment_transaction_id: of.into(),
            amount_minor: amount,
            currency: currency.into(),
            refund_id: None,
        }
    }

    fn answered(decision: Decision) -> (Charge, Delivery) {
        match decision {
            Decision::Answer { charge, delivery } => (charge, delivery),
            Decision::Refused { code, .. } => panic!("refused: {code}"),
            _ => panic!("not answered"),
        }
    }

    fn refused(decision: Decision) -> &'static str {
        match decision {
            Decision::Refused { code, .. } => code,
            _ => panic!("not refused"),
        }
    }

    #[test]
    fn one_key_refunds_once_and_another_body_is_a_conflict() {
        let shared = Shared::new(SimulatorConfig::default(), 1);
        let txn = charged(&shared, "c1", 1000, "pm_card_visa");
        let (first, _) = answered(shared.decide_refund(&key("r1"), &refund(&txn, 400, "USD")));
        let (again, _) = answered(shared.decide_refund(&key("r1"), &refund(&txn, 400, "USD")));
        assert_eq!(first, again);
        assert_eq!(first.status, ChargeStatus::Approved);
        let refunds = shared.refund_snapshot(None);
        assert_eq!(refunds.len(), 1);
        assert_eq!(refunds[0].attempts, 2);
        assert!(matches!(
            shared.decide_refund(&key("r1"), &refund(&txn, 401, "USD")),
            Decision::Conflict
        ));
        assert_eq!(
            shared.lookup_refund("r1").map(|e| e.amount_minor),
            Some(400)
        );
        assert!(shared.lookup_refund("r2").is_none());
    }

    #[test]
    fn refusals_store_nothing_and_are_listed() {
        let shared = Shared::new(SimulatorConfig::default(), 2);
        let txn = charged(&shared, "c1", 1000, "pm_card_visa");
        let declined = charged(&shared, "c2", 1000, "pm_card_declined");
        answered(shared.decide_refund(&key("r1"), &refund(&txn, 600, "USD")));
        let over = refund(&txn, 401, "USD");
        assert_eq!(
            refused(shared.decide_refund(&key("r2"), &over)),
            "amount_too_large"
        );
        assert_eq!(
            refused(shared.decide_refund(&key("r3"), &refund(&txn, 100, "EUR"))),
            "currency_mismatch"
        );
        assert_eq!(
            refused(shared.decide_refund(&key("r4"), &refund(&declined, 100, "USD"))),
            "charge_not_refundable"
        );
        assert_eq!(
            refused(shared.decide_refund(&key("r5"), &refund("txn_nope", 100, "USD"))),
            "charge_not_found"
        );
        // What is left can still be refunded, to the last cent.
        answered(shared.decide_refund(&key("r6"), &refund(&txn, 400, "USD")));
        assert_eq!(shared.refund_snapshot(None).len(), 2);
        assert!(shared.lookup_refund("r2").is_none());
        let refusals = shared.refund_refusals();
        let reasons: Vec<_> = refusals.iter().map(|r| r.reason.as_str()).collect();
        assert_eq!(
            reasons,
            [
                "amount_too_large",
                "currency_mismatch",
                "charge_not_refundable",
                "charge_not_found"
            ]
        );
        assert_eq!(refusals[0].idempotency_key, "r2");
        assert_eq!(refusals[0].amount_minor, 401);
        assert_eq!(refusals[0].payment_transaction_id, txn);
    }

    #[test]
    fn faults_apply_to_refunds() {
        let failing = Shared::new(
            SimulatorConfig {
                error_rate: 1.0,
                ..SimulatorConfig::default()
            },
            3,
        );
        // No charge can be made on a failing simulator: the 503 comes first,
        // whatever the refund asks for.
        let txn = "txn_any";
        assert!(matches!(
            failing.decide_refund(&key("r1"), &refund(txn, 100, "USD")),
            Decision::Unavailable
        ));
        assert!(failing.refund_snapshot(None).is_empty());

        let config = |timeout: f64, five_xx: f64, decline: f64| SimulatorConfig {
            timeout_after_charge_rate: timeout,
            five_xx_after_charge_rate: five_xx,
            decline_rate: decline,
            ..SimulatorConfig::default()
        };
        let late = Shared::new(config(1.0, 0.0, 0.0), 4);
        let txn = charged(&late, "c1", 1000, "pm_card_visa");
        let (_, delivery) = answered(late.decide_refund(&key("r1"), &refund(&txn, 100, "USD")));
        assert_eq!(delivery, Delivery::Late);
        assert_eq!(late.refund_snapshot(None).len(), 1, "refunded, then late");

        let failed = Shared::new(config(0.0, 1.0, 0.0), 5);
        let txn = charged(&failed, "c1", 1000, "pm_card_visa");
        let (_, delivery) = answered(failed.decide_refund(&key("r1"), &refund(&txn, 100, "USD")));
        assert!(matches!(delivery, Delivery::FailedAfterCharge(502 | 504)));
        assert_eq!(failed.refund_snapshot(None).len(), 1, "refunded, then 5xx");

        // Half of charges and refunds declined: find an approved charge, then
        // refund it a cent at a time; some refunds are declined, and those do not
        // count against what is left.
        let declining = Shared::new(config(0.0, 0.0, 0.5), 6);
        let txn = (0..40)
            .map(|i| charged(&declining, &format!("c{i}"), 1000, "pm_card_visa"))
            .find(|txn| {
                declining
                    .lock()
                    .charge_by_transaction(txn)
                    .is_some_and(|charge| charge.status == ChargeStatus::Approved)
            })
            .unwrap();
        let statuses: Vec<_> = (0..40)
            .map(|i| {
                let (answer, _) = answered(
                    declining.decide_refund(&key(&format!("r{i}")), &refund(&txn, 1, "USD")),
                );
                answer.status
            })
            .collect();
        assert!(statuses.contains(&ChargeStatus::Declined));
        assert!(statuses.contains(&ChargeStatus::Approved));
        let refunds = declining.refund_snapshot(None);
        assert_eq!(
            refunds.len(),
            40,
            "a declined refund is stored and replayed"
        );
    }

    #[test]
    fn without_idempotency_every_post_refunds_until_nothing_is_left() {
        let shared = Shared::new(
            SimulatorConfig {
                ignore_idempotency_key: true,
                ..SimulatorConfig::default()
            },
            7,
        );
        let txn = charged(&shared, "c1", 1000, "pm_card_visa");
        answered(shared.decide_refund(&key("r1"), &refund(&txn, 500, "USD")));
        answered(shared.decide_refund(&key("r1"), &refund(&txn, 500, "USD")));
        assert_eq!(
            refused(shared.decide_refund(&key("r1"), &refund(&txn, 500, "USD"))),
            "amount_too_large"
        );
        assert_eq!(shared.refund_snapshot(Some("r1")).len(), 2);
    }
}
