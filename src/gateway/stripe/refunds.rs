//! Refunds through Stripe: `POST /v1/refunds` for the charge's PaymentIntent,
//! found again by listing that PaymentIntent's refunds and keeping the one whose
//! `metadata[idempotency_key]` is the refund's key (the list has no metadata
//! filter).
//!
//! Before anything is sent the PaymentIntent is read: a refund of none, of one
//! that did not charge, or in another currency than the charge's (Stripe's
//! refund takes no currency: the amount would be read in the charge's unit) is
//! refused.
//!
//! Stripe replays the first answer to an `Idempotency-Key` (a 500 included) for
//! at least a day, so a retry under one key never settles a failure, and a new
//! key sent blindly could refund twice while a request under the old one may
//! still land. Attempt keys are therefore `<key>:refund:<n>`, and the rule is:
//!
//! 1. Before every POST, the PaymentIntent's refunds are listed: a refund under
//!    the key is the answer, and nothing is sent.
//! 2. Otherwise the POST goes out under key `n`, starting at `n = 0` on every
//!    call. Stripe either runs it, replays the answer it first gave to that key,
//!    or answers 409 while a request under it is still running.
//! 3. Only a replayed failure (`Idempotent-Replayed: true` with a 5xx, or a 4xx
//!    Stripe says to retry) proves that the request under key `n` finished
//!    without refunding: only then is key `n + 1` tried, in the same call.
//! 4. Any answer that leaves the outcome unknown (a timeout, an unreadable 2xx, a
//!    fresh 5xx, a 409) ends the call with an unknown outcome; the next call
//!    starts again at 1 and re-sends under the same keys, which Stripe replays.
//!
//! So `n` is not recorded anywhere: it is derived on every call from Stripe's own
//! replays, which are durable at Stripe. A process that crashes mid-refund loses
//! nothing: its successor walks the same keys, and every key it passes was
//! proven finished by Stripe. A key Stripe no longer remembers (older than a
//! day) is run afresh, which is safe because no request older than a day can
//! still land and step 1 found no refund. A definite answer ends the walk: a
//! refund (approved, or declined when Stripe marks it failed) or a refusal
//! (`Rejected`, a 402 included: no Refund object, so nothing to record as a
//! decline; unless Stripe marks it `Stripe-Should-Retry: true`, which is retried
//! as any transient refusal is; `charge_already_refunded` and `amount_too_large` are never caused by
//! this worker, which refunds only what is left, and are logged as errors if
//! they come). The processor keeps a refusal on the refund's row, so a later
//! delivery of the command is answered from there and nothing is sent again.

use super::adapter::{status_of, StripeGateway};
use super::amount::{minor_units, stripe_amount};
use super::api::{is_intent_id, Failure, IntentStatus};
use super::refund_api::{NewRefund, Refund};
use crate::gateway::client::note_failure;
use crate::gateway::interface::{Charge, ChargeStatus, GatewayError, LeaseGuard};
use crate::gateway::refunds::{RefundEntry, RefundRequest};
use crate::token::IdempotencyKey;

/// Attempt keys one call walks at most: each one passed was a failure Stripe
/// replayed, so this many in a row means Stripe keeps failing; retry later.
const MAX_ATTEMPT_KEYS: u32 = 16;

/// What one POST's failure means for the walk over attempt keys.
enum Step {
    /// The request under this key finished without refunding: try the next key.
    NextKey,
    /// The call ends with this failure.
    Done(GatewayError),
}

/// The gateway's answer a refund object gives.
fn answer_of(refund: &Refund) -> Charge {
    let status = if refund.refunded() {
        ChargeStatus::Approved
    } else {
        ChargeStatus::Declined
    };
    Charge {
        transaction_id: refund.id.clone(),
        status,
        decline_code: (status == ChargeStatus::Declined).then(|| {
            refund
                .failure_reason
                .clone()
                .unwrap_or_else(|| "failed".to_owned())
        }),
    }
}

/// `refund` as a [`RefundEntry`]; `None` when it is not one of this worker's
/// (no key in its metadata, no PaymentIntent) or its amount is no whole number
/// of minor units.
fn entry_of(refund: &Refund) -> Option<RefundEntry> {
    let answer = answer_of(refund);
    Some(RefundEntry {
        idempotency_key: refund.made_by_worker()?.to_owned(),
        transaction_id: answer.transaction_id,
        payment_transaction_id: refund.payment_intent.clone()?,
        amount_minor: minor_units(refund.amount, &refund.currency)?,
        currency: refund.currency.to_ascii_uppercase(),
        status: answer.status,
        refunded_at: chrono::DateTime::from_timestamp(refund.created, 0).unwrap_or_default(),
        // Stripe does not count the requests a refund received.
        attempts: 1,
        decline_code: answer.decline_code,
    })
}

