//! The gateway simulator driven through `HttpGateway` and raw HTTP.
//! Each test runs its own in-process simulator on a random port.

use std::time::{Duration, Instant};

use payment_worker::gateway::{
    ChargeRequest, ChargeStatus, GatewayError, HttpGateway, PaymentGateway,
};
use payment_worker::token::IdempotencyKey;
use payment_worker_devtools::{GatewaySimulator, RunningSimulator, SimulatorConfig};

use crate::support::helpers::NoLease;

fn key(s: &str) -> IdempotencyKey {
    IdempotencyKey::try_from(s).unwrap()
}

fn request(amount_minor: i64, payment_method: &str) -> ChargeRequest {
    ChargeRequest {
        amount_minor,
        currency: "USD".into(),
        payment_method: payment_method.into(),
        payment_id: None,
    }
}

fn start(config: SimulatorConfig) -> RunningSimulator {
    GatewaySimulator::bind("127.0.0.1:0".parse().unwrap(), config)
        .unwrap()
        .spawn()
}

fn client(sim: &RunningSimulator, timeout: Duration) -> HttpGateway {
    HttpGateway::new(&sim.url(), timeout, Duration::from_millis(500)).unwrap()
}

async fn started(config: SimulatorConfig) -> (RunningSimulator, HttpGateway) {
    let sim = start(config);
    let gw = client(&sim, Duration::from_secs(5));
    (sim, gw)
}

#[tokio::test]
async fn same_key_twice_charges_once_and_replays_the_first_answer() {
    let (sim, gw) = started(SimulatorConfig::default()).await;
    let k = key("ord-1");
    let first = gw
        .charge(&k, &request(1999, "pm_card_visa"), &NoLease)
        .await
        .unwrap();
    let second = gw
        .charge(&k, &request(1999, "pm_card_visa"), &NoLease)
        .await
        .unwrap();
    assert_eq!(first, second);
    assert_eq!(first.status, ChargeStatus::Approved);

    let ledger = gw.ledger().await.unwrap();
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0].idempotency_key, "ord-1");
    assert_eq!(ledger[0].transaction_id, first.transaction_id);
    assert_eq!(ledger[0].amount_minor, 1999);
    assert_eq!(ledger[0].currency, "USD");
    assert_eq!(ledger[0].attempts, 2);
    assert_eq!(sim.ledger(), ledger);
}

#[tokio::test]
async fn same_key_with_another_body_is_refused_with_422() {
    let (sim, gw) = started(SimulatorConfig::default()).await;
    let k = key("ord-2");
    gw.charge(&k, &request(1999, "pm_card_visa"), &NoLease)
        .await
        .unwrap();
    for changed in [
        request(2000, "pm_card_visa"),
        request(1999, "pm_card_mastercard"),
    ] {
        match gw.charge(&k, &changed, &NoLease).await {
            Err(GatewayError::Rejected {
                status: 422,
                reason,
            }) => {
                assert!(reason.contains("idempotency_key_reused"), "{reason}");
                assert!(
                    !reason.contains("pm_card"),
                    "reason echoes the payment method"
                );
            }
            other => panic!("expected 422, got {other:?}"),
        }
    }
    let raw = crate::support::helpers::http()
        .post(format!("{}/charges", sim.url()))
        .header("Idempotency-Key", "ord-2")
        .json(&serde_json::json!({"amount_minor": 1, "currency": "USD", "payment_method": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 422);
    let ledger = gw.ledger().await.unwrap();
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0].attempts, 1, "refused POSTs are not attempts");
    assert_eq!(ledger[0].amount_minor, 1999);
}

#[tokio::test]
async fn lookup_and_ledger_agree() {
    let (_sim, gw) = started(SimulatorConfig::default()).await;
    assert_eq!(gw.lookup(&key("never-charged")).await.unwrap(), None);
    let mut charges = Vec::new();
    for i in 0..5 {
        let k = key(&format!("ord-{i}"));
        charges.push((
            k.clone(),
            gw.charge(&k, &request(100 + i, "pm_card_visa"), &NoLease)
                .await
                .unwrap(),
        ));
    }
    let ledger = gw.ledger().await.unwrap();
    assert_eq!(ledger.len(), 5);
    for (k, charge) in &charges {
        assert_eq!(
            gw.lookup(k).await.unwrap().map(|e| e.charge()).as_ref(),
            Some(charge)
        );
        let entry = ledger
            .iter()
            .find(|e| e.idempotency_key == k.as_str())
            .unwrap();
        assert_eq!(entry.transaction_id, charge.transaction_id);
        assert_eq!(entry.status, charge.status);
        assert_eq!(entry.attempts, 1);
    }
    // Raw JSON field names are the gateway protocol (docs/CONTRACT.md).
    let raw: serde_json::Value =
        crate::support::helpers::http_get(format!("{}/charges/ord-0", gw.base_url()))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    assert_eq!(raw["transaction_id"], charges[0].1.transaction_id.as_str());
    assert_eq!(raw["status"], "approved");
    let raw: serde_json::Value =
        crate::support::helpers::http_get(format!("{}/charges", gw.base_url()))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    let first = &raw[0];
    for field in [
        "idempotency_key",
        "transaction_id",
        "amount_minor",
        "currency",
        "status",
        "charged_at",
        "attempts",
    ] {
        assert!(
            first.get(field).is_some(),
            "ledger entry lacks {field}: {first}"
        );
    }
    assert!(
        first.get("payment_method").is_none(),
        "the ledger must not expose payment methods"
    );
}

