//! Refunds through a worker and the mock cluster, then the whole topic replayed
//! from offset 0: the dry run finds nothing to send, and the replay sends nothing
//! (the gateway's refunds unchanged, one POST each), every refund answered as a
//! duplicate of its first answer. A refund rejected `payment_unknown` because it
//! came before its charge on its payment's key is not remembered as rejected: the
//! replay refunds it (the ignored test below, until the worker remembers it).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use payment_worker::configuration::WorkerSettings;
use payment_worker::operator::{self, RecordKind, WorkloadRecord};
use payment_worker::token::TokenMode;
use payment_worker::worker::ResultRecord;
use payment_worker_devtools::SimulatorConfig;

use crate::support::helpers::{quick_worker_settings, stop_all, Stack};

fn record(record_key: &str, value: serde_json::Value) -> WorkloadRecord {
    WorkloadRecord {
        kind: RecordKind::Valid,
        key: Some(record_key.as_bytes().to_vec()),
        value: Some(value.to_string().into_bytes()),
        partition_hint: None,
    }
}

fn charge(key: &str, amount_minor: i64) -> WorkloadRecord {
    record(
        key,
        serde_json::json!({
            "idempotency_key": key, "account_id": "acct_rf", "amount_minor": amount_minor,
            "currency": "USD", "payment_method": "pm_card_visa",
        }),
    )
}

/// A refund, sent under `record_key` (its payment's key, or its own).
fn refund(record_key: &str, key: &str, payment: &str, amount_minor: i64) -> WorkloadRecord {
    record(
        record_key,
        serde_json::json!({
            "type": "refund", "idempotency_key": key, "payment_idempotency_key": payment,
            "amount_minor": amount_minor, "currency": "USD", "reason": "returned",
        }),
    )
}

/// The worker's settings: a refund waiting for its payment gives up after `budget`.
fn settings(budget: Duration) -> WorkerSettings {
    WorkerSettings {
        retry_budget: budget,
        ..quick_worker_settings()
    }
}

/// Runs a worker over the whole topic (the group rewound to offset 0 first when
/// `from_zero`) until every command has `per_command` answers; returns them by key.
async fn run_worker(
    stack: &Stack,
    name: &str,
    budget: Duration,
    (commands, per_command): (usize, usize),
    from_zero: bool,
) -> HashMap<String, Vec<ResultRecord>> {
    if from_zero {
        let rewind = stack.settings.clone();
        tokio::task::spawn_blocking(move || operator::rewind_group(&rewind, None))
            .await
            .unwrap()
            .unwrap();
    }
    let worker = stack.start_worker(name, &settings(budget));
    let answers = answers_by_position(stack, commands, per_command).await;
    stack.wait_for_commits(Duration::from_secs(30)).await;
    stop_all(vec![worker]).await;
    by_key(&answers)
}

/// What `replay --dry-run` from offset 0 says of each record.
async fn dry_run_records(stack: &Stack) -> Vec<operator::DryRunVerdict> {
    operator::dry_run_verdicts(
        &stack.settings,
        None,
        &stack.db.pool,
        stack.tokens.as_ref(),
        TokenMode::Implicit,
    )
    .await
    .unwrap()
}

/// What `replay --dry-run` from offset 0 says of each key.
async fn dry_run(stack: &Stack) -> HashMap<String, &'static str> {
    dry_run_records(stack)
        .await
        .into_iter()
        .map(|v| (v.idempotency_key.unwrap_or_default(), v.verdict))
        .collect()
}

fn assert_rejected(answer: &ResultRecord, code: &str) {
    assert_eq!(answer.outcome, "rejected", "{answer:?}");
    assert!(
        answer.reason.as_deref().is_some_and(|r| r.contains(code)),
        "{answer:?}"
    );
}

