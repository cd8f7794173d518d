//! The demo's refunds: which results answer a refund, what the workload meant
//! them to be answered, and the report's refund part, checked against the results
//! topic and the gateway's own books.

use std::collections::{BTreeMap, HashSet};

use payment_worker::operator::{RecordKind, RefundExpectation, WorkloadRecord};
use payment_worker::worker::ResultRecord;

use crate::refund_books::RefundBooks;
use crate::RefundRefusal;

/// The outcomes of the refunds, as the results topic tells them.
#[derive(Debug, Default)]
pub(crate) struct RefundTally {
    /// `refunded`, `duplicate`, `rejected (reason)`, … per refund result.
    pub(crate) by_outcome: BTreeMap<String, usize>,
}

impl RefundTally {
    /// Counts `result` when it answers one of `keys` (a refund's own keys).
    pub(crate) fn count_if_refund(&mut self, keys: &HashSet<String>, result: &ResultRecord) {
        let is_refund = result.refund_id.is_some()
            || result
                .idempotency_key
                .as_ref()
                .is_some_and(|key| keys.contains(key));
        if is_refund {
            self.count(result);
        }
    }

    fn count(&mut self, result: &ResultRecord) {
        let label = match (&result.outcome[..], &result.reason) {
            ("rejected", Some(reason)) => format!("rejected ({})", rejection_code(reason)),
            (outcome, _) => outcome.to_owned(),
        };
        *self.by_outcome.entry(label).or_default() += 1;
    }

    fn of(&self, label: &str) -> usize {
        self.by_outcome.get(label).copied().unwrap_or(0)
    }
}

/// The refund's own rejection codes, which a result's reason names after the kind
/// of rejection (`invalid: refund_exceeds_charge: 120 minor units ...`).
const REFUND_REJECTIONS: [&str; 4] = [
    "payment_unknown",
    "payment_not_charged",
    "refund_exceeds_charge",
    "currency_mismatch",
];

/// A rejection's refund code when it has one, otherwise its kind: never the words
/// after them, which may hold amounts.
fn rejection_code(reason: &str) -> &str {
    let mut parts = reason.split(':').map(str::trim);
    let kind = parts.next().unwrap_or_default();
    parts
        .find(|part| REFUND_REJECTIONS.contains(part))
        .unwrap_or(kind)
}

/// The keys of the workload's refunds: their results name them.
pub(crate) fn refund_keys(records: &[WorkloadRecord]) -> HashSet<String> {
    records
        .iter()
        .filter(|record| record.kind == RecordKind::Refund)
        .filter_map(|record| {
            let value: serde_json::Value = serde_json::from_slice(record.value.as_deref()?).ok()?;
            value.get("idempotency_key")?.as_str().map(str::to_owned)
        })
        .collect()
}

/// The refund records of a fitted workload: those after its last charge.
pub(crate) fn refund_part(records: &[WorkloadRecord]) -> &[WorkloadRecord] {
    let first = records
        .iter()
        .position(|record| record.kind == RecordKind::Refund)
        .unwrap_or(records.len());
    &records[first..]
}

/// What the demo saw of its refunds.
pub(crate) struct RefundReport<'a> {
    pub(crate) expected: RefundExpectation,
    pub(crate) first: &'a RefundTally,
    pub(crate) replay: &'a RefundTally,
    pub(crate) books: RefundBooks,
    pub(crate) refusals: &'a [RefundRefusal],
}

impl RefundReport<'_> {
    /// Prints the refund part of the report; whether every check held.
    pub(crate) fn print(&self) -> bool {
        let expected = &self.expected;
        let first = self.first;
        let refunded = first.of("refunded");
        let exceeding = first.of("rejected (refund_exceeds_charge)");
        let duplicates = first.of("duplicate");
        println!(
            "refunds (results topic, pass 1): {refunded} refunded, {exceeding} refused (exceeds), \
             {duplicates} duplicates; all: {:?}",
            first.by_outcome
        );
        println!(
            "  expected from the workload:   {} refunded, {} refused (exceeds), {} duplicates",
            expected.refunded, expected.exceeding, expected.repeated
        );
        let books = &self.books;
        println!(
            "refund audit: {} refunds made at the gateway, {} minor units refunded of {} charged",
            books.refunds, books.refunded_minor, books.charged_minor
        );
        println!(
            "  payments refunded past their amount: {}",
            books.over_refunded
        );
        println!(
            "  refunds the gateway refused:         {}",
            self.refusals.len()
        );
        let new_in_replay = self.replay.of("refunded") + self.replay.of("refund_declined");
        println!("  new refunds during replay:           {new_in_replay}");
        let answered_as_meant = refunded == expected.refunded
            && exceeding == expected.exceeding
            && duplicates == expected.repeated
            && first.by_outcome.values().sum::<usize>()
                == expected.refunded + expected.exceeding + expected.repeated;
        let ok = answered_as_meant
            && books.refunds == refunded
            && books.refunded_minor == expected.refunded_minor
            && books.over_refunded == 0
            && self.refusals.is_empty()
            && new_in_replay == 0;
        if ok {
            println!("refund audit: OK (no payment refunded past its amount)");
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rejection_is_labelled_by_its_refund_code_or_its_kind() {
        assert_eq!(
            rejection_code("invalid: refund_exceeds_charge: 120 minor units are left"),
            "refund_exceeds_charge"
        );
        assert_eq!(
            rejection_code("invalid: payment_unknown"),
            "payment_unknown"
        );
        assert_eq!(
            rejection_code("invalid: amount 12 is out of range"),
            "invalid"
        );
    }
}
