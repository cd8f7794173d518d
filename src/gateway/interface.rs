use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::refunds::{RefundEntry, RefundRequest};
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
    /// The payment row the charge is for, when there is one: not part of the
    /// `charges` body; a gateway that keeps metadata (Stripe) attaches it.
    #[serde(skip)]
    pub payment_id: Option<Uuid>,
}

impl ChargeRequest {
    /// The same request, for the payment row `payment_id`.
    pub fn for_payment(self, payment_id: Uuid) -> Self {
        Self {
            payment_id: Some(payment_id),
            ..self
        }
    }
}

impl std::fmt::Debug for ChargeRequest {
    // The payment method is a credential reference: keep it out of every log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChargeRequest")
            .field("amount_minor", &self.amount_minor)
            .field("currency", &self.currency)
            .field("payment_method", &"<redacted>")
            .field("payment_id", &self.payment_id)
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
    #[serde(deserialize_with = "super::ids::gateway_id")]
    pub transaction_id: String,
    /// Approved or declined.
    pub status: ChargeStatus,
    /// Why a declined charge was declined, when the gateway says (Stripe's
    /// `decline_code`, else its `code`).
    #[serde(
        default,
        deserialize_with = "super::ids::decline_code",
        skip_serializing_if = "Option::is_none"
    )]
    pub decline_code: Option<String>,
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
    /// Why a declined charge was declined, when the gateway says.
    #[serde(
        default,
        deserialize_with = "super::ids::decline_code",
        skip_serializing_if = "Option::is_none"
    )]
    pub decline_code: Option<String>,
}

impl LedgerEntry {
    /// The charge this entry records.
    pub fn charge(&self) -> Charge {
        Charge {
            transaction_id: self.transaction_id.clone(),
            status: self.status,
            decline_code: self.decline_code.clone(),
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
    /// A 5xx answered after the request was sent: the gateway, or a proxy in front
    /// of it, failed, possibly after the work was done (Stripe's rule: a 5xx is an
    /// unknown result). Unknown outcome: every later attempt looks the charge up
    /// before it charges.
    #[error("gateway failed with HTTP {status} after the request was sent; the outcome is unknown: {reason}")]
    FailedAfterSending {
        /// The HTTP status (500 to 599).
        status: u16,
        /// The gateway's reason, shortened.
        reason: String,
    },
    /// Nothing was charged and a later attempt may succeed: a connect that failed
    /// (nothing was sent), 429, 408, or our access to the gateway is broken (401,
    /// 403, 404, 405); for a look-up, also a 5xx (asking charges nothing).
    #[error("gateway unavailable: {0}")]
    Unavailable(String),
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
    /// The lease check right before a POST that may create or charge did not
    /// pass, so that POST was not sent (see [`LeaseGuard`]).
    #[error("{0} before a request that may charge; it was not sent")]
    LeaseNotHeld(LeaseLoss),
}

/// Why the lease check before a POST did not pass.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseLoss {
    /// The token is no longer held under this attempt's claim: another holder may
    /// own the key now, and it decides.
    #[error("lease lost")]
    Lost,
    /// The token store could not be asked; whether the lease holds is unknown.
    #[error("lease check failed: {0}")]
    Unchecked(String),
}

/// The caller's lease on the key, asked by an adapter right before each POST that
/// may create or charge. A charge can take several requests (Stripe: read the
/// payment's PaymentIntents, list, create, record, confirm), seconds apart; a
/// worker paused or cut off meanwhile may have been replaced, and a POST sent
/// after that could charge a second time under a key the gateway cannot match to
/// the new holder's. So the lease is checked (and renewed) right before each POST,
/// not only once before the charge begins; no check, no POST.
#[async_trait::async_trait]
pub trait LeaseGuard: Send + Sync {
    /// Whether this attempt still holds the key's lease, now.
    async fn check(&self) -> Result<(), LeaseLoss>;
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
            Self::Timeout
                | Self::UnreadableAnswer(_)
                | Self::InFlight
                | Self::FailedAfterSending { .. }
        )
    }
}

