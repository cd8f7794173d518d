//! A charge whose outcome the worker cannot settle is never forgotten: a command
//! whose retries run out with its charge unknown, one whose token vanishes while
//! its charge is unresolved, and one whose charge the database refuses to record
//! are each dead-lettered saying so (or booked once the charge shows), listed by
//! `audit` until booked, and never charged twice. Through the scripted gateway
//! front, whose ledger is the simulator's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use payment_worker::audit::{audit, AuditOptions};
use payment_worker::gateway::{HttpGateway, LedgerEntry};
use payment_worker::operator::{RecordKind, WorkloadRecord};
use payment_worker::payment::{Attempt, CommandContext, Outcome, PaymentCommand};
use payment_worker::retry::RetryPolicy;
use payment_worker::token::{RedisTokenStore, TokenMode, TokenPolicy};
use payment_worker::worker;
use payment_worker_devtools::SimulatorConfig;
use rdkafka::message::{Headers, Message, OwnedMessage};

use crate::support::audit::{quiet_env, run_audit, stack_audit_args};
use crate::support::helpers::{quick_worker_settings, stop_all, Stack};
use crate::support::scripted_gateway::{PostAnswer, ScriptedGateway};

use super::answers::ikey;

fn header(message: &OwnedMessage, name: &str) -> Option<String> {
    message.headers().and_then(|h| {
        h.iter()
            .find(|x| x.key == name)
            .and_then(|x| x.value.map(|v| String::from_utf8_lossy(v).into_owned()))
    })
}

