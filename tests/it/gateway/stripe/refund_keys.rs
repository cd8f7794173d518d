//! The Stripe adapter's attempt keys for refunds (`<key>:refund:<n>`) against a
//! small Stripe-like refunds server that, as Stripe does and localstripe does
//! not, keeps the first answer to each `Idempotency-Key` and replays it with
//! `Idempotent-Replayed: true`, a 500 included. Each scripted answer is for one
//! attempt key; what the server did is observed, not inferred: the refunds it
//! holds and the attempt keys it received, in order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use payment_worker::configuration::{StripeCompat, DEFAULT_STRIPE_API_VERSION};
use payment_worker::fault::Faults;
use payment_worker::gateway::{
    ChargeStatus, GatewayError, GatewayTransport, PaymentGateway, RefundRequest, StripeGateway,
    StripeOptions,
};
use payment_worker::token::IdempotencyKey;
use serde_json::{json, Value};

use crate::support::helpers::{NoLease, TestDb};

const INTENT: &str = "pi_refunded";

/// What the server does with the first request under one attempt key.
#[derive(Clone, Copy)]
enum Script {
    /// Refund, then answer 500 (kept, and replayed).
    FailAfterWork,
    /// Answer 500 without refunding (kept, and replayed).
    FailBeforeWork,
    /// A proxy in front answers 502: the request never reached Stripe, which
    /// keeps nothing.
    ProxyFailed,
    /// 409: a request under this key is still running; nothing kept.
    Conflict,
    /// A 400 `invalid_request_error` with this code (kept, and replayed).
    Refuse(&'static str),
    /// A 402 `card_error` with this decline code (kept, and replayed).
    Decline(&'static str),
}

#[derive(Default)]
struct Books {
    refunds: Vec<Value>,
    kept: HashMap<String, (StatusCode, Value)>,
    scripts: HashMap<String, Script>,
    keys_seen: Vec<String>,
}

type Shared = Arc<Mutex<Books>>;

fn stripe_error(kind: &str, code: Option<&str>) -> Value {
    json!({"error": {"type": kind, "code": code, "message": "scripted"}})
}

async fn create(State(books): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let form: HashMap<String, String> = url::form_urlencoded::parse(&body).into_owned().collect();
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let mut books = books.lock().unwrap();
    books.keys_seen.push(key.clone());
    if let Some((status, body)) = books.kept.get(&key).cloned() {
        return (status, [("idempotent-replayed", "true")], Json(body)).into_response();
    }
    let number = books.refunds.len();
    let refund = json!({
        "id": format!("re_{number}"),
        "object": "refund",
        "amount": form.get("amount").and_then(|a| a.parse::<i64>().ok()),
        "currency": "usd",
        "status": "succeeded",
        "created": 1_700_000_000 + number as i64,
        "payment_intent": form.get("payment_intent"),
        "metadata": {
            "idempotency_key": form.get("metadata[idempotency_key]"),
            "refund_attempt": form.get("metadata[refund_attempt]"),
            "refund_id": form.get("metadata[refund_id]"),
        },
    });
    let (status, body) = match books.scripts.remove(&key) {
        None => {
            books.refunds.push(refund.clone());
            (StatusCode::OK, refund)
        }
        Some(Script::FailAfterWork) => {
            books.refunds.push(refund);
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                stripe_error("api_error", None),
            )
        }
        Some(Script::FailBeforeWork) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            stripe_error("api_error", None),
        ),
        Some(Script::Refuse(code)) => (
            StatusCode::BAD_REQUEST,
            stripe_error("invalid_request_error", Some(code)),
        ),
        Some(Script::Decline(code)) => (
            StatusCode::PAYMENT_REQUIRED,
            json!({"error": {
                "type": "card_error", "code": "card_declined", "decline_code": code,
                "message": "scripted",
            }}),
        ),
        Some(Script::ProxyFailed) => {
            return (StatusCode::BAD_GATEWAY, "<html>bad gateway</html>").into_response()
        }
        Some(Script::Conflict) => {
            return (
                StatusCode::CONFLICT,
                Json(stripe_error("idempotency_error", None)),
            )
                .into_response()
        }
    };
    books.kept.insert(key, (status, body.clone()));
    (status, Json(body)).into_response()
}

/// The refunded PaymentIntent, succeeded.
async fn intent() -> Json<Value> {
    Json(json!({
        "id": INTENT, "object": "payment_intent", "amount": 1000, "currency": "usd",
        "status": "succeeded", "created": 1_700_000_000, "metadata": {},
    }))
}

async fn list(
    State(books): State<Shared>,
    Query(query): Query<HashMap<String, String>>,
) -> Json<Value> {
    let books = books.lock().unwrap();
    let data: Vec<Value> = books
        .refunds
        .iter()
        .filter(|r| {
            query
                .get("payment_intent")
                .is_none_or(|pi| r["payment_intent"] == pi.as_str())
        })
        .cloned()
        .collect();
    Json(json!({"object": "list", "data": data, "has_more": false}))
}

struct Rig {
    books: Shared,
    gateway: StripeGateway,
    _db: TestDb,
}

