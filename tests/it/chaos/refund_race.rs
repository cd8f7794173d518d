//! Refunds racing under different keys for the same payments, through a group of
//! worker processes, one SIGKILLed and Redis losing every token mid-run: never more
//! refunded than charged, each refund key refunded at most once, the books and the
//! gateway agree.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use payment_worker::gateway::ChargeStatus;
use payment_worker::operator::{RecordKind, WorkloadRecord};

use crate::support::books::*;
use crate::support::deployment::*;
use crate::support::helpers::{http, unique, TestDb, TestRedis};

const PAYMENTS: usize = 60;
/// Refund keys per payment, each for 40 % of it: two fit, the third never.
const REFUNDS_PER_PAYMENT: usize = 4;

fn record(key: &str, value: serde_json::Value) -> WorkloadRecord {
    WorkloadRecord {
        kind: RecordKind::Valid,
        key: Some(key.as_bytes().to_vec()),
        value: Some(value.to_string().into_bytes()),
        partition_hint: None,
    }
}

/// The charges, then their refunds: half keyed by the payment's key (its partition,
/// after its charge), half by their own (another partition: they may come first
/// and wait), and each refund's first key published twice.
fn workload(
    prefix: &str,
) -> (
    Vec<WorkloadRecord>,
    Vec<WorkloadRecord>,
    HashMap<String, i64>,
) {
    let mut charges = Vec::new();
    let mut refunds = Vec::new();
    let mut amounts = HashMap::new();
    for i in 0..PAYMENTS {
        let payment = format!("{prefix}:pay:{i:03}");
        let amount = 1000 + i as i64;
        amounts.insert(payment.clone(), amount);
        charges.push(record(
            &payment,
            serde_json::json!({"idempotency_key": payment, "account_id": "acct_1",
                "amount_minor": amount, "currency": "USD", "payment_method": "pm_card_visa"}),
        ));
        for j in 0..REFUNDS_PER_PAYMENT {
            let key = format!("{prefix}:rf:{i:03}:{j}");
            let value = serde_json::json!({"type": "refund", "idempotency_key": key,
                "payment_idempotency_key": payment, "amount_minor": amount * 2 / 5,
                "currency": "USD", "reason": "race"});
            let record_key = if j % 2 == 0 { &payment } else { &key };
            refunds.push(record(record_key, value));
            if j == 0 {
                refunds.push(refunds.last().cloned().unwrap_or_else(|| unreachable!()));
            }
        }
    }
    (charges, refunds, amounts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refunds_racing_across_keys_workers_a_kill_and_a_redis_flush_never_pass_the_charge() {
    let started = Instant::now();
    let db = TestDb::new().await;
    let mut redis = TestRedis::new().await;
    // A gateway without idempotency: a second POST under one key is a second refund.
    let mut deployment = Deployment::start(
        PARTITIONS,
        &db.url,
        &redis.prefix,
        &[
            "--ignore-idempotency-key",
            "--latency-ms",
            "5",
            "--seed",
            "9",
        ],
        &[],
    )
    .await;
    let (charges, refunds, amounts) = workload(&unique("rr"));
    deployment.start_workers();
    deployment
        .wait_for_stable_group(Duration::from_secs(90))
        .await;
    let producer = deployment.produce_paced(&[charges.clone(), refunds.clone()].concat(), 40);
    let total = charges.len() + refunds.len();

    let victim = 2;
    let wait_for = |n: usize| n.min(total);
    let mut deadline = Instant::now() + Duration::from_secs(120);
    while answered(&deployment.results().await) < wait_for(total * 2 / 5) {
        deployment.assert_workers_running();
        assert!(Instant::now() < deadline, "the run did not get going");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    deployment.kill(victim);
    deadline = Instant::now() + Duration::from_secs(120);
    while answered(&deployment.results().await) < wait_for(total * 3 / 5) {
        deployment.assert_workers_running_except(Some(victim));
        assert!(Instant::now() < deadline, "the survivors did not go on");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let flushed = flush_prefix(&mut redis.conn, &redis.prefix).await;
    deployment.restart(victim);
    producer.await.unwrap();
    let results = deployment
        .wait_until_settled(total, HashMap::new(), Duration::from_secs(240))
        .await;
    deployment.stop_workers().await;

    // Every refund the gateway holds, by the charge it refunds.
    let ledger = deployment.ledger().await;
    let gateway_refunds = deployment
        .gateway
        .refunds()
        .await
        .expect("the gateway's refunds");
    let mut per_charge: BTreeMap<String, (i64, Vec<String>)> = BTreeMap::new();
    for refund in gateway_refunds
        .iter()
        .filter(|r| r.status == ChargeStatus::Approved)
    {
        let entry = per_charge
            .entry(refund.payment_transaction_id.clone())
            .or_default();
        entry.0 += refund.amount_minor;
        entry.1.push(refund.idempotency_key.clone());
    }
    for charge in &ledger {
        let charged = amounts[&charge.idempotency_key];
        let (refunded, keys) = per_charge
            .remove(&charge.transaction_id)
            .unwrap_or_default();
        assert!(
            refunded <= charged,
            "{}: refunded {refunded} of {charged}",
            charge.idempotency_key
        );
        let mut distinct = keys.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            keys.len(),
            "a refund key refunded twice: {keys:?}"
        );
        assert_eq!(
            keys.len(),
            2,
            "{}: two refunds of 40 % fit, {keys:?}",
            charge.idempotency_key
        );
    }
    assert!(
        per_charge.is_empty(),
        "refunds of no charge: {per_charge:?}"
    );
    assert_eq!(ledger.len(), PAYMENTS, "each payment charged once");

    // The books: each refund row agrees with the gateway; nothing left in flight.
    let rows: Vec<(String, String, Option<String>, i64)> = sqlx::query_as(
        "SELECT idempotency_key, status, gateway_transaction_id, amount_minor FROM refunds",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let refunded_rows: Vec<_> = rows.iter().filter(|r| r.1 == "refunded").collect();
    assert_eq!(refunded_rows.len(), PAYMENTS * 2, "{rows:?}");
    assert!(
        rows.iter().all(|r| r.1 != "processing"),
        "a refund left in flight"
    );
    for (key, _, transaction, amount) in refunded_rows {
        let at_gateway = gateway_refunds
            .iter()
            .find(|r| Some(&r.transaction_id) == transaction.as_ref())
            .unwrap_or_else(|| panic!("{key}: its row's refund is not at the gateway"));
        assert_eq!(
            (&at_gateway.idempotency_key, at_gateway.amount_minor),
            (key, *amount)
        );
    }
    let refusals: serde_json::Value = http()
        .get(format!(
            "{}/refund-refusals",
            deployment.worker_env["GATEWAY_URL"]
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        refusals,
        serde_json::json!([]),
        "an over-refund reached the gateway"
    );

    // Every command answered; each refund as refunded, refused for good, or a duplicate.
    let positions = by_position(&results);
    assert_eq!(positions.len(), total, "every command answered");
    let refused = results
        .iter()
        .filter(|r| r.outcome == "rejected")
        .filter(|r| {
            r.reason
                .as_deref()
                .is_some_and(|s| s.contains("refund_exceeds_charge"))
        })
        .count();
    assert!(
        refused >= 2 * PAYMENTS,
        "two refunds of each payment were refused"
    );
    for result in &results {
        assert!(
            ["succeeded", "refunded", "duplicate"].contains(&result.outcome.as_str())
                || result
                    .reason
                    .as_deref()
                    .is_some_and(|s| s.contains("refund_exceeds_charge")),
            "{result:?}"
        );
    }
    deployment.audit().await.assert_clean();
    eprintln!(
        "refund race: {total} commands, 1 SIGKILL, {flushed} Redis keys flushed, {} refunds, {:?}",
        gateway_refunds.len(),
        started.elapsed()
    );
    flush_prefix(&mut redis.conn, &redis.prefix).await;
}
