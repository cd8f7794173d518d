//! Refunds of a generated workload's charges: for a share of the valid charges
//! that the simulator approves, refund commands keyed by the payment's key (the
//! same partition as the charge, so each follows its charge), mostly partial, some
//! full, a few pairs that together exceed the charge, and exact repeats of some.

use std::collections::HashSet;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::workload::{RecordKind, WorkloadRecord};
use crate::payment::{Command, RefundCommand};

/// Of the refunded payments, the share refunded in full.
const FULL_SHARE: f64 = 0.2;
/// Of the refunded payments, the share sent two refunds of 60 % each: the second
/// would take back more than was charged and must be refused.
const EXCEEDING_SHARE: f64 = 0.1;
/// Of the refunds that should be made, the share sent a second time exactly.
const REPEATED_SHARE: f64 = 0.2;
/// The payment method the simulator always declines (nothing to refund).
const DECLINED_METHOD: &str = "pm_card_declined";

/// What a generated refund is meant to be answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RefundExpectation {
    /// Refunds that should be made (`refunded`).
    pub refunded: usize,
    /// Refunds that would take back more than is left (`refund_exceeds_charge`).
    pub exceeding: usize,
    /// Exact repeats of a refund (`duplicate`).
    pub repeated: usize,
    /// Minor units the refunds that should be made give back, all currencies.
    pub refunded_minor: i64,
}

/// A charge of the workload that can be refunded.
struct Refundable {
    key: String,
    amount_minor: i64,
    currency: String,
}

/// The valid charges of `records` that the simulator approves, once per key.
fn refundable(records: &[WorkloadRecord]) -> Vec<Refundable> {
    let mut seen = HashSet::new();
    records
        .iter()
        .filter(|record| record.kind == RecordKind::Valid)
        .filter_map(|record| {
            let value = record.value.as_deref()?;
            let Ok(Command::Charge(charge)) = Command::parse(value) else {
                return None;
            };
            let json: serde_json::Value = serde_json::from_slice(value).ok()?;
            let method = json.get("payment_method").and_then(|m| m.as_str());
            (method != Some(DECLINED_METHOD)).then(|| Refundable {
                key: charge.idempotency_key.as_str().to_owned(),
                amount_minor: charge.amount_minor,
                currency: charge.currency.clone(),
            })
        })
        .filter(|charge| seen.insert(charge.key.clone()))
        .collect()
}

/// The refund record `<prefix>-rf-<n>` of `amount_minor` of `charge`, keyed by the
/// payment's key; `None` when the worker would refuse it (an unusable prefix).
fn refund_record(
    prefix: &str,
    n: usize,
    charge: &Refundable,
    amount_minor: i64,
) -> Option<WorkloadRecord> {
    // `-rf-` is no longer than `-bad-`, which `produce` checks a prefix against.
    let key = format!("{prefix}-rf-{n:06}");
    RefundCommand::new(
        &key,
        &charge.key,
        amount_minor,
        &charge.currency,
        Some("generated"),
    )
    .ok()?;
    let value = serde_json::json!({
        "type": "refund",
        "idempotency_key": key,
        "payment_idempotency_key": charge.key,
        "amount_minor": amount_minor,
        "currency": charge.currency,
        "reason": "generated",
    });
    Some(WorkloadRecord {
        kind: RecordKind::Refund,
        key: Some(charge.key.clone().into_bytes()),
        value: Some(value.to_string().into_bytes()),
        partition_hint: None,
    })
}

/// The amounts refunded of a charge of `amount_minor`: half (most), all of it, or
/// 60 % twice (the pair exceeds the charge for every amount, the first alone never).
fn refund_amounts(rng: &mut StdRng, amount_minor: i64) -> Vec<i64> {
    let roll: f64 = rng.random();
    if roll < EXCEEDING_SHARE {
        let most = (amount_minor * 3 + 4) / 5;
        vec![most, most]
    } else if roll < EXCEEDING_SHARE + FULL_SHARE {
        vec![amount_minor]
    } else {
        vec![(amount_minor / 2).max(1)]
    }
}

