//! Refunds through `HttpGateway` against a real simulator (`POST /refunds`,
//! `GET /refunds[/{key}]`), and the answers no simulator gives (409, a garbled
//! 2xx, 401, …) from a fixed front: each answer class maps to its `GatewayError`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use payment_worker::gateway::{
    ChargeRequest, ChargeStatus, GatewayError, HttpGateway, LeaseGuard, LeaseLoss, PaymentGateway,
    RefundRequest,
};
use payment_worker::token::IdempotencyKey;
use payment_worker_devtools::{GatewaySimulator, RunningSimulator, SimulatorConfig};

use crate::support::helpers::{http_get, NoLease};

fn key(s: &str) -> IdempotencyKey {
    IdempotencyKey::try_from(s).unwrap()
}

fn start(config: SimulatorConfig) -> (RunningSimulator, HttpGateway) {
    let sim = GatewaySimulator::bind("127.0.0.1:0".parse().unwrap(), config)
        .unwrap()
        .spawn();
    let gw = HttpGateway::new(
        &sim.url(),
        Duration::from_secs(5),
        Duration::from_millis(500),
    )
    .unwrap();
    (sim, gw)
}

/// Charges `amount` USD under `name` and answers the charge's transaction id
/// (from the ledger: the charge's own answer may be faulty by configuration).
async fn charged(sim: &RunningSimulator, gw: &HttpGateway, name: &str, amount: i64) -> String {
    let request = ChargeRequest {
        amount_minor: amount,
        currency: "USD".into(),
        payment_method: "pm_card_visa".into(),
        payment_id: None,
    };
    let _ = gw.charge(&key(name), &request, &NoLease).await;
    sim.ledger()
        .into_iter()
        .find(|entry| entry.idempotency_key == name)
        .expect("the charge is booked")
        .transaction_id
}

fn refund(of: &str, amount: i64) -> RefundRequest {
    RefundRequest {
        payment_transaction_id: of.into(),
        amount_minor: amount,
        currency: "USD".into(),
        refund_id: None,
    }
}

#[tokio::test]
async fn refund_under_one_key_is_made_once_and_looked_up() {
    let (sim, gw) = start(SimulatorConfig::default());
    let txn = charged(&sim, &gw, "rf-c1", 1000).await;
    let k = key("rf-r1");
    let first = gw.refund(&k, &refund(&txn, 300), &NoLease).await.unwrap();
    let again = gw.refund(&k, &refund(&txn, 300), &NoLease).await.unwrap();
    assert_eq!(first, again);
    assert_eq!(first.status, ChargeStatus::Approved);
    let found = gw
        .lookup_refund(&k, &refund(&txn, 300))
        .await
        .unwrap()
        .expect("the refund is found by key");
    assert!(found.matches(&refund(&txn, 300)));
    assert_eq!(found.attempts, 2);
    assert_eq!(found.transaction_id, first.transaction_id);
    assert_eq!(
        gw.lookup_refund(&key("rf-none"), &refund(&txn, 1))
            .await
            .unwrap(),
        None
    );
    let all = gw.refunds().await.unwrap();
    assert_eq!(all, vec![found]);
    // A key made of dots travels through the filtered listing.
    gw.refund(&key(".."), &refund(&txn, 100), &NoLease)
        .await
        .unwrap();
    let dots = gw
        .lookup_refund(&key(".."), &refund(&txn, 100))
        .await
        .unwrap();
    assert_eq!(dots.map(|entry| entry.amount_minor), Some(100));
}

