//! The two phases of a charge: create (and record) a PaymentIntent, confirm it.
//! See `adapter.rs` for what each answer means.

use super::adapter::{records_unavailable, status_of, StripeGateway};
use super::api::{is_intent_id, Failure, IntentStatus, NewIntent, PaymentIntent};
use super::intent_state::{approved, manual_capture, state, IntentState};
use super::records::IntentRecord;
use crate::gateway::client::note_failure;
use crate::gateway::interface::{Charge, ChargeRequest, GatewayError, LeaseGuard};
use crate::token::IdempotencyKey;

/// The `Idempotency-Key` of one create or confirm attempt: `<key>:<phase>:<n>`.
/// Built from the key itself, never from its `Display`, which masks digit runs that
/// look like card numbers: two keys masked alike would share Stripe's cached answer.
fn attempt_key(key: &IdempotencyKey, phase: &str, attempt: impl std::fmt::Display) -> String {
    format!("{}:{phase}:{attempt}", key.as_str())
}

impl StripeGateway {
    /// The phase-one answer made for this request, or the key was reused.
    pub(super) fn check_for(
        key: &IdempotencyKey,
        intent: &PaymentIntent,
        amount: i64,
        currency: &str,
    ) -> Result<(), GatewayError> {
        if intent.metadata("idempotency_key") == Some(key.as_str())
            && intent.amount == amount
            && intent.currency.eq_ignore_ascii_case(currency)
        {
            Ok(())
        } else {
            Err(GatewayError::Rejected {
                status: 422,
                reason: format!(
                    "idempotency_key_reused: PaymentIntent {} of this key was made for another amount or currency",
                    intent.id
                ),
            })
        }
    }

    /// Phase one: a new PaymentIntent under `<key>:create:<n>`, its attempt and
    /// time recorded before the request, its id recorded before anything confirms
    /// it. Whatever goes wrong, nothing is charged: an unconfirmed PaymentIntent
    /// never charges. The lease is checked last before the request: an attempt
    /// recorded and then not sent (the lease lost) is looked for by listing, like
    /// a create whose answer was lost, and is not found.
    pub(super) async fn create(
        &self,
        key: &IdempotencyKey,
        request: &ChargeRequest,
        amount: i64,
        payment_id: uuid::Uuid,
        account: &str,
        lease: &dyn LeaseGuard,
    ) -> Result<(IntentRecord, PaymentIntent), GatewayError> {
        let mut record = self
            .records
            .begin_create(key.as_str(), payment_id, account, self.livemode)
            .await
            .map_err(records_unavailable)?;
        lease.check().await.map_err(GatewayError::LeaseNotHeld)?;
        let idempotency_key = attempt_key(key, "create", record.create_attempt);
        let new = NewIntent {
            amount,
            currency: request.currency.to_ascii_lowercase(),
            payment_method: &request.payment_method,
            idempotency_key: key.as_str(),
            payment_id: payment_id.to_string(),
            create_attempt: record.create_attempt,
        };
        let intent = match self.api.create(&idempotency_key, &new).await {
            Ok(intent) if is_intent_id(&intent.id) => intent,
            Ok(intent) => {
                return Err(GatewayError::Protocol(format!(
                    "Stripe answered a create with id {:?}",
                    intent.id
                )))
            }
            Err(failure) => {
                let error = match &failure {
                    Failure::Answered(answer)
                        if matches!(answer.status, 400 | 402 | 404)
                            && !answer.is_idempotency_error()
                            && !answer.error_is_empty()
                            && answer.should_retry != Some(true) =>
                    {
                        GatewayError::Rejected {
                            status: answer.status,
                            reason: answer.reason.clone(),
                        }
                    }
                    _ => GatewayError::Unavailable(format!(
                        "creating the PaymentIntent failed ({failure}); nothing is charged: the \
                         next attempt looks for it, then makes another"
                    )),
                };
                note_failure("charge", key, status_of(&failure), &error);
                return Err(error);
            }
        };
        self.records
            .record_intent(key.as_str(), record.create_attempt, &intent.id)
            .await
            .map_err(|error| {
                GatewayError::Unavailable(format!(
                    "PaymentIntent {} was made but its id could not be recorded ({error}); it is \
                     not confirmed, and the next attempt finds it by listing",
                    intent.id
                ))
            })?;
        record.payment_intent_id = Some(intent.id.clone());
        Ok((record, intent))
    }

