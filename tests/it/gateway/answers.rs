//! The processor against gateway answers as real gateways
//! give them, through a scripted HTTP front whose ledger is the simulator's, run
//! in `--ignore-idempotency-key` mode so that a second POST is a second charge.
//! Also: no POST without a lease checked right before it, and a command whose
//! retries run out with its charge unknown is dead-lettered saying so and listed
//! by `audit` until it is booked.

use std::sync::Arc;
use std::time::{Duration, Instant};

use payment_worker::audit::{audit, AuditOptions};
use payment_worker::devtools::{GatewaySimulator, RunningSimulator, SimulatorConfig};
use payment_worker::fault::Faults;
use payment_worker::gateway::{HttpGateway, LedgerEntry, PaymentGateway};
use payment_worker::operator::{RecordKind, WorkloadRecord};
use payment_worker::payment::{
    Attempt, ChargeEvidence, CommandContext, GatewayLookup, Outcome, PaymentCommand, Processor,
    RejectionKind,
};
use payment_worker::retry::RetryPolicy;
use payment_worker::token::{
    IdempotencyKey, RedisTokenStore, Reservation, TokenMode, TokenPolicy, TokenState, TokenStore,
    TokenView,
};
use payment_worker::worker::{self, Handler, Publisher};
use rdkafka::message::{Headers, Message, OwnedMessage};
use uuid::Uuid;

use crate::support::helpers::{
    final_outcome, quick_worker_settings, stop_all, Stack, TestDb, TestRedis, REDIS_URL,
};
use crate::support::scripted_gateway::{PostAnswer, ScriptedGateway};

// ---------------------------------------------------------------------------
// Fixture

struct Rig {
    db: TestDb,
    simulator: RunningSimulator,
    front: ScriptedGateway,
    store: Arc<RedisTokenStore>,
    gateway: Arc<dyn PaymentGateway>,
    _redis: TestRedis,
}

impl Rig {
    async fn new(lease: Duration) -> Self {
        let db = TestDb::new().await;
        let redis = TestRedis::new().await;
        let ledger = SimulatorConfig {
            ignore_idempotency_key: true,
            ..SimulatorConfig::default()
        };
        let simulator = GatewaySimulator::bind("127.0.0.1:0".parse().unwrap(), ledger)
            .unwrap()
            .spawn();
        let front = ScriptedGateway::start(&simulator).await;
        let store = Arc::new(RedisTokenStore::new(
            redis.conn.clone(),
            redis.prefix.clone(),
            TokenPolicy {
                lease,
                ..TokenPolicy::default()
            },
        ));
        let gateway = Arc::new(
            HttpGateway::new(&front.url(), Duration::from_secs(5), Duration::from_secs(1)).unwrap(),
        );
        Self {
            db,
            simulator,
            front,
            store,
            gateway,
            _redis: redis,
        }
    }

    fn processor(&self) -> Processor {
        Processor::new(
            Arc::clone(&self.store) as Arc<dyn TokenStore>,
            Arc::clone(&self.gateway),
            self.db.pool.clone(),
            GatewayLookup::Uncertain,
            "gw-answers",
        )
        .with_faults(Faults::none())
    }

    fn ledger_for(&self, key: &str) -> Vec<LedgerEntry> {
        self.simulator
            .ledger()
            .into_iter()
            .filter(|e| e.idempotency_key == key)
            .collect()
    }

    async fn rows(&self, key: &str) -> Vec<(Uuid, String, Option<String>)> {
        sqlx::query_as(
            "SELECT id, status, gateway_transaction_id FROM payments WHERE idempotency_key = $1",
        )
        .bind(key)
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }

    async fn token(&self, key: &str) -> TokenView {
        self.store
            .show(&ikey(key))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("no token for {key}"))
    }

    /// The key was charged exactly once, that charge is booked on the one row, the
    /// token names the row, and `outcome` reports it.
    async fn assert_booked_once(&self, key: &str, outcome: &Outcome) {
        let ledger = self.ledger_for(key);
        assert_eq!(
            ledger.len(),
            1,
            "{key}: one charge in the ledger: {ledger:?}"
        );
        let rows = self.rows(key).await;
        assert_eq!(rows.len(), 1, "{key}: one payment row");
        let (id, status, transaction) = &rows[0];
        assert_eq!(status, "succeeded", "{key}");
        assert_eq!(
            transaction.as_deref(),
            Some(ledger[0].transaction_id.as_str()),
            "{key}: the row carries the ledger's transaction"
        );
        assert_eq!(
            outcome,
            &Outcome::Succeeded {
                payment_id: *id,
                transaction_id: ledger[0].transaction_id.clone()
            },
            "{key}"
        );
        let token = self.token(key).await;
        assert_eq!(
            (token.state, token.payment_id),
            (TokenState::Completed, Some(*id)),
            "{key}: confirmed"
        );
    }

    /// Nothing charged, nothing booked, and the token back to `pending`.
    async fn assert_restored_uncharged(&self, key: &str) {
        assert!(self.ledger_for(key).is_empty(), "{key}: no charge");
        assert!(self.rows(key).await.is_empty(), "{key}: no row");
        assert_eq!(
            self.token(key).await.state,
            TokenState::Pending,
            "{key}: restored"
        );
    }
}