/// Of the refunds made under one key, the one that refunded, else the latest.
fn settled_of(mut ours: Vec<Refund>) -> Option<Refund> {
    ours.sort_by_key(|refund| (refund.refunded(), refund.created));
    ours.pop()
}

fn refused(reason: String) -> GatewayError {
    GatewayError::Rejected {
        status: 400,
        reason,
    }
}

/// The failure of `POST /v1/refunds` under one attempt key (the module's rule).
fn step_after(key: &IdempotencyKey, failure: Failure) -> Step {
    let error = match failure {
        Failure::NotSent(text) => GatewayError::Unavailable(text),
        Failure::NoAnswer(_) => GatewayError::Timeout,
        Failure::Unreadable(text) => GatewayError::UnreadableAnswer(text),
        Failure::Incomplete(text) => GatewayError::Protocol(text),
        Failure::Answered(answer) => {
            let retry_advised = answer.should_retry == Some(true);
            let code = answer.error.code.as_deref();
            match answer.status {
                _ if answer.replayed && (answer.status >= 500 || retry_advised) => {
                    return Step::NextKey
                }
                // No Refund object was made, so no refund id exists to record a
                // decline under (the PaymentIntent's is the charge's): a refusal
                // for good, its decline code in the reason.
                // (Unless Stripe says the refusal was transient: retried below.)
                402 if !retry_advised => GatewayError::Rejected {
                    status: 402,
                    reason: answer.reason,
                },
                409 => GatewayError::InFlight,
                400 if answer.is_idempotency_error() => GatewayError::Rejected {
                    status: 422,
                    reason: answer.reason,
                },
                401 | 403 | 429 => GatewayError::Unavailable(answer.reason),
                status if status >= 500 => GatewayError::FailedAfterSending {
                    status,
                    reason: answer.reason,
                },
                // A proxy's page, not Stripe's: whether Stripe got the request is
                // unknown, and a re-send under the same key is safe.
                _ if answer.error_is_empty() => GatewayError::UnreadableAnswer(answer.reason),
                _ if retry_advised => GatewayError::Unavailable(answer.reason),
                status => {
                    if matches!(code, Some("charge_already_refunded" | "amount_too_large")) {
                        tracing::error!(
                            idempotency_key = %key,
                            code,
                            "Stripe refused a refund as more than is left of the charge"
                        );
                    }
                    GatewayError::Rejected {
                        status,
                        reason: answer.reason,
                    }
                }
            }
        }
    };
    Step::Done(error)
}

impl StripeGateway {
    /// The refunds made under `key` for the PaymentIntent `intent`.
    async fn refunds_under(
        &self,
        key: &IdempotencyKey,
        intent: &str,
    ) -> Result<Vec<Refund>, GatewayError> {
        let listed = self
            .api
            .list_refunds(Some(intent))
            .await
            .map_err(|failure| {
                let error = GatewayError::Unavailable(format!("listing refunds failed: {failure}"));
                note_failure("lookup_refund", key, status_of(&failure), &error);
                error
            })?;
        Ok(listed
            .into_iter()
            .filter(|refund| refund.made_by_worker() == Some(key.as_str()))
            .collect())
    }

    /// Refuses, before anything is sent, a refund Stripe would take wrongly or
    /// not at all: of no PaymentIntent, of one that did not charge, or in
    /// another currency than the charge's (Stripe refunds take no currency, so
    /// the amount would be read in the charge's unit).
    async fn check_refundable(
        &self,
        key: &IdempotencyKey,
        intent: &str,
        currency: &str,
    ) -> Result<(), GatewayError> {
        let found = self.api.retrieve(intent).await.map_err(|failure| {
            let error =
                GatewayError::Unavailable(format!("reading the PaymentIntent failed: {failure}"));
            note_failure("refund", key, status_of(&failure), &error);
            error
        })?;
        let Some(found) = found else {
            return Err(refused(format!(
                "charge_not_found: no PaymentIntent {intent}"
            )));
        };
        if found.status != IntentStatus::Succeeded {
            return Err(refused(format!(
                "charge_not_refundable: the PaymentIntent is {:?}",
                found.status
            )));
        }
        if !found.currency.eq_ignore_ascii_case(currency) {
            return Err(refused(format!(
                "currency_mismatch: the charge was made in {}",
                found.currency.to_ascii_uppercase()
            )));
        }
        Ok(())
    }