/// A charge a two-phase gateway made ready and nobody confirmed (Stripe: a
/// PaymentIntent awaiting its confirm). It charges nothing; left alone it is an
/// orphan, which `audit` lists and `audit --repair` cancels.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Unconfirmed {
    /// The key it was made for.
    pub idempotency_key: String,
    /// The gateway's id of it.
    pub id: String,
    /// Amount in minor units.
    pub amount_minor: i64,
    /// ISO 4217 code.
    pub currency: String,
    /// When the gateway made it.
    pub created_at: DateTime<Utc>,
}

/// A payment gateway: charges under an idempotency key, looked up by it. Each
/// adapter (`client.rs` for the `charges` protocol, `stripe/` for PaymentIntents)
/// keeps its protocol to itself; the processor, `audit` and the dry run speak to
/// this trait only.
#[async_trait::async_trait]
pub trait PaymentGateway: Send + Sync + 'static {
    /// Charges `request` under `key`, or answers what an earlier attempt under
    /// `key` already settled (`charges`: `POST /charges` with `Idempotency-Key`).
    /// `lease` is checked right before every POST that may create or charge; when
    /// it does not pass, that POST is not sent and the answer is
    /// [`GatewayError::LeaseNotHeld`].
    async fn charge(
        &self,
        key: &IdempotencyKey,
        request: &ChargeRequest,
        lease: &dyn LeaseGuard,
    ) -> Result<Charge, GatewayError>;

    /// The final charge made under `key`, if any, with the amount and currency it
    /// was made for, so the caller can tell a reused key (`charges`:
    /// `GET /charges/{key}`). `None`: no charge shows (yet).
    async fn lookup(&self, key: &IdempotencyKey) -> Result<Option<LedgerEntry>, GatewayError>;

    /// Every charge the gateway holds for this worker (audit, tests).
    async fn ledger(&self) -> Result<Vec<LedgerEntry>, GatewayError>;

    /// Refunds `request` under `key`, or answers what an earlier attempt under
    /// `key` already settled (`charges`: `POST /refunds` with `Idempotency-Key`).
    /// The same rules as [`PaymentGateway::charge`]: `lease` checked right before
    /// every POST, an unknown outcome reported as such, never guessed.
    /// A gateway that cannot refund (a test double) refuses every refund for good.
    async fn refund(
        &self,
        _key: &IdempotencyKey,
        _request: &RefundRequest,
        _lease: &dyn LeaseGuard,
    ) -> Result<Charge, GatewayError> {
        Err(no_refunds())
    }

    /// The refund made under `key` for `request`'s charge, if any (`charges`:
    /// `GET /refunds/{key}`; Stripe: the PaymentIntent's refunds, filtered on the
    /// key). `None`: no refund shows (yet).
    async fn lookup_refund(
        &self,
        _key: &IdempotencyKey,
        _request: &RefundRequest,
    ) -> Result<Option<RefundEntry>, GatewayError> {
        Ok(None)
    }

    /// Every refund the gateway holds for this worker (audit, tests).
    async fn refunds(&self) -> Result<Vec<RefundEntry>, GatewayError> {
        Ok(Vec::new())
    }

    /// Whether this gateway can take `request` at all, decided before anything
    /// is sent; `Err` is the refusal (`<reason code>: <explanation>`).
    fn accepts(&self, _request: &ChargeRequest) -> Result<(), String> {
        Ok(())
    }

    /// Charges made ready and never confirmed; a one-phase gateway has none.
    async fn unconfirmed(&self) -> Result<Vec<Unconfirmed>, GatewayError> {
        Ok(Vec::new())
    }

    /// Cancels one of [`PaymentGateway::unconfirmed`], so nothing can confirm it
    /// later.
    async fn cancel_unconfirmed(&self, _unconfirmed: &Unconfirmed) -> Result<(), GatewayError> {
        Err(GatewayError::Protocol(
            "this gateway holds no unconfirmed charges".to_owned(),
        ))
    }
}

/// The refusal of a gateway that cannot refund (a test double without refunds):
/// final, nothing sent.
fn no_refunds() -> GatewayError {
    GatewayError::Rejected {
        status: 501,
        reason: "this gateway does not refund".to_owned(),
    }
}
