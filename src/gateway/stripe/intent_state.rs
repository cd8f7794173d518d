//! What a PaymentIntent's state means for one payment, and the answers the adapter
//! builds from it.

use chrono::{DateTime, Utc};

use super::amount::minor_units;
use super::api::{IntentStatus, PaymentIntent};
use super::records::IntentRecord;
use crate::gateway::interface::{Charge, ChargeStatus, GatewayError, LedgerEntry};

/// A PaymentIntent's state, as far as one payment is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum IntentState {
    /// `succeeded`: charged.
    Charged,
    /// A confirm's charge failed, or the card asked for an authentication an
    /// off-session payment cannot give: final, with Stripe's reason.
    Declined(String),
    /// A confirm is still being worked on (`processing`, or a status this adapter
    /// does not know): look again later.
    InProgress,
    /// Awaits its confirm.
    Confirmable,
    /// Authorised, waiting for a manual capture this worker never makes.
    ManualCapture,
    /// Cancelled, or without a payment method: it can charge nothing any more.
    Dead,
}

pub(super) fn state(intent: &PaymentIntent, recorded_decline: Option<&str>) -> IntentState {
    match intent.status {
        IntentStatus::Succeeded => IntentState::Charged,
        IntentStatus::Processing | IntentStatus::Unknown => IntentState::InProgress,
        IntentStatus::RequiresConfirmation => IntentState::Confirmable,
        IntentStatus::RequiresCapture => IntentState::ManualCapture,
        IntentStatus::RequiresAction => IntentState::Declined(
            recorded_decline
                .unwrap_or("authentication_required")
                .to_owned(),
        ),
        IntentStatus::RequiresPaymentMethod | IntentStatus::Canceled => {
            match recorded_decline
                .map(str::to_owned)
                .or_else(|| intent.failed_charge())
            {
                Some(code) => IntentState::Declined(code),
                None => IntentState::Dead,
            }
        }
    }
}

/// What the PaymentIntents recorded for a key say, the latest first.
pub(super) enum Standing {
    /// Charged or declined.
    Settled(Charge, PaymentIntent),
    /// A confirm is being worked on.
    InProgress,
    /// This one awaits its confirm.
    Confirmable(IntentRecord, PaymentIntent),
    /// None is alive: a new create attempt is due.
    Nothing,
}

pub(super) fn approved(intent: &PaymentIntent) -> Charge {
    Charge {
        transaction_id: intent.id.clone(),
        status: ChargeStatus::Approved,
        decline_code: None,
    }
}

pub(super) fn declined(intent_id: &str, code: String) -> Charge {
    Charge {
        transaction_id: intent_id.to_owned(),
        status: ChargeStatus::Declined,
        decline_code: Some(code),
    }
}

pub(super) fn created_at(intent: &PaymentIntent) -> DateTime<Utc> {
    DateTime::from_timestamp(intent.created, 0).unwrap_or_default()
}

/// `intent` as a ledger entry: its key from the metadata, its amount in minor units.
pub(super) fn entry(key: &str, intent: &PaymentIntent, charge: Charge) -> LedgerEntry {
    LedgerEntry {
        idempotency_key: key.to_owned(),
        transaction_id: intent.id.clone(),
        // An amount no whole number of minor units can match no command.
        amount_minor: minor_units(intent.amount, &intent.currency).unwrap_or(i64::MIN),
        currency: intent.currency.to_ascii_uppercase(),
        status: charge.status,
        charged_at: created_at(intent),
        attempts: 1,
        decline_code: charge.decline_code,
    }
}

pub(super) fn manual_capture(intent: &PaymentIntent) -> GatewayError {
    GatewayError::Rejected {
        status: 400,
        reason: format!(
            "manual_capture_not_supported: PaymentIntent {} waits for a manual capture, which \
             this worker never makes",
            intent.id
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intent(status: &str, extra: serde_json::Value) -> PaymentIntent {
        let mut value = serde_json::json!({
            "id": "pi_1", "amount": 100, "currency": "usd", "status": status, "created": 1,
            "metadata": {"idempotency_key": "k"},
        });
        if let (Some(object), Some(extra)) = (value.as_object_mut(), extra.as_object()) {
            object.extend(extra.clone());
        }
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn each_status_means_what_the_payment_needs() {
        let none = serde_json::json!({});
        assert_eq!(
            state(&intent("succeeded", none.clone()), None),
            IntentState::Charged
        );
        assert_eq!(
            state(&intent("requires_confirmation", none.clone()), None),
            IntentState::Confirmable
        );
        assert_eq!(
            state(&intent("processing", none.clone()), None),
            IntentState::InProgress
        );
        assert_eq!(
            state(&intent("some_new_status", none.clone()), None),
            IntentState::InProgress
        );
        assert_eq!(
            state(&intent("requires_capture", none.clone()), None),
            IntentState::ManualCapture
        );
        assert_eq!(
            state(&intent("canceled", none.clone()), None),
            IntentState::Dead
        );
        let failed = serde_json::json!({"last_payment_error": {"code": "card_declined", "decline_code": "insufficient_funds"}});
        assert_eq!(
            state(&intent("requires_payment_method", failed.clone()), None),
            IntentState::Declined("insufficient_funds".into())
        );
        // Cancelled after the decline: still a decline.
        assert_eq!(
            state(&intent("canceled", failed), None),
            IntentState::Declined("insufficient_funds".into())
        );
        let charged_object =
            serde_json::json!({"latest_charge": {"id": "ch_1", "status": "failed"}});
        assert_eq!(
            state(&intent("canceled", charged_object), None),
            IntentState::Declined("declined".into())
        );
        assert_eq!(
            state(&intent("canceled", none.clone()), Some("card_declined")),
            IntentState::Declined("card_declined".into())
        );
        assert_eq!(
            state(&intent("requires_action", none), None),
            IntentState::Declined("authentication_required".into())
        );
    }
}
