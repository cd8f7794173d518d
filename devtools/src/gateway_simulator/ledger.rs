//! The ledger: every charge made, and the decision for each POST (fault, conflict,
//! replay or new charge) taken under one lock.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use sha2::{Digest as _, Sha256};

use super::book::{Book, Booked};
use super::refunds::RefundBook;
use super::SimulatorConfig;
use payment_worker::gateway::{Charge, ChargeRequest, ChargeStatus, LedgerEntry};
use payment_worker::token::IdempotencyKey;

/// A payment method the simulator always declines, whatever `--decline-rate` says.
const DECLINED_PAYMENT_METHOD: &str = "pm_card_declined";

/// Charges and refunds under one lock: a refund is checked against its charge and
/// the charge's other refunds, and the fault draws come from one RNG.
pub(super) struct Ledger {
    charges: Book<LedgerEntry>,
    pub(super) refunds: RefundBook,
    pub(super) rng: StdRng,
}

/// What every request handler shares: the fault settings and the ledger.
pub(super) struct Shared {
    pub(super) config: SimulatorConfig,
    /// Key → how long its answer is held back (`--slow-key`).
    pub(super) slow_keys: HashMap<String, Duration>,
    ledger: Mutex<Ledger>,
    /// The trace context headers (`traceparent`, `tracestate`, `baggage`, as sent)
    /// of the first POST per key, so tests can see what of the trace context reaches
    /// the gateway (in process only; not part of the HTTP API).
    trace_headers: Mutex<HashMap<String, Vec<(String, String)>>>,
}

pub(super) enum Decision {
    Unavailable,
    Conflict,
    /// Refused for good, nothing stored (refunds only): `{"error": code}` with 400.
    Refused {
        code: &'static str,
        message: String,
    },
    Answer {
        charge: Charge,
        delivery: Delivery,
    },
}

/// The faults drawn for one POST.
pub(super) struct Faults {
    /// Answer 503 without acting (`--error-rate`).
    pub(super) fail: bool,
    /// Decline a new charge or refund (`--decline-rate`).
    pub(super) decline: bool,
    pub(super) delivery: Delivery,
}

/// How the answer to a POST that charged (or found its charge) is delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Delivery {
    /// At once (after `--slow-key`'s delay, if any).
    OnTime,
    /// After `--late-by-ms` more (`--timeout-after-charge-rate`).
    Late,
    /// Replaced by this 5xx (`--5xx-after-charge-rate`): the charge stands, the
    /// client is told the request failed.
    FailedAfterCharge(u16),
}

/// Length-prefixed, so no two different bodies hash alike by shifting characters
/// between fields.
pub(super) fn body_hash(parts: &[&str]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    hasher.finalize().into()
}

impl Ledger {
    /// The same draws on every POST (charge or refund), so a seeded run replays
    /// the same faults for the same sequence of requests.
    pub(super) fn draw_faults(&mut self, config: &SimulatorConfig) -> Faults {
        let fail = self.rng.random::<f64>() < config.error_rate;
        let decline = self.rng.random::<f64>() < config.decline_rate;
        let late = self.rng.random::<f64>() < config.timeout_after_charge_rate;
        // Drawn only when asked for, so the runs seeded before this fault existed
        // still draw the same faults and transaction ids.
        let failed_after = if config.five_xx_after_charge_rate > 0.0 {
            let draw = self.rng.random::<f64>();
            (draw < config.five_xx_after_charge_rate).then(|| {
                if draw < config.five_xx_after_charge_rate / 2.0 {
                    502
                } else {
                    504
                }
            })
        } else {
            None
        };
        let delivery = match (failed_after, late) {
            (Some(status), _) => Delivery::FailedAfterCharge(status),
            (None, true) => Delivery::Late,
            (None, false) => Delivery::OnTime,
        };
        Faults {
            fail,
            decline,
            delivery,
        }
    }

    /// The faults drawn for a POST of `key`, or its decision already: an
    /// injected 503, or the replay of what `key` made in `book`.
    pub(super) fn before_acting<P: Booked>(
        &mut self,
        config: &SimulatorConfig,
        key: &IdempotencyKey,
        body_hash: [u8; 32],
        book: fn(&mut Self) -> &mut Book<P>,
    ) -> Result<Faults, Decision> {
        let faults = self.draw_faults(config);
        if faults.fail {
            return Err(Decision::Unavailable);
        }
        if !config.ignore_idempotency_key {
            if let Some(replayed) = book(self).replay(key.as_str(), body_hash, faults.delivery) {
                return Err(replayed);
            }
        }
        Ok(faults)
    }

    /// The charge whose gateway id is `transaction_id` (its latest entry when
    /// `--ignore-idempotency-key` made several under one key).
    pub(super) fn charge_by_transaction(&self, transaction_id: &str) -> Option<&LedgerEntry> {
        self.charges
            .iter()
            .find(|entry| entry.transaction_id == transaction_id)
    }
}

