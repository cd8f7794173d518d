//! I5 at the commit: a worker whose lease is taken over after it charged and before it
//! commits must not commit. The fence check right before `COMMIT` is the only thing that
//! stops it, so these tests fail when that check is removed.
//!
//! The race window is made deterministic with a paused fault point, not a sleep: the
//! first worker is held right after its charge, its lease lapses (nothing renews it while
//! it is held), the test waits until a second worker has taken the token over (fence 2),
//! and only then lets the first one go on to its commit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use payment_worker::configuration::DatabaseSettings;
use payment_worker::fault::{FaultPoint, Faults, Pause};
use payment_worker::gateway::{HttpGateway, LedgerEntry, PaymentGateway};
use payment_worker::payment::{
    Attempt, CommandContext, GatewayLookup, Outcome, PaymentCommand, Processor,
};
use payment_worker::token::{
    IdempotencyKey, PostgresTokenStore, RedisTokenStore, TokenPolicy, TokenState, TokenStore,
};
use payment_worker_devtools::{GatewaySimulator, RunningSimulator, SimulatorConfig};
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::support::helpers::{final_outcome, TestDb, TestRedis};

/// Short, so the held worker's lease lapses quickly; long enough that the gateway call
/// before the hold never outruns its renewals.
const LEASE: Duration = Duration::from_millis(400);
/// Generous bounds for a loaded machine; a healthy run takes well under a second.
const PATIENCE: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, Copy)]
enum Backend {
    Redis,
    Postgres,
}

struct Rig {
    db: TestDb,
    _redis: TestRedis,
    simulator: RunningSimulator,
    tokens: Arc<dyn TokenStore>,
    gateway: Arc<dyn PaymentGateway>,
}

impl Rig {
    async fn new(backend: Backend) -> Self {
        let db = TestDb::new().await;
        let redis = TestRedis::new().await;
        let policy = TokenPolicy {
            lease: LEASE,
            ..TokenPolicy::default()
        };
        let tokens: Arc<dyn TokenStore> = match backend {
            Backend::Redis => Arc::new(RedisTokenStore::new(
                redis.conn.clone(),
                redis.prefix.clone(),
                policy,
            )),
            // A pool of its own, as `run` has: token statements never queue behind the
            // payment transaction that is held open.
            Backend::Postgres => {
                let pool = payment_worker::startup::connect(&DatabaseSettings {
                    max_connections: 4,
                    ..DatabaseSettings::with_url(&db.url)
                })
                .await
                .unwrap();
                Arc::new(PostgresTokenStore::new(pool, policy))
            }
        };
        let simulator =
            GatewaySimulator::bind("127.0.0.1:0".parse().unwrap(), SimulatorConfig::default())
                .unwrap()
                .spawn();
        let gateway = Arc::new(
            HttpGateway::new(
                &simulator.url(),
                Duration::from_secs(15),
                Duration::from_secs(1),
            )
            .unwrap(),
        );
        Self {
            db,
            _redis: redis,
            simulator,
            tokens,
            gateway,
        }
    }

    fn processor(&self, id: &str, faults: Faults) -> Processor {
        Processor::new(
            Arc::clone(&self.tokens),
            Arc::clone(&self.gateway),
            self.db.pool.clone(),
            GatewayLookup::Uncertain,
            id,
        )
        .with_faults(faults)
    }

    /// Worker A processing `cmd`, held at `point` (it has got there when this returns).
    async fn hold_worker_a_at(
        &self,
        point: FaultPoint,
        cmd: &PaymentCommand,
    ) -> (JoinHandle<Attempt>, Pause) {
        let (held, pause) = Faults::pause_at(point);
        let first = {
            let (processor, cmd) = (self.processor("a", held), cmd.clone());
            tokio::spawn(async move { processor.process(&cmd, &CommandContext::default()).await })
        };
        tokio::time::timeout(PATIENCE, pause.arrival())
            .await
            .unwrap_or_else(|_| panic!("worker A never reached {point:?}"));
        (first, pause)
    }

    fn ledger_for(&self, key: &str) -> Vec<LedgerEntry> {
        self.simulator
            .ledger()
            .into_iter()
            .filter(|e| e.idempotency_key == key)
            .collect()
    }

    /// (id, status, gateway transaction id, fence) of every committed row for `key`.
    async fn rows(&self, key: &str) -> Vec<(Uuid, String, Option<String>, i64)> {
        sqlx::query_as(
            "SELECT id, status, gateway_transaction_id, fence FROM payments
             WHERE idempotency_key = $1",
        )
        .bind(key)
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }
}

fn ikey(key: &str) -> IdempotencyKey {
    IdempotencyKey::try_from(key).unwrap()
}

fn command(key: &str) -> PaymentCommand {
    PaymentCommand::new(key, "acct_42", 1999, "USD", "pm_card_visa", None).unwrap()
}

/// Processes until the outcome is final, as the handler's retry loop would.
async fn until_final(processor: &Processor, command: &PaymentCommand) -> Outcome {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match processor.process(command, &CommandContext::default()).await {
            Attempt::Retry { after, reason, .. } => {
                assert!(Instant::now() < deadline, "still retrying: {reason}");
                tokio::time::sleep(
                    after.clamp(Duration::from_millis(5), Duration::from_millis(25)),
                )
                .await;
            }
            Attempt::Final(outcome) | Attempt::Unbooked(outcome) => return outcome,
        }
    }
}

