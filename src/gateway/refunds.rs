//! What a gateway is asked to refund, and what it answers: the refund side of the
//! [`PaymentGateway`](super::PaymentGateway) interface. A refund is shaped like a
//! charge at the gateway (a POST under an idempotency key, the same key answered
//! with the first answer, looked up by key when its outcome is unknown), so it
//! reuses [`Charge`](super::Charge) for the gateway's answer and
//! [`ChargeStatus`](super::ChargeStatus) for its verdict: `approved` = refunded,
//! `declined` = the gateway refused to refund.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::ChargeStatus;

/// The body of `POST /refunds` (the idempotency key travels as a header).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RefundRequest {
    /// The gateway's id of the charge refunded (its `transaction_id`; Stripe: the
    /// PaymentIntent's id).
    pub payment_transaction_id: String,
    /// Amount refunded, in minor units; never more than is left of the charge.
    pub amount_minor: i64,
    /// ISO 4217 code: the charge's.
    pub currency: String,
    /// The refund row this request is for, when there is one: not part of the
    /// `refunds` body; a gateway that keeps metadata (Stripe) attaches it.
    #[serde(skip)]
    pub refund_id: Option<Uuid>,
}

/// One row of `GET /refunds`, and the answer of `GET /refunds/{key}`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RefundEntry {
    /// The key the refund was made under.
    pub idempotency_key: String,
    /// The gateway's id of the refund.
    pub transaction_id: String,
    /// The gateway's id of the charge it refunds.
    pub payment_transaction_id: String,
    /// Amount refunded, in minor units.
    pub amount_minor: i64,
    /// ISO 4217 code.
    pub currency: String,
    /// `approved` (refunded) or `declined` (refused by the gateway).
    pub status: ChargeStatus,
    /// When the gateway made the refund.
    pub refunded_at: DateTime<Utc>,
    /// POST requests this entry received (the first included).
    pub attempts: u64,
    /// Why a declined refund was declined, when the gateway says.
    #[serde(
        default,
        deserialize_with = "super::ids::decline_code",
        skip_serializing_if = "Option::is_none"
    )]
    pub decline_code: Option<String>,
}

impl RefundEntry {
    /// The gateway's answer this entry records.
    pub fn answer(&self) -> super::Charge {
        super::Charge {
            transaction_id: self.transaction_id.clone(),
            status: self.status,
            decline_code: self.decline_code.clone(),
        }
    }

    /// Whether this refund was made for `request`'s charge, amount and currency.
    pub fn matches(&self, request: &RefundRequest) -> bool {
        self.payment_transaction_id == request.payment_transaction_id
            && self.amount_minor == request.amount_minor
            && self.currency == request.currency
    }
}
