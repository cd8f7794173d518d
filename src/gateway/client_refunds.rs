//! Refunds over the simulator's protocol: `POST /refunds` under an
//! `Idempotency-Key`, `GET /refunds/{key}`, `GET /refunds`. A refund travels
//! like a charge, so its answers are classified by the same table (`client.rs`):
//! a timeout, an unreadable 2xx, a 409 or a 5xx after sending is an unknown
//! outcome; 422 a key reused; another 4xx a refusal (the simulator's
//! `amount_too_large`, `currency_mismatch`, …); a failed connect, 401, 403,
//! 404, 405, 408 or 429 unavailable.

use super::client::HttpGateway;
use super::client_reads::KeyedEntry;
use super::interface::{Charge, GatewayError, LeaseGuard};
use super::refunds::{RefundEntry, RefundRequest};
use crate::token::IdempotencyKey;

impl KeyedEntry for RefundEntry {
    fn idempotency_key(&self) -> &str {
        &self.idempotency_key
    }

    fn made_at(&self) -> chrono::DateTime<chrono::Utc> {
        self.refunded_at
    }
}

impl HttpGateway {
    /// `POST /refunds`; the lease is checked right before it.
    #[tracing::instrument(
        name = "gateway refund",
        skip_all,
        fields(
            otel.name = "POST /refunds",
            otel.kind = "client",
            http.request.method = "POST",
            url.template = "/refunds",
            http.response.status_code = tracing::field::Empty,
            gateway.status = tracing::field::Empty,
        )
    )]
    pub(super) async fn post_refund(
        &self,
        key: &IdempotencyKey,
        request: &RefundRequest,
        lease: &dyn LeaseGuard,
    ) -> Result<Charge, GatewayError> {
        self.post_keyed(self.refunds_url(), "refund", key, request, lease)
            .await
    }

    /// `GET /refunds/{key}`.
    #[tracing::instrument(
        name = "gateway refund lookup",
        skip_all,
        fields(
            otel.name = "GET /refunds/{key}",
            otel.kind = "client",
            http.request.method = "GET",
            url.template = "/refunds/{key}",
            http.response.status_code = tracing::field::Empty,
        )
    )]
    pub(super) async fn get_refund(
        &self,
        key: &IdempotencyKey,
    ) -> Result<Option<RefundEntry>, GatewayError> {
        self.lookup_at(self.refunds_url(), "lookup_refund", key)
            .await
    }
}