/// Worker A charges and is held before its commit; its lease lapses and worker B takes
/// the token over (fence 2). Released, A must roll back instead of committing; B finds
/// A's charge by look-up, records it once, and no second POST reaches the gateway.
async fn survivor_of_a_takeover_does_not_commit(backend: Backend) {
    let rig = Rig::new(backend).await;
    let key = "survivor-1";
    let cmd = command(key);

    let (first, pause) = rig.hold_worker_a_at(FaultPoint::AfterCharge, &cmd).await;
    assert_eq!(rig.ledger_for(key).len(), 1, "A charged before the hold");
    assert!(rig.rows(key).await.is_empty(), "A has not committed yet");

    let second = {
        let (processor, cmd) = (rig.processor("b", Faults::none()), cmd.clone());
        tokio::spawn(async move { until_final(&processor, &cmd).await })
    };
    // B retries while A's lease runs, then takes the token over once it lapsed.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let view = rig.tokens.show(&ikey(key)).await.unwrap();
        if view.as_ref().is_some_and(|v| v.fence == 2) {
            let view = view.unwrap();
            assert_eq!(view.state, TokenState::Processing, "{view:?}");
            assert!(view.owner.as_deref().is_some_and(|o| o.starts_with("b:")));
            break;
        }
        assert!(Instant::now() < deadline, "B never took over: {view:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    pause.release();

    let first = tokio::time::timeout(PATIENCE, first)
        .await
        .expect("A ends once released")
        .unwrap();
    assert!(
        matches!(first, Attempt::Retry { .. }),
        "A lost its lease before COMMIT and must not commit: {first:?}"
    );
    let second = tokio::time::timeout(PATIENCE, second)
        .await
        .expect("B ends once A rolled back")
        .unwrap();
    let Outcome::Succeeded {
        payment_id,
        transaction_id,
    } = second
    else {
        panic!("B records the charge A made: {second:?}")
    };

    let ledger = rig.ledger_for(key);
    assert_eq!(ledger.len(), 1, "one charge: {ledger:?}");
    assert_eq!(
        ledger[0].attempts, 1,
        "B looked the charge up, never POSTed"
    );
    assert_eq!(ledger[0].transaction_id, transaction_id);
    assert_eq!(
        rig.rows(key).await,
        vec![(payment_id, "succeeded".to_owned(), Some(transaction_id), 2)],
        "only B's row (fence 2) was committed"
    );
    let token = rig.tokens.show(&ikey(key)).await.unwrap().unwrap();
    assert_eq!(
        (token.state, token.fence, token.payment_id),
        (TokenState::Completed, 2, Some(payment_id))
    );
    // A's retry, as its handler would make it, now learns the outcome.
    let again = rig
        .processor("a", Faults::none())
        .process(&cmd, &CommandContext::default())
        .await;
    crate::support::helpers::assert_duplicate_of(&final_outcome(again), payment_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survivor_with_the_redis_token_store_does_not_commit() {
    survivor_of_a_takeover_does_not_commit(Backend::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survivor_with_the_postgres_token_store_does_not_commit() {
    survivor_of_a_takeover_does_not_commit(Backend::Postgres).await;
}

/// A first attempt may skip the lease check before its POST only while it is surely
/// within the lease it was just granted (half of it). Worker A is held after its insert,
/// before the POST, until its lease lapsed and another owner reserved the token (fence
/// 2). Released, A checks, finds the lease lost and sends nothing: the gateway never
/// hears of the key and no row is committed.
async fn a_held_first_attempt_checks_its_lease_before_the_post(backend: Backend) {
    let rig = Rig::new(backend).await;
    let key = "held-before-post";
    let cmd = command(key);

    let (first, pause) = rig.hold_worker_a_at(FaultPoint::AfterInsert, &cmd).await;
    // Another owner takes the token over as soon as A's lease has lapsed.
    let deadline = Instant::now() + PATIENCE;
    loop {
        match rig.tokens.reserve(&ikey(key), "b:takeover").await.unwrap() {
            payment_worker::token::Reservation::Reserved { fence, .. } => {
                assert_eq!(fence, 2);
                break;
            }
            other => assert!(Instant::now() < deadline, "never taken over: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    pause.release();

    let first = tokio::time::timeout(PATIENCE, first)
        .await
        .expect("A ends once released")
        .unwrap();
    assert!(
        matches!(first, Attempt::Retry { .. }),
        "A lost its lease before the POST: {first:?}"
    );
    assert!(
        rig.ledger_for(key).is_empty(),
        "A sent its POST with a lease it no longer held: {:?}",
        rig.ledger_for(key)
    );
    assert!(rig.rows(key).await.is_empty(), "A committed nothing");
    let token = rig.tokens.show(&ikey(key)).await.unwrap().unwrap();
    assert_eq!(
        (token.state, token.fence, token.owner.as_deref()),
        (TokenState::Processing, 2, Some("b:takeover")),
        "the new owner's reservation stands"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_first_attempt_checks_its_lease_before_the_post_redis() {
    a_held_first_attempt_checks_its_lease_before_the_post(Backend::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_first_attempt_checks_its_lease_before_the_post_postgres() {
    a_held_first_attempt_checks_its_lease_before_the_post(Backend::Postgres).await;
}
