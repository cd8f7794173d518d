//! `audit` reconciles the gateway ledger, the payments table and the token
//! store. A clean run audits clean; each violation kind planted by hand is found,
//! both in process and by the binary's exit status; `--repair` settles stuck tokens
//! only where that is safe.

use std::sync::Arc;
use std::time::Duration;

use payment_worker::audit::{audit, AuditOptions, AuditReport, RepairAction};
use payment_worker::fault::{FaultPoint, Faults};
use payment_worker::gateway::ChargeRequest;
use payment_worker::payment::{
    Attempt, CommandContext, GatewayLookup, Outcome, PaymentCommand, Processor,
};
use payment_worker::token::{
    Claim, IdempotencyKey, RedisTokenStore, Reservation, TokenPolicy, TokenState, TokenStore,
};
use payment_worker_devtools::SimulatorConfig;
use uuid::Uuid;

use crate::support::audit::{quiet_env, run_audit, stack_audit_args, AuditVerdict};
use crate::support::helpers::{assert_duplicate_of, final_outcome, NoLease, Stack};

const SHORT_LEASE: Duration = Duration::from_millis(300);

fn command(key: &str, amount: i64, method: &str) -> PaymentCommand {
    PaymentCommand::new(key, "acct_audit", amount, "EUR", method, None).unwrap()
}

fn key(raw: &str) -> IdempotencyKey {
    IdempotencyKey::try_from(raw).unwrap()
}

/// The stack's token store with a lease short enough to expire within the test.
fn short_lease_store(stack: &Stack) -> Arc<dyn TokenStore> {
    Arc::new(RedisTokenStore::new(
        stack.redis.conn.clone(),
        stack.redis.prefix.clone(),
        TokenPolicy {
            lease: SHORT_LEASE,
            ..TokenPolicy::default()
        },
    ))
}

async fn audit_in_process(stack: &Stack, options: AuditOptions) -> AuditReport {
    audit(
        &stack.db.pool,
        stack.tokens.as_ref(),
        stack.gateway.as_ref(),
        &options,
    )
    .await
    .unwrap()
}

/// Runs `payment-worker audit` against the stack; flags only, so no ambient
/// environment variable can point it elsewhere.
async fn audit_binary(stack: &Stack, extra: &[&str]) -> AuditVerdict {
    run_audit(&stack_audit_args(stack, "5s", extra), &quiet_env()).await
}

async fn token_state(stack: &Stack, raw: &str) -> Option<(TokenState, Option<Uuid>)> {
    stack
        .tokens
        .show(&key(raw))
        .await
        .unwrap()
        .map(|v| (v.state, v.payment_id))
}

async fn payment_id_of(stack: &Stack, raw: &str) -> Uuid {
    sqlx::query_scalar("SELECT id FROM payments WHERE idempotency_key = $1")
        .bind(raw)
        .fetch_one(&stack.db.pool)
        .await
        .unwrap()
}

async fn insert_row(
    stack: &Stack,
    raw: &str,
    status: &str,
    transaction: Option<&str>,
    age_secs: i64,
) {
    let fingerprint = command(raw, 100, "pm_card_visa").fingerprint();
    sqlx::query(
        "INSERT INTO payments (id, idempotency_key, fingerprint, account_id, amount_minor, currency,
             status, gateway_transaction_id, created_at, updated_at)
         VALUES ($1, $2, $3, 'acct_audit', 100, 'EUR', $4, $5,
                 now() - make_interval(secs => $6), now() - make_interval(secs => $6))",
    )
    .bind(Uuid::now_v7())
    .bind(raw)
    .bind(fingerprint.as_str())
    .bind(status)
    .bind(transaction)
    .bind(age_secs as f64)
    .execute(&stack.db.pool)
    .await
    .unwrap();
}

