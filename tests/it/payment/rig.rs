//! The processor's fixture: real Postgres, a Redis prefix and the gateway simulator
//! over HTTP, with a gateway wrapper that counts charges and look-ups. No Kafka.

use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use payment_worker::fault::{FaultPoint, Faults, FROZEN_MARKER};
use payment_worker::gateway::{
    Charge, ChargeRequest, GatewayError, HttpGateway, LeaseGuard, LeaseLoss, LedgerEntry,
    PaymentGateway, RefundEntry, RefundRequest,
};
use payment_worker::payment::{
    Attempt, CommandContext, GatewayLookup, Outcome, PaymentCommand, Processor,
};
use payment_worker::token::{
    IdempotencyKey, RedisTokenStore, TokenPolicy, TokenState, TokenStore, TokenView,
};
use payment_worker_devtools::{GatewaySimulator, RunningSimulator, SimulatorConfig};
use tokio::io::{AsyncBufReadExt, BufReader};
use uuid::Uuid;

use crate::support::helpers::{TestDb, TestRedis, REDIS_URL};

pub(crate) const BIN: &str = crate::support::procs::BINARY;

/// Counts the calls that reach the gateway, so "never charged" and "looked up, not
/// charged again" are observed, not inferred from the ledger alone (a refused POST
/// leaves no ledger trace).
pub(crate) struct CountingGateway {
    pub(crate) inner: HttpGateway,
    pub(crate) charges: AtomicUsize,
    pub(crate) lookups: AtomicUsize,
    /// Refund POSTs let out.
    pub(crate) refunds: AtomicUsize,
}

impl CountingGateway {
    pub(crate) fn charges(&self) -> usize {
        self.charges.load(Ordering::SeqCst)
    }

    pub(crate) fn lookups(&self) -> usize {
        self.lookups.load(Ordering::SeqCst)
    }
}

/// The processor's lease check, counting each POST it lets out: a charge call
/// whose lease check failed sent nothing, so it is no charge.
struct CountedPost<'a> {
    lease: &'a dyn LeaseGuard,
    charges: &'a AtomicUsize,
}

#[async_trait::async_trait]
impl LeaseGuard for CountedPost<'_> {
    async fn check(&self) -> Result<(), LeaseLoss> {
        self.lease.check().await?;
        self.charges.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[async_trait::async_trait]
impl PaymentGateway for CountingGateway {
    async fn charge(
        &self,
        key: &IdempotencyKey,
        request: &ChargeRequest,
        lease: &dyn LeaseGuard,
    ) -> Result<Charge, GatewayError> {
        let counted = CountedPost {
            lease,
            charges: &self.charges,
        };
        self.inner.charge(key, request, &counted).await
    }

    async fn lookup(&self, key: &IdempotencyKey) -> Result<Option<LedgerEntry>, GatewayError> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        self.inner.lookup(key).await
    }

    async fn ledger(&self) -> Result<Vec<LedgerEntry>, GatewayError> {
        self.inner.ledger().await
    }

    async fn refund(
        &self,
        key: &IdempotencyKey,
        request: &RefundRequest,
        lease: &dyn LeaseGuard,
    ) -> Result<Charge, GatewayError> {
        let counted = CountedPost {
            lease,
            charges: &self.refunds,
        };
        self.inner.refund(key, request, &counted).await
    }

    async fn lookup_refund(
        &self,
        key: &IdempotencyKey,
        request: &RefundRequest,
    ) -> Result<Option<RefundEntry>, GatewayError> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        self.inner.lookup_refund(key, request).await
    }

    async fn refunds(&self) -> Result<Vec<RefundEntry>, GatewayError> {
        self.inner.refunds().await
    }
}

/// Postgres, a Redis prefix, a simulator and a Redis token store; no Kafka.
pub(crate) struct Rig {
    pub(crate) db: TestDb,
    pub(crate) redis: TestRedis,
    pub(crate) simulator: RunningSimulator,
    pub(crate) policy: TokenPolicy,
    pub(crate) store: Arc<RedisTokenStore>,
    pub(crate) gateway: Arc<CountingGateway>,
}