/// Refund records for a share `share` (0 to 1) of the valid, approved charges of
/// `records`, to be published after them: keyed by the payment's key, refund keys
/// `<prefix>-rf-000000`, … The same records, share, seed and prefix give the same
/// refunds.
pub fn refunds_for(
    records: &[WorkloadRecord],
    share: f64,
    seed: u64,
    prefix: &str,
) -> Vec<WorkloadRecord> {
    let mut rng = StdRng::seed_from_u64(seed);
    let share = if share.is_finite() {
        share.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let mut refunds = Vec::new();
    let mut n = 0;
    for charge in refundable(records) {
        if !rng.random_bool(share) {
            continue;
        }
        let amounts = refund_amounts(&mut rng, charge.amount_minor);
        let exceeding = amounts.len() > 1;
        for (i, amount) in amounts.into_iter().enumerate() {
            let Some(refund) = refund_record(prefix, n, &charge, amount) else {
                continue;
            };
            n += 1;
            // Only a refund that is made is repeated: the repeat of a refused one
            // would be answered as the worker's policy on refusals says, which is
            // not what this workload is about.
            let repeat = !(exceeding && i == 1) && rng.random_bool(REPEATED_SHARE);
            let copy = repeat.then(|| WorkloadRecord {
                kind: RecordKind::Duplicate,
                ..refund.clone()
            });
            refunds.push(refund);
            refunds.extend(copy);
        }
    }
    refunds
}

/// What the refunds of [`refunds_for`] should be answered, read from the records
/// themselves: the second refund of a payment whose refunds sum past its charge
/// is the one refused.
pub fn expected_refunds(
    charges: &[WorkloadRecord],
    refunds: &[WorkloadRecord],
) -> RefundExpectation {
    let charged: std::collections::HashMap<String, i64> = refundable(charges)
        .into_iter()
        .map(|charge| (charge.key, charge.amount_minor))
        .collect();
    let mut refunded_of: std::collections::HashMap<String, i64> = Default::default();
    let mut expected = RefundExpectation::default();
    for record in refunds {
        if record.kind == RecordKind::Duplicate {
            expected.repeated += 1;
            continue;
        }
        let Some(Ok(Command::Refund(refund))) = record.value.as_deref().map(Command::parse) else {
            continue;
        };
        let payment = refund.payment_key.as_str();
        let left = charged.get(payment).copied().unwrap_or(0)
            - refunded_of.get(payment).copied().unwrap_or(0);
        if refund.amount_minor <= left {
            *refunded_of.entry(payment.to_owned()).or_default() += refund.amount_minor;
            expected.refunded += 1;
            expected.refunded_minor += refund.amount_minor;
        } else {
            expected.exceeding += 1;
        }
    }
    expected
}

/// The first charges of `charges` and their refunds, `total` records in all (when
/// `charges` has that many): the refunds take the place of the last charges, whose
/// refunds are left out with them. Charges first, then refunds, in their order.
pub fn fit_refunds(
    charges: &[WorkloadRecord],
    refunds: &[WorkloadRecord],
    total: usize,
) -> Vec<WorkloadRecord> {
    let first_index = |key: &[u8]| {
        charges
            .iter()
            .position(|record| record.key.as_deref() == Some(key))
            .unwrap_or(usize::MAX)
    };
    let payment_of: Vec<usize> = refunds
        .iter()
        .map(|refund| refund.key.as_deref().map_or(usize::MAX, first_index))
        .collect();
    let refunds_within = |kept: usize| payment_of.iter().filter(|p| **p < kept).count();
    // The most charges whose own refunds still fit; the charges after them fill
    // the few places left (fewer than one payment's refunds).
    let mut with_refunds = total.min(charges.len());
    while with_refunds > 0 && with_refunds + refunds_within(with_refunds) > total {
        with_refunds -= 1;
    }
    let kept_refunds = refunds_within(with_refunds);
    let kept_charges = (total - kept_refunds).min(charges.len());
    let mut out: Vec<WorkloadRecord> = charges[..kept_charges].to_vec();
    out.extend(
        refunds
            .iter()
            .zip(&payment_of)
            .filter(|(_, p)| **p < with_refunds)
            .map(|(r, _)| r.clone()),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::{generate, WorkloadSpec};

    fn charges(seed: u64, count: usize) -> Vec<WorkloadRecord> {
        generate(
            &WorkloadSpec {
                count,
                duplicate_ratio: 0.2,
                invalid_ratio: 0.05,
                decline_ratio: 0.1,
                seed,
            },
            "ord-2026",
        )
    }

    fn parsed(record: &WorkloadRecord) -> RefundCommand {
        match record.value.as_deref().map(Command::parse) {
            Some(Ok(Command::Refund(refund))) => refund,
            other => panic!("not a refund: {other:?}"),
        }
    }

    #[test]
    fn refunds_follow_their_approved_charges_and_are_deterministic() {
        let charges = charges(7, 2000);
        let refunds = refunds_for(&charges, 0.3, 11, "ord-2026");
        assert_eq!(
            refunds_for(&charges, 0.3, 11, "ord-2026").len(),
            refunds.len()
        );
        let values = |r: &[WorkloadRecord]| r.iter().map(|x| x.value.clone()).collect::<Vec<_>>();
        assert_eq!(
            values(&refunds_for(&charges, 0.3, 11, "ord-2026")),
            values(&refunds)
        );
        assert_ne!(
            values(&refunds_for(&charges, 0.3, 12, "ord-2026")),
            values(&refunds)
        );
        let approved = refundable(&charges);
        for record in &refunds {
            let refund = parsed(record);
            // Keyed by the payment: the same partition as the charge.
            assert_eq!(
                record.key.as_deref(),
                Some(refund.payment_key.as_str().as_bytes())
            );
            assert_eq!(record.partition_hint, None);
            let charge = approved
                .iter()
                .find(|c| c.key == refund.payment_key.as_str())
                .expect("a refund of an approved, valid charge");
            assert_eq!(refund.currency, charge.currency);
            assert!(refund.amount_minor <= charge.amount_minor);
        }
        let share = refunds
            .iter()
            .filter(|r| r.kind == RecordKind::Refund)
            .count() as f64
            / approved.len() as f64;
        assert!((0.25..0.45).contains(&share), "{share}");
    }

    #[test]
    fn refunds_are_mostly_partial_some_full_some_exceeding_some_repeated() {
        let charges = charges(3, 3000);
        let refunds = refunds_for(&charges, 0.5, 5, "ord-2026");
        let approved = refundable(&charges);
        let amount_of = |key: &str| {
            approved
                .iter()
                .find(|c| c.key == key)
                .map(|c| c.amount_minor)
        };
        let (mut partial, mut full) = (0, 0);
        for record in refunds.iter().filter(|r| r.kind == RecordKind::Refund) {
            let refund = parsed(record);
            match amount_of(refund.payment_key.as_str()) {
                Some(a) if refund.amount_minor == a => full += 1,
                Some(a) if refund.amount_minor == (a / 2).max(1) => partial += 1,
                _ => {}
            }
        }
        let expected = expected_refunds(&charges, &refunds);
        assert!(
            partial > full && full > expected.exceeding,
            "{partial} {full} {expected:?}"
        );
        assert!(
            expected.exceeding > 0 && expected.repeated > 0,
            "{expected:?}"
        );
        assert_eq!(
            expected.refunded + expected.exceeding + expected.repeated,
            refunds.len()
        );
        // A repeat is an exact copy of the refund just before it, which is made.
        for pair in refunds.windows(2) {
            if pair[1].kind == RecordKind::Duplicate {
                assert_eq!(
                    (&pair[0].key, &pair[0].value),
                    (&pair[1].key, &pair[1].value)
                );
            }
        }
    }

    #[test]
    fn no_share_no_refunds_and_declined_charges_are_never_refunded() {
        let charges = charges(1, 500);
        assert!(refunds_for(&charges, 0.0, 1, "p").is_empty());
        assert!(refunds_for(&charges, f64::NAN, 1, "p").is_empty());
        let all = refunds_for(&charges, 1.0, 1, "p");
        let declined: HashSet<Vec<u8>> = charges
            .iter()
            .filter(|r| {
                r.value
                    .as_deref()
                    .is_some_and(|v| v.windows(16).any(|w| w == b"pm_card_declined"))
            })
            .filter_map(|r| r.key.clone())
            .collect();
        assert!(!declined.is_empty());
        assert!(all
            .iter()
            .all(|r| !declined.contains(r.key.as_deref().unwrap_or_default())));
    }

    #[test]
    fn an_exceeding_pair_refuses_exactly_its_second_refund() {
        let charge = Refundable {
            key: "ord-1".into(),
            amount_minor: 101,
            currency: "EUR".into(),
        };
        let mut rng = StdRng::seed_from_u64(0);
        let pair = (0..1000)
            .map(|_| refund_amounts(&mut rng, charge.amount_minor))
            .find(|a| a.len() == 2)
            .expect("an exceeding pair");
        assert!(pair[0] <= 101 && pair[0] + pair[1] > 101, "{pair:?}");
        let refunds: Vec<_> = pair
            .iter()
            .enumerate()
            .filter_map(|(n, a)| refund_record("p", n, &charge, *a))
            .collect();
        let value = serde_json::json!({"idempotency_key": "ord-1", "account_id": "a",
            "amount_minor": 101, "currency": "EUR", "payment_method": "pm_card_visa"});
        let charges = vec![WorkloadRecord {
            kind: RecordKind::Valid,
            key: Some(b"ord-1".to_vec()),
            value: Some(value.to_string().into_bytes()),
            partition_hint: None,
        }];
        let expected = expected_refunds(&charges, &refunds);
        assert_eq!((expected.refunded, expected.exceeding), (1, 1));
        assert_eq!(expected.refunded_minor, pair[0]);
    }

    #[test]
    fn fitted_workloads_have_exactly_the_total_and_no_orphan_refund() {
        let charges = charges(9, 400);
        let refunds = refunds_for(&charges, 0.5, 9, "ord-2026");
        for total in [0, 1, 50, 399, 400] {
            let fitted = fit_refunds(&charges, &refunds, total);
            assert_eq!(fitted.len(), total);
            let split = fitted
                .iter()
                .position(|r| parsed_kind(r) == Some(true))
                .unwrap_or(fitted.len());
            let (head, tail) = fitted.split_at(split);
            assert!(tail.iter().all(|r| parsed_kind(r) == Some(true)));
            let keys: HashSet<_> = head.iter().filter_map(|r| r.key.clone()).collect();
            for refund in tail {
                assert!(keys.contains(refund.key.as_deref().unwrap_or_default()));
            }
        }
    }

    /// Whether a record is a refund (`None`: unreadable).
    fn parsed_kind(record: &WorkloadRecord) -> Option<bool> {
        let command = Command::parse(record.value.as_deref()?).ok()?;
        Some(matches!(command, Command::Refund(_)))
    }
}
