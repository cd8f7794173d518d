//! The HTTP client for a gateway that speaks the protocol of SPEC §7.
//!
//! The error mapping is what keeps I1 (one charge) honest: anything that may have
//! reached the gateway without a readable answer is [`GatewayError::Timeout`]
//! (unknown outcome, look the charge up before deciding); only failures that
//! provably charged nothing are [`GatewayError::Unavailable`].

use std::time::Duration;

use anyhow::Context as _;
use reqwest::{StatusCode, Url};

use super::interface::{Charge, ChargeRequest, GatewayError, LedgerEntry, PaymentGateway};
use crate::token::IdempotencyKey;

/// A rejection reason is shown to operators; a gateway could send a whole page.
const MAX_REASON_LEN: usize = 512;

/// The ledger dump can be large (one entry per charge); it gets at least this long.
const MIN_LEDGER_TIMEOUT: Duration = Duration::from_secs(60);

pub struct HttpGateway {
    http: reqwest::Client,
    /// Always ends without a slash, so `{base}/charges` never doubles it.
    base: String,
    timeout: Duration,
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
        let url =
            Url::parse(base_url).with_context(|| format!("invalid gateway URL {base_url:?}"))?;
        anyhow::ensure!(
            matches!(url.scheme(), "http" | "https"),
            "gateway URL must be http or https, got {:?}",
            url.scheme()
        );
        anyhow::ensure!(
            url.query().is_none() && url.fragment().is_none(),
            "gateway URL must not carry a query or fragment"
        );
        anyhow::ensure!(
            url.username().is_empty() && url.password().is_none(),
            "gateway URL must not carry credentials"
        );
        anyhow::ensure!(!timeout.is_zero(), "gateway timeout must be positive");
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(connect_timeout)
            // A redirected POST turns into a GET in most clients; a gateway that
            // redirects a charge is misconfigured and must be seen as such.
            .redirect(reqwest::redirect::Policy::none())
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(30))
            .user_agent(concat!("payment-worker/", env!("CARGO_PKG_VERSION")))
            .build()
            .context("building the gateway HTTP client")?;
        Ok(Self {
            http,
            base: url.as_str().trim_end_matches('/').to_owned(),
            timeout,
        })
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    fn charges_url(&self) -> String {
        format!("{}/charges", self.base)
    }

    /// Reads an error answer into the matching variant (never called for 2xx).
    async fn error_from(response: reqwest::Response) -> GatewayError {
        let status = response.status();
        let reason = reason_from_body(response.text().await.unwrap_or_default());
        if status.is_server_error()
            || status == StatusCode::TOO_MANY_REQUESTS
            || status == StatusCode::REQUEST_TIMEOUT
        {
            // 5xx, 429 and 408 say the gateway did not process the request: safe to
            // retry later, unlike a real 4xx refusal.
            GatewayError::Unavailable(format!("HTTP {}: {reason}", status.as_u16()))
        } else if status.is_client_error() {
            GatewayError::Rejected {
                status: status.as_u16(),
                reason,
            }
        } else {
            GatewayError::Protocol(format!("unexpected HTTP {}", status.as_u16()))
        }
    }

    /// Look-up for keys made only of dots: `.` and `..` are dot segments that every
    /// URL parser folds away (`/charges/..` is `/`), even percent-encoded, so they
    /// are asked for through the ledger filtered by key instead.
    async fn lookup_via_ledger(
        &self,
        key: &IdempotencyKey,
    ) -> Result<Option<LedgerEntry>, GatewayError> {
        let response = self
            .http
            .get(self.charges_url())
            .query(&[("idempotency_key", key.as_str())])
            .send()
            .await
            .map_err(idempotent_request_error)?;
        if !response.status().is_success() {
            return Err(Self::error_from(response).await);
        }
        let entries: Vec<LedgerEntry> = read_json(response)
            .await
            .map_err(idempotent_request_error_or)?;
        Ok(entries
            .into_iter()
            .filter(|entry| entry.idempotency_key == key.as_str())
            .max_by_key(|entry| entry.charged_at))
    }
}

/// Body-read failures split in two: the transport broke (`Err(reqwest)`) or the
/// bytes were not the expected JSON (`Ok(message)`).
enum ReadError {
    Transport(reqwest::Error),
    Decode(String),
}

async fn read_json<T: serde::de::DeserializeOwned>(
    response: reqwest::Response,
) -> Result<T, ReadError> {
    let bytes = response.bytes().await.map_err(ReadError::Transport)?;
    serde_json::from_slice(&bytes).map_err(|e| ReadError::Decode(e.to_string()))
}

