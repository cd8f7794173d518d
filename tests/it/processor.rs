//! Issue 3 acceptance: the processor (SPEC §5) and the gateway simulator (SPEC §7)
//! against real Redis, real Postgres and the simulator over HTTP. Crash claims are
//! made by SIGKILLing the real binary frozen at a fault point.

use std::collections::HashSet;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use payment_worker::configuration::DatabaseSettings;
use payment_worker::devtools::{GatewaySimulator, RunningSimulator, SimulatorConfig, SlowKey};
use payment_worker::fault::{FaultPoint, Faults, FROZEN_MARKER};
use payment_worker::gateway::{
    Charge, ChargeRequest, ChargeStatus, GatewayError, HttpGateway, LedgerEntry, PaymentGateway,
};
use payment_worker::operator::{RecordKind, WorkloadRecord};
use payment_worker::payment::{
    CommandContext, GatewayLookup, Outcome, PaymentCommand, Processor, RejectionKind,
};
use payment_worker::token::{
    IdempotencyKey, PostgresTokenStore, RedisTokenStore, TokenMode, TokenPolicy, TokenState,
    TokenStore, TokenView,
};
use payment_worker::worker;
use rdkafka::message::{Headers, Message};
use tokio::io::{AsyncBufReadExt, BufReader};
use uuid::Uuid;

use crate::helpers::{
    assert_duplicate_of, quick_worker_settings, stop_all, Stack, TestDb, TestRedis, REDIS_URL,
};

const BIN: &str = env!("CARGO_BIN_EXE_payment-worker");

// ---------------------------------------------------------------------------
// Fixture

/// Counts the calls that reach the gateway, so "never charged" and "looked up, not
/// charged again" are observed, not inferred from the ledger alone (a refused POST
/// leaves no ledger trace).
struct CountingGateway {
    inner: HttpGateway,
    charges: AtomicUsize,
    lookups: AtomicUsize,
}

impl CountingGateway {
    fn charges(&self) -> usize {
        self.charges.load(Ordering::SeqCst)
    }

