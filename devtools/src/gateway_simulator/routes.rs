//! The HTTP routes: `POST /charges`, `GET /charges/{key}`, `GET /charges`, and
//! the same three for `/refunds`, with `GET /refund-refusals`.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use super::ledger::{Decision, Delivery, Shared};
use super::refunds::RefundRefusal;
use payment_worker::gateway::{ChargeRequest, LedgerEntry, RefundEntry, RefundRequest};
use payment_worker::token::IdempotencyKey;

/// An error answer: `{"error": code, "message": …}`.
struct Rejection {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.code, "message": self.message });
        (self.status, Json(body)).into_response()
    }
}

fn error(status: StatusCode, code: &'static str, message: impl Into<String>) -> Rejection {
    Rejection {
        status,
        code,
        message: message.into(),
    }
}

fn key_from_headers(headers: &HeaderMap) -> Result<IdempotencyKey, Rejection> {
    let mut values = headers.get_all("idempotency-key").iter();
    let Some(value) = values.next() else {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "missing_idempotency_key",
            "the Idempotency-Key header is required",
        ));
    };
    if values.next().is_some() {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "invalid_idempotency_key",
            "the Idempotency-Key header must appear once",
        ));
    }
    let text = value.to_str().map_err(|_| {
        error(
            StatusCode::BAD_REQUEST,
            "invalid_idempotency_key",
            "the Idempotency-Key header is not visible ASCII",
        )
    })?;
    IdempotencyKey::try_from(text).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            "invalid_idempotency_key",
            e.to_string(),
        )
    })
}

/// The body is parsed here rather than by axum's `Json`: its rejection texts can
/// quote the body (and so the payment method), and its 422 would be confused with
/// "key reused with another body". `shape` names the fields, for the refusal.
fn json_body<T: serde::de::DeserializeOwned>(body: &[u8], shape: &str) -> Result<T, Rejection> {
    serde_json::from_slice(body).map_err(|e| {
        invalid(format!(
            "the body must be a JSON object {{{shape}}} ({:?} error at line {}, column {})",
            e.classify(),
            e.line(),
            e.column()
        ))
    })
}

fn invalid(message: String) -> Rejection {
    error(StatusCode::BAD_REQUEST, "invalid_request", message)
}

/// What a charge and a refund both need: a positive amount, an ISO 4217 code.
fn check_amount(amount_minor: i64, currency: &str) -> Result<(), Rejection> {
    if amount_minor < 1 {
        return Err(invalid("amount_minor must be at least 1".into()));
    }
    if !(currency.len() == 3 && currency.bytes().all(|b| b.is_ascii_uppercase())) {
        return Err(invalid("currency must be three upper-case letters".into()));
    }
    Ok(())
}

fn request_from_body(body: &[u8]) -> Result<ChargeRequest, Rejection> {
    let request: ChargeRequest = json_body(body, "amount_minor, currency, payment_method")?;
    check_amount(request.amount_minor, &request.currency)?;
    if request.payment_method.is_empty() {
        return Err(invalid("payment_method must not be empty".into()));
    }
    Ok(request)
}

/// As [`request_from_body`], for `POST /refunds`.
fn refund_from_body(body: &[u8]) -> Result<RefundRequest, Rejection> {
    let request: RefundRequest = json_body(body, "payment_transaction_id, amount_minor, currency")?;
    check_amount(request.amount_minor, &request.currency)?;
    if request.payment_transaction_id.is_empty() {
        return Err(invalid("payment_transaction_id must not be empty".into()));
    }
    Ok(request)
}

/// The trace context headers of a POST, as sent.
fn trace_headers_of(headers: &HeaderMap) -> Vec<(String, String)> {
    ["traceparent", "tracestate", "baggage"]
        .iter()
        .flat_map(|name| {
            headers.get_all(*name).iter().map(move |value| {
                (
                    (*name).to_owned(),
                    String::from_utf8_lossy(value.as_bytes()).into_owned(),
                )
            })
        })
        .collect()
}