/// For the idempotent GETs: no answer means nothing changed, so try again later.
fn idempotent_request_error(error: reqwest::Error) -> GatewayError {
    if error.is_timeout() && !error.is_connect() {
        GatewayError::Timeout
    } else {
        GatewayError::Unavailable(describe(&error))
    }
}

fn idempotent_request_error_or(error: ReadError) -> GatewayError {
    match error {
        ReadError::Transport(e) => idempotent_request_error(e),
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

/// The whole error chain: reqwest's Display stops at the top level and hides the
/// cause an operator needs ("connection refused", "dns error", …).
fn describe(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Prefers the `error`/`message` of a JSON error body, else the text, shortened.
fn reason_from_body(body: String) -> String {
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
    let mut reason = from_json.unwrap_or(body);
    if reason.trim().is_empty() {
        reason = "no reason given".to_owned();
    }
    if reason.chars().count() > MAX_REASON_LEN {
        reason = reason.chars().take(MAX_REASON_LEN).collect::<String>() + "…";
    }
    reason
}

/// The W3C trace context of the current (client) span, so the gateway's spans join
/// the command's trace.
fn trace_headers() -> reqwest::header::HeaderMap {
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

fn record_status(status: StatusCode) {
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
    ) -> Result<Charge, GatewayError> {
        let response = self
            .http
            .post(self.charges_url())
            .header("Idempotency-Key", key.as_str())
            .headers(trace_headers())
            .json(request)
            .send()
            .await
            .map_err(charge_request_error)?;
        record_status(response.status());
        if !response.status().is_success() {
            return Err(Self::error_from(response).await);
        }
        // A 2xx means the gateway decided; a body that breaks off or cannot be read
        // leaves the decision unknown, which a look-up can recover.
        let charge: Charge = read_json(response).await.map_err(|e| match e {
            ReadError::Transport(_) => GatewayError::Timeout,
            ReadError::Decode(message) => GatewayError::Protocol(message),
        })?;
        tracing::Span::current().record(
            "gateway.status",
            match charge.status {
                crate::gateway::ChargeStatus::Approved => "approved",
                crate::gateway::ChargeStatus::Declined => "declined",
            },
        );
        Ok(charge)
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
        if key.as_str().bytes().all(|b| b == b'.') {
            return self.lookup_via_ledger(key).await;
        }
        // The key alphabet [A-Za-z0-9._:-] is all URL-safe in a path segment.
        let url = format!("{}/{}", self.charges_url(), key.as_str());
        let response = self
            .http
            .get(url)
            .headers(trace_headers())
            .send()
            .await
            .map_err(idempotent_request_error)?;
        record_status(response.status());
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !response.status().is_success() {
            return Err(Self::error_from(response).await);
        }
        read_json(response)
            .await
            .map(Some)
            .map_err(idempotent_request_error_or)
    }

    async fn ledger(&self) -> Result<Vec<LedgerEntry>, GatewayError> {
        let response = self
            .http
            .get(self.charges_url())
            .timeout(self.timeout.max(MIN_LEDGER_TIMEOUT))
            .send()
            .await
            .map_err(idempotent_request_error)?;
        if !response.status().is_success() {
            return Err(Self::error_from(response).await);
        }
        read_json(response)
            .await
            .map_err(idempotent_request_error_or)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_url_is_normalised_and_checked() {
        let t = Duration::from_secs(1);
        let gw = HttpGateway::new("http://127.0.0.1:8080/", t, t).unwrap();
        assert_eq!(gw.charges_url(), "http://127.0.0.1:8080/charges");
        let gw = HttpGateway::new("https://gw.example/v1/", t, t).unwrap();
        assert_eq!(gw.charges_url(), "https://gw.example/v1/charges");
        assert!(HttpGateway::new("ftp://gw.example", t, t).is_err());
        assert!(HttpGateway::new("not a url", t, t).is_err());
        assert!(HttpGateway::new("http://u:p@gw.example", t, t).is_err());
        assert!(HttpGateway::new("http://gw.example", Duration::ZERO, t).is_err());
    }

    #[test]
    fn reasons_are_read_from_json_and_shortened() {
        assert_eq!(
            reason_from_body(r#"{"error":"idempotency_key_reused","message":"other body"}"#.into()),
            "idempotency_key_reused: other body"
        );
        assert_eq!(reason_from_body("plain".into()), "plain");
        assert_eq!(reason_from_body("".into()), "no reason given");
        assert_eq!(
            reason_from_body("x".repeat(2000)).chars().count(),
            MAX_REASON_LEN + 1
        );
    }
}
