//! The HTTP client for a gateway that speaks the simulator's protocol
//! (`POST /charges` with `Idempotency-Key`, `GET /charges/{key}`, `GET /charges`;
//! the same for `/refunds`, in `client_refunds.rs`).
//!
//! The error mapping is what keeps I1 (one charge) honest. Answers to
//! `POST /charges` (and `POST /refunds`: read "refund" for "charge"), as real
//! gateways give them:
//!
//! | answer | error | meaning |
//! |---|---|---|
//! | 2xx, readable body | (none) | approved / declined |
//! | 2xx with an unreadable body, 3xx, 1xx or unknown code | `UnreadableAnswer` | unknown outcome |
//! | no answer in time, connection lost after sending | `Timeout` | unknown outcome |
//! | 409 | `InFlight` | a request with this key is still running: unknown outcome |
//! | 422 | `Rejected{422}` | key reused with another body |
//! | 400 and other 4xx not listed here | `Rejected` | the request itself is refused |
//! | 5xx (500, 502, 503, 504, …) once the request was sent | `FailedAfterSending` | may have charged (a proxy or the gateway failed after the work): unknown outcome |
//! | 401, 403, 404, 405, 408, 429, failed connect (nothing sent) | `Unavailable` | nothing charged; our access or the gateway is broken: retry later |
//!
//! Every failure is counted (`payment_worker.gateway.failures`) and logged, at
//! `error` when our access itself is refused (401, 403, 404, 405), without the
//! request body or the gateway's error text.

use std::time::Duration;

use reqwest::StatusCode;

use super::bodies::{error_text, read_body, BodyError, ONE_ANSWER};
use super::interface::{
    Charge, ChargeRequest, GatewayError, LeaseGuard, LedgerEntry, PaymentGateway,
};
use super::refunds::{RefundEntry, RefundRequest};
use super::transport::{checked_base_url, describe, GatewayTransport};
use crate::redaction::{masked_text, masked_within};
use crate::telemetry::events::GatewayCallFailed;
use crate::token::IdempotencyKey;

/// A rejection reason is shown to operators; a gateway could send a whole page.
const MAX_REASON_LEN: usize = 512;

/// The ledger dump can be large (one entry per charge); it gets at least this long.
pub(super) const MIN_LEDGER_TIMEOUT: Duration = Duration::from_secs(60);

/// The gateway over HTTP: `POST /charges` with an `Idempotency-Key`, `GET /charges/{key}`, `GET /charges`.
pub struct HttpGateway {
    pub(super) http: reqwest::Client,
    /// Always ends without a slash, so `{base}/charges` never doubles it.
    base: String,
    /// `{base}/charges` and `{base}/refunds`, parsed once: a URL parsed per request
    /// cost a payment about 3 % of its instructions.
    charges: reqwest::Url,
    refunds: reqwest::Url,
    pub(super) timeout: Duration,
}

