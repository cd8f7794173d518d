//! Stripe's refunds as the adapter uses them: `POST /v1/refunds` for a
//! PaymentIntent, under an `Idempotency-Key` of the caller's making, and
//! `GET /v1/refunds` listed (for one PaymentIntent, or all) to the end.
//! What an answer means for a refund is decided in `refunds.rs`, not here.

use serde::Deserialize;

use super::api::{send, Failure, Listed, StripeApi};

/// The fields of a Refund the adapter reads; everything else is ignored. Its id is
/// kept (`refunds.gateway_transaction_id`) and its failure reason too
/// (`failure_reason`, at most 512 characters): both are held to the rules of the
/// `charges` adapter's (`gateway/ids.rs`), so an answer the worker could not record is
/// unreadable, looked up, instead of failing after the refund.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct Refund {
    #[serde(deserialize_with = "super::super::ids::gateway_id")]
    pub id: String,
    pub amount: i64,
    pub currency: String,
    /// `pending`, `requires_action`, `succeeded`, `failed` or `canceled`.
    #[serde(default)]
    pub status: Option<String>,
    /// Unix seconds, Stripe's clock.
    pub created: i64,
    /// The PaymentIntent refunded (absent for a refund of a bare charge).
    #[serde(default)]
    pub payment_intent: Option<String>,
    #[serde(default)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// Why a failed refund failed.
    #[serde(default, deserialize_with = "super::super::ids::decline_code")]
    pub failure_reason: Option<String>,
}

impl Refund {
    /// A metadata value, when it is text.
    pub fn metadata(&self, name: &str) -> Option<&str> {
        self.metadata.get(name).and_then(|v| v.as_str())
    }

    /// The key this worker refunded under, when the refund is one of this
    /// worker's: its metadata holds a key the worker could have taken and the
    /// refund attempt, as the worker writes them (a shared account's other
    /// refunds are not ours to audit).
    pub fn made_by_worker(&self) -> Option<&str> {
        let key = super::api::worker_key(self.metadata("idempotency_key")?)?;
        self.metadata("refund_attempt")?.parse::<u32>().ok()?;
        Some(key)
    }

    /// Whether the money goes (or went) back: Stripe took the refund. A pending
    /// refund is Stripe's to finish; it fails afterwards only outside the
    /// request (an event), as a charge's dispute would.
    pub fn refunded(&self) -> bool {
        !matches!(self.status.as_deref(), Some("failed" | "canceled"))
    }
}

impl Listed for Refund {
    fn id(&self) -> &str {
        &self.id
    }
}

/// What a refund sends.
pub(super) struct NewRefund<'a> {
    pub payment_intent: &'a str,
    /// In Stripe's unit for the currency.
    pub amount: i64,
    /// The refund command's key (what a look-up filters on).
    pub idempotency_key: &'a str,
    pub refund_id: Option<String>,
    /// The attempt key's number (`<key>:refund:<n>`), for the record.
    pub attempt: u32,
}

impl StripeApi {
    fn refunds_url(&self) -> String {
        format!("{}/v1/refunds", self.base())
    }

    /// `POST /v1/refunds` under `Idempotency-Key: attempt_key`.
    pub async fn create_refund(
        &self,
        attempt_key: &str,
        refund: &NewRefund<'_>,
    ) -> Result<Refund, Failure> {
        let amount = refund.amount.to_string();
        let attempt = refund.attempt.to_string();
        let mut form = vec![
            ("payment_intent", refund.payment_intent),
            ("amount", amount.as_str()),
            ("metadata[idempotency_key]", refund.idempotency_key),
            ("metadata[refund_attempt]", attempt.as_str()),
        ];
        if let Some(refund_id) = &refund.refund_id {
            form.push(("metadata[refund_id]", refund_id.as_str()));
        }
        send(self.post(self.refunds_url(), Some(attempt_key)).form(&form)).await
    }

    /// Every refund of `payment_intent` (Stripe's list filter; localstripe has
    /// it too), or every refund of the account when `None`, paged to the end.
    /// There is no metadata filter: the caller filters.
    pub async fn list_refunds(&self, payment_intent: Option<&str>) -> Result<Vec<Refund>, Failure> {
        let filter: Vec<(&str, String)> = payment_intent
            .map(|id| ("payment_intent", id.to_owned()))
            .into_iter()
            .collect();
        let (refunds, _) = self.page_through(self.refunds_url(), &filter).await?;
        Ok(refunds)
    }
}

#[cfg(test)]
mod tests {
    use super::Refund;

    fn refund(id: &str, failure_reason: &str) -> Result<Refund, String> {
        let body = serde_json::json!({
            "id": id, "amount": 500, "currency": "usd", "status": "failed",
            "created": 1_700_000_000, "failure_reason": failure_reason,
        });
        serde_json::from_value(body).map_err(|e| e.to_string())
    }

    #[test]
    fn a_refund_the_worker_cannot_record_is_unreadable_and_an_odd_reason_left_out() {
        let kept = refund("re_3Q0abc", "expired_or_canceled_card").unwrap();
        assert_eq!(
            kept.failure_reason.as_deref(),
            Some("expired_or_canceled_card")
        );
        for id in [String::new(), "r".repeat(256), "re_\u{0}x".to_owned()] {
            assert!(refund(&id, "lost").is_err(), "{id:?}");
        }
        let long = "x".repeat(600);
        for reason in [long.as_str(), "a\nb", "4111 1111 1111 1111"] {
            assert_eq!(
                refund("re_1", reason).unwrap().failure_reason,
                None,
                "{reason}"
            );
        }
    }

    #[test]
    fn only_a_refund_with_the_workers_metadata_is_the_workers() {
        let with = |metadata: serde_json::Value| -> Refund {
            serde_json::from_value(serde_json::json!({
                "id": "re_1", "amount": 500, "currency": "usd", "status": "succeeded",
                "created": 1_700_000_000, "metadata": metadata,
            }))
            .unwrap()
        };
        let ours = with(serde_json::json!({"idempotency_key": "rf-1", "refund_attempt": "0"}));
        assert_eq!(ours.made_by_worker(), Some("rf-1"));
        for other in [
            serde_json::json!({"idempotency_key": "rf-1"}),
            serde_json::json!({"idempotency_key": "rf 1", "refund_attempt": "0"}),
            serde_json::json!({"idempotency_key": "rf-1", "refund_attempt": "last"}),
        ] {
            assert_eq!(with(other.clone()).made_by_worker(), None, "{other}");
        }
    }
}
