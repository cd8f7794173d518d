//! Generated workloads for `produce`, `demo` and the tests: valid commands,
//! exact duplicates (some sent to another partition than their original), and
//! invalid records of several kinds; refunds of them in `refund_workload.rs`.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// What a generated record is meant to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordKind {
    /// A new, valid command.
    Valid,
    /// An exact repeat of an earlier valid command or refund.
    Duplicate,
    /// A record that breaks one rule (each invalid record a different one).
    Invalid,
    /// A new refund of an earlier valid charge, keyed by the charge's key
    /// (`refunds_for`).
    Refund,
}

/// One record of a generated workload.
#[derive(Debug, Clone)]
pub struct WorkloadRecord {
    /// What it is meant to be.
    pub kind: RecordKind,
    /// The record key (the idempotency key; `None` for some invalid records).
    pub key: Option<Vec<u8>>,
    /// The record value (the command's JSON; `None` for some invalid records).
    pub value: Option<Vec<u8>>,
    /// Send to this partition index (modulo the partition count) instead of by key.
    pub partition_hint: Option<u32>,
}

/// The shape of a generated workload.
#[derive(Debug, Clone, Copy)]
pub struct WorkloadSpec {
    /// Records in all.
    pub count: usize,
    /// Share of records that repeat an earlier command exactly.
    pub duplicate_ratio: f64,
    /// Share of records that are invalid.
    pub invalid_ratio: f64,
    /// Share of commands whose payment method is always declined by the simulator.
    pub decline_ratio: f64,
    /// Seed of the generator: the same seed and prefix give the same records.
    pub seed: u64,
}

/// The `n`th generated key of `prefix`: `<prefix>:<n>`, `n` written with at least
/// `width` digits. Never a card number by chance, which one detector for every field
/// would refuse (`card_number_as_key`): the colon is none of the separators that
/// join digit groups into one number, so the counter's digits (fewer than 13)
/// stand alone, and a prefix that holds no card number (`produce` refuses one that
/// does) cannot gain one.
pub fn numbered_key(prefix: &str, n: usize, width: usize) -> String {
    format!("{prefix}:{n:0width$}")
}

fn command_json(key: &str, rng: &mut StdRng, decline_ratio: f64) -> serde_json::Value {
    let method = if rng.random_bool(decline_ratio.clamp(0.0, 1.0)) {
        "pm_card_declined"
    } else {
        "pm_card_visa"
    };
    let currency = ["USD", "EUR", "GBP"][rng.random_range(0..3)];
    serde_json::json!({
        "idempotency_key": key,
        "account_id": format!("acct_{}", rng.random_range(1..500)),
        "amount_minor": rng.random_range(100..100_000),
        "currency": currency,
        "payment_method": method,
        "description": "generated",
    })
}

/// Invalid records, each breaking a different rule.
fn invalid_record(n: usize, prefix: &str) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
    let key = format!("{prefix}-bad-{n}");
    let body = |v: serde_json::Value| Some(v.to_string().into_bytes());
    let value = match n % 7 {
        0 => Some(b"{\"idempotency_key\": ".to_vec()),
        1 => body(
            serde_json::json!({"idempotency_key": key, "account_id": "a", "amount_minor": -5,
            "currency": "USD", "payment_method": "pm_card_visa"}),
        ),
        2 => body(
            serde_json::json!({"idempotency_key": key, "account_id": "a", "amount_minor": 10,
            "currency": "usd", "payment_method": "pm_card_visa"}),
        ),
        3 => body(
            serde_json::json!({"idempotency_key": key, "account_id": "a", "amount_minor": 10,
            "currency": "USD", "payment_method": "4242424242424242"}),
        ),
        4 => body(
            serde_json::json!({"idempotency_key": key, "amount_minor": 10,
            "currency": "USD", "payment_method": "pm_card_visa"}),
        ),
        5 => body(
            serde_json::json!({"idempotency_key": key, "account_id": "a", "amount_minor": 19.99,
            "currency": "USD", "payment_method": "pm_card_visa"}),
        ),
        _ => Some(vec![0xff, 0xfe, 0x00]),
    };
    (Some(key.into_bytes()), value)
}

/// `spec.count` records with keys `<prefix>:000000`, `<prefix>:000001`, …
pub fn generate(spec: &WorkloadSpec, prefix: &str) -> Vec<WorkloadRecord> {
    let mut rng = StdRng::seed_from_u64(spec.seed);
    let mut records = Vec::with_capacity(spec.count);
    let mut valid: Vec<usize> = Vec::new();
    for n in 0..spec.count {
        let roll: f64 = rng.random();
        let record = if roll < spec.invalid_ratio {
            let (key, value) = invalid_record(n, prefix);
            WorkloadRecord {
                kind: RecordKind::Invalid,
                key,
                value,
                partition_hint: None,
            }
        } else if roll < spec.invalid_ratio + spec.duplicate_ratio && !valid.is_empty() {
            let original: &WorkloadRecord = &records[valid[rng.random_range(0..valid.len())]];
            WorkloadRecord {
                kind: RecordKind::Duplicate,
                key: original.key.clone(),
                value: original.value.clone(),
                // Half of the duplicates travel through another partition, where only
                // the token and the unique key can stop them.
                partition_hint: rng.random_bool(0.5).then(|| rng.random()),
            }
        } else {
            let key = numbered_key(prefix, n, 6);
            let value = command_json(&key, &mut rng, spec.decline_ratio).to_string();
            valid.push(records.len());
            WorkloadRecord {
                kind: RecordKind::Valid,
                key: Some(key.into_bytes()),
                value: Some(value.into_bytes()),
                partition_hint: None,
            }
        };
        records.push(record);
    }
    records
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::redaction::holds_card_number;

    proptest! {
        #[test]
        fn generated_keys_are_never_card_numbers(
            prefix in "[A-Za-z0-9._:-]{0,40}",
            n in 0usize..100_000_000,
            width in 1usize..8,
        ) {
            // A prefix that holds no card number, as `produce` takes them.
            prop_assume!(!holds_card_number(prefix.as_bytes()));
            let key = numbered_key(&prefix, n, width);
            prop_assert!(!holds_card_number(key.as_bytes()), "{}", key);
            let bad = format!("{prefix}-bad-{n}");
            prop_assert!(!holds_card_number(bad.as_bytes()), "{}", bad);
        }

        #[test]
        fn a_workload_is_refused_only_where_it_means_to_be(seed in any::<u64>()) {
            let spec = WorkloadSpec {
                count: 300,
                duplicate_ratio: 0.2,
                invalid_ratio: 0.1,
                decline_ratio: 0.1,
                seed,
            };
            for record in generate(&spec, "cmd-12345678") {
                let key = record.key.unwrap_or_default();
                prop_assert!(!holds_card_number(&key), "{}", String::from_utf8_lossy(&key));
                if record.kind != RecordKind::Invalid {
                    let value = record.value.unwrap_or_default();
                    prop_assert!(crate::payment::PaymentCommand::parse(&value).is_ok());
                }
            }
        }
    }
}
