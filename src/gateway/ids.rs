//! What the worker keeps of a gateway's own words: its ids, read from an answer.
//!
//! A transaction id is stored (`payments.gateway_transaction_id`, unique-indexed),
//! echoed on the result record and written in log lines. An answer whose id the
//! worker could not keep is no answer it can book: it reads as unreadable, so a 2xx
//! leaves the outcome unknown and the charge is looked up (and, if the look-up says
//! the same, flagged and listed for `audit`), instead of failing later on an index
//! too small for it or a result record too large for the topic, or echoing a card
//! number. A decline code is only informative: one the worker could not keep is
//! left out.

use serde::{Deserialize, Deserializer};

/// The longest id kept, in characters.
const LONGEST_ID: usize = 255;

/// Why `id` cannot be kept, or `None`. Never quotes it.
fn unkeepable(id: &str) -> Option<&'static str> {
    if id.is_empty() {
        return Some("it is empty");
    }
    if id.chars().count() > LONGEST_ID {
        return Some("it is longer than 255 characters");
    }
    if id.chars().any(char::is_control) {
        return Some("it holds a control character");
    }
    if crate::redaction::contains_card_number(id) {
        return Some("it holds a card number");
    }
    None
}

/// A gateway's id of a charge or a refund, refused when it cannot be kept.
pub(super) fn gateway_id<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    let id = String::deserialize(deserializer)?;
    match unkeepable(&id) {
        None => Ok(id),
        Some(why) => Err(serde::de::Error::custom(format!(
            "a transaction id the worker cannot keep: {why}"
        ))),
    }
}

/// A decline code, left out when it cannot be kept.
pub(super) fn decline_code<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<String>, D::Error> {
    let code = Option::<String>::deserialize(deserializer)?;
    Ok(code.filter(|code| unkeepable(code).is_none()))
}

#[cfg(test)]
mod tests {
    use crate::gateway::{Charge, ChargeStatus, LedgerEntry, RefundEntry};

    fn charge(transaction_id: &str, decline_code: &str) -> Result<Charge, String> {
        let body = serde_json::json!({
            "transaction_id": transaction_id,
            "status": "declined",
            "decline_code": decline_code,
        });
        serde_json::from_value(body).map_err(|error| error.to_string())
    }

    #[test]
    fn an_id_the_worker_cannot_keep_makes_the_answer_unreadable_without_quoting_it() {
        let long = "t".repeat(256);
        for (id, why) in [
            ("", "empty"),
            (long.as_str(), "longer than 255"),
            ("tx\n1", "control character"),
            ("tx-4111111111111111", "card number"),
        ] {
            let error = charge(id, "card_declined").expect_err(id);
            assert!(error.contains(why), "{error}");
            assert!(
                !error.contains("4111") && !error.contains("ttttt"),
                "{error}"
            );
        }
        let kept = charge(&"t".repeat(255), "insufficient_funds").unwrap();
        assert_eq!(kept.status, ChargeStatus::Declined);
        assert_eq!(kept.decline_code.as_deref(), Some("insufficient_funds"));
    }

    #[test]
    fn a_decline_code_the_worker_cannot_keep_is_left_out() {
        let charge = charge("tx-1", "pan 4111 1111 1111 1111").unwrap();
        assert_eq!(charge.decline_code, None);
    }

    #[test]
    fn ledger_and_refund_entries_are_held_to_the_same_rule() {
        let ledger = serde_json::json!({
            "idempotency_key": "k", "transaction_id": "tx\u{7}", "amount_minor": 1,
            "currency": "USD", "status": "approved",
            "charged_at": "2026-12-05T00:00:00Z", "attempts": 1,
        });
        assert!(serde_json::from_value::<LedgerEntry>(ledger).is_err());
        let refund = serde_json::json!({
            "idempotency_key": "r", "transaction_id": "rf-1",
            "payment_transaction_id": "4111111111111111", "amount_minor": 1,
            "currency": "USD", "status": "approved",
            "refunded_at": "2026-12-05T00:00:00Z", "attempts": 1,
        });
        assert!(serde_json::from_value::<RefundEntry>(refund).is_err());
    }
}
