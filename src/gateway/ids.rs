//! What the worker keeps of a gateway's own words: its ids, read from an answer.
//!
//! A charge's transaction id is stored (`payments.gateway_transaction_id`,
//! unique-indexed), echoed on the result record and written in log lines. An answer
//! to a POST whose id the worker could not keep is no answer it can book: it reads
//! as unreadable, so a 2xx leaves the outcome unknown and the charge is looked up,
//! instead of failing after the charge on an index too small for the id or on a
//! result record too large for the topic. Ids are not scanned for card numbers: a
//! gateway's ids are its own, and numeric or UUID-like ones pass the Luhn check by
//! chance (one in ten runs of 13 to 19 digits), which would leave real charges
//! unbooked. Listings and look-ups (`LedgerEntry`, `RefundEntry`) are read as they
//! are: one odd entry must not hide the rest of the ledger from `audit`. A decline
//! code is only informative: one the worker could not keep is left out.

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

/// A decline code, left out when it cannot be kept or holds a card number (a code
/// is a word, never a number: no gateway's own code is lost to the check).
pub(super) fn decline_code<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<String>, D::Error> {
    let code = Option::<String>::deserialize(deserializer)?;
    Ok(code
        .filter(|code| unkeepable(code).is_none() && !crate::redaction::contains_card_number(code)))
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
    fn numeric_ids_are_kept_even_when_they_pass_luhn() {
        // A UUID whose digit groups join to a Luhn-valid run, and a 16-digit id.
        for id in [
            "tx-4111111111111111",
            "4012888888881881",
            "10000000-0000-4000-8000-000000000000",
        ] {
            assert_eq!(charge(id, "").unwrap().transaction_id, id);
        }
    }

    #[test]
    fn listings_are_read_as_they_are() {
        let ledger = serde_json::json!({
            "idempotency_key": "k", "transaction_id": "tx\u{7}", "amount_minor": 1,
            "currency": "USD", "status": "approved",
            "charged_at": "2026-12-05T00:00:00Z", "attempts": 1,
        });
        assert!(serde_json::from_value::<LedgerEntry>(ledger).is_ok());
        let refund = serde_json::json!({
            "idempotency_key": "r", "transaction_id": "",
            "payment_transaction_id": "4111111111111111", "amount_minor": 1,
            "currency": "USD", "status": "approved",
            "refunded_at": "2026-12-05T00:00:00Z", "attempts": 1,
        });
        assert!(serde_json::from_value::<RefundEntry>(refund).is_ok());
    }
}