impl std::fmt::Debug for HttpGateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpGateway")
            .field("base", &self.base)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl HttpGateway {
    /// `timeout` bounds a whole request (connect, send, answer); a charge that
    /// exceeds it is reported as [`GatewayError::Timeout`]. `connect_timeout` bounds
    /// the TCP connect only: a connect that fails or times out sent nothing.
    pub fn new(
        base_url: &str,
        timeout: Duration,
        connect_timeout: Duration,
    ) -> anyhow::Result<Self> {
        Self::with_transport(
            base_url,
            timeout,
            connect_timeout,
            &GatewayTransport::default(),
        )
    }

    /// As [`HttpGateway::new`], with the credentials and TLS of `transport`.
    pub fn with_transport(
        base_url: &str,
        timeout: Duration,
        connect_timeout: Duration,
        transport: &GatewayTransport,
    ) -> anyhow::Result<Self> {
        let base = checked_base_url(base_url)?;
        anyhow::ensure!(!timeout.is_zero(), "gateway timeout must be positive");
        anyhow::ensure!(
            !connect_timeout.is_zero(),
            "gateway connect timeout must be positive"
        );
        let http = transport.client(&base, timeout, connect_timeout)?;
        let charges = reqwest::Url::parse(&format!("{base}/charges"))?;
        let refunds = reqwest::Url::parse(&format!("{base}/refunds"))?;
        Ok(Self {
            http,
            base,
            charges,
            refunds,
            timeout,
        })
    }

    /// The gateway's base URL, without a trailing slash.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    fn charges_url(&self) -> &reqwest::Url {
        &self.charges
    }

    pub(super) fn refunds_url(&self) -> &reqwest::Url {
        &self.refunds
    }

    /// The status and the gateway's reason of an error answer (never called for 2xx).
    async fn status_and_reason(response: reqwest::Response) -> (StatusCode, String) {
        let status = response.status();
        (status, reason_from_body(error_text(response).await))
    }

    /// An error answer to a look-up or the ledger: nothing is charged by asking, so
    /// every failure is transient except a refusal of the request itself.
    pub(super) async fn read_error_from(response: reqwest::Response) -> GatewayError {
        let (status, reason) = Self::status_and_reason(response).await;
        let code = status.as_u16();
        if is_transient_status(code) || code == 409 || status.is_redirection() {
            GatewayError::Unavailable(format!("HTTP {code}: {reason}"))
        } else if status.is_client_error() {
            GatewayError::Rejected {
                status: code,
                reason,
            }
        } else {
            GatewayError::Protocol(format!("unexpected HTTP {code}"))
        }
    }

    /// `POST {url}` of `body` under `key` (a charge or a refund), the answer
    /// classified as the table at the top of this file says. The lease is checked
    /// right before the POST: one POST, one check.
    pub(super) async fn post_keyed<B: serde::Serialize + Sync>(
        &self,
        url: &reqwest::Url,
        operation: &'static str,
        key: &IdempotencyKey,
        body: &B,
        lease: &dyn LeaseGuard,
    ) -> Result<Charge, GatewayError> {
        lease.check().await.map_err(GatewayError::LeaseNotHeld)?;
        let response = match self
            .http
            .post(url.clone())
            .header("Idempotency-Key", key.as_str())
            .headers(trace_headers())
            .json(body)
            .send()
            .await
        {
            Ok(response) => response,
            Err(error) => {
                let error = charge_request_error(error);
                note_failure(operation, key, None, &error);
                return Err(error);
            }
        };
        let status = response.status();
        record_status(status);
        if !status.is_success() {
            let (status, reason) = Self::status_and_reason(response).await;
            let error = charge_error(status, reason);
            note_failure(operation, key, Some(status), &error);
            return Err(error);
        }
        // A 2xx means the gateway decided; a body that breaks off or cannot be read
        // leaves the decision unknown, which only a look-up can recover.
        let charge: Charge = match read_json(response, ONE_ANSWER).await {
            Ok(charge) => charge,
            Err(error) => {
                let error = GatewayError::UnreadableAnswer(match error {
                    ReadError::Body(error) => error.describe(),
                    ReadError::Decode(message) => format!("the body is not an answer: {message}"),
                });
                note_failure(operation, key, Some(status), &error);
                return Err(error);
            }
        };
        tracing::Span::current().record("gateway.status", charge.status.as_str());
        Ok(charge)
    }
}

/// Why a 2xx body was not read: not whole ([`super::bodies`]: the transport broke,
/// or the body is over its limit), or the bytes were not the expected JSON.
pub(super) enum ReadError {
    Body(BodyError),
    Decode(String),
}

/// A 2xx body of at most `limit` bytes, read as `T`.
pub(super) async fn read_json<T: serde::de::DeserializeOwned>(
    response: reqwest::Response,
    limit: usize,
) -> Result<T, ReadError> {
    let bytes = read_body(response, limit).await.map_err(ReadError::Body)?;
    serde_json::from_slice(&bytes).map_err(|error| ReadError::Decode(unreadable_json(&error)))
}

/// What an answer that is not the expected JSON is reported as: serde_json's message,
/// with any card number in it masked. The message quotes the value it could not read
/// (an unknown status, a number where a string was due), a gateway that echoes the
/// request may put a card number there, and the text travels on: retry reasons, a
/// dead letter's `x-error-reason`, log lines, `unresolved_charges.reason`.
pub(super) fn unreadable_json(error: &serde_json::Error) -> String {
    masked_text(&error.to_string()).into_owned()
}

