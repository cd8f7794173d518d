//! Where a payment stands at Stripe: its recorded PaymentIntents retrieved (or
//! found by listing when a create's answer was lost), the latest attempt first.

use super::adapter::{records_unavailable, status_of, StripeGateway, LIST_WINDOW_SKEW};
use super::api::{is_intent_id, Failure, IntentStatus, PaymentIntent};
use super::intent_state::{approved, declined, manual_capture, state, IntentState, Standing};
use super::records::IntentRecord;
use crate::gateway::client::note_failure;
use crate::gateway::interface::{Charge, GatewayError};
use crate::telemetry::events::GatewayListingIncomplete;
use crate::token::IdempotencyKey;

/// A listing for a lost create that failed: counted and logged. One that stopped
/// short (its page limit) is its own class: retrying it alone will not help.
fn listing_failed(key: &IdempotencyKey, failure: &Failure) -> GatewayError {
    match failure {
        Failure::Incomplete(why) => {
            crate::telemetry::emit(GatewayListingIncomplete { key, why });
            GatewayError::Unavailable(format!(
                "listing PaymentIntents to find a create whose answer was lost {why}; whether \
                 it made a PaymentIntent is unknown"
            ))
        }
        _ => {
            let error = GatewayError::Unavailable(format!(
                "listing PaymentIntents to find a create whose answer was lost failed: {failure}"
            ));
            note_failure("lookup", key, status_of(failure), &error);
            error
        }
    }
}

impl StripeGateway {
    /// The PaymentIntent of one create attempt: retrieved by its recorded id, or,
    /// when the create's answer was lost, found by listing its time window.
    /// `None`: that create made none that can be found.
    pub(super) async fn intent_of(
        &self,
        key: &IdempotencyKey,
        record: &IntentRecord,
    ) -> Result<Option<PaymentIntent>, GatewayError> {
        let intent = match &record.payment_intent_id {
            Some(id) if is_intent_id(id) => match self.api.retrieve(id).await {
                Ok(Some(intent)) => intent,
                Ok(None) => {
                    return Err(GatewayError::UnreadableAnswer(format!(
                        "PaymentIntent {id} recorded for this payment is unknown to this API key \
                         (another account or mode?)"
                    )))
                }
                Err(failure) => {
                    let error = GatewayError::Unavailable(format!(
                        "retrieving PaymentIntent {id} failed: {failure}"
                    ));
                    note_failure("lookup", key, status_of(&failure), &error);
                    return Err(error);
                }
            },
            Some(id) => {
                return Err(GatewayError::Protocol(format!(
                    "recorded PaymentIntent id {id:?} is not one"
                )))
            }
            None => match self.find_lost_create(key, record).await? {
                Some(intent) => intent,
                None => return Ok(None),
            },
        };
        if intent.livemode.is_some_and(|live| live != record.livemode) {
            return Err(GatewayError::UnreadableAnswer(format!(
                "PaymentIntent {} is in the other mode than the payment's",
                intent.id
            )));
        }
        Ok(Some(intent))
    }

    /// Lists the PaymentIntents created around a create attempt whose answer was
    /// lost and keeps the one whose metadata names this key and attempt. What
    /// earlier listings of the window already covered is not listed again
    /// (`listed.rs`); a listing that stopped short proves nothing and fails.
    pub(super) async fn find_lost_create(
        &self,
        key: &IdempotencyKey,
        record: &IntentRecord,
    ) -> Result<Option<PaymentIntent>, GatewayError> {
        let margin = (LIST_WINDOW_SKEW + self.timeout).as_secs() as i64;
        let at = record.requested_at.timestamp();
        let window = (at - margin, at + margin);
        let attempt = record.create_attempt;
        let Some(left) = self.listed.left(key.as_str(), attempt, window) else {
            tracing::debug!(idempotency_key = %key, create_attempt = attempt, "the window of a lost create was listed already; nothing there");
            return Ok(None);
        };
        let listing = self
            .api
            .list(Some(left))
            .await
            .map_err(|failure| listing_failed(key, &failure))?;
        let attempt_text = attempt.to_string();
        let Some(found) = listing.intents.into_iter().find(|intent| {
            intent.made_by_worker() == Some(key.as_str())
                && intent.metadata("create_attempt") == Some(attempt_text.as_str())
        }) else {
            // Without Stripe's clock, ours less the skew it may be behind.
            let served_at = listing.served_at.unwrap_or_else(|| {
                chrono::Utc::now().timestamp() - LIST_WINDOW_SKEW.as_secs() as i64
            });
            self.listed
                .found_nothing(key.as_str(), attempt, window, served_at);
            return Ok(None);
        };
        tracing::info!(idempotency_key = %key, payment_intent = %found.id, "found a PaymentIntent whose create answer was lost");
        self.records
            .record_intent(key.as_str(), attempt, &found.id)
            .await
            .map_err(records_unavailable)?;
        self.listed.found(key.as_str(), attempt);
        Ok(Some(found))
    }

    /// Reads the key's PaymentIntents, the latest attempt first, and says where
    /// the payment stands. A declined one still alive is cancelled here.
    pub(super) async fn standing(
        &self,
        key: &IdempotencyKey,
        records: &[IntentRecord],
    ) -> Result<Standing, GatewayError> {
        for record in records {
            let Some(intent) = self.intent_of(key, record).await? else {
                continue;
            };
            match state(&intent, record.decline_code.as_deref()) {
                IntentState::Charged => return Ok(Standing::Settled(approved(&intent), intent)),
                IntentState::Declined(code) => {
                    let charge = self.settle_decline(key, record, &intent, code).await;
                    return Ok(Standing::Settled(charge, intent));
                }
                IntentState::InProgress => return Ok(Standing::InProgress),
                IntentState::Confirmable => {
                    return Ok(Standing::Confirmable(record.clone(), intent))
                }
                IntentState::ManualCapture => return Err(manual_capture(&intent)),
                IntentState::Dead => {}
            }
        }
        Ok(Standing::Nothing)
    }

    /// A decline is recorded, then the PaymentIntent cancelled, so nothing can
    /// confirm it later (best effort: either failing leaves the decline standing).
    pub(super) async fn settle_decline(
        &self,
        key: &IdempotencyKey,
        record: &IntentRecord,
        intent: &PaymentIntent,
        code: String,
    ) -> Charge {
        if record.decline_code.is_none() {
            if let Err(error) = self
                .records
                .record_decline(key.as_str(), record.create_attempt, &code)
                .await
            {
                tracing::warn!(idempotency_key = %key, %error, "recording a decline failed");
            }
        }
        if intent.status != IntentStatus::Canceled {
            if let Err(failure) = self.api.cancel(&intent.id).await {
                tracing::warn!(idempotency_key = %key, payment_intent = %intent.id, %failure, "cancelling a declined PaymentIntent failed; audit lists it");
            }
        }
        declined(&intent.id, code)
    }
}