/// Every answer, by the position of the command it answers, once each position has
/// at least `per_command` of them.
async fn answers_by_position(
    stack: &Stack,
    commands: usize,
    per_command: usize,
) -> HashMap<(i32, i64), Vec<ResultRecord>> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut answers: HashMap<(i32, i64), Vec<ResultRecord>> = HashMap::new();
        for r in stack.results().await {
            answers
                .entry((r.source.partition, r.source.offset))
                .or_default()
                .push(r);
        }
        if answers.len() == commands && answers.values().all(|a| a.len() >= per_command) {
            return answers;
        }
        assert!(
            Instant::now() < deadline,
            "not every command answered: {answers:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn by_key(answers: &HashMap<(i32, i64), Vec<ResultRecord>>) -> HashMap<String, Vec<ResultRecord>> {
    let mut out: HashMap<String, Vec<ResultRecord>> = HashMap::new();
    for list in answers.values() {
        for answer in list {
            let key = answer.idempotency_key.clone().unwrap_or_default();
            out.entry(key).or_default().push(answer.clone());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replaying_every_refund_from_offset_zero_sends_nothing() {
    let stack = Stack::new(2, SimulatorConfig::default()).await;
    let records = vec![
        charge("pay-1", 1000),
        charge("pay-2", 500),
        // Partial refunds keyed by their payment's key (the recommended keying).
        refund("pay-1", "rf-1a", "pay-1", 400),
        refund("pay-1", "rf-1b", "pay-1", 600),
        // Nothing is left of pay-1.
        refund("pay-1", "rf-1c", "pay-1", 1),
        // Keyed by its own key: accepted too.
        refund("rf-2a", "rf-2a", "pay-2", 200),
        // Before its charge, under its own key: it waits for the charge, then refunds.
        refund("rf-3a", "rf-3a", "pay-3", 100),
        charge("pay-3", 300),
    ];
    stack.produce(&records).await;
    let budget = Duration::from_secs(20);
    let first = run_worker(&stack, "w", budget, (records.len(), 1), false).await;
    for key in ["rf-1a", "rf-1b", "rf-2a", "rf-3a"] {
        assert_eq!(first[key][0].outcome, "refunded", "{key}: {:?}", first[key]);
        assert!(first[key][0].refund_id.is_some(), "{:?}", first[key]);
    }
    assert_rejected(&first["rf-1c"][0], "refund_exceeds_charge");
    let refunds_before = stack.simulator.refunds();
    assert_eq!(refunds_before.len(), 4, "{refunds_before:?}");
    assert!(
        refunds_before.iter().all(|r| r.attempts == 1),
        "{refunds_before:?}"
    );
    let ledger_before = stack.ledger();

    let verdicts = dry_run(&stack).await;
    for key in [
        "pay-1", "pay-2", "pay-3", "rf-1a", "rf-1b", "rf-2a", "rf-3a",
    ] {
        assert_eq!(verdicts[key], "duplicate", "{key}: {verdicts:?}");
    }
    // The refusal is kept: the replay answers it again as the refusal it was.
    assert_eq!(verdicts["rf-1c"], "invalid", "{verdicts:?}");
    // Nothing would be sent again: never a POST.
    assert!(
        !verdicts
            .values()
            .any(|v| *v == "would_refund" || *v == "would_charge"),
        "{verdicts:?}"
    );

    let replayed = run_worker(&stack, "r", budget, (records.len(), 2), true).await;
    let refunds_after = stack.simulator.refunds();
    assert_eq!(refunds_after, refunds_before, "the replay refunded");
    assert_eq!(stack.ledger(), ledger_before, "the replay charged");
    for key in ["rf-1a", "rf-1b", "rf-2a", "rf-3a"] {
        let again = &replayed[key][1];
        assert_eq!(again.outcome, "duplicate", "{key}: {again:?}");
        let original = again.original.as_ref().expect("the first answer");
        assert_eq!(original.outcome, "refunded", "{key}: {again:?}");
        assert_eq!(original.refund_id, replayed[key][0].refund_id, "{key}");
    }
    assert_rejected(&replayed["rf-1c"][1], "refund_exceeds_charge");

    // The books agree after both passes: every refund booked as made, none past
    // its charge, none left processing.
    let report = payment_worker::audit::audit(
        &stack.db.pool,
        stack.tokens.as_ref(),
        stack.gateway.as_ref(),
        &payment_worker::audit::AuditOptions::default(),
    )
    .await
    .unwrap();
    assert!(report.is_clean(), "{}", report.to_table());
    assert_eq!((report.refund_entries, report.refund_rows), (4, 4));
}

/// A refund produced before its charge on its payment's key holds the charge back
/// (one key runs in order) until its retry budget runs out: rejected
/// `payment_unknown`, nothing reserved. The refusal is kept, so a replay, which
/// finds the payment charged by then, refuses it again and refunds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refund_rejected_before_its_charge_is_not_refunded_on_replay() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let records = vec![refund("pay-4", "rf-4a", "pay-4", 100), charge("pay-4", 300)];
    stack.produce(&records).await;
    let budget = Duration::from_secs(3);
    let first = run_worker(&stack, "w", budget, (records.len(), 1), false).await;
    assert_rejected(&first["rf-4a"][0], "payment_unknown");
    assert_eq!(first["pay-4"][0].outcome, "succeeded");
    assert!(stack.simulator.refunds().is_empty());

    let replayed = run_worker(&stack, "r", budget, (records.len(), 2), true).await;
    assert!(
        stack.simulator.refunds().is_empty(),
        "the replay refunded: {:?}",
        replayed["rf-4a"]
    );
}

/// A refund refused for want of anything left to refund is refused again on a
/// replay, and nothing was ever sent for it: its replayed answer must not say a
/// refund may exist (`charge_unknown`), nor `audit` list it as given up on with
/// its outcome unknown ("redrive to refund", which would only be refused again).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_refund_replayed_is_not_flagged_as_possibly_refunded() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let records = vec![
        charge("pay-5", 100),
        refund("pay-5", "rf-5a", "pay-5", 100),
        refund("pay-5", "rf-5b", "pay-5", 1),
    ];
    stack.produce(&records).await;
    let budget = Duration::from_secs(20);
    let first = run_worker(&stack, "w", budget, (records.len(), 1), false).await;
    assert_rejected(&first["rf-5b"][0], "refund_exceeds_charge");
    assert!(!first["rf-5b"][0].charge_unknown);

    let replayed = run_worker(&stack, "r", budget, (records.len(), 2), true).await;
    let again = &replayed["rf-5b"][1];
    assert_rejected(again, "refund_exceeds_charge");
    assert!(!again.charge_unknown, "{again:?}");
    let remembered: i64 = sqlx::query_scalar("SELECT count(*) FROM unresolved_charges")
        .fetch_one(&stack.db.pool)
        .await
        .unwrap();
    assert_eq!(remembered, 0);
}