#[tokio::test]
async fn keys_made_of_dots_can_be_looked_up() {
    let (_sim, gw) = started(SimulatorConfig::default()).await;
    let mut charged = Vec::new();
    for k in [".", "..", "..."] {
        let k = key(k);
        charged.push((
            k.clone(),
            gw.charge(&k, &request(5, "pm_card_visa"), &NoLease)
                .await
                .unwrap(),
        ));
    }
    for (k, charge) in charged {
        assert_eq!(
            gw.lookup(&k).await.unwrap().map(|e| e.charge()),
            Some(charge),
            "key {k}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_posts_of_one_key_charge_once() {
    let (_sim, gw) = started(SimulatorConfig {
        latency_ms: 5,
        ..SimulatorConfig::default()
    })
    .await;
    let gw = std::sync::Arc::new(gw);
    let k = key("hot-key");
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let gw = std::sync::Arc::clone(&gw);
            let k = k.clone();
            tokio::spawn(
                async move { gw.charge(&k, &request(700, "pm_card_visa"), &NoLease).await },
            )
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap().unwrap());
    }
    assert!(
        answers.windows(2).all(|w| w[0] == w[1]),
        "every POST gets the same answer"
    );
    let ledger = gw.ledger().await.unwrap();
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0].attempts, 32);
}

#[tokio::test]
async fn error_rate_one_answers_503_which_the_client_takes_as_a_charge_unknown() {
    let (_sim, gw) = started(SimulatorConfig {
        error_rate: 1.0,
        ..SimulatorConfig::default()
    })
    .await;
    let err = gw
        .charge(&key("ord-err"), &request(1, "pm_card_visa"), &NoLease)
        .await
        .unwrap_err();
    // The simulator charged nothing, but a 5xx to a POST that was sent cannot say
    // so: the client reports the charge as unknown, for a look-up to settle.
    assert!(
        matches!(err, GatewayError::FailedAfterSending { status: 503, .. }),
        "{err:?}"
    );
    assert!(err.is_retryable());
    assert!(gw.ledger().await.unwrap().is_empty());
    assert_eq!(gw.lookup(&key("ord-err")).await.unwrap(), None);
}

#[tokio::test]
async fn late_answer_is_a_timeout_yet_the_charge_exists() {
    let sim = start(SimulatorConfig {
        timeout_after_charge_rate: 1.0,
        late_by_ms: 2_000,
        ..SimulatorConfig::default()
    });
    let impatient = client(&sim, Duration::from_millis(200));
    let k = key("ord-late");
    let started = Instant::now();
    let err = impatient
        .charge(&k, &request(4200, "pm_card_visa"), &NoLease)
        .await
        .unwrap_err();
    assert!(matches!(err, GatewayError::Timeout), "{err:?}");
    assert!(started.elapsed() < Duration::from_millis(1_500));
    let found = impatient
        .lookup(&k)
        .await
        .unwrap()
        .expect("the charge was made");
    assert_eq!(found.status, ChargeStatus::Approved);
    let ledger = impatient.ledger().await.unwrap();
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0].transaction_id, found.transaction_id);
}

#[tokio::test]
async fn ignoring_idempotency_keys_charges_every_post() {
    let (_sim, gw) = started(SimulatorConfig {
        ignore_idempotency_key: true,
        ..SimulatorConfig::default()
    })
    .await;
    let k = key("ord-dup");
    let first = gw
        .charge(&k, &request(300, "pm_card_visa"), &NoLease)
        .await
        .unwrap();
    let second = gw
        .charge(&k, &request(300, "pm_card_visa"), &NoLease)
        .await
        .unwrap();
    assert_ne!(first.transaction_id, second.transaction_id);
    let ledger = gw.ledger().await.unwrap();
    assert_eq!(ledger.len(), 2);
    assert!(ledger
        .iter()
        .all(|e| e.idempotency_key == "ord-dup" && e.attempts == 1));
    assert_eq!(
        gw.lookup(&k).await.unwrap().map(|e| e.charge()),
        Some(second),
        "look-up returns the latest"
    );
}

