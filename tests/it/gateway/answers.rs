//! The processor against gateway answers as real gateways
//! give them, through a scripted HTTP front whose ledger is the simulator's, run
//! in `--ignore-idempotency-key` mode so that a second POST is a second charge.
//! Also: no POST without a lease checked right before it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use payment_worker::fault::Faults;
use payment_worker::gateway::{HttpGateway, LedgerEntry, PaymentGateway};
use payment_worker::payment::{
    Attempt, ChargeEvidence, CommandContext, GatewayLookup, Outcome, PaymentCommand, Processor,
    RejectionKind,
};
use payment_worker::token::{
    IdempotencyKey, RedisTokenStore, Reservation, TokenPolicy, TokenState, TokenStore, TokenView,
};
use payment_worker_devtools::{GatewaySimulator, RunningSimulator, SimulatorConfig};
use uuid::Uuid;

use crate::support::helpers::{final_outcome, TestDb, TestRedis};
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

pub(super) fn ikey(key: &str) -> IdempotencyKey {
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
    /// Charged, then answered 5xx: nothing booked, the token restored, the charge
    /// unknown; the retry looks it up and books it without a second POST.
    RestoredThenBooked,
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
        // A 5xx once the request was sent may have charged (a proxy failed after
        // the gateway's work): unknown, restored, looked up before any POST.
        (
            "c500",
            Refuse(500),
            Expect::RestoredThenCharged(ChargeEvidence::MayHaveCharged),
        ),
        (
            "c503",
            Refuse(503),
            Expect::RestoredThenCharged(ChargeEvidence::MayHaveCharged),
        ),
        ("c502-charged", ChargeThen(502), Expect::RestoredThenBooked),
        ("c504-charged", ChargeThen(504), Expect::RestoredThenBooked),
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
            Expect::RestoredThenBooked => {
                assert!(
                    matches!(
                        &first,
                        Attempt::Retry {
                            charge: ChargeEvidence::MayHaveCharged,
                            ..
                        }
                    ),
                    "{key}: {first:?}"
                );
                assert_eq!(rig.ledger_for(key).len(), 1, "{key}: charged");
                assert!(rig.rows(key).await.is_empty(), "{key}: nothing booked");
                assert_eq!(
                    rig.token(key).await.state,
                    TokenState::Pending,
                    "{key}: restored"
                );
                // What a panic in the next attempt must not lose, even one before
                // its POST: the charge stays at stake across the retry...
                assert!(
                    processor.charge_at_stake(key).is_some(),
                    "{key}: at stake after the unknown answer"
                );
                let second = once(&processor, &cmd).await;
                rig.assert_booked_once(key, &final_outcome(second)).await;
                assert_eq!(
                    rig.front.posts_seen(key),
                    1,
                    "{key}: booked from the look-up"
                );
                // ... until an attempt answers for good.
                assert_eq!(
                    processor.charge_at_stake(key),
                    None,
                    "{key}: settled by the booking"
                );
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

/// A 2xx the worker would have to hold megabytes of to read is not read past its
/// limit (4 MiB): the charge is found by a look-up instead, and booked once. The
/// same answer padded to well under the limit is read as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2xx_body_over_the_size_limit_is_not_read_but_looked_up() {
    let rig = Rig::new(Duration::from_secs(5)).await;
    let processor = rig.processor();
    for (key, padding, lookups) in [("padded", 256 << 10, 0), ("oversized", 8 << 20, 1)] {
        rig.front
            .script(key, &[PostAnswer::ChargeThenPaddedBody(padding)]);
        let attempt = once(&processor, &command(key, 2500)).await;
        rig.assert_booked_once(key, &final_outcome(attempt)).await;
        assert_eq!(rig.front.posts_seen(key), 1, "{key}: one POST");
        assert_eq!(rig.front.lookups_seen(key), lookups, "{key}: looked up");
    }
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
        matches!(taken, Reservation::Reserved { fence: 2, .. }),
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
