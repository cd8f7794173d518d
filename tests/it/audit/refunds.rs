//! `audit` reconciles refunds: the gateway's refunds against the `refunds` rows
//! (R1), no payment given back past its amount by either side's count (R2), and
//! refunds left `processing` past a lease listed (R3), `--repair` recording only
//! what the gateway shows and never releasing a reservation.

use std::sync::Arc;
use std::time::{Duration, Instant};

use payment_worker::audit::{audit, AuditOptions, AuditReport, RepairAction};
use payment_worker::gateway::{
    Charge, ChargeRequest, ChargeStatus, GatewayError, LeaseGuard, LedgerEntry, PaymentGateway,
    RefundEntry, RefundRequest,
};
use payment_worker::payment::{
    refunded_of, Attempt, CommandContext, Outcome, PaymentCommand, Processor, RefundCommand,
    RejectionKind,
};
use payment_worker::token::{
    IdempotencyKey, RedisTokenStore, Reservation, TokenPolicy, TokenStore,
};
use payment_worker_devtools::SimulatorConfig;
use uuid::Uuid;

use crate::support::audit::{quiet_env, run_audit, stack_audit_args, AuditVerdict};
use crate::support::helpers::{NoLease, Stack};

fn key(raw: &str) -> IdempotencyKey {
    IdempotencyKey::try_from(raw).unwrap()
}

async fn charged(stack: &Stack, payment_key: &str, amount_minor: i64) -> String {
    let command = PaymentCommand::new(
        payment_key,
        "acct_audit",
        amount_minor,
        "USD",
        "pm_card_visa",
        None,
    )
    .unwrap();
    let outcome = stack
        .processor("charger")
        .process(&command, &CommandContext::default())
        .await;
    let Attempt::Final(Outcome::Succeeded { transaction_id, .. }) = outcome else {
        panic!("{payment_key}: {outcome:?}");
    };
    transaction_id
}