fn ikey(key: &str) -> IdempotencyKey {
    IdempotencyKey::try_from(key).unwrap()
}

fn command(key: &str, amount_minor: i64) -> PaymentCommand {
    PaymentCommand::new(key, "acct_7", amount_minor, "USD", "pm_card_visa", None).unwrap()
}

async fn once(processor: &Processor, command: &PaymentCommand) -> Attempt {
    processor.process(command, &CommandContext::default()).await
}

// ---------------------------------------------------------------------------
// Each answer, its settlement

/// What the first attempt must leave, per scripted answer.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// The charge is found by key and booked at once (Confirm), never POSTed again.
    Booked,
    /// Nothing booked, token restored; the retry looks up, POSTs, books.
    RestoredThenCharged(ChargeEvidence),
    /// Final refusal, token restored, nothing charged.
    Refused(RejectionKind),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_gateway_answer_is_settled_without_a_second_charge() {
    use PostAnswer::*;
    let rig = Rig::new(Duration::from_secs(5)).await;
    let unchanged = Expect::RestoredThenCharged(ChargeEvidence::Unchanged);
    let cases: Vec<(&str, PostAnswer, Expect)> = vec![
        // A request with this key is in flight at the gateway: look up, retry.
        ("c409-charged", ChargeThen(409), Expect::Booked),
        (
            "c409-pending",
            Refuse(409),
            Expect::RestoredThenCharged(ChargeEvidence::MayHaveCharged),
        ),
        // Our access or the gateway is broken: transient, nothing charged.
        ("c401", Refuse(401), unchanged),
        ("c403", Refuse(403), unchanged),
        ("c404", Refuse(404), unchanged),
        ("c405", Refuse(405), unchanged),
        ("c408", Refuse(408), unchanged),
        ("c429", Refuse(429), unchanged),
        ("c500", Refuse(500), unchanged),
        ("c503", Refuse(503), unchanged),
        // The gateway decided but its answer cannot be read: unknown, looked up.
        ("c200-garbled", ChargeThenGarbledBody, Expect::Booked),
        ("c200-cut", ChargeThenCutBody, Expect::Booked),
        ("c303-charged", ChargeThen(303), Expect::Booked),
        // Refusals for good.
        (
            "c422",
            Refuse(422),
            Expect::Refused(RejectionKind::KeyReused),
        ),
        ("c400", Refuse(400), Expect::Refused(RejectionKind::Invalid)),
        ("c402", Refuse(402), Expect::Refused(RejectionKind::Invalid)),
        ("c418", Refuse(418), Expect::Refused(RejectionKind::Invalid)),
    ];
    let processor = rig.processor();
    for (key, answer, expect) in cases {
        rig.front.script(key, &[answer]);
        let cmd = command(key, 1234);
        let first = once(&processor, &cmd).await;
        match expect {
            Expect::Booked => {
                rig.assert_booked_once(key, &final_outcome(first)).await;
                assert_eq!(rig.front.posts_seen(key), 1, "{key}: one POST");
            }
            Expect::RestoredThenCharged(evidence) => {
                assert!(
                    matches!(&first, Attempt::Retry { charge, .. } if *charge == evidence),
                    "{key}: {first:?}"
                );
                rig.assert_restored_uncharged(key).await;
                let second = once(&processor, &cmd).await;
                rig.assert_booked_once(key, &final_outcome(second)).await;
                assert_eq!(rig.front.posts_seen(key), 2, "{key}: refused, then charged");
            }
            Expect::Refused(kind) => {
                match &first {
                    Attempt::Final(Outcome::Rejected { kind: got, reason }) => {
                        assert_eq!(*got, kind, "{key}: {reason}");
                        if kind == RejectionKind::Invalid {
                            let code = &key[1..];
                            assert!(
                                reason.starts_with(&format!("gateway_rejected: HTTP {code}")),
                                "{key}: {reason}"
                            );
                        }
                    }
                    other => panic!("{key}: expected a rejection, got {other:?}"),
                }
                rig.assert_restored_uncharged(key).await;
                assert_eq!(rig.front.posts_seen(key), 1, "{key}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_2xx_whose_lookup_fails_is_left_to_the_lease_then_booked_once() {
    let rig = Rig::new(Duration::from_millis(800)).await;
    let key = "garbled-then-dark";
    rig.front.script(key, &[PostAnswer::ChargeThenGarbledBody]);
    rig.front.lookups_down(key, true);
    let cmd = command(key, 4321);
    let processor = rig.processor();

    let first = once(&processor, &cmd).await;
    assert!(
        matches!(
            &first,
            Attempt::Retry {
                charge: ChargeEvidence::MayHaveCharged,
                ..
            }
        ),
        "{first:?}"
    );
    assert_eq!(rig.ledger_for(key).len(), 1, "the gateway did charge");
    assert!(rig.rows(key).await.is_empty(), "nothing booked yet");
    let token = rig.token(key).await;
    assert_eq!(
        (token.state, token.fence),
        (TokenState::Processing, 1),
        "left to its lease, never restored on a guess"
    );

    // The look-up comes back; after the lease the next owner finds the charge.
    rig.front.lookups_down(key, false);
    let deadline = Instant::now() + Duration::from_secs(20);
    let outcome = loop {
        match once(&processor, &cmd).await {
            Attempt::Retry { reason, .. } => {
                assert!(Instant::now() < deadline, "still retrying: {reason}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Attempt::Final(outcome) | Attempt::Unbooked(outcome) => break outcome,
        }
    };
    rig.assert_booked_once(key, &outcome).await;
    assert_eq!(
        rig.front.posts_seen(key),
        1,
        "booked from the look-up, no second POST"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_that_refuses_connections_is_transient_and_charges_nothing() {
    let rig = Rig::new(Duration::from_secs(5)).await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let processor = Processor::new(
        Arc::clone(&rig.store) as Arc<dyn TokenStore>,
        Arc::new(HttpGateway::new(&url, Duration::from_secs(5), Duration::from_secs(1)).unwrap()),
        rig.db.pool.clone(),
        GatewayLookup::Uncertain,
        "refused",
    )
    .with_faults(Faults::none());
    let key = "connect-refused";
    let outcome = once(&processor, &command(key, 99)).await;
    assert!(
        matches!(
            &outcome,
            Attempt::Retry {
                charge: ChargeEvidence::Unchanged,
                ..
            }
        ),
        "{outcome:?}"
    );
    rig.assert_restored_uncharged(key).await;
}

// ---------------------------------------------------------------------------
// The lease is checked right before the POST

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lost_before_the_post_means_no_post() {
    let rig = Rig::new(Duration::from_millis(500)).await;
    let key = "lease-lost-before-post";
    let cmd = command(key, 1500);

    // Another holder's uncommitted row: the processor's INSERT waits on the unique key
    // with its reservation taken, the way a worker stalls after reserving.
    let mut blocker = rig.db.pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO payments (id, idempotency_key, fingerprint, account_id, amount_minor,
                               currency, status)
         VALUES ($1, $2, $3, 'acct_other', 1500, 'USD', 'processing')",
    )
    .bind(Uuid::new_v4())
    .bind(key)
    .bind("0".repeat(64))
    .execute(&mut *blocker)
    .await
    .unwrap();
    let processor = Arc::new(rig.processor());
    let attempt = tokio::spawn({
        let processor = Arc::clone(&processor);
        let cmd = cmd.clone();
        async move { processor.process(&cmd, &CommandContext::default()).await }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&rig.db.pool)
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the INSERT never waited on the row"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(rig.token(key).await.fence, 1, "reserved before it stalled");

    // Its lease runs out while it waits, and another owner takes the token over.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let taken = rig.store.reserve(&ikey(key), "new-owner").await.unwrap();
    assert!(
        matches!(taken, Reservation::Reserved { fence: 2 }),
        "{taken:?}"
    );
    blocker.rollback().await.unwrap();

    let outcome = tokio::time::timeout(Duration::from_secs(10), attempt)
        .await
        .expect("the stalled attempt ends")
        .unwrap();
    assert!(matches!(outcome, Attempt::Retry { .. }), "{outcome:?}");
    assert_eq!(
        rig.front.posts_seen(key),
        0,
        "no POST after the lease was lost"
    );
    assert!(rig.ledger_for(key).is_empty(), "no charge");
    assert!(rig.rows(key).await.is_empty(), "its row was rolled back");
    let token = rig.token(key).await;
    assert_eq!(
        (token.state, token.fence, token.owner.as_deref()),
        (TokenState::Processing, 2, Some("new-owner")),
        "the new owner still holds the token"
    );
}

// ---------------------------------------------------------------------------
// Retries exhausted with the charge unknown: said on the dead letter, listed by audit

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
    // Refused every time, charged never: exhausted too, but nothing is unknown.
    let down = "xu-down";
    front.script(down, &[PostAnswer::Refuse(503); 500]);

    let handler = Arc::new(Handler::new(
        stack.processor("short-budget"),
        Publisher::new(&stack.settings).unwrap(),
        RetryPolicy {
            min_delay: Duration::from_millis(50),
            max_delay: Duration::from_millis(300),
            budget: Duration::from_secs(3),
        },
    ));
    let running = worker::start(&stack.settings, &quick_worker_settings(), handler).unwrap();
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
    let output = tokio::process::Command::new(crate::support::procs::BINARY)
        .arg("audit")
        .args(["--database-url", &stack.db.url])
        .args(["--redis-url", REDIS_URL])
        .args(["--redis-key-prefix", &stack.redis.prefix])
        .args(["--gateway-url", &stack.simulator.url()])
        .args(["--lease", "500ms", "--json"])
        .env("RUST_LOG", "warn")
        .output()
        .await
        .unwrap();
    assert!(!output.status.success(), "{output:?}");
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
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

/// Issued mode. The gateway charges behind an unreadable answer and, for a while,
/// its look-ups do not show the charge (it has not booked it yet). Meanwhile the
/// token's own deadline passes, so once the lease ends the next reservation finds
/// no token. "token_missing" would then forget a charge the gateway is about to
/// show: the command is looked at again until the missing-token path finds the
/// charge and books it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_token_whose_deadline_passes_while_its_charge_is_unresolved_is_booked_not_answered_missing(
) {
    let lease = Duration::from_secs(2);
    let policy = TokenPolicy {
        mode: TokenMode::Issued,
        lease,
        ..TokenPolicy::default()
    };
    let mut stack = Stack::with_policy(1, SimulatorConfig::default(), policy).await;
    let front = ScriptedGateway::start(&stack.simulator).await;
    stack.gateway = Arc::new(
        HttpGateway::new(&front.url(), Duration::from_secs(5), Duration::from_secs(1)).unwrap(),
    );
    let key = "xm-late-charge";
    front.script(key, &[PostAnswer::ChargeThenGarbledBody]);
    front.lookups_hidden(key, true);
    stack
        .tokens
        .issue(&ikey(key), Duration::from_secs(3600))
        .await
        .unwrap();
    let handler = Arc::new(Handler::new(
        stack.processor("late-charge"),
        Publisher::new(&stack.settings).unwrap(),
        RetryPolicy {
            min_delay: Duration::from_millis(50),
            max_delay: Duration::from_millis(200),
            budget: Duration::from_secs(60),
        },
    ));
    let running = worker::start(&stack.settings, &quick_worker_settings(), handler).unwrap();
    stack.produce(&[record(key, 3100)]).await;

    let lookups_reach = |n: usize| {
        let front = &front;
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            while front.lookups_seen(key) < n {
                assert!(Instant::now() < deadline, "{n} look-ups never came");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    // The first attempt's look-up found nothing: it left the token to its lease.
    // Its deadline passes now, well inside that lease.
    lookups_reach(1).await;
    assert_eq!(front.posts_seen(key), 1);
    let raw = RedisTokenStore::new(stack.redis.conn.clone(), stack.redis.prefix.clone(), policy);
    let mut conn = stack.redis.conn.clone();
    let _: () = redis::cmd("HSET")
        .arg(raw.token_key(&ikey(key)))
        .arg("expires_at_ms")
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    // After the lease, the token is missing and the gateway still shows nothing.
    lookups_reach(2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    front.lookups_hidden(key, false);

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
    let handler = Arc::new(Handler::new(
        stack.processor("unbooked"),
        Publisher::new(&stack.settings).unwrap(),
        RetryPolicy::default(),
    ));
    let running = worker::start(&stack.settings, &quick_worker_settings(), handler).unwrap();
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