#[tokio::test]
async fn declined_payment_method_is_declined() {
    let (_sim, gw) = started(SimulatorConfig::default()).await;
    let charge = gw
        .charge(&key("ord-decl"), &request(1, "pm_card_declined"), &NoLease)
        .await
        .unwrap();
    assert_eq!(charge.status, ChargeStatus::Declined);
    let ledger = gw.ledger().await.unwrap();
    assert_eq!(ledger[0].status, ChargeStatus::Declined);

    let (_sim, all_declined) = started(SimulatorConfig {
        decline_rate: 1.0,
        ..SimulatorConfig::default()
    })
    .await;
    let charge = all_declined
        .charge(&key("ord-decl-2"), &request(1, "pm_card_visa"), &NoLease)
        .await
        .unwrap();
    assert_eq!(charge.status, ChargeStatus::Declined);
}

#[tokio::test]
async fn connection_refused_is_unavailable_quickly() {
    let gw = HttpGateway::new(
        "http://127.0.0.1:1",
        Duration::from_secs(5),
        Duration::from_secs(1),
    )
    .unwrap();
    let started = Instant::now();
    let charge = gw
        .charge(&key("ord-x"), &request(1, "pm_card_visa"), &NoLease)
        .await;
    assert!(
        matches!(charge, Err(GatewayError::Unavailable(_))),
        "{charge:?}"
    );
    let lookup = gw.lookup(&key("ord-x")).await;
    assert!(
        matches!(lookup, Err(GatewayError::Unavailable(_))),
        "{lookup:?}"
    );
    let ledger = gw.ledger().await;
    assert!(
        matches!(ledger, Err(GatewayError::Unavailable(_))),
        "{ledger:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn bad_requests_are_400_and_never_echo_the_payment_method() {
    let sim = start(SimulatorConfig::default());
    let http = crate::support::helpers::http();
    let url = format!("{}/charges", sim.url());
    let body =
        serde_json::json!({"amount_minor": 1, "currency": "USD", "payment_method": "pm_secret"});

    let missing = http.post(&url).json(&body).send().await.unwrap();
    assert_eq!(missing.status(), 400);
    let text = missing.text().await.unwrap();
    assert!(text.contains("missing_idempotency_key"), "{text}");

    for bad_key in ["", "has space", "{tag}", &"k".repeat(129)] {
        let response = http
            .post(&url)
            .header("Idempotency-Key", bad_key)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "key {bad_key:?}");
    }

    for bad_body in [
        r#"{"amount_minor": "1", "currency": "USD", "payment_method": "pm_secret"}"#,
        r#"{"amount_minor": 0, "currency": "USD", "payment_method": "pm_secret"}"#,
        r#"{"amount_minor": 1, "currency": "usd", "payment_method": "pm_secret"}"#,
        r#"{"amount_minor": 1, "currency": "USD"}"#,
        r#"{"amount_minor": 1, "currency": "USD", "payment_method": "pm_secret""#,
        "not json",
    ] {
        let response = http
            .post(&url)
            .header("Idempotency-Key", "ord-bad")
            .header("content-type", "application/json")
            .body(bad_body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{bad_body}");
        let text = response.text().await.unwrap();
        assert!(!text.contains("pm_secret"), "{text}");
    }
    assert!(sim.ledger().is_empty());
}

#[tokio::test]
async fn slow_key_is_charged_at_once_and_answered_late() {
    let sim = start(SimulatorConfig {
        slow_keys: vec!["held=800".parse().unwrap()],
        ..SimulatorConfig::default()
    });
    let gw = std::sync::Arc::new(client(&sim, Duration::from_secs(5)));
    let background = {
        let gw = std::sync::Arc::clone(&gw);
        tokio::spawn(async move {
            gw.charge(&key("held"), &request(9, "pm_card_visa"), &NoLease)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!background.is_finished(), "the answer is held");
    let found = gw
        .lookup(&key("held"))
        .await
        .unwrap()
        .expect("charged before answering")
        .charge();
    let other = Instant::now();
    gw.charge(&key("free"), &request(9, "pm_card_visa"), &NoLease)
        .await
        .unwrap();
    assert!(
        other.elapsed() < Duration::from_millis(300),
        "only the slow key is held"
    );
    assert_eq!(background.await.unwrap().unwrap(), found);
}

#[tokio::test]
async fn shutdown_closes_the_port() {
    let sim = start(SimulatorConfig::default());
    let addr = sim.addr();
    let gw = client(&sim, Duration::from_secs(2));
    gw.charge(&key("ord-s"), &request(1, "pm_card_visa"), &NoLease)
        .await
        .unwrap();
    sim.shutdown().await.unwrap();
    let after = HttpGateway::new(
        &format!("http://{addr}"),
        Duration::from_secs(2),
        Duration::from_millis(500),
    )
    .unwrap();
    assert!(matches!(
        after.ledger().await,
        Err(GatewayError::Unavailable(_))
    ));
}