impl Rig {
    async fn new() -> Self {
        let books = Shared::default();
        let app = Router::new()
            .route("/v1/refunds", post(create).get(list))
            .route(&format!("/v1/payment_intents/{INTENT}"), get(intent))
            .with_state(Arc::clone(&books));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let db = TestDb::new().await;
        let gateway = StripeGateway::new(
            &StripeOptions {
                base_url: format!("http://{addr}"),
                api_version: DEFAULT_STRIPE_API_VERSION.to_owned(),
                compat: StripeCompat::Stripe,
                timeout: Duration::from_secs(5),
                connect_timeout: Duration::from_secs(1),
            },
            &GatewayTransport::with_api_key("sk_test_refunds".into()),
            db.pool.clone(),
        )
        .unwrap()
        .with_faults(Faults::none());
        Self {
            books,
            gateway,
            _db: db,
        }
    }

    fn script(&self, attempt_key: &str, script: Script) {
        let mut books = self.books.lock().unwrap();
        books.scripts.insert(attempt_key.to_owned(), script);
    }

    fn refunds(&self) -> usize {
        self.books.lock().unwrap().refunds.len()
    }

    fn keys_seen(&self) -> Vec<String> {
        self.books.lock().unwrap().keys_seen.clone()
    }
}

fn request() -> RefundRequest {
    RefundRequest {
        payment_transaction_id: INTENT.to_owned(),
        amount_minor: 250,
        currency: "USD".into(),
        refund_id: None,
    }
}

#[tokio::test]
async fn a_replayed_500_moves_to_the_next_key_and_refunds_once() {
    let rig = Rig::new().await;
    let key = IdempotencyKey::try_from("rk-before").unwrap();
    rig.script("rk-before:refund:0", Script::FailBeforeWork);
    let first = rig.gateway.refund(&key, &request(), &NoLease).await;
    assert!(
        matches!(
            first,
            Err(GatewayError::FailedAfterSending { status: 500, .. })
        ),
        "{first:?}"
    );
    let second = rig
        .gateway
        .refund(&key, &request(), &NoLease)
        .await
        .unwrap();
    assert_eq!(second.status, ChargeStatus::Approved);
    assert_eq!(rig.refunds(), 1);
    // Key 0 again (replayed: proven finished without refunding), only then key 1.
    assert_eq!(
        rig.keys_seen(),
        [
            "rk-before:refund:0",
            "rk-before:refund:0",
            "rk-before:refund:1"
        ]
    );
}

#[tokio::test]
async fn a_500_after_the_refund_is_found_by_the_look_up_and_nothing_is_sent() {
    let rig = Rig::new().await;
    let key = IdempotencyKey::try_from("rk-after").unwrap();
    rig.script("rk-after:refund:0", Script::FailAfterWork);
    let first = rig.gateway.refund(&key, &request(), &NoLease).await;
    assert!(
        first.as_ref().is_err_and(GatewayError::outcome_unknown),
        "{first:?}"
    );
    let second = rig
        .gateway
        .refund(&key, &request(), &NoLease)
        .await
        .unwrap();
    assert_eq!(second.transaction_id, "re_0");
    assert_eq!(rig.refunds(), 1);
    assert_eq!(rig.keys_seen(), ["rk-after:refund:0"]);
    let found = rig.gateway.lookup_refund(&key, &request()).await.unwrap();
    assert_eq!(found.map(|e| e.amount_minor), Some(250));
}

#[tokio::test]
async fn an_unknown_outcome_is_retried_under_the_same_key_never_a_fresh_one() {
    let rig = Rig::new().await;
    let key = IdempotencyKey::try_from("rk-proxy").unwrap();
    rig.script("rk-proxy:refund:0", Script::ProxyFailed);
    let first = rig.gateway.refund(&key, &request(), &NoLease).await;
    assert!(
        first.as_ref().is_err_and(GatewayError::outcome_unknown),
        "{first:?}"
    );
    rig.script("rk-proxy:refund:0", Script::Conflict);
    let second = rig.gateway.refund(&key, &request(), &NoLease).await;
    assert!(matches!(second, Err(GatewayError::InFlight)), "{second:?}");
    let third = rig
        .gateway
        .refund(&key, &request(), &NoLease)
        .await
        .unwrap();
    assert_eq!(third.status, ChargeStatus::Approved);
    assert_eq!(rig.refunds(), 1);
    assert_eq!(rig.keys_seen(), ["rk-proxy:refund:0"; 3]);
}

/// A refusal is final, replayed or not: an over-refund (400), and a 402, which
/// makes no Refund object (its decline code in the reason), never a declined refund
/// recorded under the PaymentIntent's id.
#[tokio::test]
async fn a_refusal_or_a_402_is_final_even_when_replayed() {
    let rig = Rig::new().await;
    let cases = [
        (
            "rk-over",
            Script::Refuse("amount_too_large"),
            400,
            "amount_too_large",
        ),
        (
            "rk-402",
            Script::Decline("insufficient_funds"),
            402,
            "insufficient_funds",
        ),
    ];
    let mut keys_seen = Vec::new();
    for (raw, script, status, code) in cases {
        let key = IdempotencyKey::try_from(raw).unwrap();
        let attempt_key = format!("{raw}:refund:0");
        rig.script(&attempt_key, script);
        for _ in 0..2 {
            let refused = rig.gateway.refund(&key, &request(), &NoLease).await;
            assert!(
                matches!(&refused, Err(GatewayError::Rejected { status: s, reason }) if *s == status && reason.contains(code)),
                "{raw}: {refused:?}"
            );
            keys_seen.push(attempt_key.clone());
        }
    }
    assert_eq!(rig.refunds(), 0);
    assert_eq!(rig.keys_seen(), keys_seen);
}