fn record(key: &str, amount_minor: i64) -> WorkloadRecord {
    let value = serde_json::json!({
        "idempotency_key": key, "account_id": "acct_7", "amount_minor": amount_minor,
        "currency": "USD", "payment_method": "pm_card_visa",
    });
    WorkloadRecord {
        kind: RecordKind::Valid,
        key: Some(key.as_bytes().to_vec()),
        value: Some(value.to_string().into_bytes()),
        partition_hint: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retries_exhausted_with_the_charge_unknown_is_dead_lettered_so_and_listed_by_audit() {
    let mut stack = Stack::with_policy(
        1,
        SimulatorConfig::default(),
        TokenPolicy {
            lease: Duration::from_millis(500),
            ..TokenPolicy::default()
        },
    )
    .await;
    let front = ScriptedGateway::start(&stack.simulator).await;
    let ledger_gateway = HttpGateway::new(
        &stack.simulator.url(),
        Duration::from_secs(5),
        Duration::from_secs(1),
    )
    .unwrap();
    stack.gateway = Arc::new(
        HttpGateway::new(&front.url(), Duration::from_secs(2), Duration::from_secs(1)).unwrap(),
    );
    // Charged behind an unreadable answer, and no look-up ever answers.
    let unknown = "xu-unknown";
    front.script(unknown, &[PostAnswer::ChargeThenGarbledBody]);
    front.lookups_down(unknown, true);
    // Refused every time, charged never (429: the gateway says it did not take the
    // request; a 5xx would leave the charge unknown): exhausted too, but nothing is
    // unknown.
    let down = "xu-down";
    front.script(down, &[PostAnswer::Refuse(429); 500]);

    let retry = RetryPolicy {
        min_delay: Duration::from_millis(50),
        max_delay: Duration::from_millis(300),
        budget: Duration::from_secs(3),
    };
    let running = stack.start_worker_retrying("short-budget", &quick_worker_settings(), retry);
    stack
        .produce(&[record(unknown, 2500), record(down, 2600)])
        .await;
    let results = stack.wait_for_results(2, Duration::from_secs(60)).await;
    stack.wait_for_commits(Duration::from_secs(30)).await;
    stop_all(vec![running]).await;

    assert!(
        results.iter().all(|r| r.outcome == "rejected"),
        "{results:?}"
    );
    let letters = stack.dead_letters().await;
    assert_eq!(letters.len(), 2, "one dead letter each");
    let letter_of = |key: &str| {
        letters
            .iter()
            .find(|m| m.key() == Some(key.as_bytes()))
            .unwrap_or_else(|| panic!("no dead letter for {key}"))
    };
    for key in [unknown, down] {
        assert_eq!(
            header(letter_of(key), worker::ERROR_KIND).as_deref(),
            Some("retries_exhausted"),
            "{key}"
        );
    }
    assert_eq!(
        header(letter_of(unknown), worker::CHARGE_UNKNOWN).as_deref(),
        Some("true"),
        "an earlier attempt may have charged"
    );
    assert_eq!(
        header(letter_of(down), worker::CHARGE_UNKNOWN),
        None,
        "every attempt was refused: nothing is unknown"
    );
    assert_eq!(front.posts_seen(unknown), 1, "never POSTed blindly again");
    let charged: Vec<LedgerEntry> = stack
        .ledger()
        .into_iter()
        .filter(|e| e.idempotency_key == unknown)
        .collect();
    assert_eq!(charged.len(), 1);
    assert_eq!(charged[0].attempts, 1);

    // audit lists the key with what the ledger holds; the refused one is not listed.
    let report = audit_against(&stack, &ledger_gateway).await;
    assert_eq!(report.unresolved_charges.keys(), vec![unknown]);
    let detail = &report.unresolved_charges.examples[0].detail;
    assert!(
        detail.contains(&charged[0].transaction_id) && detail.contains("approved"),
        "{detail}"
    );
    assert_eq!(report.charges_without_row.keys(), vec![unknown]);
    assert!(report
        .to_table()
        .contains("dead-lettered with the charge unknown"));
    // The same from the command line: listed in the JSON, and the charge without its
    // row fails the audit.
    let output = run_audit(
        &stack_audit_args(&stack, "500ms", &["--json"]),
        &quiet_env(),
    )
    .await;
    assert!(!output.status.success(), "{output}");
    let json = output.json();
    assert_eq!(
        json["unresolved_charges"]["examples"][0]["idempotency_key"], unknown,
        "{json}"
    );

    // Once the gateway answers look-ups again, a redelivery books the charge, and the
    // key leaves audit's list.
    front.lookups_down(unknown, false);
    let processor = stack.processor("redrive");
    let cmd = PaymentCommand::new(unknown, "acct_7", 2500, "USD", "pm_card_visa", None).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let outcome = loop {
        match processor.process(&cmd, &CommandContext::default()).await {
            Attempt::Retry { reason, .. } => {
                assert!(Instant::now() < deadline, "still retrying: {reason}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Attempt::Final(outcome) | Attempt::Unbooked(outcome) => break outcome,
        }
    };
    assert!(
        matches!(&outcome, Outcome::Succeeded { transaction_id, .. } if *transaction_id == charged[0].transaction_id),
        "{outcome:?}"
    );
    assert_eq!(front.posts_seen(unknown), 1, "booked from the look-up");
    let report = audit(
        &stack.db.pool,
        stack.tokens.as_ref(),
        &ledger_gateway,
        &AuditOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(report.unresolved_charges.count, 0, "{report:?}");
    assert!(report.is_clean(), "{}", report.to_table());
}

/// An issued-mode worker (2 s lease) behind the scripted front, whose first POST for
/// `key` gets `answer`; `key`'s token is issued and its command produced.
struct IssuedRun {
    stack: Stack,
    front: ScriptedGateway,
    running: worker::RunningWorker,
    policy: TokenPolicy,
    key: &'static str,
}

impl IssuedRun {
    /// `hidden`: the front's look-ups show no charge for `key` until told otherwise.
    async fn start(
        key: &'static str,
        answer: PostAnswer,
        hidden: bool,
        gateway_timeout: Duration,
    ) -> Self {
        let policy = TokenPolicy {
            mode: TokenMode::Issued,
            lease: Duration::from_secs(2),
            ..TokenPolicy::default()
        };
        let mut stack = Stack::with_policy(1, SimulatorConfig::default(), policy).await;
        let front = ScriptedGateway::start(&stack.simulator).await;
        stack.gateway = Arc::new(
            HttpGateway::new(&front.url(), gateway_timeout, Duration::from_secs(1)).unwrap(),
        );
        front.script(key, &[answer]);
        front.lookups_hidden(key, hidden);
        stack
            .tokens
            .issue(&ikey(key), Duration::from_secs(3600))
            .await
            .unwrap();
        let retry = RetryPolicy {
            min_delay: Duration::from_millis(50),
            max_delay: Duration::from_millis(200),
            budget: Duration::from_secs(60),
        };
        let running = stack.start_worker_retrying(key, &quick_worker_settings(), retry);
        stack.produce(&[record(key, 3100)]).await;
        Self {
            stack,
            front,
            running,
            policy,
            key,
        }
    }

    /// Waits until the front saw `n` of `what` (`posts_seen` or `lookups_seen`).
    async fn wait_for(&self, n: usize, what: &str, seen: fn(&ScriptedGateway, &str) -> usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while seen(&self.front, self.key) < n {
            assert!(Instant::now() < deadline, "{n} {what} never came");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The token's deadline passes now: the next restore deletes it.
    async fn expire_token(&self) {
        let raw = RedisTokenStore::new(
            self.stack.redis.conn.clone(),
            self.stack.redis.prefix.clone(),
            self.policy,
        );
        let mut conn = self.stack.redis.conn.clone();
        let _: () = redis::cmd("HSET")
            .arg(raw.token_key(&ikey(self.key)))
            .arg("expires_at_ms")
            .arg(1)
            .query_async(&mut conn)
            .await
            .unwrap();
    }

    /// The command ends `succeeded`, booked once from the look-up: one charge, its
    /// row, no dead letter, a single POST.
    async fn assert_booked_from_the_look_up(self) {
        let Self {
            stack,
            front,
            running,
            key,
            ..
        } = self;
        let results = stack.wait_for_results(1, Duration::from_secs(60)).await;
        stack.wait_for_commits(Duration::from_secs(30)).await;
        stop_all(vec![running]).await;
        let charged: Vec<LedgerEntry> = stack
            .ledger()
            .into_iter()
            .filter(|e| e.idempotency_key == key)
            .collect();
        assert_eq!(charged.len(), 1, "{charged:?}");
        assert_eq!(results[0].outcome, "succeeded", "{results:?}");
        assert_eq!(
            results[0].gateway_transaction_id.as_deref(),
            Some(charged[0].transaction_id.as_str())
        );
        assert_eq!(
            stack.payment_rows().await,
            vec![(
                key.to_owned(),
                "succeeded".to_owned(),
                Some(charged[0].transaction_id.clone())
            )]
        );
        assert!(
            stack.dead_letters().await.is_empty(),
            "nothing dead-lettered"
        );
        assert_eq!(
            front.posts_seen(key),
            1,
            "booked from the look-up, never POSTed again"
        );
    }
}

/// Issued mode. The gateway charges behind an unreadable answer and, for a while,
/// its look-ups do not show the charge (it has not booked it yet). Meanwhile the
/// token's own deadline passes, so once the lease ends the next reservation finds
/// no token. "token_missing" would then forget a charge the gateway is about to
/// show: the command is looked at again until the missing-token path finds the
/// charge and books it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_token_whose_deadline_passes_while_its_charge_is_unresolved_is_booked_not_answered_missing(
) {
    let run = IssuedRun::start(
        "xm-late-charge",
        PostAnswer::ChargeThenGarbledBody,
        true,
        Duration::from_secs(5),
    )
    .await;
    // The first attempt's look-up found nothing: it left the token to its lease.
    // Its deadline passes now, well inside that lease.
    run.wait_for(1, "look-ups", ScriptedGateway::lookups_seen)
        .await;
    assert_eq!(run.front.posts_seen(run.key), 1);
    run.expire_token().await;
    // After the lease, the token is missing and the gateway still shows nothing.
    run.wait_for(2, "look-ups", ScriptedGateway::lookups_seen)
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    run.front.lookups_hidden(run.key, false);
    run.assert_booked_from_the_look_up().await;
}

/// Issued mode. The charge times out and a look-up finds nothing: the request is
/// still queued inside the gateway, and lands seconds later. Meanwhile the restore
/// finds the token past its deadline and deletes it, so the next attempts find no
/// token and, for a while, no charge. The timeout left the charge unknown, so they
/// look again until the charge shows and book it; "token_missing" would forget it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_timed_out_charge_that_lands_after_its_token_vanished_is_booked_not_answered_missing() {
    let run = IssuedRun::start(
        "xm-queued-charge",
        PostAnswer::ChargeLate(Duration::from_secs(3)),
        false,
        Duration::from_secs(1),
    )
    .await;
    // While the POST is held, the token's deadline passes: the restore after the
    // timeout deletes it.
    run.wait_for(1, "POSTs", ScriptedGateway::posts_seen).await;
    run.expire_token().await;
    run.assert_booked_from_the_look_up().await;
}

/// The gateway charges, then answers with a transaction id another payment already
/// holds: Postgres refuses the row (unique index), for good. The charge exists and no
/// row records it, so the answer must not read like a plain internal error: the dead
/// letter says the charge is unknown, `audit` lists the key, and nothing is charged
/// twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_charge_the_database_refuses_to_record_is_dead_lettered_as_unknown_and_listed_by_audit() {
    let mut stack = Stack::new(1, SimulatorConfig::default()).await;
    let front = ScriptedGateway::start(&stack.simulator).await;
    stack.gateway = Arc::new(
        HttpGateway::new(&front.url(), Duration::from_secs(5), Duration::from_secs(1)).unwrap(),
    );
    let running =
        stack.start_worker_retrying("unbooked", &quick_worker_settings(), RetryPolicy::default());
    let (first, reused) = ("xb-first", "xb-reused");
    stack.produce(&[record(first, 1000)]).await;
    let results = stack.wait_for_results(1, Duration::from_secs(60)).await;
    let taken = results[0]
        .gateway_transaction_id
        .clone()
        .expect("the first payment's transaction id");
    front.script(reused, &[PostAnswer::ChargeWithTransactionId(taken.leak())]);
    stack.produce(&[record(reused, 2000)]).await;
    let results = stack.wait_for_results(2, Duration::from_secs(60)).await;
    stack.wait_for_commits(Duration::from_secs(30)).await;
    stop_all(vec![running]).await;

    let answer = results
        .iter()
        .find(|r| r.idempotency_key.as_deref() == Some(reused))
        .expect("an answer for the reused id");
    assert_eq!(answer.outcome, "rejected", "{answer:?}");
    let letters = stack.dead_letters().await;
    assert_eq!(letters.len(), 1, "one dead letter");
    assert_eq!(
        header(&letters[0], worker::ERROR_KIND).as_deref(),
        Some("internal")
    );
    assert_eq!(
        header(&letters[0], worker::CHARGE_UNKNOWN).as_deref(),
        Some("true"),
        "the gateway charged and no row records it"
    );
    let charged: Vec<LedgerEntry> = stack
        .ledger()
        .into_iter()
        .filter(|e| e.idempotency_key == reused)
        .collect();
    assert_eq!(charged.len(), 1, "charged once, never again");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM payments WHERE idempotency_key = $1")
        .bind(reused)
        .fetch_one(&stack.db.pool)
        .await
        .unwrap();
    assert_eq!(rows, 0, "the database refused the row");

    let ledger_gateway = HttpGateway::new(
        &stack.simulator.url(),
        Duration::from_secs(5),
        Duration::from_secs(1),
    )
    .unwrap();
    let report = audit_against(&stack, &ledger_gateway).await;
    assert_eq!(report.unresolved_charges.keys(), vec![reused]);
    assert_eq!(report.charges_without_row.keys(), vec![reused]);
}

/// `audit` of the stack's books against the gateway's ledger, default options.
async fn audit_against(stack: &Stack, ledger: &HttpGateway) -> payment_worker::audit::AuditReport {
    audit(
        &stack.db.pool,
        stack.tokens.as_ref(),
        ledger,
        &AuditOptions::default(),
    )
    .await
    .unwrap()
}