fn charge_request() -> ChargeRequest {
    command("any", 100, "pm_card_visa").charge_request()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_run_is_clean_and_repair_settles_stuck_tokens() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let processor = stack.processor("p");
    let context = CommandContext::default();
    for (n, method) in [
        "pm_card_visa",
        "pm_card_visa",
        "pm_card_declined",
        "pm_card_visa",
    ]
    .iter()
    .enumerate()
    {
        let outcome = processor
            .process(
                &command(&format!("ok-{n}"), 100 + n as i64, method),
                &context,
            )
            .await;
        assert!(
            matches!(
                outcome,
                Attempt::Final(Outcome::Succeeded { .. } | Outcome::Declined { .. })
            ),
            "{outcome:?}"
        );
    }
    let report = audit_in_process(&stack, AuditOptions::default()).await;
    assert!(report.is_clean(), "{}", report.to_table());
    assert_eq!((report.ledger_entries, report.payment_rows), (4, 4));
    audit_binary(&stack, &[]).await.assert_clean();

    // A worker that crashed right after COMMIT: row and charge exist, token processing.
    let crashed = Processor::new(
        short_lease_store(&stack),
        Arc::clone(&stack.gateway),
        stack.db.pool.clone(),
        GatewayLookup::Uncertain,
        "crashed",
    )
    .with_faults(Faults::fail_at(FaultPoint::AfterCommit));
    let crash_command = command("crash-1", 700, "pm_card_visa");
    let outcome = crashed.process(&crash_command, &context).await;
    assert!(
        matches!(outcome, Attempt::Final(Outcome::Succeeded { .. })),
        "{outcome:?}"
    );
    // A worker that crashed right after reserving: no row, no charge.
    let abandoned = short_lease_store(&stack);
    assert!(matches!(
        abandoned
            .reserve(&key("abandoned-1"), "gone:1")
            .await
            .unwrap(),
        Reservation::Reserved { .. }
    ));
    tokio::time::sleep(SHORT_LEASE + Duration::from_millis(200)).await;
    assert_eq!(
        token_state(&stack, "crash-1").await.map(|s| s.0),
        Some(TokenState::Processing)
    );

    // Without a final row the token is stuck and unsafe (a violation); with one it was
    // only left to its lease and the next delivery settles it (a warning).
    let report = audit_in_process(&stack, AuditOptions::default()).await;
    assert_eq!(
        report.stuck_tokens.keys(),
        ["abandoned-1"],
        "{}",
        report.to_table()
    );
    assert_eq!(
        report.lease_left_tokens.keys(),
        ["crash-1"],
        "{}",
        report.to_table()
    );
    assert_eq!((report.violations(), report.warnings()), (1, 1));
    assert!(report.repairs.is_empty(), "no repair without --repair");
    let output = audit_binary(&stack, &[]).await;
    assert!(!output.status.success(), "stuck tokens must fail the audit");
    assert!(output.stderr.contains("invariant violation"), "{output}");
    let table = &output.stdout;
    assert!(
        table.contains("result: 1 invariant violation(s), 1 warning(s)")
            && table.contains("crash-1: processing past its lease, succeeded row committed"),
        "{table}"
    );
    assert_eq!(
        token_state(&stack, "crash-1").await.map(|s| s.0),
        Some(TokenState::Processing)
    );

    let output = audit_binary(&stack, &["--repair", "--json"]).await;
    let json = output.json();
    assert!(
        output.status.success(),
        "every stuck token repaired: {json}"
    );
    assert_eq!(json["token_inconsistencies_repaired"], 2, "{json}");
    let actions: Vec<(String, String)> = json["repairs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["idempotency_key"].as_str().unwrap().to_owned(),
                r["action"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        actions.contains(&("crash-1".into(), "completed".into())),
        "{actions:?}"
    );
    assert!(
        actions.contains(&("abandoned-1".into(), "restored".into())),
        "{actions:?}"
    );

    let row_id = payment_id_of(&stack, "crash-1").await;
    assert_eq!(
        token_state(&stack, "crash-1").await,
        Some((TokenState::Completed, Some(row_id)))
    );
    assert_eq!(
        token_state(&stack, "abandoned-1").await.map(|s| s.0),
        Some(TokenState::Pending)
    );
    let report = audit_in_process(&stack, AuditOptions::default()).await;
    assert!(report.is_clean(), "{}", report.to_table());
    assert_eq!(report.stuck_tokens.count, 0);
    assert_eq!(report.warnings(), 0, "{}", report.to_table());

    // The repaired tombstone answers a redelivery from Redis alone, with the row's id
    // and its fingerprint (another amount under the same key is refused).
    let outcome = processor.process(&crash_command, &context).await;
    assert_duplicate_of(&final_outcome(outcome), row_id);
    let outcome = processor
        .process(&command("crash-1", 701, "pm_card_visa"), &context)
        .await;
    assert!(
        matches!(outcome, Attempt::Final(Outcome::Rejected { .. })),
        "{outcome:?}"
    );
    assert_eq!(
        stack.ledger().len(),
        5,
        "nothing charged by audit or the redeliveries"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_planted_violation_is_detected_and_fails_the_audit() {
    // A gateway without idempotency support lets a second POST of a key charge again.
    let stack = Stack::new(
        1,
        SimulatorConfig {
            ignore_idempotency_key: true,
            ..SimulatorConfig::default()
        },
    )
    .await;
    let processor = stack.processor("p");
    let context = CommandContext::default();
    for raw in ["ok-1", "dbl-1", "dis-1"] {
        let outcome = processor
            .process(&command(raw, 100, "pm_card_visa"), &context)
            .await;
        assert!(
            matches!(outcome, Attempt::Final(Outcome::Succeeded { .. })),
            "{outcome:?}"
        );
    }
    let short = short_lease_store(&stack);

    // I1: the same key charged twice.
    stack
        .gateway
        .charge(&key("dbl-1"), &charge_request(), &NoLease)
        .await
        .unwrap();
    // I7: a charge without a row, whose token is also stuck in processing.
    stack
        .gateway
        .charge(&key("norow-1"), &charge_request(), &NoLease)
        .await
        .unwrap();
    assert!(matches!(
        short.reserve(&key("norow-1"), "gone:2").await.unwrap(),
        Reservation::Reserved { .. }
    ));
    // A completed tombstone whose payment row does not exist.
    stack
        .gateway
        .charge(&key("tomb-1"), &charge_request(), &NoLease)
        .await
        .unwrap();
    let Reservation::Reserved { fence, .. } =
        short.reserve(&key("tomb-1"), "gone:3").await.unwrap()
    else {
        panic!("tomb-1 not reserved")
    };
    let claim = Claim {
        owner: "gone:3".into(),
        fence,
    };
    let fingerprint = command("tomb-1", 100, "pm_card_visa").fingerprint();
    short
        .confirm(&key("tomb-1"), &claim, Uuid::new_v4(), fingerprint.as_str())
        .await
        .unwrap();
    // I7: an orphan row (succeeded, never charged).
    insert_row(&stack, "orphan-1", "succeeded", Some("tx-orphan-1"), 0).await;
    // I7: a row whose transaction id is not the ledger's.
    sqlx::query(
        "UPDATE payments SET gateway_transaction_id = 'tx-forged' WHERE idempotency_key = 'dis-1'",
    )
    .execute(&stack.db.pool)
    .await
    .unwrap();
    // A committed row still `processing` an hour later.
    insert_row(&stack, "limbo-1", "processing", None, 3600).await;
    tokio::time::sleep(SHORT_LEASE + Duration::from_millis(200)).await;

    let report = audit_in_process(&stack, AuditOptions::default()).await;
    let table = report.to_table();
    let expect = |name: &str, finding: &payment_worker::audit::Finding, keys: &[&str]| {
        let mut found = finding.keys();
        found.sort();
        assert_eq!(found, keys, "{name}:\n{table}");
        assert_eq!(finding.count, keys.len(), "{name}:\n{table}");
    };
    expect("double charges", &report.double_charges, &["dbl-1"]);
    expect(
        "charges without row",
        &report.charges_without_row,
        &["norow-1", "tomb-1"],
    );
    expect(
        "rows without charge",
        &report.rows_without_charge,
        &["orphan-1"],
    );
    expect("rows disagreeing", &report.rows_disagreeing, &["dis-1"]);
    expect("stuck tokens", &report.stuck_tokens, &["norow-1"]);
    expect(
        "tombstones without row",
        &report.tombstones_without_row,
        &["tomb-1"],
    );
    expect(
        "stale processing rows",
        &report.stale_processing_rows,
        &["limbo-1"],
    );
    assert_eq!(report.violations(), 8);
    assert!(
        report.double_charges.examples[0]
            .detail
            .starts_with("2 charges"),
        "{table}"
    );

    // The binary sees the same and exits non-zero, as JSON and as a table.
    let output = audit_binary(&stack, &["--json"]).await;
    assert!(!output.status.success());
    let json = output.json();
    for (field, count) in [
        ("double_charges", 1),
        ("charges_without_row", 2),
        ("rows_without_charge", 1),
        ("rows_disagreeing", 1),
        ("stuck_tokens", 1),
        ("tombstones_without_row", 1),
        ("stale_processing_rows", 1),
    ] {
        assert_eq!(json[field]["count"], count, "{field}: {json}");
    }
    let output = audit_binary(&stack, &[]).await;
    assert!(!output.status.success());
    let table = &output.stdout;
    assert!(
        table.contains("keys charged more than once") && table.contains("dbl-1"),
        "{table}"
    );
    assert!(
        table.contains("result: 8 invariant violation(s)"),
        "{table}"
    );

    // Repair leaves a token alone when a charge exists without a row: only a worker
    // that looks the charge up (fence > 1) may record it.
    let report = audit_in_process(
        &stack,
        AuditOptions {
            repair: true,
            key_prefix: None,
            ..AuditOptions::default()
        },
    )
    .await;
    assert_eq!(report.repairs.len(), 1);
    assert_eq!(report.repairs[0].idempotency_key, "norow-1");
    assert_eq!(report.repairs[0].action, RepairAction::LeftForWorker);
    assert_eq!(report.token_inconsistencies_repaired, 0);
    assert_eq!(report.violations(), 8);
    assert_eq!(
        token_state(&stack, "norow-1").await.map(|s| s.0),
        Some(TokenState::Processing)
    );
    let output = audit_binary(&stack, &["--repair"]).await;
    assert!(
        !output.status.success(),
        "an unrepairable token still fails the audit"
    );

    // The key prefix scopes the audit: the untouched key alone is clean.
    let report = audit_in_process(
        &stack,
        AuditOptions {
            repair: false,
            key_prefix: Some("ok-".into()),
            ..AuditOptions::default()
        },
    )
    .await;
    assert!(report.is_clean(), "{}", report.to_table());
    assert_eq!((report.ledger_entries, report.payment_rows), (1, 1));
    audit_binary(&stack, &["--key-prefix", "ok-"])
        .await
        .assert_success();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repair_works_on_the_postgres_token_store_too() {
    use payment_worker::token::PostgresTokenStore;
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let store = |lease| -> Arc<dyn TokenStore> {
        Arc::new(PostgresTokenStore::new(
            stack.db.pool.clone(),
            TokenPolicy {
                lease,
                ..TokenPolicy::default()
            },
        ))
    };
    let short = store(SHORT_LEASE);
    let tokens = store(Duration::from_secs(5));
    // Stopped right after COMMIT: the commit completed the token already (the
    // Postgres store settles inside the payment transaction), nothing to repair.
    let crashed = Processor::new(
        Arc::clone(&short),
        Arc::clone(&stack.gateway),
        stack.db.pool.clone(),
        GatewayLookup::Uncertain,
        "crashed",
    )
    .with_faults(Faults::fail_at(FaultPoint::AfterCommit));
    let outcome = crashed
        .process(
            &command("pg-crash", 300, "pm_card_visa"),
            &CommandContext::default(),
        )
        .await;
    assert!(
        matches!(outcome, Attempt::Final(Outcome::Succeeded { .. })),
        "{outcome:?}"
    );
    let row_id = payment_id_of(&stack, "pg-crash").await;
    let view = tokens.show(&key("pg-crash")).await.unwrap().unwrap();
    assert_eq!(
        (view.state, view.payment_id),
        (TokenState::Completed, Some(row_id))
    );
    // Committed by a Redis-token worker, then the key reserved on the Postgres store
    // by a worker that died: committed row, token processing.
    let committed = stack
        .processor("redis-worker")
        .process(
            &command("pg-committed", 310, "pm_card_visa"),
            &CommandContext::default(),
        )
        .await;
    assert!(
        matches!(committed, Attempt::Final(Outcome::Succeeded { .. })),
        "{committed:?}"
    );
    // Reserved but never processed.
    for stuck in ["pg-abandoned", "pg-committed"] {
        assert!(matches!(
            short.reserve(&key(stuck), "gone:1").await.unwrap(),
            Reservation::Reserved { .. }
        ));
    }
    tokio::time::sleep(SHORT_LEASE + Duration::from_millis(200)).await;

    let run = |repair| {
        let tokens = Arc::clone(&tokens);
        let stack = &stack;
        async move {
            audit(
                &stack.db.pool,
                tokens.as_ref(),
                stack.gateway.as_ref(),
                &AuditOptions {
                    repair,
                    key_prefix: None,
                    ..AuditOptions::default()
                },
            )
            .await
            .unwrap()
        }
    };
    let report = run(false).await;
    assert_eq!(
        report.stuck_tokens.keys(),
        ["pg-abandoned"],
        "{}",
        report.to_table()
    );
    assert_eq!(
        report.lease_left_tokens.keys(),
        ["pg-committed"],
        "{}",
        report.to_table()
    );
    let table = report
        .token_table
        .clone()
        .expect("the token table's figures");
    assert!(table.rows >= 3 && table.table_bytes > 0, "{table:?}");
    let report = run(true).await;
    assert_eq!(
        report.token_inconsistencies_repaired,
        2,
        "{}",
        report.to_table()
    );
    assert!(report.is_clean(), "{}", report.to_table());
    let row_id = payment_id_of(&stack, "pg-committed").await;
    let view = tokens.show(&key("pg-committed")).await.unwrap().unwrap();
    assert_eq!(
        (view.state, view.payment_id),
        (TokenState::Completed, Some(row_id))
    );
    let view = tokens.show(&key("pg-abandoned")).await.unwrap().unwrap();
    assert_eq!(view.state, TokenState::Pending);
    assert!(run(false).await.is_clean());
}