/// Refund attempts until one is final, as the handler's retry loop would.
async fn refunded(processor: &Processor, key: &str, payment_key: &str, amount: i64) -> Outcome {
    let command = RefundCommand::new(key, payment_key, amount, "USD", Some("returned")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match processor
            .process_refund(&command, &CommandContext::default())
            .await
        {
            Attempt::Retry { reason, .. } => {
                assert!(Instant::now() < deadline, "still retrying: {reason}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Attempt::Final(outcome) | Attempt::Unbooked(outcome) => return outcome,
        }
    }
}

/// A refund POSTed straight to the gateway, as if by someone else than a worker.
async fn refund_at_gateway(stack: &Stack, key_raw: &str, charge: &str, amount: i64) -> Charge {
    let request = RefundRequest {
        payment_transaction_id: charge.to_owned(),
        amount_minor: amount,
        currency: "USD".into(),
        refund_id: None,
    };
    stack
        .gateway
        .refund(&key(key_raw), &request, &NoLease)
        .await
        .unwrap()
}

/// A refund row written by hand, `age_secs` old.
async fn insert_refund_row(
    stack: &Stack,
    key_raw: &str,
    payment_key: &str,
    amount: i64,
    (status, transaction): (&str, Option<&str>),
    age_secs: f64,
) {
    sqlx::query(
        "INSERT INTO refunds (id, idempotency_key, payment_id, fingerprint, amount_minor,
             currency, status, gateway_transaction_id, created_at, updated_at)
         SELECT $1, $2, p.id, repeat('0', 64), $3, 'USD', $4, $5,
                now() - make_interval(secs => $6), now() - make_interval(secs => $6)
           FROM payments p WHERE p.idempotency_key = $7",
    )
    .bind(Uuid::now_v7())
    .bind(key_raw)
    .bind(amount)
    .bind(status)
    .bind(transaction)
    .bind(age_secs)
    .bind(payment_key)
    .execute(&stack.db.pool)
    .await
    .unwrap();
}

async fn refund_status(stack: &Stack, key_raw: &str) -> String {
    sqlx::query_scalar("SELECT status FROM refunds WHERE idempotency_key = $1")
        .bind(key_raw)
        .fetch_one(&stack.db.pool)
        .await
        .unwrap()
}

async fn audit_with(stack: &Stack, gateway: &dyn PaymentGateway, repair: bool) -> AuditReport {
    let options = AuditOptions {
        repair,
        ..AuditOptions::default()
    };
    audit(&stack.db.pool, stack.tokens.as_ref(), gateway, &options)
        .await
        .unwrap()
}

async fn audit_binary(stack: &Stack) -> AuditVerdict {
    run_audit(&stack_audit_args(stack, "5s", &[]), &quiet_env()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_audit_clean_and_a_refund_made_behind_the_workers_back_fails_it() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let p = stack.processor("p");
    charged(&stack, "pay-a", 1000).await;
    let charge_b = charged(&stack, "pay-b", 500).await;
    for (refund, payment, amount) in [
        ("rf-a1", "pay-a", 300),
        ("rf-a2", "pay-a", 700),
        ("rf-b1", "pay-b", 200),
    ] {
        let outcome = refunded(&p, refund, payment, amount).await;
        assert!(matches!(outcome, Outcome::Refunded { .. }), "{outcome:?}");
    }
    let over = refunded(&p, "rf-a3", "pay-a", 1).await;
    assert!(
        matches!(&over, Outcome::Rejected { kind: RejectionKind::Invalid, reason } if reason.starts_with("refund_exceeds_charge")),
        "{over:?}"
    );

    let report = audit_with(&stack, stack.gateway.as_ref(), false).await;
    assert!(report.is_clean(), "{}", report.to_table());
    assert_eq!((report.refund_entries, report.refund_rows), (3, 3));
    audit_binary(&stack).await.assert_clean();

    // Refunded at the gateway, not through a worker: no row records it.
    let injected = refund_at_gateway(&stack, "rf-x", &charge_b, 100).await;
    assert_eq!(injected.status, ChargeStatus::Approved);
    let report = audit_with(&stack, stack.gateway.as_ref(), false).await;
    assert_eq!(
        report.refunds_unbooked.keys(),
        ["rf-x"],
        "{}",
        report.to_table()
    );
    assert_eq!(report.violations(), 1, "{}", report.to_table());
    let verdict = audit_binary(&stack).await;
    assert_eq!(verdict.code(), 3, "{verdict}");
    assert!(verdict.stdout.contains("rf-x"), "{verdict}");

    // A row that says more than the gateway did is caught the other way round.
    sqlx::query("UPDATE refunds SET amount_minor = 250 WHERE idempotency_key = 'rf-b1'")
        .execute(&stack.db.pool)
        .await
        .unwrap();
    let report = audit_with(&stack, stack.gateway.as_ref(), false).await;
    assert_eq!(
        report.refund_rows_unbacked.keys(),
        ["rf-b1"],
        "{}",
        report.to_table()
    );
}

/// The stack's gateway, with refunds it never made added to its listing: the
/// simulator refuses to refund past a charge, a real gateway's books may not.
struct ExtraRefunds {
    inner: Arc<dyn PaymentGateway>,
    extra: Vec<RefundEntry>,
}

#[async_trait::async_trait]
impl PaymentGateway for ExtraRefunds {
    async fn charge(
        &self,
        key: &IdempotencyKey,
        request: &ChargeRequest,
        lease: &dyn LeaseGuard,
    ) -> Result<Charge, GatewayError> {
        self.inner.charge(key, request, lease).await
    }

    async fn lookup(&self, key: &IdempotencyKey) -> Result<Option<LedgerEntry>, GatewayError> {
        self.inner.lookup(key).await
    }

    async fn ledger(&self) -> Result<Vec<LedgerEntry>, GatewayError> {
        self.inner.ledger().await
    }

    async fn refunds(&self) -> Result<Vec<RefundEntry>, GatewayError> {
        let mut all = self.inner.refunds().await?;
        all.extend(self.extra.iter().cloned());
        Ok(all)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_refunded_past_its_amount_fails_the_audit() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let charge = charged(&stack, "pay-o", 100).await;
    let outcome = refunded(&stack.processor("p"), "rf-o1", "pay-o", 100).await;
    assert!(matches!(outcome, Outcome::Refunded { .. }), "{outcome:?}");
    audit_binary(&stack).await.assert_clean();

    // A second refund of 50 booked and made at the gateway: 150 of 100 given back.
    insert_refund_row(
        &stack,
        "rf-o2",
        "pay-o",
        50,
        ("refunded", Some("rt_extra")),
        0.0,
    )
    .await;
    assert_eq!(
        refunded_of(&stack.db.pool, "pay-o").await.unwrap(),
        (150, 0)
    );
    let gateway = ExtraRefunds {
        inner: stack.gateway.clone(),
        extra: vec![RefundEntry {
            idempotency_key: "rf-o2".into(),
            transaction_id: "rt_extra".into(),
            payment_transaction_id: charge.clone(),
            amount_minor: 50,
            currency: "USD".into(),
            status: ChargeStatus::Approved,
            refunded_at: chrono::Utc::now(),
            attempts: 1,
            decline_code: None,
        }],
    };
    let report = audit_with(&stack, &gateway, false).await;
    // Every refund is booked as made; only the totals are wrong, on both sides.
    assert_eq!(report.refunds_unbooked.count, 0, "{}", report.to_table());
    assert_eq!(
        report.refund_rows_unbacked.count,
        0,
        "{}",
        report.to_table()
    );
    assert_eq!(
        report.refunds_past_charge.keys(),
        ["pay-o", "pay-o"],
        "{}",
        report.to_table()
    );
    let details: Vec<&str> = report
        .refunds_past_charge
        .examples
        .iter()
        .map(|e| e.detail.as_str())
        .collect();
    assert!(
        details[0].starts_with("gateway: 150 USD refunded"),
        "{details:?}"
    );
    assert!(details[1].starts_with("rows: 150"), "{details:?}");
    assert_eq!(report.violations(), 2);

    // The binary reads the simulator, which holds no rt_extra: the row is unbacked
    // as well as past the charge.
    let verdict = audit_binary(&stack).await;
    assert_eq!(verdict.code(), 3, "{verdict}");
    let json = run_audit(&stack_audit_args(&stack, "5s", &["--json"]), &quiet_env())
        .await
        .json();
    assert_eq!(json["refunds_past_charge"]["count"], 1, "{json}");
    assert_eq!(json["refund_rows_unbacked"]["count"], 1, "{json}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_processing_refund_is_listed_and_repair_records_only_what_the_gateway_shows() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let charge = charged(&stack, "pay-s", 1000).await;
    // Both reserved and committed a minute ago; only rf-s2's POST reached the gateway.
    insert_refund_row(&stack, "rf-s1", "pay-s", 200, ("processing", None), 60.0).await;
    insert_refund_row(&stack, "rf-s2", "pay-s", 300, ("processing", None), 60.0).await;
    refund_at_gateway(&stack, "rf-s2", &charge, 300).await;
    // In flight right now: within its lease, not stuck.
    insert_refund_row(&stack, "rf-s3", "pay-s", 100, ("processing", None), 0.0).await;

    let report = audit_with(&stack, stack.gateway.as_ref(), false).await;
    assert_eq!(
        report.stuck_refunds.keys(),
        ["rf-s1", "rf-s2"],
        "{}",
        report.to_table()
    );
    assert_eq!(report.refunds_unbooked.keys(), ["rf-s2"]);
    assert_eq!(report.violations(), 3, "{}", report.to_table());
    let verdict = audit_binary(&stack).await;
    assert_eq!(verdict.code(), 3, "{verdict}");
    assert!(verdict.stdout.contains("rf-s1"), "{verdict}");

    let repaired = audit_with(&stack, stack.gateway.as_ref(), true).await;
    let actions: Vec<(&str, RepairAction)> = repaired
        .repairs
        .iter()
        .map(|r| (r.idempotency_key.as_str(), r.action))
        .collect();
    assert_eq!(
        actions,
        [
            ("rf-s1", RepairAction::LeftForWorker),
            ("rf-s2", RepairAction::Recorded)
        ],
        "{}",
        repaired.to_table()
    );
    assert_eq!(repaired.stuck_refunds_repaired, 1);
    assert_eq!(repaired.stuck_refunds.keys(), ["rf-s1"]);
    assert_eq!(
        repaired.refunds_unbooked.count,
        0,
        "{}",
        repaired.to_table()
    );
    assert_eq!(repaired.violations(), 1);
    assert_eq!(refund_status(&stack, "rf-s2").await, "refunded");
    // Never released: rf-s1's amount stays reserved, rf-s3 is left to its worker.
    assert_eq!(refund_status(&stack, "rf-s1").await, "processing");
    assert_eq!(refund_status(&stack, "rf-s3").await, "processing");
    assert_eq!(
        refunded_of(&stack.db.pool, "pay-s").await.unwrap(),
        (300, 300)
    );
}

async fn remember_unresolved_refund(stack: &Stack, key_raw: &str, amount: i64) {
    sqlx::query(
        "INSERT INTO unresolved_charges (idempotency_key, amount_minor, currency, reason,
             attempts, kind)
         VALUES ($1, $2, 'USD', 'retries_exhausted after 3 attempts: gateway timeout', 3, 'refund')",
    )
    .bind(key_raw)
    .bind(amount)
    .execute(&stack.db.pool)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_given_up_on_is_looked_for_among_the_gateways_refunds() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let charge = charged(&stack, "pay-u", 1000).await;
    // Its reservation committed, its POST landed, its answer lost; then given up on.
    insert_refund_row(&stack, "rf-u1", "pay-u", 100, ("processing", None), 0.0).await;
    refund_at_gateway(&stack, "rf-u1", &charge, 100).await;
    remember_unresolved_refund(&stack, "rf-u1", 100).await;
    // Given up on before anything reached the gateway.
    insert_refund_row(&stack, "rf-u2", "pay-u", 200, ("processing", None), 0.0).await;
    remember_unresolved_refund(&stack, "rf-u2", 200).await;

    let report = audit_with(&stack, stack.gateway.as_ref(), false).await;
    let details: Vec<(&str, &str)> = report
        .unresolved_charges
        .examples
        .iter()
        .map(|e| (e.idempotency_key.as_str(), e.detail.as_str()))
        .collect();
    assert_eq!(details.len(), 2, "{}", report.to_table());
    assert_eq!(details[0].0, "rf-u1");
    assert!(
        details[0].1.contains("the gateway holds rfd_")
            && details[0].1.contains("refunded 100 USD"),
        "{details:?}"
    );
    assert_eq!(details[1].0, "rf-u2");
    assert!(
        details[1].1.contains("the gateway holds no refund for it"),
        "{details:?}"
    );
    // The refund made without its row recorded is a violation on its own (R1).
    assert_eq!(report.refunds_unbooked.keys(), ["rf-u1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refunds_token_left_to_its_lease_is_a_warning_once_its_row_is_final() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let charge = charged(&stack, "pay-t", 1000).await;
    // rf-t1 refunded and booked, its token left processing by a worker that died
    // before confirming it; rf-t2 reserved, its token left the same way; rf-t3 a
    // refusal kept (`rejected`), its token left the same way.
    let made = refund_at_gateway(&stack, "rf-t1", &charge, 100).await;
    let booked = ("refunded", Some(made.transaction_id.as_str()));
    insert_refund_row(&stack, "rf-t1", "pay-t", 100, booked, 0.0).await;
    insert_refund_row(&stack, "rf-t2", "pay-t", 200, ("processing", None), 0.0).await;
    insert_refund_row(&stack, "rf-t3", "pay-t", 300, ("rejected", None), 0.0).await;
    let short: Arc<dyn TokenStore> = Arc::new(RedisTokenStore::new(
        stack.redis.conn.clone(),
        stack.redis.prefix.clone(),
        TokenPolicy {
            lease: Duration::from_millis(300),
            ..TokenPolicy::default()
        },
    ));
    for (raw, owner) in [
        ("rf-t1", "gone:1"),
        ("rf-t2", "gone:2"),
        ("rf-t3", "gone:3"),
    ] {
        let reserved = short.reserve(&key(raw), owner).await.unwrap();
        assert!(
            matches!(reserved, Reservation::Reserved { .. }),
            "{reserved:?}"
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    let report = audit(
        &stack.db.pool,
        short.as_ref(),
        stack.gateway.as_ref(),
        &AuditOptions::default(),
    )
    .await
    .unwrap();
    let mut left = report.lease_left_tokens.keys();
    left.sort_unstable();
    assert_eq!(left, ["rf-t1", "rf-t3"], "{}", report.to_table());
    assert_eq!(
        report.stuck_tokens.keys(),
        ["rf-t2"],
        "{}",
        report.to_table()
    );
    assert!(
        report.stuck_tokens.examples[0]
            .detail
            .ends_with("row: refund processing"),
        "{}",
        report.to_table()
    );
    // Its row is stale too under this lease: listed as a stuck refund as well.
    assert_eq!(report.stuck_refunds.keys(), ["rf-t2"]);
    assert_eq!(report.violations(), 2, "{}", report.to_table());

    // `--repair` completes the tokens of the final refunds with their rows, as the
    // worker would have, and leaves the reserved one to the next delivery's look-up:
    // none is restored as a charge that never happened.
    let repaired = audit(
        &stack.db.pool,
        short.as_ref(),
        stack.gateway.as_ref(),
        &AuditOptions {
            repair: true,
            ..AuditOptions::default()
        },
    )
    .await
    .unwrap();
    let mut actions: Vec<(&str, RepairAction, &str)> = repaired
        .repairs
        .iter()
        .map(|r| (r.idempotency_key.as_str(), r.action, r.detail.as_str()))
        .collect();
    actions.sort_unstable_by_key(|(k, _, detail)| (*k, *detail));
    let ids: Vec<(String, Uuid)> = sqlx::query_as(
        "SELECT idempotency_key, id FROM refunds WHERE idempotency_key IN ('rf-t1', 'rf-t3')
         ORDER BY idempotency_key",
    )
    .fetch_all(&stack.db.pool)
    .await
    .unwrap();
    let (t1, t3) = (ids[0].1, ids[1].1);
    assert_eq!(
        actions,
        [
            (
                "rf-t1",
                RepairAction::Completed,
                format!("refund {t1}").as_str()
            ),
            (
                "rf-t2",
                RepairAction::LeftForWorker,
                "its refund row is processing; the next delivery looks the refund up"
            ),
            // (The stuck refund's own repair: nothing shows at the gateway.)
            (
                "rf-t2",
                RepairAction::LeftForWorker,
                "the gateway shows no refund under its key; its amount stays reserved until \
                 one shows or an operator decides"
            ),
            (
                "rf-t3",
                RepairAction::Completed,
                format!("refund {t3}").as_str()
            ),
        ],
        "{}",
        repaired.to_table()
    );
    for raw in ["rf-t1", "rf-t3"] {
        let shown = short.show(&key(raw)).await.unwrap().unwrap();
        assert_eq!(
            shown.state,
            payment_worker::token::TokenState::Completed,
            "{raw}"
        );
    }
}