/// A charge and a refund never share a key, and the dry run says so as the workers
/// do: a refund under a payment's key, or a charge under a refund's, is `key_reused`
/// (the tables decide, whatever the key's token says), not a `duplicate` of the
/// completed token.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dry_run_calls_a_key_the_other_kind_holds_reused_as_the_workers_do() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let budget = Duration::from_secs(20);
    let booked = vec![
        charge("pay-1", 1000),
        charge("pay-2", 500),
        refund("pay-1", "rf-1", "pay-1", 100),
    ];
    stack.produce(&booked).await;
    run_worker(&stack, "w", budget, (booked.len(), 1), false).await;
    // Keys crossed: a refund of pay-1 under pay-2's key, a charge under rf-1's, and
    // a refund under the key of a charge given up on with its outcome unknown.
    sqlx::query(
        "INSERT INTO unresolved_charges (idempotency_key, amount_minor, currency, reason, attempts, kind)
         VALUES ('pay-x', 300, 'USD', 'gateway timed out', 3, 'charge')",
    )
    .execute(&stack.db.pool)
    .await
    .unwrap();
    let crossed = vec![
        refund("pay-2", "pay-2", "pay-1", 50),
        charge("rf-1", 700),
        refund("pay-x", "pay-x", "pay-1", 10),
    ];
    stack.produce(&crossed).await;

    let verdicts = dry_run_records(&stack).await;
    let at = |offset: i64| {
        let verdict = verdicts.iter().find(|v| v.offset == offset).unwrap();
        (verdict.verdict, verdict.detail.clone())
    };
    let (refund_verdict, refund_detail) = at(3);
    assert_eq!(refund_verdict, "key_reused", "{verdicts:?}");
    assert!(
        refund_detail.starts_with("key belongs to payment "),
        "{refund_detail}"
    );
    let (charge_verdict, charge_detail) = at(4);
    assert_eq!(charge_verdict, "key_reused", "{verdicts:?}");
    assert!(
        charge_detail.starts_with("key belongs to refund "),
        "{charge_detail}"
    );
    let (unknown_verdict, unknown_detail) = at(5);
    assert_eq!(unknown_verdict, "key_reused", "{verdicts:?}");
    assert!(
        unknown_detail.contains("unresolved_charges"),
        "{unknown_detail}"
    );

    // The workers answer all three so.
    let answers = run_worker(
        &stack,
        "w2",
        budget,
        (booked.len() + crossed.len(), 1),
        false,
    )
    .await;
    for (key, offset) in [("pay-2", 3), ("rf-1", 4), ("pay-x", 5)] {
        let answer = answers[key]
            .iter()
            .find(|a| a.source.offset == offset)
            .unwrap();
        assert_rejected(answer, "key_reused");
    }
    assert_eq!(stack.simulator.refunds().len(), 1, "nothing more refunded");
    assert_eq!(stack.ledger().len(), 2, "nothing more charged");
}
