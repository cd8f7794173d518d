use chrono::{DateTime, Utc};

use crate::token::IdempotencyKey;

/// The body of `POST /charges` (the gateway contract, docs/CONTRACT.md). The idempotency key travels as a header.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChargeRequest {
    /// Amount in minor units (cents).
    pub amount_minor: i64,
    /// ISO 4217 code.
    pub currency: String,
    /// What to charge; never logged.
    pub payment_method: String,
}

impl std::fmt::Debug for ChargeRequest {
    // The payment method is a credential reference: keep it out of every log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChargeRequest")
            .field("amount_minor", &self.amount_minor)
            .field("currency", &self.currency)
            .field("payment_method", &"<redacted>")
            .finish()
    }
}

/// The gateway's verdict on a charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChargeStatus {
    /// Charged.
    Approved,
    /// Refused by the payment method's issuer; final.
    Declined,
}

impl ChargeStatus {
    /// The gateway's own spelling (`approved`, `declined`), as on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Approved => "approved",
            Self::Declined => "declined",
        }
    }
}

/// The gateway's answer for one idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Charge {
    /// The gateway's id of the charge.
    pub transaction_id: String,
    /// Approved or declined.
    pub status: ChargeStatus,
}

/// One row of `GET /charges` (the gateway contract, docs/CONTRACT.md), and the answer of `GET /charges/{key}`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LedgerEntry {
    /// The key the charge was made under.
    pub idempotency_key: String,
    /// The gateway's id of the charge.
    pub transaction_id: String,
    /// Amount in minor units.
    pub amount_minor: i64,
    /// ISO 4217 code.
    pub currency: String,
    /// Approved or declined.
    pub status: ChargeStatus,
    /// When the gateway made the charge.
    pub charged_at: DateTime<Utc>,
    /// POST requests this entry received (the first included).
    pub attempts: u64,
}

impl LedgerEntry {
    /// The charge this entry records.
    pub fn charge(&self) -> Charge {
        Charge {
            transaction_id: self.transaction_id.clone(),
            status: self.status,
        }
    }

    /// Whether this charge was made for `request`'s amount and currency.
    pub fn matches(&self, request: &ChargeRequest) -> bool {
        self.amount_minor == request.amount_minor && self.currency == request.currency
    }
}

/// How a gateway call failed. The processor branches on the variant; the HTTP
/// answers behind each are listed in `client.rs`.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// No answer in time, or the connection broke after the request may have been
    /// sent: the charge may or may not have happened (unknown outcome).
    #[error("gateway timed out; the outcome is unknown")]
    Timeout,
    /// The gateway answered, but not in a way that says what it did: a 2xx whose body
    /// cannot be read, a redirect, a status no gateway should send. Unknown outcome.
    #[error("gateway answered unreadably; the outcome is unknown: {0}")]
    UnreadableAnswer(String),
    /// 409: a request with this idempotency key is still being processed at the
    /// gateway. It may yet charge: unknown outcome.
    #[error("gateway is still processing a request with this key (HTTP 409)")]
    InFlight,
    /// Nothing was charged and a later attempt may succeed: a connect that failed,
    /// 5xx, 429, 408, or our access to the gateway is broken (401, 403, 404, 405).
    #[error("gateway unavailable: {0}")]
    Unavailable(String),
    /// The gateway refused this request for good (422: key reused with another body;
    /// 400 and other 4xx: the request itself is refused).
    /// The gateway refused this request for good (422: key reused with another body; 400 and other 4xx: the request itself is refused).
    #[error("gateway rejected the request with HTTP {status}: {reason}")]
    Rejected {
        /// The HTTP status.
        status: u16,
        /// The gateway's reason, shortened.
        reason: String,
    },
    /// A look-up or ledger answer this client cannot read (no charge is at stake).
    #[error("gateway answered unreadably: {0}")]
    Protocol(String),
}

impl GatewayError {
    /// Retrying the same request with the same idempotency key is safe and may succeed.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, Self::Rejected { .. })
    }

    /// The request may have charged: only a look-up by key can tell.
    pub fn outcome_unknown(&self) -> bool {
        matches!(
            self,
            Self::Timeout | Self::UnreadableAnswer(_) | Self::InFlight
        )
    }
}

/// A payment gateway that honours an idempotency key per charge.
#[async_trait::async_trait]
pub trait PaymentGateway: Send + Sync + 'static {
    /// `POST /charges` with `Idempotency-Key: key`.
    async fn charge(
        &self,
        key: &IdempotencyKey,
        request: &ChargeRequest,
    ) -> Result<Charge, GatewayError>;

    /// `GET /charges/{key}`: the charge made under `key`, if any, with the amount and
    /// currency it was made for, so the caller can tell a reused key.
    async fn lookup(&self, key: &IdempotencyKey) -> Result<Option<LedgerEntry>, GatewayError>;

    /// `GET /charges`: the whole ledger (audit, tests).
    async fn ledger(&self) -> Result<Vec<LedgerEntry>, GatewayError>;
}