/// For the idempotent GETs: no answer means nothing changed, so try again later.
pub(super) fn idempotent_request_error(error: reqwest::Error) -> GatewayError {
    if error.is_timeout() && !error.is_connect() {
        GatewayError::Timeout
    } else {
        GatewayError::Unavailable(describe(&error))
    }
}

pub(super) fn idempotent_request_error_or(error: ReadError) -> GatewayError {
    match error {
        ReadError::Body(BodyError::Transport(e)) => idempotent_request_error(e),
        ReadError::Body(too_large) => GatewayError::Protocol(too_large.describe()),
        ReadError::Decode(message) => GatewayError::Protocol(message),
    }
}

/// For the charge: once the request may have left this process, a missing answer
/// is an unknown outcome. Only a failed connect proves nothing was sent.
fn charge_request_error(error: reqwest::Error) -> GatewayError {
    if error.is_connect() {
        GatewayError::Unavailable(describe(&error))
    } else if error.is_builder() {
        GatewayError::Protocol(describe(&error))
    } else {
        GatewayError::Timeout
    }
}

/// Statuses that say the gateway did not act on the request, or that our access to
/// it is broken (credentials, URL, method, rate limit): retry later, count, alert.
/// 408 is here too: the gateway gave up waiting for the request it never processed.
fn is_transient_status(code: u16) -> bool {
    matches!(code, 401 | 403 | 404 | 405 | 408 | 429 | 500..=599)
}

/// A non-2xx answer to `POST /charges` (the table at the top of this file).
fn charge_error(status: StatusCode, reason: String) -> GatewayError {
    let code = status.as_u16();
    match code {
        409 => GatewayError::InFlight,
        // The request reached something that failed: the gateway, or a proxy in front
        // of it that may have passed the request on before it failed. Only a look-up
        // can tell whether a charge was made.
        500..=599 => GatewayError::FailedAfterSending {
            status: code,
            reason,
        },
        code if is_transient_status(code) => {
            GatewayError::Unavailable(format!("HTTP {code}: {reason}"))
        }
        400..=499 => GatewayError::Rejected {
            status: code,
            reason,
        },
        // A redirect answering a POST (303 See Other) usually points at a charge it
        // created; a 1xx or non-standard code says nothing. Ask before deciding.
        code => GatewayError::UnreadableAnswer(format!("unexpected HTTP {code}")),
    }
}

/// Counts and logs one failed gateway call. The gateway's error text and the
/// request body stay out of the log: either could echo a payment method.
pub(super) fn note_failure(
    operation: &'static str,
    key: &IdempotencyKey,
    status: Option<StatusCode>,
    error: &GatewayError,
) {
    let class = match error {
        GatewayError::Timeout
        | GatewayError::UnreadableAnswer(_)
        | GatewayError::InFlight
        | GatewayError::FailedAfterSending { .. } => "unknown_outcome",
        GatewayError::Unavailable(_) => "transient",
        GatewayError::Rejected { .. } => "rejected",
        GatewayError::Protocol(_) => "protocol",
        // Nothing was sent: no gateway call failed (never passed here).
        GatewayError::LeaseNotHeld(_) => "lease_not_held",
    };
    crate::telemetry::emit(GatewayCallFailed {
        key,
        operation,
        class,
        status: status.map(|s| s.as_u16()),
        error,
    });
}

/// Prefers the `error`/`message` of a JSON error body, else the text, shortened.
pub(super) fn reason_from_body(body: String) -> String {
    let from_json = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|value| {
            let error = value.get("error").and_then(|v| v.as_str());
            let message = value.get("message").and_then(|v| v.as_str());
            match (error, message) {
                (Some(error), Some(message)) => Some(format!("{error}: {message}")),
                (Some(one), None) | (None, Some(one)) => Some(one.to_owned()),
                (None, None) => None,
            }
        });
    // The reason travels on (results, dead-letter headers, logs), and a gateway
    // that echoes the request could put a card number in it, in any writing; it is
    // masked before and after it is cut to length (`masked_within`).
    let text = from_json.unwrap_or(body);
    if text.trim().is_empty() {
        return "no reason given".to_owned();
    }
    let mut reason = masked_within(&text, MAX_REASON_LEN);
    if text.chars().nth(MAX_REASON_LEN).is_some() {
        reason.push('…');
    }
    reason
}