    fn lookups(&self) -> usize {
        self.lookups.load(Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl PaymentGateway for CountingGateway {
    async fn charge(
        &self,
        key: &IdempotencyKey,
        request: &ChargeRequest,
    ) -> Result<Charge, GatewayError> {
        self.charges.fetch_add(1, Ordering::SeqCst);
        self.inner.charge(key, request).await
    }

    async fn lookup(&self, key: &IdempotencyKey) -> Result<Option<LedgerEntry>, GatewayError> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        self.inner.lookup(key).await
    }

    async fn ledger(&self) -> Result<Vec<LedgerEntry>, GatewayError> {
        self.inner.ledger().await
    }
}

/// Postgres, a Redis prefix, a simulator and a Redis token store; no Kafka.
struct Rig {
    db: TestDb,
    redis: TestRedis,
    simulator: RunningSimulator,
    policy: TokenPolicy,
    store: Arc<RedisTokenStore>,
    gateway: Arc<CountingGateway>,
}

fn short_lease() -> TokenPolicy {
    TokenPolicy {
        lease: Duration::from_secs(1),
        ..TokenPolicy::default()
    }
}

impl Rig {
    async fn new(simulator: SimulatorConfig, policy: TokenPolicy) -> Self {
        Self::with_timeout(simulator, policy, Duration::from_secs(15)).await
    }

    async fn with_timeout(
        simulator: SimulatorConfig,
        policy: TokenPolicy,
        timeout: Duration,
    ) -> Self {
        let db = TestDb::new().await;
        let redis = TestRedis::new().await;
        let simulator = GatewaySimulator::bind("127.0.0.1:0".parse().unwrap(), simulator)
            .unwrap()
            .spawn();
        let store = Arc::new(RedisTokenStore::new(
            redis.conn.clone(),
            redis.prefix.clone(),
            policy,
        ));
        let gateway = Arc::new(CountingGateway {
            inner: HttpGateway::new(&simulator.url(), timeout, Duration::from_secs(1)).unwrap(),
            charges: AtomicUsize::new(0),
            lookups: AtomicUsize::new(0),
        });
        Self {
            db,
            redis,
            simulator,
            policy,
            store,
            gateway,
        }
    }

    fn tokens(&self) -> Arc<dyn TokenStore> {
        Arc::clone(&self.store) as Arc<dyn TokenStore>
    }

    fn processor_with(
        &self,
        tokens: Arc<dyn TokenStore>,
        lookup: GatewayLookup,
        id: &str,
    ) -> Processor {
        Processor::new(
            tokens,
            Arc::clone(&self.gateway) as Arc<dyn PaymentGateway>,
            self.db.pool.clone(),
            lookup,
            id,
        )
        .with_faults(Faults::none())
    }

    fn processor(&self, id: &str) -> Processor {
        self.processor_with(self.tokens(), GatewayLookup::Uncertain, id)
    }

    fn ledger_for(&self, key: &str) -> Vec<LedgerEntry> {
        self.simulator
            .ledger()
            .into_iter()
            .filter(|e| e.idempotency_key == key)
            .collect()
    }

    async fn rows(&self, key: &str) -> Vec<Row> {
        sqlx::query_as("SELECT id, status, gateway_transaction_id, fence FROM payments WHERE idempotency_key = $1")
            .bind(key)
            .fetch_all(&self.db.pool)
            .await
            .unwrap()
    }

    async fn token(&self, key: &str) -> Option<TokenView> {
        self.store.show(&ikey(key)).await.unwrap()
    }

    /// Redis losing the token (it runs without persistence): the key is simply gone.
    async fn forget_token(&self, key: &str) {
        let mut conn = self.redis.conn.clone();
        let removed: i64 = redis::cmd("DEL")
            .arg(self.store.token_key(&ikey(key)))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(removed, 1, "the token existed before it was flushed");
    }

    /// One charge, one `succeeded` row carrying its transaction id, token `completed`
    /// with that row's id; the gateway received exactly one POST for the key.
    async fn assert_charged_once(&self, key: &str) -> Uuid {
        let ledger = self.ledger_for(key);
        assert_eq!(ledger.len(), 1, "one ledger entry for {key}: {ledger:?}");
        assert_eq!(ledger[0].attempts, 1, "the gateway saw one POST for {key}");
        let rows = self.rows(key).await;
        assert_eq!(rows.len(), 1, "one payment row for {key}");
        let (id, status, transaction, _) = &rows[0];
        assert_eq!(status, "succeeded");
        assert_eq!(
            transaction.as_deref(),
            Some(ledger[0].transaction_id.as_str())
        );
        let token = self.token(key).await.expect("token exists");
        assert_eq!(token.state, TokenState::Completed, "token of {key}");
        assert_eq!(token.payment_id, Some(*id), "the tombstone names the row");
        *id
    }
}

type Row = (Uuid, String, Option<String>, i64);

fn ikey(key: &str) -> IdempotencyKey {
    IdempotencyKey::try_from(key).unwrap()
}

fn command(key: &str, amount_minor: i64, payment_method: &str) -> PaymentCommand {
    PaymentCommand::new(
        key,
        "acct_42",
        amount_minor,
        "USD",
        payment_method,
        Some("test"),
    )
    .unwrap()
}

fn command_json(key: &str, amount_minor: i64) -> String {
    serde_json::json!({
        "idempotency_key": key, "account_id": "acct_42", "amount_minor": amount_minor,
        "currency": "USD", "payment_method": "pm_card_visa", "description": "test",
    })
    .to_string()
}

/// Processes until the outcome is final, as the handler's retry loop would (without
/// its budget). Returns the outcome and the reasons of the retries on the way.
async fn until_final(processor: &Processor, command: &PaymentCommand) -> (Outcome, Vec<String>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut retries = Vec::new();
    loop {
        match processor.process(command, &CommandContext::default()).await {
            Outcome::Retry { after, reason, .. } => {
                assert!(
                    Instant::now() < deadline,
                    "still retrying after 30 s: {reason}"
                );
                retries.push(reason);
                tokio::time::sleep(
                    after.clamp(Duration::from_millis(5), Duration::from_millis(25)),
                )
                .await;
            }
            outcome => return (outcome, retries),
        }
    }
}

const IN_FLIGHT: &str = "token in flight at another worker";

// ---------------------------------------------------------------------------
// 32 processors, one command

/// One round: `stores[i]` is processor i's token store. All start together.
/// Returns the payment and how many attempts found the token in flight.
async fn race_round(rig: &Rig, stores: Vec<Arc<dyn TokenStore>>, key: &str) -> (Uuid, usize) {
    let n = stores.len();
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let command = command(key, 2500, "pm_card_visa");
    let tasks: Vec<_> = stores
        .into_iter()
        .enumerate()
        .map(|(i, tokens)| {
            let processor = rig.processor_with(tokens, GatewayLookup::Uncertain, &format!("p{i}"));
            let barrier = Arc::clone(&barrier);
            let command = command.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                until_final(&processor, &command).await
            })
        })
        .collect();
    let mut winners = Vec::new();
    let mut duplicates = Vec::new();
    let mut in_flight = 0;
    for task in tasks {
        let (outcome, retries) = task.await.unwrap();
        in_flight += retries.len();
        // The only acceptable detour is waiting for the owner of the token.
        assert!(
            retries.iter().all(|r| r == IN_FLIGHT),
            "unexpected retries: {retries:?}"
        );
        match outcome {
            Outcome::Succeeded {
                payment_id,
                transaction_id,
            } => winners.push((payment_id, transaction_id)),
            Outcome::Duplicate { payment_id, .. } => duplicates.push(payment_id),
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one processor charged");
    assert_eq!(
        duplicates.len(),
        n - 1,
        "every other processor saw a duplicate"
    );
    let (payment_id, transaction_id) = winners.pop().unwrap();
    assert!(
        duplicates.iter().all(|d| *d == payment_id),
        "duplicates name the original payment"
    );
    let ledger = rig.ledger_for(key);
    assert_eq!(ledger.len(), 1, "one charge for {key}");
    assert_eq!(ledger[0].attempts, 1, "one POST reached the gateway");
    assert_eq!(ledger[0].transaction_id, transaction_id);
    let rows = rig.rows(key).await;
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].0, rows[0].1.as_str()), (payment_id, "succeeded"));
    assert_eq!(rows[0].2.as_deref(), Some(transaction_id.as_str()));
    (payment_id, in_flight)
}