pub(crate) fn short_lease() -> TokenPolicy {
    TokenPolicy {
        lease: Duration::from_secs(1),
        ..TokenPolicy::default()
    }
}

impl Rig {
    pub(crate) async fn new(simulator: SimulatorConfig, policy: TokenPolicy) -> Self {
        Self::with_timeout(simulator, policy, Duration::from_secs(15)).await
    }

    pub(crate) async fn with_timeout(
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
            refunds: AtomicUsize::new(0),
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

    pub(crate) fn tokens(&self) -> Arc<dyn TokenStore> {
        Arc::clone(&self.store) as Arc<dyn TokenStore>
    }

    pub(crate) fn processor_with(
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

    pub(crate) fn processor(&self, id: &str) -> Processor {
        self.processor_with(self.tokens(), GatewayLookup::Uncertain, id)
    }

    pub(crate) fn ledger_for(&self, key: &str) -> Vec<LedgerEntry> {
        self.simulator
            .ledger()
            .into_iter()
            .filter(|e| e.idempotency_key == key)
            .collect()
    }

    pub(crate) async fn rows(&self, key: &str) -> Vec<Row> {
        sqlx::query_as("SELECT id, status, gateway_transaction_id, fence FROM payments WHERE idempotency_key = $1")
            .bind(key)
            .fetch_all(&self.db.pool)
            .await
            .unwrap()
    }

    pub(crate) async fn token(&self, key: &str) -> Option<TokenView> {
        self.store.show(&ikey(key)).await.unwrap()
    }

    /// Redis losing the token (it runs without persistence): the key is simply gone.
    pub(crate) async fn forget_token(&self, key: &str) {
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
    pub(crate) async fn assert_charged_once(&self, key: &str) -> Uuid {
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

pub(crate) type Row = (Uuid, String, Option<String>, i64);

pub(crate) fn ikey(key: &str) -> IdempotencyKey {
    IdempotencyKey::try_from(key).unwrap()
}

pub(crate) fn command(key: &str, amount_minor: i64, payment_method: &str) -> PaymentCommand {
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

pub(crate) fn command_json(key: &str, amount_minor: i64) -> String {
    serde_json::json!({
        "idempotency_key": key, "account_id": "acct_42", "amount_minor": amount_minor,
        "currency": "USD", "payment_method": "pm_card_visa", "description": "test",
    })
    .to_string()
}

/// Processes until the outcome is final, as the handler's retry loop would (without
/// its budget). Returns the outcome and the reasons of the retries on the way.
pub(crate) async fn until_final(
    processor: &Processor,
    command: &PaymentCommand,
) -> (Outcome, Vec<String>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut retries = Vec::new();
    loop {
        match processor.process(command, &CommandContext::default()).await {
            Attempt::Retry { after, reason, .. } => {
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
            Attempt::Final(outcome) | Attempt::Unbooked(outcome) => return (outcome, retries),
        }
    }
}

pub(crate) const IN_FLIGHT: &str = "token in flight at another worker";

/// Runs the binary's `process` until it freezes at `point`, returns the child.
pub(crate) async fn start_frozen(
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

pub(crate) fn process_flags(rig: &Rig, lookup: &str) -> Vec<String> {
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

pub(crate) async fn sigkill(mut child: tokio::process::Child) {
    use std::os::unix::process::ExitStatusExt;
    let pid = Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    kill(pid, Signal::SIGKILL).unwrap();
    let status = child.wait().await.unwrap();
    assert_eq!(status.signal(), Some(Signal::SIGKILL as i32), "{status:?}");
}

/// The binary's `process`, repeated while it answers `retry` (a lease to wait out).
pub(crate) async fn process_with_binary(rig: &Rig, json: &str, lookup: &str) -> serde_json::Value {
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