    /// The refund: see the module documentation.
    pub(super) async fn refund_payment(
        &self,
        key: &IdempotencyKey,
        request: &RefundRequest,
        lease: &dyn LeaseGuard,
    ) -> Result<Charge, GatewayError> {
        let intent = request.payment_transaction_id.as_str();
        if !is_intent_id(intent) {
            return Err(refused(format!("{intent:?} is no PaymentIntent id")));
        }
        let amount = stripe_amount(request.amount_minor, &request.currency).map_err(refused)?;
        self.check_refundable(key, intent, &request.currency)
            .await?;
        for attempt in 0..MAX_ATTEMPT_KEYS {
            if let Some(found) = settled_of(self.refunds_under(key, intent).await?) {
                let currency = request.currency.to_ascii_lowercase();
                if found.amount != amount || found.currency != currency {
                    return Err(GatewayError::Rejected {
                        status: 422,
                        reason: "a refund was made under this key for another amount".to_owned(),
                    });
                }
                return Ok(answer_of(&found));
            }
            lease.check().await.map_err(GatewayError::LeaseNotHeld)?;
            let attempt_key = format!("{}:refund:{attempt}", key.as_str());
            let new = NewRefund {
                payment_intent: intent,
                amount,
                idempotency_key: key.as_str(),
                refund_id: request.refund_id.map(|id| id.to_string()),
                attempt,
            };
            match self.api.create_refund(&attempt_key, &new).await {
                Ok(refund) => return Ok(answer_of(&refund)),
                Err(failure) => {
                    let status = status_of(&failure);
                    match step_after(key, failure) {
                        Step::NextKey => continue,
                        Step::Done(error) => {
                            note_failure("refund", key, status, &error);
                            return Err(error);
                        }
                    }
                }
            }
        }
        let error = GatewayError::Unavailable(format!(
            "Stripe failed the refund under each of {MAX_ATTEMPT_KEYS} attempt keys"
        ));
        note_failure("refund", key, None, &error);
        Err(error)
    }

    /// The refund made under `key` for `request`'s PaymentIntent, if any.
    pub(super) async fn find_refund(
        &self,
        key: &IdempotencyKey,
        request: &RefundRequest,
    ) -> Result<Option<RefundEntry>, GatewayError> {
        if !is_intent_id(&request.payment_transaction_id) {
            return Err(refused(format!(
                "{:?} is no PaymentIntent id",
                request.payment_transaction_id
            )));
        }
        let ours = self
            .refunds_under(key, &request.payment_transaction_id)
            .await?;
        Ok(settled_of(ours).as_ref().and_then(entry_of))
    }

    /// Every refund this worker made (metadata names a key).
    pub(super) async fn our_refunds(&self) -> Result<Vec<RefundEntry>, GatewayError> {
        let listed = self.api.list_refunds(None).await.map_err(|failure| {
            GatewayError::Unavailable(format!("listing refunds failed: {failure}"))
        })?;
        Ok(listed.iter().filter_map(entry_of).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::super::api::{Answer, ErrorBody};
    use super::*;

    fn declined(should_retry: Option<bool>, replayed: bool) -> Failure {
        Failure::Answered(Answer {
            status: 402,
            error: ErrorBody {
                kind: Some("card_error".to_owned()),
                code: Some("card_declined".to_owned()),
                decline_code: Some("generic_decline".to_owned()),
                message: Some("Your card was declined.".to_owned()),
            },
            should_retry,
            replayed,
            reason: "card_declined: generic_decline".to_owned(),
        })
    }

    #[test]
    fn a_402_is_final_unless_stripe_advises_a_retry() {
        let key = IdempotencyKey::try_from("rf-1").unwrap();
        for should_retry in [None, Some(false)] {
            assert!(matches!(
                step_after(&key, declined(should_retry, false)),
                Step::Done(GatewayError::Rejected { status: 402, .. })
            ));
        }
        // Transient by Stripe's word: asked again under the same key, which replays
        // it, and then under the next one.
        assert!(matches!(
            step_after(&key, declined(Some(true), false)),
            Step::Done(GatewayError::Unavailable(_))
        ));
        assert!(matches!(
            step_after(&key, declined(Some(true), true)),
            Step::NextKey
        ));
    }
}