const RACERS: usize = 32;
const ROUNDS: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_processors_sharing_redis_charge_once() {
    let rig = Rig::new(SimulatorConfig::default(), TokenPolicy::default()).await;
    let mut waited = 0;
    for round in 0..ROUNDS {
        let key = format!("race-redis-{round}");
        let (payment_id, in_flight) = race_round(&rig, vec![rig.tokens(); RACERS], &key).await;
        waited += in_flight;
        let token = rig.token(&key).await.unwrap();
        assert_eq!(
            (token.state, token.payment_id),
            (TokenState::Completed, Some(payment_id))
        );
        assert_eq!(token.fence, 1, "nobody took the lease over");
    }
    assert!(waited > 0, "the processors really overlapped");
    assert_eq!(rig.gateway.charges(), ROUNDS, "one POST per round");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_processors_sharing_the_postgres_token_store_charge_once() {
    let rig = Rig::new(SimulatorConfig::default(), TokenPolicy::default()).await;
    // A pool of its own, smaller than the racers: the statements still contend on
    // the row, and the test leaves Postgres connections for everything else running.
    let token_pool = payment_worker::startup::connect(&DatabaseSettings {
        max_connections: 12,
        ..DatabaseSettings::with_url(&rig.db.url)
    })
    .await
    .unwrap();
    let tokens: Arc<dyn TokenStore> =
        Arc::new(PostgresTokenStore::new(token_pool, TokenPolicy::default()));
    let mut waited = 0;
    for round in 0..ROUNDS {
        let key = format!("race-pg-{round}");
        let (payment_id, in_flight) =
            race_round(&rig, vec![Arc::clone(&tokens); RACERS], &key).await;
        waited += in_flight;
        let token = tokens.show(&ikey(&key)).await.unwrap().unwrap();
        assert_eq!(
            (token.state, token.payment_id),
            (TokenState::Completed, Some(payment_id))
        );
    }
    assert!(waited > 0, "the processors really overlapped");
    assert_eq!(rig.gateway.charges(), ROUNDS, "one POST per round");
}

/// Redis split-brain (every processor has its own empty token namespace, as after a
/// failover that lost the data): all 32 reserve fence 1, and only the unique key in
/// Postgres serialises them (I6).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_holders_of_a_reservation_are_serialised_by_postgres() {
    let rig = Rig::new(SimulatorConfig::default(), TokenPolicy::default()).await;
    for round in 0..ROUNDS {
        let key = format!("split-{round}");
        let stores: Vec<Arc<dyn TokenStore>> = (0..RACERS)
            .map(|i| {
                let prefix = format!("{}-brain{i}", rig.redis.prefix);
                Arc::new(RedisTokenStore::new(
                    rig.redis.conn.clone(),
                    prefix,
                    TokenPolicy::default(),
                )) as Arc<dyn TokenStore>
            })
            .collect();
        let (payment_id, in_flight) = race_round(&rig, stores.clone(), &key).await;
        assert_eq!(
            in_flight, 0,
            "nobody shares a token, so nobody waits on one"
        );
        // Every processor held its own reservation and settled it on the one row.
        for store in &stores {
            let token = store.show(&ikey(&key)).await.unwrap().unwrap();
            assert_eq!(
                (token.state, token.fence, token.payment_id),
                (TokenState::Completed, 1, Some(payment_id))
            );
        }
    }
    assert_eq!(rig.gateway.charges(), ROUNDS, "one POST per round");
}

// ---------------------------------------------------------------------------
// Failure after each step, then the command again

const POINTS: [FaultPoint; 4] = [
    FaultPoint::AfterReserve,
    FaultPoint::AfterInsert,
    FaultPoint::AfterCharge,
    FaultPoint::AfterCommit,
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_after_each_step_then_a_retry_charges_once() {
    let rig = Rig::new(SimulatorConfig::default(), short_lease()).await;
    for point in POINTS {
        let key = format!("fail-{}", point.as_str().replace('_', "-"));
        let cmd = command(&key, 1200, "pm_card_visa");
        let failing = rig.processor("crashy").with_faults(Faults::fail_at(point));
        let first = failing.process(&cmd, &CommandContext::default()).await;
        match point {
            // The payment committed before the failure: its outcome stands.
            FaultPoint::AfterCommit => {
                assert!(matches!(first, Outcome::Succeeded { .. }), "{first:?}")
            }
            _ => assert!(
                matches!(first, Outcome::Retry { .. }),
                "{point:?}: {first:?}"
            ),
        }
        let (second, _) = until_final(&rig.processor("healthy"), &cmd).await;
        let payment_id = rig.assert_charged_once(&key).await;
        match point {
            FaultPoint::AfterCommit => assert_duplicate_of(&second, payment_id),
            _ => assert!(
                matches!(second, Outcome::Succeeded { payment_id: p, .. } if p == payment_id),
                "{second:?}"
            ),
        }
        if point == FaultPoint::AfterCharge {
            // The charge was found by look-up (fence 2), not repeated.
            assert_eq!(
                rig.rows(&key).await[0].3,
                2,
                "recorded under the second reservation"
            );
        }
    }
    assert_eq!(
        rig.gateway.charges(),
        POINTS.len(),
        "one POST per key: none repeats a charge made before the failure"
    );
}

/// Runs the binary's `process` until it freezes at `point`, returns the child.
async fn start_frozen(
    rig: &Rig,
    json: &str,
    point: FaultPoint,
    lookup: &str,
) -> tokio::process::Child {
    let mut child = tokio::process::Command::new(BIN)
        .args(["process", json])
        .args(process_flags(rig, lookup))
        .env(Faults::ENV, point.as_str())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let wanted = format!("{FROZEN_MARKER} {}", point.as_str());
    let mut seen = Vec::new();
    let frozen = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains(&wanted) {
                return true;
            }
            seen.push(line);
        }
        false
    })
    .await;
    assert_eq!(
        frozen,
        Ok(true),
        "the process never froze at {point:?}; stderr: {seen:#?}"
    );
    child
}