    /// Phase two: confirms `intent` under `<key>:confirm:<m>`, the count recorded
    /// first and the lease checked right before the request (a confirm not sent
    /// leaves a number unused, never one sent twice). Only an answer that says
    /// what happened is final; anything else is an unknown outcome for the look-up
    /// to decide.
    pub(super) async fn confirm(
        &self,
        key: &IdempotencyKey,
        record: &IntentRecord,
        intent: &PaymentIntent,
        lease: &dyn LeaseGuard,
    ) -> Result<Charge, GatewayError> {
        let attempt = self
            .records
            .begin_confirm(key.as_str(), record.create_attempt)
            .await
            .map_err(records_unavailable)?;
        lease.check().await.map_err(GatewayError::LeaseNotHeld)?;
        let idempotency_key = attempt_key(key, "confirm", attempt);
        let failure = match self.api.confirm(&idempotency_key, &intent.id).await {
            Ok(answer) => return self.after_confirm(key, record, answer).await,
            Err(failure) => failure,
        };
        let error = match &failure {
            // A 4xx whose body is no Stripe error came from something between us
            // and Stripe (a proxy's page, a router's 404), not from Stripe: whether
            // the confirm reached Stripe, and charged, is unknown. Looked up, never
            // taken for a refusal (which would cancel the PaymentIntent and refuse
            // the command). A bodiless 409 stays "in flight" (also unknown).
            Failure::Answered(answer)
                if (400..500).contains(&answer.status)
                    && answer.status != 409
                    && answer.error_is_empty() =>
            {
                GatewayError::UnreadableAnswer(format!(
                    "confirm of {} answered HTTP {} without a Stripe error (a proxy's answer?)",
                    intent.id, answer.status
                ))
            }
            Failure::Answered(answer) if answer.status == 402 => {
                let code = answer
                    .error
                    .decline_code
                    .clone()
                    .or_else(|| answer.error.code.clone())
                    .unwrap_or_else(|| "card_declined".to_owned());
                let mut answered = intent.clone();
                answered.status = IntentStatus::RequiresPaymentMethod;
                return Ok(self.settle_decline(key, record, &answered, code).await);
            }
            Failure::Answered(answer) if answer.is_idempotency_error() => {
                GatewayError::UnreadableAnswer(format!("confirm of {}: {failure}", intent.id))
            }
            // Stripe says the refusal was transient (`Stripe-Should-Retry: true`):
            // nothing was charged and the PaymentIntent still awaits its confirm,
            // so it is not cancelled; the next attempt looks it up and confirms it
            // under a new key.
            Failure::Answered(answer)
                if matches!(answer.status, 400 | 404) && answer.should_retry == Some(true) =>
            {
                GatewayError::Unavailable(format!(
                    "confirm of {} refused for now ({failure}); Stripe says to retry",
                    intent.id
                ))
            }
            Failure::Answered(answer) if matches!(answer.status, 400 | 404) => {
                return self.confirm_refused(key, record, intent, &failure).await
            }
            Failure::Answered(answer) if answer.status == 409 => GatewayError::InFlight,
            Failure::Answered(answer) if matches!(answer.status, 401 | 403 | 429) => {
                GatewayError::Unavailable(format!("confirm of {}: {failure}", intent.id))
            }
            Failure::NotSent(_) => {
                GatewayError::Unavailable(format!("confirm of {}: {failure}", intent.id))
            }
            Failure::NoAnswer(_) => GatewayError::Timeout,
            // A 5xx may have charged (Stripe's rule), so may an unreadable 2xx. (A
            // confirm is no listing: it is never incomplete.)
            Failure::Answered(_) | Failure::Unreadable(_) | Failure::Incomplete(_) => {
                GatewayError::UnreadableAnswer(format!("confirm of {}: {failure}", intent.id))
            }
        };
        note_failure("charge", key, status_of(&failure), &error);
        Err(error)
    }

    /// What a confirm's 2xx answer says.
    pub(super) async fn after_confirm(
        &self,
        key: &IdempotencyKey,
        record: &IntentRecord,
        answer: PaymentIntent,
    ) -> Result<Charge, GatewayError> {
        match state(&answer, None) {
            IntentState::Charged => Ok(approved(&answer)),
            IntentState::Declined(code) => {
                Ok(self.settle_decline(key, record, &answer, code).await)
            }
            IntentState::InProgress => Err(GatewayError::InFlight),
            IntentState::ManualCapture => Err(manual_capture(&answer)),
            IntentState::Confirmable => Err(GatewayError::UnreadableAnswer(format!(
                "Stripe answered the confirm of {} with a PaymentIntent still awaiting it",
                answer.id
            ))),
            IntentState::Dead => Err(GatewayError::Unavailable(format!(
                "PaymentIntent {} was cancelled before its confirm: nothing is charged",
                answer.id
            ))),
        }
    }

    /// A confirm refused with 400 or 404: the PaymentIntent's own state decides
    /// (it may have moved since it was read). A cancelled one is final for it: it
    /// is never confirmed again, and the next attempt makes a new one.
    pub(super) async fn confirm_refused(
        &self,
        key: &IdempotencyKey,
        record: &IntentRecord,
        intent: &PaymentIntent,
        failure: &Failure,
    ) -> Result<Charge, GatewayError> {
        let now = match self.api.retrieve(&intent.id).await {
            Ok(Some(now)) => now,
            _ => {
                let error = GatewayError::UnreadableAnswer(format!(
                    "confirm of {} refused ({failure}) and the PaymentIntent could not be read",
                    intent.id
                ));
                note_failure("charge", key, status_of(failure), &error);
                return Err(error);
            }
        };
        match state(&now, record.decline_code.as_deref()) {
            IntentState::Confirmable => {
                // The request itself is refused: final. Cancel the PaymentIntent so
                // it does not linger as an orphan.
                if let Err(cancel) = self.api.cancel(&now.id).await {
                    tracing::warn!(idempotency_key = %key, %cancel, "cancelling a refused PaymentIntent failed");
                }
                let (status, reason) = match failure {
                    Failure::Answered(answer) => (answer.status, answer.reason.clone()),
                    other => (400, other.to_string()),
                };
                let error = GatewayError::Rejected { status, reason };
                note_failure("charge", key, status_of(failure), &error);
                Err(error)
            }
            _ => self.after_confirm(key, record, now).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_key_carries_the_key_as_it_is_even_where_it_looks_like_a_card_number() {
        // 9485977024011 passes the Luhn check: a key's Display masks it.
        let key = IdempotencyKey::try_from("order_23e9485977024011a90a").unwrap();
        assert_ne!(
            key.to_string(),
            key.as_str(),
            "the premise: Display masks it"
        );
        assert_eq!(
            attempt_key(&key, "create", 2),
            "order_23e9485977024011a90a:create:2"
        );
        assert_eq!(
            attempt_key(&key, "confirm", 1_i64),
            "order_23e9485977024011a90a:confirm:1"
        );
    }
}