#[tokio::test]
async fn refusals_are_rejected_and_nothing_is_refunded() {
    let (sim, gw) = start(SimulatorConfig::default());
    let txn = charged(&sim, &gw, "rf-c2", 1000).await;
    gw.refund(&key("rf-a"), &refund(&txn, 700), &NoLease)
        .await
        .unwrap();
    let reused = gw.refund(&key("rf-a"), &refund(&txn, 701), &NoLease).await;
    assert!(
        matches!(reused, Err(GatewayError::Rejected { status: 422, .. })),
        "{reused:?}"
    );
    let over = gw.refund(&key("rf-b"), &refund(&txn, 301), &NoLease).await;
    match over {
        Err(GatewayError::Rejected {
            status: 400,
            reason,
        }) => {
            assert!(reason.starts_with("amount_too_large"), "{reason}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let unknown = gw
        .refund(&key("rf-c"), &refund("txn_nope", 1), &NoLease)
        .await;
    assert!(
        matches!(unknown, Err(GatewayError::Rejected { status: 400, .. })),
        "{unknown:?}"
    );
    assert_eq!(sim.refunds().len(), 1);
    let refusals = sim.refund_refusals();
    assert_eq!(refusals.len(), 2);
    assert_eq!(refusals[0].reason, "amount_too_large");
    assert_eq!(refusals[0].amount_minor, 301);
    // The same list over HTTP, as a test outside the process reads it.
    let listed: serde_json::Value = http_get(format!("{}/refund-refusals", sim.url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        listed[0],
        serde_json::json!({
            "idempotency_key": "rf-b",
            "payment_transaction_id": txn,
            "amount_minor": 301,
            "reason": "amount_too_large",
        })
    );
    assert_eq!(listed[1]["reason"], "charge_not_found");
}

#[tokio::test]
async fn faults_are_unknown_outcomes_or_unavailable() {
    let (_sim, gw) = start(SimulatorConfig {
        error_rate: 1.0,
        ..SimulatorConfig::default()
    });
    let err = gw
        .refund(&key("rf-e"), &refund("txn_any", 1), &NoLease)
        .await
        .unwrap_err();
    assert!(
        matches!(err, GatewayError::FailedAfterSending { status: 503, .. }),
        "{err:?}"
    );
    assert!(err.outcome_unknown());

    let (sim, _) = start(SimulatorConfig {
        timeout_after_charge_rate: 1.0,
        late_by_ms: 2_000,
        ..SimulatorConfig::default()
    });
    let impatient = HttpGateway::new(
        &sim.url(),
        Duration::from_millis(300),
        Duration::from_millis(300),
    )
    .unwrap();
    let txn = charged(&sim, &impatient, "rf-c3", 1000).await;
    let err = impatient
        .refund(&key("rf-late"), &refund(&txn, 10), &NoLease)
        .await
        .unwrap_err();
    assert!(matches!(err, GatewayError::Timeout), "{err:?}");
    let found = impatient
        .lookup_refund(&key("rf-late"), &refund(&txn, 10))
        .await
        .unwrap();
    assert_eq!(
        found.map(|e| e.status),
        Some(ChargeStatus::Approved),
        "refunded, answered late"
    );

    let (sim, gw) = start(SimulatorConfig {
        five_xx_after_charge_rate: 1.0,
        ..SimulatorConfig::default()
    });
    let txn = charged(&sim, &gw, "rf-c4", 1000).await;
    let err = gw
        .refund(&key("rf-5xx"), &refund(&txn, 10), &NoLease)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            GatewayError::FailedAfterSending {
                status: 502 | 504,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(sim.refunds().len(), 1);

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let nowhere = HttpGateway::new(
        &format!("http://{addr}"),
        Duration::from_secs(1),
        Duration::from_secs(1),
    )
    .unwrap();
    let err = nowhere
        .refund(&key("rf-x"), &refund("t", 1), &NoLease)
        .await
        .unwrap_err();
    assert!(matches!(err, GatewayError::Unavailable(_)), "{err:?}");
}

/// A front answering `POST /refunds` with the status named by the key
/// (`status-409`), or a garbled 200 (`garbled`); counts the POSTs it gets.
async fn fixed_front(posts: Arc<AtomicUsize>) -> String {
    async fn answer(State(posts): State<Arc<AtomicUsize>>, headers: HeaderMap) -> Response {
        posts.fetch_add(1, Ordering::SeqCst);
        let key = headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if key == "garbled" {
            return (StatusCode::OK, "{\"transaction_id\":").into_response();
        }
        let code = key
            .strip_prefix("status-")
            .and_then(|code| code.parse().ok())
            .and_then(|code| StatusCode::from_u16(code).ok())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (code, "{\"error\":\"scripted\"}").into_response()
    }
    let app = axum::Router::new()
        .route("/refunds", post(answer))
        .with_state(posts);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn answers_no_simulator_gives_are_classified_like_a_charge_s() {
    let posts = Arc::new(AtomicUsize::new(0));
    let url = fixed_front(Arc::clone(&posts)).await;
    let gw = HttpGateway::new(&url, Duration::from_secs(2), Duration::from_secs(1)).unwrap();
    let mut classes = HashMap::new();
    for name in [
        "status-409",
        "garbled",
        "status-303",
        "status-401",
        "status-403",
        "status-404",
        "status-405",
        "status-429",
        "status-400",
        "status-402",
    ] {
        let err = gw
            .refund(&key(name), &refund("t", 1), &NoLease)
            .await
            .unwrap_err();
        let class = match err {
            GatewayError::InFlight => "in_flight",
            GatewayError::UnreadableAnswer(_) => "unreadable",
            GatewayError::Unavailable(_) => "unavailable",
            GatewayError::Rejected { .. } => "rejected",
            other => panic!("{name}: {other:?}"),
        };
        classes.insert(name, class);
    }
    let expected = HashMap::from([
        ("status-409", "in_flight"),
        ("garbled", "unreadable"),
        ("status-303", "unreadable"),
        ("status-401", "unavailable"),
        ("status-403", "unavailable"),
        ("status-404", "unavailable"),
        ("status-405", "unavailable"),
        ("status-429", "unavailable"),
        ("status-400", "rejected"),
        ("status-402", "rejected"),
    ]);
    assert_eq!(classes, expected);
    assert_eq!(posts.load(Ordering::SeqCst), expected.len());
}

struct LostLease;

#[async_trait::async_trait]
impl LeaseGuard for LostLease {
    async fn check(&self) -> Result<(), LeaseLoss> {
        Err(LeaseLoss::Lost)
    }
}

#[tokio::test]
async fn a_failed_lease_check_sends_nothing() {
    let posts = Arc::new(AtomicUsize::new(0));
    let url = fixed_front(Arc::clone(&posts)).await;
    let gw = HttpGateway::new(&url, Duration::from_secs(2), Duration::from_secs(1)).unwrap();
    let err = gw
        .refund(&key("status-200"), &refund("t", 1), &LostLease)
        .await
        .unwrap_err();
    assert!(
        matches!(err, GatewayError::LeaseNotHeld(LeaseLoss::Lost)),
        "{err:?}"
    );
    assert_eq!(posts.load(Ordering::SeqCst), 0);
}
