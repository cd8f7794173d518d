//! The refund race both gateways run (the simulator, localstripe): refunds under
//! different keys for the same payments through a group of worker processes, one
//! SIGKILLed and Redis losing every token mid-run, then the whole topic replayed:
//! never more refunded than charged, each refund key refunded at most once, the
//! books and the gateway agree, and the replay refunds nothing.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use payment_worker::gateway::{ChargeStatus, RefundEntry};
use payment_worker::operator::{RecordKind, WorkloadRecord};
use payment_worker::worker::ResultRecord;

use crate::support::books::*;
use crate::support::deployment::*;
use crate::support::helpers::{http, unique, TestDb, TestRedis};

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
    payments: usize,
) -> (
    Vec<WorkloadRecord>,
    Vec<WorkloadRecord>,
    HashMap<String, i64>,
) {
    let mut charges = Vec::new();
    let mut refunds = Vec::new();
    let mut amounts = HashMap::new();
    for i in 0..payments {
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

/// What the gateway can tell besides its refunds.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusals {
    /// The simulator lists every refund it refused (`GET /refund-refusals`).
    Listed,
    /// localstripe keeps none; an over-refund shows in the sums instead.
    NotKept,
}

/// The race over `deployment` (its workers not started yet): `payments` charges and
/// their refunds, a SIGKILL, a Redis flush, a replay from offset 0; every check.
pub(crate) async fn refund_race(
    deployment: &mut Deployment,
    db: &TestDb,
    redis: &mut TestRedis,
    payments: usize,
    refusals: Refusals,
) {
    let started = Instant::now();
    let (charges, refunds, amounts) = workload(&unique("rr"), payments);
    deployment.start_workers();
    deployment
        .wait_for_stable_group(Duration::from_secs(90))
        .await;
    let producer = deployment.produce_paced(&[charges.clone(), refunds.clone()].concat(), 40);
    let total = charges.len() + refunds.len();
    let flushed = kill_and_flush_mid_run(deployment, redis, total).await;
    producer.await.unwrap();
    let results = deployment
        .wait_until_settled(total, HashMap::new(), Duration::from_secs(240))
        .await;
    deployment.stop_workers().await;
    let gateway_refunds = deployment
        .gateway
        .refunds()
        .await
        .expect("the gateway's refunds");
    check_gateway(deployment, &gateway_refunds, &amounts, payments).await;
    check_books(db, &gateway_refunds, payments).await;
    if refusals == Refusals::Listed {
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
    }
    check_answers(&results, total, payments);
    deployment.audit().await.assert_clean();

    // The whole topic again: every refund answered from the books, none sent.
    let results_end = deployment
        .high_watermarks(&deployment.settings.results_topic.clone())
        .await;
    deployment.rewind_to_beginning().await;
    deployment.start_workers();
    let replayed = deployment
        .wait_until_settled(total, results_end, Duration::from_secs(180))
        .await;
    deployment.stop_workers().await;
    let after = deployment
        .gateway
        .refunds()
        .await
        .expect("the gateway's refunds");
    assert_eq!(
        after.len(),
        gateway_refunds.len(),
        "the replay refunded nothing"
    );
    assert!(
        replayed
            .iter()
            .filter(|r| r.refund_id.is_some()
                || r.original.as_ref().is_some_and(|o| o.refund_id.is_some()))
            .all(|r| r.outcome == "duplicate"),
        "a replayed refund was answered other than as a duplicate"
    );
    eprintln!(
        "refund race: {total} commands, 1 SIGKILL, {flushed} Redis keys flushed, {} refunds, {:?}",
        gateway_refunds.len(),
        started.elapsed()
    );
    flush_prefix(&mut redis.conn, &redis.prefix).await;
}

/// One worker SIGKILLed at 40 % answered, Redis flushed at 60 %, the worker back.
async fn kill_and_flush_mid_run(
    deployment: &mut Deployment,
    redis: &mut TestRedis,
    total: usize,
) -> usize {
    let victim = 2;
    let mut deadline = Instant::now() + Duration::from_secs(120);
    while answered(&deployment.results().await) < total * 2 / 5 {
        deployment.assert_workers_running();
        assert!(Instant::now() < deadline, "the run did not get going");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    deployment.kill(victim);
    deadline = Instant::now() + Duration::from_secs(120);
    while answered(&deployment.results().await) < total * 3 / 5 {
        deployment.assert_workers_running_except(Some(victim));
        assert!(Instant::now() < deadline, "the survivors did not go on");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let flushed = flush_prefix(&mut redis.conn, &redis.prefix).await;
    deployment.restart(victim);
    flushed
}

/// Per charge: refunded at most what was charged, by exactly two distinct keys.
async fn check_gateway(
    deployment: &Deployment,
    gateway_refunds: &[RefundEntry],
    amounts: &HashMap<String, i64>,
    payments: usize,
) {
    let ledger = deployment.ledger().await;
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
    assert_eq!(ledger.len(), payments, "each payment charged once");
}

/// Each refund row agrees with the gateway; nothing left in flight.
async fn check_books(db: &TestDb, gateway_refunds: &[RefundEntry], payments: usize) {
    let rows: Vec<(String, String, Option<String>, i64)> = sqlx::query_as(
        "SELECT idempotency_key, status, gateway_transaction_id, amount_minor FROM refunds",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let refunded_rows: Vec<_> = rows.iter().filter(|r| r.1 == "refunded").collect();
    assert_eq!(refunded_rows.len(), payments * 2, "{rows:?}");
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
}

/// Every command answered; each refund refunded, refused for good, or a duplicate.
fn check_answers(results: &[ResultRecord], total: usize, payments: usize) {
    assert_eq!(by_position(results).len(), total, "every command answered");
    let exceeds = |r: &ResultRecord| {
        r.reason
            .as_deref()
            .is_some_and(|s| s.contains("refund_exceeds_charge"))
    };
    let refused = results.iter().filter(|r| exceeds(r)).count();
    assert!(
        refused >= 2 * payments,
        "two refunds of each payment were refused"
    );
    for result in results {
        assert!(
            ["succeeded", "refunded", "duplicate"].contains(&result.outcome.as_str())
                || exceeds(result),
            "{result:?}"
        );
    }
}