async fn post_charge(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (key, request) = match keyed(&headers, &body, request_from_body) {
        Ok(keyed) => keyed,
        Err(rejection) => return rejection.into_response(),
    };
    shared.remember_trace_headers(&key, trace_headers_of(&headers));
    latency(&shared).await;
    let decision = shared.decide(&key, &request);
    answer(&shared, &key, decision).await
}

/// The key and the body of a POST, or the 400 refusing either.
fn keyed<T>(
    headers: &HeaderMap,
    body: &[u8],
    parse: fn(&[u8]) -> Result<T, Rejection>,
) -> Result<(IdempotencyKey, T), Rejection> {
    Ok((key_from_headers(headers)?, parse(body)?))
}

async fn post_refund(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (key, request) = match keyed(&headers, &body, refund_from_body) {
        Ok(keyed) => keyed,
        Err(rejection) => return rejection.into_response(),
    };
    latency(&shared).await;
    let decision = shared.decide_refund(&key, &request);
    answer(&shared, &key, decision).await
}

/// `--latency-ms`, before every request is handled.
async fn latency(shared: &Shared) {
    if shared.config.latency_ms > 0 {
        tokio::time::sleep(Duration::from_millis(shared.config.latency_ms)).await;
    }
}

/// The answer to a POST of `key` (charge or refund), delivered as the faults say.
async fn answer(shared: &Shared, key: &IdempotencyKey, decision: Decision) -> Response {
    match decision {
        Decision::Unavailable => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "injected fault; nothing was done",
        )
        .into_response(),
        Decision::Conflict => error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency_key_reused",
            "this Idempotency-Key was first used with a different request body",
        )
        .into_response(),
        Decision::Refused { code, message } => {
            error(StatusCode::BAD_REQUEST, code, message).into_response()
        }
        Decision::Answer { charge, delivery } => {
            // The work is already booked: a client that gives up while this
            // sleeps leaves a charge or refund it has no answer for, as with a
            // real gateway.
            let mut hold = shared
                .slow_keys
                .get(key.as_str())
                .copied()
                .unwrap_or_default();
            if delivery == Delivery::Late {
                hold += Duration::from_millis(shared.config.late_by_ms);
            }
            if !hold.is_zero() {
                tokio::time::sleep(hold).await;
            }
            match delivery {
                // A proxy in front of the gateway failed after passing the request on.
                Delivery::FailedAfterCharge(status) => error(
                    StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
                    "upstream_failed",
                    "injected fault: the request was passed on and its answer lost",
                )
                .into_response(),
                Delivery::OnTime | Delivery::Late => Json(charge).into_response(),
            }
        }
    }
}

async fn get_charge(State(shared): State<Arc<Shared>>, Path(key): Path<String>) -> Response {
    latency(&shared).await;
    match shared.lookup(&key) {
        Some(charge) => Json(charge).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            "not_found",
            "no charge was made under this idempotency key",
        )
        .into_response(),
    }
}

#[derive(serde::Deserialize)]
struct LedgerQuery {
    idempotency_key: Option<String>,
}

async fn get_ledger(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<LedgerQuery>,
) -> Json<Vec<LedgerEntry>> {
    Json(shared.snapshot(query.idempotency_key.as_deref()))
}

async fn get_refund(State(shared): State<Arc<Shared>>, Path(key): Path<String>) -> Response {
    latency(&shared).await;
    match shared.lookup_refund(&key) {
        Some(refund) => Json(refund).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            "not_found",
            "no refund was made under this idempotency key",
        )
        .into_response(),
    }
}

async fn get_refunds(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<LedgerQuery>,
) -> Json<Vec<RefundEntry>> {
    Json(shared.refund_snapshot(query.idempotency_key.as_deref()))
}

async fn get_refund_refusals(State(shared): State<Arc<Shared>>) -> Json<Vec<RefundRefusal>> {
    Json(shared.refund_refusals())
}

pub(super) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/charges", get(get_ledger).post(post_charge))
        .route("/charges/{key}", get(get_charge))
        .route("/refunds", get(get_refunds).post(post_refund))
        .route("/refunds/{key}", get(get_refund))
        .route("/refund-refusals", get(get_refund_refusals))
        // For container health checks (`payment-worker healthcheck`).
        .route("/healthz", get(|| async { "ok" }))
        .with_state(shared)
}
