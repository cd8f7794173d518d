//! `payment-worker-devtools gateway-sim`, black box: the protocol over HTTP.

use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_sim_binary_speaks_the_protocol() {
    let mut child = tokio::process::Command::new(crate::support::procs::devtools_binary())
        .args(["gateway-sim", "--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), stdout.next_line())
        .await
        .expect("the listening line within 30 s")
        .unwrap()
        .expect("a first line");
    let addr = line
        .strip_prefix("gateway-sim listening on ")
        .unwrap_or_else(|| panic!("{line:?}"));
    let base = format!("http://{addr}/charges");
    let http = crate::support::helpers::http();
    let post = |key: &str, body: serde_json::Value| {
        http.post(&base)
            .header("Idempotency-Key", key)
            .json(&body)
            .send()
    };
    let body = serde_json::json!({"amount_minor": 1999, "currency": "EUR", "payment_method": "pm_card_visa"});

    let first = post("bb-1", body.clone()).await.unwrap();
    assert_eq!(first.status(), 200);
    let first: serde_json::Value = first.json().await.unwrap();
    let second = post("bb-1", body.clone()).await.unwrap();
    assert_eq!(second.status(), 200);
    assert_eq!(
        second.json::<serde_json::Value>().await.unwrap(),
        first,
        "the same answer"
    );
    assert_eq!(first["status"], "approved");

    let changed = serde_json::json!({"amount_minor": 2999, "currency": "EUR", "payment_method": "pm_card_visa"});
    let conflict = post("bb-1", changed).await.unwrap();
    assert_eq!(conflict.status(), 422);

    let declined = post("bb-2", serde_json::json!({"amount_minor": 5, "currency": "USD", "payment_method": "pm_card_declined"}))
        .await
        .unwrap();
    let declined: serde_json::Value = declined.json().await.unwrap();
    assert_eq!(declined["status"], "declined");

    let ledger: Vec<serde_json::Value> =
        http.get(&base).send().await.unwrap().json().await.unwrap();
    assert_eq!(ledger.len(), 2, "one entry per key: {ledger:#?}");
    let entry = |key: &str| {
        ledger
            .iter()
            .find(|e| e["idempotency_key"] == key)
            .unwrap()
            .clone()
    };
    let bb1 = entry("bb-1");
    assert_eq!(bb1["attempts"], 2);
    assert_eq!(
        (bb1["amount_minor"].as_i64(), bb1["currency"].as_str()),
        (Some(1999), Some("EUR"))
    );
    assert!(bb1["charged_at"].is_string());
    for (key, answer) in [("bb-1", &first), ("bb-2", &declined)] {
        let one = http.get(format!("{base}/{key}")).send().await.unwrap();
        assert_eq!(one.status(), 200);
        let one: serde_json::Value = one.json().await.unwrap();
        assert_eq!(
            (&one["transaction_id"], &one["status"]),
            (&answer["transaction_id"], &answer["status"]),
            "GET /charges/{key} is the POST's charge"
        );
        let listed = entry(key);
        assert_eq!(one, listed, "GET /charges/{key} is its ledger entry");
        assert_eq!(
            (&listed["transaction_id"], &listed["status"]),
            (&one["transaction_id"], &one["status"])
        );
    }
    assert_eq!(
        http.get(format!("{base}/bb-unknown"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );

    let pid = Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    kill(pid, Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("exits on SIGTERM")
        .unwrap();
    assert!(status.success(), "{status:?}");
    assert!(http.get(&base).send().await.is_err(), "the port is closed");
}