impl Shared {
    /// An empty ledger whose faults are drawn from `seed`.
    pub(super) fn new(config: SimulatorConfig, seed: u64) -> Self {
        let slow_keys = config
            .slow_keys
            .iter()
            .map(|slow| (slow.key.as_str().to_owned(), slow.delay))
            .collect();
        Self {
            slow_keys,
            ledger: Mutex::new(Ledger {
                charges: Book::default(),
                refunds: RefundBook::default(),
                rng: StdRng::seed_from_u64(seed),
            }),
            trace_headers: Mutex::new(HashMap::new()),
            config,
        }
    }

    /// Keeps the trace context headers of the first POST for `key`.
    pub(super) fn remember_trace_headers(
        &self,
        key: &IdempotencyKey,
        headers: Vec<(String, String)>,
    ) {
        let mut seen = self
            .trace_headers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        seen.entry(key.as_str().to_owned()).or_insert(headers);
    }

    pub(super) fn trace_headers_of(&self, key: &str) -> Vec<(String, String)> {
        let seen = self
            .trace_headers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        seen.get(key).cloned().unwrap_or_default()
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Ledger> {
        // Nothing panics while holding the lock; if something did, the ledger is
        // still consistent (every mutation is a single push/insert/increment).
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Check and insert under one lock, so concurrent POSTs of one key charge once.
    pub(super) fn decide(&self, key: &IdempotencyKey, request: &ChargeRequest) -> Decision {
        let config = &self.config;
        let amount = request.amount_minor.to_string();
        let hash = body_hash(&[&amount, &request.currency, &request.payment_method]);
        let mut guard = self.lock();
        let ledger = &mut *guard;
        let Faults {
            decline, delivery, ..
        } = match ledger.before_acting(config, key, hash, |ledger| &mut ledger.charges) {
            Ok(faults) => faults,
            Err(decided) => return decided,
        };
        let status = if request.payment_method == DECLINED_PAYMENT_METHOD || decline {
            ChargeStatus::Declined
        } else {
            ChargeStatus::Approved
        };
        let transaction_id = format!("txn_{:032x}", ledger.rng.random::<u128>());
        let public = LedgerEntry {
            idempotency_key: key.as_str().to_owned(),
            transaction_id,
            amount_minor: request.amount_minor,
            currency: request.currency.clone(),
            status,
            charged_at: chrono::Utc::now(),
            attempts: 1,
            decline_code: None,
        };
        let charge = public.charge();
        ledger.charges.insert(public, hash);
        tracing::debug!(
            idempotency_key = %key,
            transaction_id = %charge.transaction_id,
            status = ?charge.status,
            amount_minor = request.amount_minor,
            currency = %request.currency,
            "gateway-sim charged"
        );
        Decision::Answer { charge, delivery }
    }

    pub(super) fn lookup(&self, key: &str) -> Option<LedgerEntry> {
        self.lock().charges.latest(key)
    }

    pub(super) fn snapshot(&self, key: Option<&str>) -> Vec<LedgerEntry> {
        self.lock().charges.snapshot(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_5xx_after_charge_still_charges_once_and_answers_502_or_504() {
        let config = SimulatorConfig {
            five_xx_after_charge_rate: 1.0,
            ..SimulatorConfig::default()
        };
        let shared = Shared::new(config, 7);
        let request = ChargeRequest {
            amount_minor: 100,
            currency: "USD".into(),
            payment_method: "pm_card_visa".into(),
            payment_id: None,
        };
        let mut statuses = std::collections::HashSet::new();
        for i in 0..40 {
            let key = IdempotencyKey::try_from(format!("k{}", i % 4)).unwrap();
            match shared.decide(&key, &request) {
                Decision::Answer {
                    delivery: Delivery::FailedAfterCharge(status),
                    ..
                } => {
                    statuses.insert(status);
                }
                _ => panic!("every POST charges, then fails"),
            }
        }
        assert_eq!(statuses, [502, 504].into_iter().collect());
        let ledger = shared.snapshot(None);
        assert_eq!(ledger.len(), 4, "one charge per key");
        assert!(ledger.iter().all(|e| e.attempts == 10));
    }

    #[test]
    fn seeded_runs_are_reproducible() {
        let config = SimulatorConfig {
            decline_rate: 0.5,
            seed: Some(42),
            ..SimulatorConfig::default()
        };
        let run = || {
            let shared = Shared::new(config.clone(), 42);
            (0..20)
                .map(|i| {
                    let key = IdempotencyKey::try_from(format!("k{i}")).unwrap();
                    let request = ChargeRequest {
                        amount_minor: 100,
                        currency: "USD".into(),
                        payment_method: "pm_card_visa".into(),
                        payment_id: None,
                    };
                    match shared.decide(&key, &request) {
                        Decision::Answer { charge, .. } => charge,
                        _ => panic!("unexpected decision"),
                    }
                })
                .collect::<Vec<_>>()
        };
        let first = run();
        assert_eq!(first, run());
        assert!(first.iter().any(|c| c.status == ChargeStatus::Declined));
        assert!(first.iter().any(|c| c.status == ChargeStatus::Approved));
    }
}