fn process_flags(rig: &Rig, lookup: &str) -> Vec<String> {
    [
        "--database-url",
        &rig.db.url,
        "--redis-url",
        REDIS_URL,
        "--redis-key-prefix",
        &rig.redis.prefix,
        "--token-store",
        "redis",
        "--token-mode",
        "implicit",
        "--gateway-url",
        &rig.simulator.url(),
        "--database-max-connections",
        "4",
        "--lease",
        "1s",
        "--gateway-lookup",
        lookup,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

async fn sigkill(mut child: tokio::process::Child) {
    use std::os::unix::process::ExitStatusExt;
    let pid = Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    kill(pid, Signal::SIGKILL).unwrap();
    let status = child.wait().await.unwrap();
    assert_eq!(status.signal(), Some(Signal::SIGKILL as i32), "{status:?}");
}

/// The binary's `process`, repeated while it answers `retry` (a lease to wait out).
async fn process_with_binary(rig: &Rig, json: &str, lookup: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let output = tokio::process::Command::new(BIN)
            .args(["process", json])
            .args(process_flags(rig, lookup))
            .env_remove(Faults::ENV)
            .env("RUST_LOG", "warn")
            .output()
            .await
            .unwrap();
        let view: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        // A final outcome exits 0, a retry 75 (temporary failure).
        let expected_status = if view["outcome"] == "retry" { 75 } else { 0 };
        assert_eq!(
            output.status.code(),
            Some(expected_status),
            "{view}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        if view["outcome"] != "retry" {
            return view;
        }
        assert!(Instant::now() < deadline, "still retrying: {view}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_each_step_then_a_restart_charges_once() {
    let rig = Rig::new(SimulatorConfig::default(), short_lease()).await;
    for point in POINTS {
        let key = format!("kill-{}", point.as_str().replace('_', "-"));
        let json = command_json(&key, 3300);
        let child = start_frozen(&rig, &json, point, "uncertain").await;

        // The state each point claims to leave, seen while the process is frozen.
        let token = rig.token(&key).await.expect("token reserved");
        assert_eq!(token.state, TokenState::Processing, "{point:?}");
        let ledger = rig.ledger_for(&key);
        let rows = rig.rows(&key).await;
        match point {
            FaultPoint::AfterReserve | FaultPoint::AfterInsert => {
                assert!(
                    ledger.is_empty() && rows.is_empty(),
                    "{point:?}: {ledger:?} {rows:?}"
                )
            }
            FaultPoint::AfterCharge => {
                assert!(ledger.len() == 1 && rows.is_empty(), "{ledger:?} {rows:?}")
            }
            FaultPoint::AfterCommit => {
                assert!(ledger.len() == 1 && rows.len() == 1, "{ledger:?} {rows:?}")
            }
        }
        sigkill(child).await;

        let view = process_with_binary(&rig, &json, "uncertain").await;
        let payment_id = rig.assert_charged_once(&key).await;
        let expected = if point == FaultPoint::AfterCommit {
            "duplicate"
        } else {
            "succeeded"
        };
        assert_eq!(view["outcome"], expected, "{point:?}: {view}");
        assert_eq!(view["payment_id"], payment_id.to_string());
    }
}

// ---------------------------------------------------------------------------
// Gateway faults

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_comes_too_late_is_looked_up_and_succeeds() {
    let sim = SimulatorConfig {
        timeout_after_charge_rate: 1.0,
        late_by_ms: 2000,
        ..SimulatorConfig::default()
    };
    let rig = Rig::with_timeout(sim, TokenPolicy::default(), Duration::from_millis(300)).await;
    let key = "late-1";
    let outcome = rig
        .processor("p")
        .process(
            &command(key, 700, "pm_card_visa"),
            &CommandContext::default(),
        )
        .await;
    let payment_id = rig.assert_charged_once(key).await;
    let transaction_id = rig.ledger_for(key)[0].transaction_id.clone();
    assert_eq!(
        outcome,
        Outcome::Succeeded {
            payment_id,
            transaction_id
        }
    );
    assert_eq!(
        rig.gateway.charges(),
        1,
        "the unknown outcome was not re-charged"
    );
    assert!(
        rig.gateway.lookups() >= 1,
        "the outcome came from a look-up"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_ignoring_idempotency_keys_still_charges_once_with_lookup_always() {
    let sim = SimulatorConfig {
        ignore_idempotency_key: true,
        ..SimulatorConfig::default()
    };
    let rig = Rig::new(sim, short_lease()).await;
    let always = |id: &str| rig.processor_with(rig.tokens(), GatewayLookup::Always, id);

    // The premise: this gateway books every POST, whatever its key.
    let probe = command("probe", 100, "pm_card_visa");
    for _ in 0..2 {
        rig.gateway
            .charge(&probe.idempotency_key, &probe.charge_request())
            .await
            .unwrap();
    }
    assert_eq!(rig.ledger_for("probe").len(), 2);

    // Crash after the charge (in process), then the lease runs out and a retry comes.
    let cmd = command("ignore-1", 900, "pm_card_visa");
    let first = always("a")
        .with_faults(Faults::fail_at(FaultPoint::AfterCharge))
        .process(&cmd, &CommandContext::default())
        .await;
    assert!(matches!(first, Outcome::Retry { .. }), "{first:?}");
    let (second, _) = until_final(&always("b"), &cmd).await;
    assert!(matches!(second, Outcome::Succeeded { .. }), "{second:?}");
    assert_eq!(rig.ledger_for("ignore-1").len(), 1, "one charge");

    // The same crash, then Redis loses the token: the retry reserves fence 1 again, so
    // only `always` stands between it and a second charge.
    let cmd = command("ignore-2", 900, "pm_card_visa");
    let first = always("a")
        .with_faults(Faults::fail_at(FaultPoint::AfterCharge))
        .process(&cmd, &CommandContext::default())
        .await;
    assert!(matches!(first, Outcome::Retry { .. }), "{first:?}");
    rig.forget_token("ignore-2").await;
    let (second, retries) = until_final(&always("b"), &cmd).await;
    assert!(retries.is_empty(), "{retries:?}");
    assert!(matches!(second, Outcome::Succeeded { .. }), "{second:?}");
    assert_eq!(rig.ledger_for("ignore-2").len(), 1, "one charge");
    assert_eq!(
        rig.token("ignore-2").await.unwrap().fence,
        1,
        "the retry really started from scratch"
    );

    // And with a real process SIGKILLed between charge and commit.
    let json = command_json("ignore-3", 900);
    let child = start_frozen(&rig, &json, FaultPoint::AfterCharge, "always").await;
    assert_eq!(rig.ledger_for("ignore-3").len(), 1);
    sigkill(child).await;
    let view = process_with_binary(&rig, &json, "always").await;
    assert_eq!(view["outcome"], "succeeded", "{view}");
    let ledger = rig.ledger_for("ignore-3");
    assert_eq!(ledger.len(), 1, "one charge: {ledger:?}");
    let rows = rig.rows("ignore-3").await;
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0].2.as_deref(),
        Some(ledger[0].transaction_id.as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unavailable_gateway_is_retried_without_a_charge_and_the_token_restored() {
    let sim = SimulatorConfig {
        error_rate: 1.0,
        ..SimulatorConfig::default()
    };
    let rig = Rig::new(sim, TokenPolicy::default()).await;
    let key = "unavailable-1";
    let cmd = command(key, 4200, "pm_card_visa");
    for attempt in 1..=2u64 {
        let outcome = rig
            .processor("p")
            .process(&cmd, &CommandContext::default())
            .await;
        assert!(matches!(outcome, Outcome::Retry { .. }), "{outcome:?}");
        assert!(rig.ledger_for(key).is_empty(), "no charge");
        assert!(rig.rows(key).await.is_empty(), "no row");
        let token = rig.token(key).await.unwrap();
        assert_eq!(
            token.state,
            TokenState::Pending,
            "restored, not left to its lease"
        );
        // Reservable again at once: each attempt took the next fence.
        assert_eq!(token.fence, attempt);
    }
    assert_eq!(
        rig.gateway.charges(),
        2,
        "both attempts reached the gateway and were refused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declined_payment_is_final_and_a_replay_is_a_duplicate() {
    let rig = Rig::new(SimulatorConfig::default(), TokenPolicy::default()).await;
    let key = "declined-1";
    let cmd = command(key, 5000, "pm_card_declined");
    let outcome = rig
        .processor("p")
        .process(&cmd, &CommandContext::default())
        .await;
    let Outcome::Declined {
        payment_id,
        transaction_id,
    } = outcome
    else {
        panic!("{outcome:?}")
    };
    let ledger = rig.ledger_for(key);
    assert_eq!(ledger.len(), 1);
    assert_eq!(
        (ledger[0].status, &ledger[0].transaction_id),
        (ChargeStatus::Declined, &transaction_id)
    );
    let rows = rig.rows(key).await;
    assert_eq!(
        rows,
        vec![(payment_id, "declined".to_owned(), Some(transaction_id), 1)]
    );
    let token = rig.token(key).await.unwrap();
    assert_eq!(
        (token.state, token.payment_id),
        (TokenState::Completed, Some(payment_id))
    );

    let again = rig
        .processor("q")
        .process(&cmd, &CommandContext::default())
        .await;
    assert_duplicate_of(&again, payment_id);
    assert_eq!(
        rig.gateway.charges(),
        1,
        "the replay never reached the gateway"
    );
    assert_eq!(rig.ledger_for(key)[0].attempts, 1);
}

// ---------------------------------------------------------------------------
// Slow charges: the lease is renewed, and a lost lease cannot commit

fn slow(key: &str, millis: u64) -> SimulatorConfig {
    SimulatorConfig {
        slow_keys: vec![SlowKey {
            key: ikey(key),
            delay: Duration::from_millis(millis),
        }],
        ..SimulatorConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_charge_renews_its_lease_so_a_second_worker_waits() {
    let key = "slow-1";
    let rig = Rig::new(slow(key, 2500), short_lease()).await;
    let cmd = command(key, 640, "pm_card_visa");
    let first = {
        let (processor, cmd) = (rig.processor("a"), cmd.clone());
        tokio::spawn(async move { processor.process(&cmd, &CommandContext::default()).await })
    };
    // Well past the 1 s lease the reservation started with.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let second = rig.processor("b");
    let during = second.process(&cmd, &CommandContext::default()).await;
    assert!(
        matches!(&during, Outcome::Retry { reason, .. } if reason == IN_FLIGHT),
        "{during:?}"
    );

    let first = first.await.unwrap();
    assert!(matches!(first, Outcome::Succeeded { .. }), "{first:?}");
    let (later, _) = until_final(&second, &cmd).await;
    let payment_id = rig.assert_charged_once(key).await;
    assert_duplicate_of(&later, payment_id);
    assert_eq!(rig.token(key).await.unwrap().fence, 1, "never taken over");
}

/// I5: Redis loses the token while a slow charge runs and another worker reserves
/// it afresh. The first worker's renewal is refused, so it must not commit; the
/// second one waits on the unique key, then records the same charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_lost_its_lease_during_the_charge_does_not_commit() {
    let key = "fenced-1";
    let rig = Rig::new(slow(key, 2000), short_lease()).await;
    let cmd = command(key, 640, "pm_card_visa");
    let first = {
        let (processor, cmd) = (rig.processor("a"), cmd.clone());
        tokio::spawn(async move { processor.process(&cmd, &CommandContext::default()).await })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.ledger_for(key).is_empty() {
        assert!(Instant::now() < deadline, "the first charge never arrived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    rig.forget_token(key).await;
    let second = {
        let (processor, cmd) = (rig.processor("b"), cmd.clone());
        tokio::spawn(async move { until_final(&processor, &cmd).await })
    };

    let first = first.await.unwrap();
    assert_eq!(
        first,
        Outcome::Retry {
            after: Duration::ZERO,
            reason: "lease lost during the gateway call".to_owned(),
            charge: payment_worker::payment::ChargeEvidence::MayHaveCharged,
        }
    );
    let (second, _) = second.await.unwrap();
    let Outcome::Succeeded {
        payment_id,
        transaction_id,
    } = second
    else {
        panic!("{second:?}")
    };
    let ledger = rig.ledger_for(key);
    assert_eq!(ledger.len(), 1, "one charge");
    assert_eq!(ledger[0].transaction_id, transaction_id);
    let rows = rig.rows(key).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].0, rows[0].2.as_deref()),
        (payment_id, Some(transaction_id.as_str()))
    );
    let token = rig.token(key).await.unwrap();
    assert_eq!(
        (token.state, token.payment_id),
        (TokenState::Completed, Some(payment_id))
    );
}

/// SPEC §4: a key used again with another request is `key_reused`, never booked.
/// When the first request charged and crashed before recording, the look-up that
/// a later reservation (fence > 1) makes returns only `{transaction_id, status}`,
/// so the processor records that charge under the second request's amount.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_key_after_a_crash_after_charge_is_rejected() {
    let rig = Rig::new(SimulatorConfig::default(), short_lease()).await;
    let key = "reused-after-crash";
    let first = rig
        .processor("a")
        .with_faults(Faults::fail_at(FaultPoint::AfterCharge))
        .process(
            &command(key, 100, "pm_card_visa"),
            &CommandContext::default(),
        )
        .await;
    assert!(matches!(first, Outcome::Retry { .. }), "{first:?}");
    let (second, _) = until_final(&rig.processor("b"), &command(key, 20_000, "pm_card_visa")).await;
    assert!(
        matches!(
            second,
            Outcome::Rejected {
                kind: RejectionKind::KeyReused,
                ..
            }
        ),
        "{second:?}"
    );
    let booked: Vec<(i64,)> =
        sqlx::query_as("SELECT amount_minor FROM payments WHERE idempotency_key = $1")
            .bind(key)
            .fetch_all(&rig.db.pool)
            .await
            .unwrap();
    assert!(
        booked.iter().all(|(amount,)| *amount == 100),
        "a row must never claim an amount the gateway did not charge: {booked:?}"
    );
}

// ---------------------------------------------------------------------------
// Key reuse, Redis loss, issued tokens

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_with_another_amount_is_rejected_and_never_charged() {
    let rig = Rig::new(SimulatorConfig::default(), TokenPolicy::default()).await;
    let key = "reuse-1";
    let original = rig
        .processor("p")
        .process(
            &command(key, 1000, "pm_card_visa"),
            &CommandContext::default(),
        )
        .await;
    assert!(
        matches!(original, Outcome::Succeeded { .. }),
        "{original:?}"
    );
    let payment_id = rig.assert_charged_once(key).await;

    let other = command(key, 2000, "pm_card_visa");
    // Fast path: the completed token kept the fingerprint.
    let outcome = rig
        .processor("p")
        .process(&other, &CommandContext::default())
        .await;
    assert!(
        matches!(
            outcome,
            Outcome::Rejected {
                kind: RejectionKind::KeyReused,
                ..
            }
        ),
        "{outcome:?}"
    );
    // Postgres path: Redis lost the token, the row's fingerprint decides.
    rig.forget_token(key).await;
    let outcome = rig
        .processor("p")
        .process(&other, &CommandContext::default())
        .await;
    assert!(
        matches!(
            outcome,
            Outcome::Rejected {
                kind: RejectionKind::KeyReused,
                ..
            }
        ),
        "{outcome:?}"
    );

    assert_eq!(
        rig.gateway.charges(),
        1,
        "the reused key never reached the gateway"
    );
    assert_eq!(
        rig.assert_charged_once(key).await,
        payment_id,
        "the original payment is untouched"
    );
    let ledger = rig.ledger_for(key);
    assert_eq!(ledger[0].amount_minor, 1000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_redis_lost_the_token_postgres_answers_duplicate() {
    let rig = Rig::new(SimulatorConfig::default(), TokenPolicy::default()).await;
    let key = "flushed-1";
    let cmd = command(key, 1500, "pm_card_visa");
    let first = rig
        .processor("p")
        .process(&cmd, &CommandContext::default())
        .await;
    assert!(matches!(first, Outcome::Succeeded { .. }), "{first:?}");
    rig.forget_token(key).await;
    assert!(rig.token(key).await.is_none());

    let again = rig
        .processor("q")
        .process(&cmd, &CommandContext::default())
        .await;
    let payment_id = rig.assert_charged_once(key).await;
    assert_duplicate_of(&again, payment_id);
    assert_eq!(
        (rig.gateway.charges(), rig.gateway.lookups()),
        (1, 0),
        "decided by Postgres alone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issued_mode_rejects_a_missing_token_unless_the_gateway_holds_its_charge() {
    let policy = TokenPolicy {
        mode: TokenMode::Issued,
        ..TokenPolicy::default()
    };
    let rig = Rig::new(SimulatorConfig::default(), policy).await;
    assert_eq!(rig.policy.mode, TokenMode::Issued);

    // Never issued, never charged: token_missing, nothing written anywhere.
    let cmd = command("never-issued", 800, "pm_card_visa");
    let outcome = rig
        .processor("p")
        .process(&cmd, &CommandContext::default())
        .await;
    assert!(
        matches!(
            outcome,
            Outcome::Rejected {
                kind: RejectionKind::TokenMissing,
                ..
            }
        ),
        "{outcome:?}"
    );
    assert!(rig.ledger_for("never-issued").is_empty());
    assert!(rig.rows("never-issued").await.is_empty());
    assert!(
        rig.token("never-issued").await.is_none(),
        "no token was created"
    );

    // Never issued (or expired), but an earlier attempt charged and crashed before
    // recording: the charge is recorded, not repeated.
    let cmd = command("charged-before", 800, "pm_card_visa");
    let earlier = rig
        .gateway
        .charge(&cmd.idempotency_key, &cmd.charge_request())
        .await
        .unwrap();
    let charges_before = rig.gateway.charges();
    let outcome = rig
        .processor("p")
        .process(&cmd, &CommandContext::default())
        .await;
    let Outcome::Succeeded {
        payment_id,
        transaction_id,
    } = outcome
    else {
        panic!("{outcome:?}")
    };
    assert_eq!(transaction_id, earlier.transaction_id);
    let ledger = rig.ledger_for("charged-before");
    assert_eq!(
        (ledger.len(), ledger[0].attempts),
        (1, 1),
        "not charged again"
    );
    assert_eq!(rig.gateway.charges(), charges_before, "no POST");
    let rows = rig.rows("charged-before").await;
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].0, rows[0].1.as_str()), (payment_id, "succeeded"));
    assert_eq!(rows[0].2.as_deref(), Some(earlier.transaction_id.as_str()));
    let again = rig
        .processor("p")
        .process(&cmd, &CommandContext::default())
        .await;
    assert_duplicate_of(&again, payment_id);

    // An issued token is charged the ordinary way.
    let cmd = command("issued-1", 800, "pm_card_visa");
    rig.store
        .issue(&cmd.idempotency_key, Duration::from_secs(60))
        .await
        .unwrap();
    let outcome = rig
        .processor("p")
        .process(&cmd, &CommandContext::default())
        .await;
    assert!(matches!(outcome, Outcome::Succeeded { .. }), "{outcome:?}");
    rig.assert_charged_once("issued-1").await;
}

// ---------------------------------------------------------------------------
// Invalid commands never reach the gateway

/// A valid command's JSON with `field` replaced (`None`: removed).
fn with(key: &str, field: &str, value: Option<serde_json::Value>) -> Option<Vec<u8>> {
    let mut body = serde_json::json!({
        "idempotency_key": key, "account_id": "acct_42", "amount_minor": 100,
        "currency": "USD", "payment_method": "pm_card_visa",
    });
    let object = body.as_object_mut().unwrap();
    match value {
        Some(value) => object.insert(field.to_owned(), value),
        None => object.remove(field),
    };
    Some(body.to_string().into_bytes())
}

/// Like [`with`], with a JSON literal serde_json would not produce (`1e3`, 2^66).
fn with_literal(key: &str, field: &str, literal: &str) -> Option<Vec<u8>> {
    let body = String::from_utf8(with(key, field, Some(serde_json::json!("@literal@")))?).ok()?;
    Some(body.replace("\"@literal@\"", literal).into_bytes())
}

fn raw(text: &str) -> Option<Vec<u8>> {
    Some(text.as_bytes().to_vec())
}

/// Builds a record value from its Kafka key.
type Payload = Box<dyn Fn(&str) -> Option<Vec<u8>>>;

/// (Kafka key, value, the reason code it must be refused with).
fn invalid_table() -> Vec<(String, Option<Vec<u8>>, &'static str)> {
    use serde_json::json;
    let cases: Vec<(Payload, &'static str)> = vec![
        (Box::new(|_| None), "empty_payload"),
        (Box::new(|_| raw(" \n\t ")), "empty_payload"),
        (Box::new(|_| Some(vec![0xff, 0xfe, 0x00])), "not_utf8"),
        (
            Box::new(|k| raw(&format!("{{\"idempotency_key\": \"{k}\", "))),
            "malformed_json",
        ),
        (
            Box::new(|k| raw(&format!("{{\"idempotency_key\": \"{k}\"}} trailing"))),
            "malformed_json",
        ),
        (Box::new(|_| raw("[1, 2, 3]")), "not_an_object"),
        (Box::new(|_| raw("\"pm_card_visa\"")), "not_an_object"),
        (
            Box::new(|k| {
                raw(&format!(
                    "{{\"idempotency_key\":\"{k}\",\"account_id\":\"a\",\"amount_minor\":1,\"amount_minor\":100000,\
                     \"currency\":\"USD\",\"payment_method\":\"pm_card_visa\"}}"
                ))
            }),
            "duplicate_field",
        ),
        (Box::new(|k| with(k, "account_id", None)), "missing_field"),
        (
            Box::new(|k| with(k, "amount_minor", Some(json!(null)))),
            "null_field",
        ),
        (
            Box::new(|k| with(k, "amount_minor", Some(json!("100")))),
            "wrong_type",
        ),
        (
            Box::new(|k| with(k, "payment_method", Some(json!(42)))),
            "wrong_type",
        ),
        (
            Box::new(|k| {
                with(
                    k,
                    "idempotency_key",
                    Some(json!(format!("{k} with spaces"))),
                )
            }),
            "invalid_idempotency_key",
        ),
        (
            Box::new(|k| with(k, "idempotency_key", Some(json!("k".repeat(129))))),
            "invalid_idempotency_key",
        ),
        (
            Box::new(|k| with(k, "idempotency_key", Some(json!("{tag}*")))),
            "invalid_idempotency_key",
        ),
        (
            Box::new(|k| with(k, "account_id", Some(json!("   ")))),
            "invalid_account_id",
        ),
        (
            Box::new(|k| with(k, "account_id", Some(json!("a".repeat(65))))),
            "invalid_account_id",
        ),
        (
            Box::new(|k| with(k, "account_id", Some(json!("acct 4111111111111111")))),
            "card_number_in_account_id",
        ),
        (
            Box::new(|k| with(k, "amount_minor", Some(json!(19.99)))),
            "amount_not_integer",
        ),
        (
            Box::new(|k| with_literal(k, "amount_minor", "1e3")),
            "amount_not_integer",
        ),
        (
            Box::new(|k| with(k, "amount_minor", Some(json!(0)))),
            "amount_out_of_range",
        ),
        (
            Box::new(|k| with(k, "amount_minor", Some(json!(-5)))),
            "amount_out_of_range",
        ),
        (
            Box::new(|k| with(k, "amount_minor", Some(json!(1_000_000_000_001_i64)))),
            "amount_out_of_range",
        ),
        (
            Box::new(|k| with_literal(k, "amount_minor", "99999999999999999999")),
            "amount_out_of_range",
        ),
        (
            Box::new(|k| with(k, "currency", Some(json!("US")))),
            "invalid_currency_format",
        ),
        (
            Box::new(|k| with(k, "currency", Some(json!("usd")))),
            "currency_not_upper_case",
        ),
        (
            Box::new(|k| with(k, "currency", Some(json!("ABC")))),
            "unknown_currency",
        ),
        (
            Box::new(|k| with(k, "currency", Some(json!("XAU")))),
            "currency_not_payable",
        ),
        (
            Box::new(|k| with(k, "payment_method", Some(json!("4111 1111 1111 1111")))),
            "card_number_as_payment_method",
        ),
        (
            Box::new(|k| with(k, "payment_method", Some(json!("")))),
            "invalid_payment_method",
        ),
        (
            Box::new(|k| with(k, "payment_method", Some(json!("pm_\u{7}card")))),
            "invalid_payment_method",
        ),
        (
            Box::new(|k| with(k, "payment_method", Some(json!("p".repeat(129))))),
            "invalid_payment_method",
        ),
        (
            Box::new(|k| with(k, "description", Some(json!("d".repeat(513))))),
            "description_too_long",
        ),
        (
            Box::new(|k| {
                with(
                    k,
                    "description",
                    Some(json!("card 5555555555554444 please")),
                )
            }),
            "card_number_in_description",
        ),
        // Well-formed, but its Kafka key names another payment: refused by the worker.
        (
            Box::new(|k| with(k, "idempotency_key", Some(json!(format!("{k}-elsewhere"))))),
            "kafka_key_mismatch",
        ),
    ];
    cases
        .into_iter()
        .enumerate()
        .map(|(n, (value, code))| {
            let key = format!("inv-{n:02}");
            let value = value(&key);
            (key, value, code)
        })
        .collect()
}

fn header(message: &rdkafka::message::OwnedMessage, name: &str) -> Option<String> {
    message.headers().and_then(|h| {
        h.iter()
            .find(|x| x.key == name)
            .and_then(|x| x.value.map(|v| String::from_utf8_lossy(v).into_owned()))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn invalid_commands_are_dead_lettered_with_their_reason_and_never_reach_the_gateway() {
    let table = invalid_table();
    assert!(table.len() >= 25, "{} cases", table.len());
    let codes: HashSet<_> = table.iter().map(|(_, _, code)| *code).collect();
    assert!(codes.len() >= 22, "distinct reasons: {codes:?}");

    // Each payload is refused by the parser with exactly its reason.
    for (key, value, code) in &table {
        let parsed = PaymentCommand::parse(value.as_deref().unwrap_or_default());
        if *code == "kafka_key_mismatch" {
            assert!(parsed.is_ok(), "{key}");
        } else {
            assert_eq!(parsed.err().map(|e| e.code()), Some(*code), "{key}");
        }
    }

    // Through a real worker: every one dead-lettered, none reserved or charged.
    let mut stack = Stack::new(3, SimulatorConfig::default()).await;
    let gateway = Arc::new(CountingGateway {
        inner: HttpGateway::new(
            &stack.simulator.url(),
            Duration::from_secs(5),
            Duration::from_secs(1),
        )
        .unwrap(),
        charges: AtomicUsize::new(0),
        lookups: AtomicUsize::new(0),
    });
    stack.gateway = Arc::clone(&gateway) as Arc<dyn PaymentGateway>;
    let records: Vec<WorkloadRecord> = table
        .iter()
        .map(|(key, value, _)| WorkloadRecord {
            kind: RecordKind::Invalid,
            key: Some(key.clone().into_bytes()),
            value: value.clone(),
            partition_hint: None,
        })
        .collect();
    let worker = stack.start_worker("inv", &quick_worker_settings());
    stack.produce(&records).await;
    let results = stack
        .wait_for_results(table.len(), Duration::from_secs(120))
        .await;
    stack.wait_for_commits(Duration::from_secs(30)).await;
    stop_all(vec![worker]).await;

    let dead = stack.dead_letters().await;
    assert_eq!(dead.len(), table.len(), "one dead letter per command");
    assert_eq!(results.len(), table.len(), "one result per command");
    for (key, value, code) in &table {
        let letters: Vec<_> = dead
            .iter()
            .filter(|m| m.key() == Some(key.as_bytes()))
            .collect();
        assert_eq!(letters.len(), 1, "{key}");
        let letter = letters[0];
        if code.starts_with("card_number") {
            // Masked, all but the last four digits: a card number never lands on a topic.
            let original = String::from_utf8(value.clone().unwrap()).unwrap();
            let masked = payment_worker::payment::mask_card_numbers(&original);
            assert_ne!(masked, original, "{key}");
            assert_eq!(letter.payload(), Some(masked.as_bytes()), "{key}");
        } else {
            assert_eq!(
                letter.payload(),
                value.as_deref(),
                "{key}: the original value, unchanged"
            );
        }
        assert_eq!(
            header(letter, worker::ERROR_KIND).as_deref(),
            Some("invalid"),
            "{key}"
        );
        let reason = header(letter, worker::ERROR_REASON).unwrap_or_default();
        assert!(
            reason.starts_with(&format!("{code}: ")),
            "{key}: expected {code}, got {reason:?}"
        );
        for secret in ["4111", "5555555555554444", "pm_card_visa"] {
            assert!(
                !reason.contains(secret),
                "{key}: the reason leaks {secret:?}: {reason:?}"
            );
        }
        let result = results
            .iter()
            .find(|r| {
                r.source.partition == letter.partition()
                    && r.source.offset.to_string() == header(letter, "x-source-offset").unwrap()
            })
            .unwrap_or_else(|| panic!("no result for {key}"));
        assert_eq!(result.outcome, "rejected", "{key}");
        assert!(
            result.payment_id.is_none() && result.gateway_transaction_id.is_none(),
            "{key}"
        );
    }

    assert_eq!(
        (gateway.charges(), gateway.lookups()),
        (0, 0),
        "nothing reached the gateway"
    );
    assert!(stack.ledger().is_empty());
    assert!(stack.payment_rows().await.is_empty(), "no payment row");
    let mut conn = stack.redis.conn.clone();
    let tokens: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}:*", stack.redis.prefix))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(tokens.is_empty(), "no token was reserved: {tokens:?}");
}

// ---------------------------------------------------------------------------
// `payment-worker gateway-sim`, black box

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_sim_binary_speaks_the_protocol() {
    let mut child = tokio::process::Command::new(BIN)
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
    let http = reqwest::Client::new();
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