/// The W3C trace context of the current (client) span, so the gateway's spans join
/// the command's trace.
pub(super) fn trace_headers() -> reqwest::header::HeaderMap {
    let mut headers = reqwest::header::HeaderMap::new();
    for (key, value) in crate::telemetry::current_trace_headers() {
        if let (Ok(name), Ok(value)) = (
            reqwest::header::HeaderName::from_bytes(key.as_bytes()),
            reqwest::header::HeaderValue::from_str(&value),
        ) {
            headers.insert(name, value);
        }
    }
    headers
}

pub(super) fn record_status(status: StatusCode) {
    tracing::Span::current().record("http.response.status_code", status.as_u16());
}

#[async_trait::async_trait]
impl PaymentGateway for HttpGateway {
    #[tracing::instrument(
        name = "gateway charge",
        skip_all,
        fields(
            otel.name = "POST /charges",
            otel.kind = "client",
            http.request.method = "POST",
            url.template = "/charges",
            http.response.status_code = tracing::field::Empty,
            gateway.status = tracing::field::Empty,
        )
    )]
    async fn charge(
        &self,
        key: &IdempotencyKey,
        request: &ChargeRequest,
        lease: &dyn LeaseGuard,
    ) -> Result<Charge, GatewayError> {
        self.post_keyed(self.charges_url(), "charge", key, request, lease)
            .await
    }

    #[tracing::instrument(
        name = "gateway lookup",
        skip_all,
        fields(
            otel.name = "GET /charges/{key}",
            otel.kind = "client",
            http.request.method = "GET",
            url.template = "/charges/{key}",
            http.response.status_code = tracing::field::Empty,
        )
    )]
    async fn lookup(&self, key: &IdempotencyKey) -> Result<Option<LedgerEntry>, GatewayError> {
        self.lookup_at(self.charges_url(), "lookup", key).await
    }

    async fn ledger(&self) -> Result<Vec<LedgerEntry>, GatewayError> {
        self.list_at(self.charges_url()).await
    }

    async fn refund(
        &self,
        key: &IdempotencyKey,
        request: &RefundRequest,
        lease: &dyn LeaseGuard,
    ) -> Result<Charge, GatewayError> {
        self.post_refund(key, request, lease).await
    }

    async fn lookup_refund(
        &self,
        key: &IdempotencyKey,
        _request: &RefundRequest,
    ) -> Result<Option<RefundEntry>, GatewayError> {
        // The key alone finds it; the caller compares the request with
        // `RefundEntry::matches`, as it does a charge's.
        self.get_refund(key).await
    }

    async fn refunds(&self) -> Result<Vec<RefundEntry>, GatewayError> {
        self.list_at(self.refunds_url()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreadable_answer_is_reported_without_the_card_number_it_quotes() {
        #[derive(Debug, serde::Deserialize)]
        #[serde(rename_all = "snake_case")]
        enum Status {
            Approved,
            Declined,
        }
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Answer {
            transaction_id: String,
            status: Status,
        }
        for body in [
            r#"{"transaction_id":"t","status":"card 4111111111111111"}"#,
            r#"{"transaction_id":4111111111111111,"status":"approved"}"#,
            r#"{"transaction_id":"t","status":"４１１１ １１１１ １１１１ １１１１"}"#,
        ] {
            let Err(error) = serde_json::from_str::<Answer>(body) else {
                panic!("{body} was read");
            };
            assert!(
                crate::redaction::contains_card_number(&error.to_string()),
                "serde_json quotes it: {error}"
            );
            let reported = unreadable_json(&error);
            assert!(
                !crate::redaction::holds_card_number(reported.as_bytes()),
                "{reported}"
            );
            assert!(reported.contains("****"), "masked, not dropped: {reported}");
        }
    }

    #[test]
    fn base_url_is_normalised_and_checked() {
        let t = Duration::from_secs(1);
        let gw = HttpGateway::new("http://127.0.0.1:8080/", t, t).unwrap();
        assert_eq!(gw.charges_url().as_str(), "http://127.0.0.1:8080/charges");
        let gw = HttpGateway::new("https://gw.example/v1/", t, t).unwrap();
        assert_eq!(gw.charges_url().as_str(), "https://gw.example/v1/charges");
        assert!(HttpGateway::new("ftp://gw.example", t, t).is_err());
        assert!(HttpGateway::new("not a url", t, t).is_err());
        assert!(HttpGateway::new("http://u:p@gw.example", t, t).is_err());
        assert!(HttpGateway::new("http://gw.example", Duration::ZERO, t).is_err());
        assert!(HttpGateway::new("http://gw.example", t, Duration::ZERO).is_err());
    }

    #[tokio::test]
    async fn a_failed_look_up_names_the_gateway_but_not_the_key() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = closed.local_addr().unwrap();
        drop(closed);
        let t = Duration::from_secs(1);
        let gateway = HttpGateway::new(&format!("http://{addr}"), t, t).unwrap();
        let card = IdempotencyKey::try_from("4111111111111111").unwrap();
        match gateway.lookup(&card).await {
            Err(GatewayError::Unavailable(text)) => {
                assert!(text.contains(&addr.to_string()), "{text}");
                assert!(!text.contains("4111111111111111"), "{text}");
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }

    #[test]
    fn reasons_are_read_from_json_and_shortened() {
        assert_eq!(
            reason_from_body(r#"{"error":"idempotency_key_reused","message":"other body"}"#.into()),
            "idempotency_key_reused: other body"
        );
        assert_eq!(reason_from_body("plain".into()), "plain");
        assert_eq!(
            reason_from_body(
                r#"{"error":"invalid_request","message":"card 4111 1111 1111 1111 refused"}"#
                    .into()
            ),
            "invalid_request: card **** **** **** 1111 refused"
        );
        assert_eq!(reason_from_body("".into()), "no reason given");
        assert_eq!(
            reason_from_body("x".repeat(2000)).chars().count(),
            MAX_REASON_LEN + 1
        );
        // Masked after the cut too: a run of 20 digits is no card, its first 16 are.
        let filler = "a".repeat(MAX_REASON_LEN - "declined: ".len() - 16);
        let cut = reason_from_body(format!(
            r#"{{"error":"declined","message":"{filler}41111111111111111111"}}"#
        ));
        assert_eq!(cut.chars().count(), MAX_REASON_LEN + 1);
        assert!(
            !crate::redaction::contains_card_number(&cut),
            "{}",
            &cut[cut.len() - 24..]
        );
    }

    #[test]
    fn charge_answers_are_classified_as_real_gateways_mean_them() {
        let class = |code: u16| {
            let status = StatusCode::from_u16(code).unwrap();
            match charge_error(status, "why".into()) {
                GatewayError::InFlight => "in_flight",
                GatewayError::FailedAfterSending { .. } => "may_have_charged",
                GatewayError::Unavailable(_) => "transient",
                GatewayError::Rejected { status: 422, .. } => "key_reused",
                GatewayError::Rejected { .. } => "invalid",
                GatewayError::UnreadableAnswer(_) => "unknown",
                other => panic!("HTTP {code}: {other:?}"),
            }
        };
        for (codes, expected) in [
            (&[409][..], "in_flight"),
            (&[401, 403, 404, 405, 408, 429][..], "transient"),
            (&[500, 502, 503, 504, 501, 599][..], "may_have_charged"),
            (&[422][..], "key_reused"),
            (&[400, 402, 406, 410, 413, 415, 418, 451][..], "invalid"),
            (&[301, 302, 303, 307, 308, 101, 600][..], "unknown"),
        ] {
            for &code in codes {
                assert_eq!(class(code), expected, "HTTP {code}");
            }
        }
        for unknown in [
            GatewayError::Timeout,
            GatewayError::InFlight,
            GatewayError::UnreadableAnswer("x".into()),
            GatewayError::FailedAfterSending {
                status: 502,
                reason: "x".into(),
            },
        ] {
            assert!(
                unknown.outcome_unknown() && unknown.is_retryable(),
                "{unknown:?}"
            );
        }
        assert!(!GatewayError::Unavailable("x".into()).outcome_unknown());
        assert!(!GatewayError::Rejected {
            status: 400,
            reason: "x".into()
        }
        .is_retryable());
    }
}
