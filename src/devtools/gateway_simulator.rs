//! An in-memory payment gateway speaking the gateway contract (docs/CONTRACT.md), with fault injection, so the
//! worker's exactly-once behaviour can be tested against timeouts, outages,
//! declines and a gateway that ignores idempotency keys.
//!
//! Routes:
//! - `POST /charges` (header `Idempotency-Key`, body `{amount_minor, currency,
//!   payment_method}`) → 200 `{transaction_id, status}`; the same key replays the
//!   first answer (and counts an attempt); the same key with another body → 422;
//!   a missing or invalid key or body → 400; an injected fault → 503.
//! - `GET /charges/{key}` → the (latest) charge made under `key`, or 404.
//! - `GET /charges` → the whole ledger as a JSON array of [`LedgerEntry`];
//!   `?idempotency_key=K` narrows it to one key (the way to ask for the keys `.`
//!   and `..`, which cannot travel as a path segment).
//!
//! Test hook: the payment method `pm_card_declined` is always declined.
//!
//! Payment methods are never logged and never kept: a replay is matched against a
//! SHA-256 of the first request body.

use std::collections::HashMap;
use std::future::{Future, IntoFuture};
use std::io::Write as _;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::ListenerExt as _;
use axum::{Json, Router};
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use sha2::{Digest as _, Sha256};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::gateway::{Charge, ChargeRequest, ChargeStatus, LedgerEntry};
use crate::token::IdempotencyKey;

/// A payment method the simulator always declines, whatever `--decline-rate` says.
pub const DECLINED_PAYMENT_METHOD: &str = "pm_card_declined";

/// How long requests in flight may finish after shutdown was asked for; a held
/// answer (`--late-by-ms`, `--slow-key`) is cut off rather than waited for.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// Fault injection for the simulator (`payment-worker gateway-sim …`).
#[derive(Debug, Clone, clap::Args)]
pub struct SimulatorConfig {
    /// Delay before every charge and look-up is handled, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub latency_ms: u64,

    /// Share of POSTs answered 503 without charging (0 to 1).
    #[arg(long, value_name = "RATE", default_value_t = 0.0, value_parser = parse_rate)]
    pub error_rate: f64,

    /// Share of new charges declined (0 to 1).
    #[arg(long, value_name = "RATE", default_value_t = 0.0, value_parser = parse_rate)]
    pub decline_rate: f64,

    /// Share of POSTs that charge, then answer only after `--late-by-ms` (0 to 1).
    #[arg(long, value_name = "RATE", default_value_t = 0.0, value_parser = parse_rate)]
    pub timeout_after_charge_rate: f64,

    /// How late a `--timeout-after-charge-rate` answer comes, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    pub late_by_ms: u64,

    /// Behave like a gateway without idempotency support: every POST is a new
    /// charge with a new transaction id; a look-up by key returns the latest.
    #[arg(long)]
    pub ignore_idempotency_key: bool,

    /// Seed of the fault-injection RNG, for reproducible runs (default: random,
    /// logged at start-up).
    #[arg(long)]
    pub seed: Option<u64>,

    /// `KEY=MS`: POSTs with this idempotency key charge at once but answer only
    /// after MS milliseconds (repeatable). Lets a test hold one key in flight.
    #[arg(long = "slow-key", value_name = "KEY=MS")]
    pub slow_keys: Vec<SlowKey>,
}

impl Default for SimulatorConfig {
    fn default() -> Self {
        Self {
            latency_ms: 0,
            error_rate: 0.0,
            decline_rate: 0.0,
            timeout_after_charge_rate: 0.0,
            late_by_ms: 30_000,
            ignore_idempotency_key: false,
            seed: None,
            slow_keys: Vec::new(),
        }
    }
}

impl SimulatorConfig {
    fn validate(&self) -> anyhow::Result<()> {
        for (name, rate) in [
            ("error-rate", self.error_rate),
            ("decline-rate", self.decline_rate),
            ("timeout-after-charge-rate", self.timeout_after_charge_rate),
        ] {
            anyhow::ensure!(
                (0.0..=1.0).contains(&rate),
                "--{name} must be between 0 and 1, got {rate}"
            );
        }
        Ok(())
    }
}

/// One `--slow-key KEY=MS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlowKey {
    /// The key whose charges are slowed.
    pub key: IdempotencyKey,
    /// How much longer its charges take.
    pub delay: Duration,
}

impl FromStr for SlowKey {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (key, ms) = s
            .split_once('=')
            .ok_or_else(|| format!("expected KEY=MS, got {s:?}"))?;
        let key = IdempotencyKey::try_from(key).map_err(|e| e.to_string())?;
        let ms: u64 = ms
            .parse()
            .map_err(|_| format!("expected a number of milliseconds after '=', got {ms:?}"))?;
        Ok(Self {
            key,
            delay: Duration::from_millis(ms),
        })
    }
}

fn parse_rate(s: &str) -> Result<f64, String> {
    let rate: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if (0.0..=1.0).contains(&rate) {
        Ok(rate)
    } else {
        Err(format!("{rate} is not between 0 and 1"))
    }
}

// ---------------------------------------------------------------------------
// State

struct Entry {
    public: LedgerEntry,
    /// SHA-256 of the first request body; the payment method itself is not kept.
    body_hash: [u8; 32],
}

struct Ledger {
    entries: Vec<Entry>,
    /// Key → index of its latest entry.
    latest: HashMap<String, usize>,
    rng: StdRng,
}

struct Shared {
    config: SimulatorConfig,
    slow_keys: HashMap<String, Duration>,
    ledger: Mutex<Ledger>,
    /// The `traceparent` of the first POST per key, so tests can see the trace
    /// context reach the gateway (in process only; not part of the HTTP API).
    traceparents: Mutex<HashMap<String, String>>,
}

enum Decision {
    Unavailable,
    Conflict,
    Answer { charge: Charge, late: bool },
}

/// Length-prefixed, so no two different bodies hash alike by shifting characters
/// between fields.
fn body_hash(request: &ChargeRequest) -> [u8; 32] {
    let mut hasher = Sha256::new();
    let amount = request.amount_minor.to_string();
    for part in [
        amount.as_str(),
        request.currency.as_str(),
        request.payment_method.as_str(),
    ] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    hasher.finalize().into()
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Ledger> {
        // Nothing panics while holding the lock; if something did, the ledger is
        // still consistent (every mutation is a single push/insert/increment).
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Check and insert under one lock, so concurrent POSTs of one key charge once.
    fn decide(&self, key: &IdempotencyKey, request: &ChargeRequest) -> Decision {
        let config = &self.config;
        let hash = body_hash(request);
        let mut guard = self.lock();
        let ledger = &mut *guard;
        // The same three draws on every POST, so a seeded run replays the same
        // faults for the same sequence of requests.
        let fail = ledger.rng.random::<f64>() < config.error_rate;
        let decline = ledger.rng.random::<f64>() < config.decline_rate;
        let late = ledger.rng.random::<f64>() < config.timeout_after_charge_rate;
        if fail {
            return Decision::Unavailable;
        }
        if !config.ignore_idempotency_key {
            if let Some(entry) = ledger
                .latest
                .get(key.as_str())
                .and_then(|&index| ledger.entries.get_mut(index))
            {
                if entry.body_hash != hash {
                    return Decision::Conflict;
                }
                entry.public.attempts += 1;
                return Decision::Answer {
                    charge: charge_of(&entry.public),
                    late,
                };
            }
        }
        let status = if request.payment_method == DECLINED_PAYMENT_METHOD || decline {
            ChargeStatus::Declined
        } else {
            ChargeStatus::Approved
        };
        let transaction_id = format!("txn_{:032x}", ledger.rng.random::<u128>());
        let public = LedgerEntry {
            idempotency_key: key.as_str().to_owned(),
            transaction_id,
            amount_minor: request.amount_minor,
            currency: request.currency.clone(),
            status,
            charged_at: chrono::Utc::now(),
            attempts: 1,
        };
        let charge = charge_of(&public);
        ledger
            .latest
            .insert(key.as_str().to_owned(), ledger.entries.len());
        ledger.entries.push(Entry {
            public,
            body_hash: hash,
        });
        tracing::debug!(
            idempotency_key = %key,
            transaction_id = %charge.transaction_id,
            status = ?charge.status,
            amount_minor = request.amount_minor,
            currency = %request.currency,
            "gateway-sim charged"
        );
        Decision::Answer { charge, late }
    }

    fn lookup(&self, key: &str) -> Option<LedgerEntry> {
        let ledger = self.lock();
        ledger
            .latest
            .get(key)
            .and_then(|&index| ledger.entries.get(index))
            .map(|entry| entry.public.clone())
    }

    fn snapshot(&self, key: Option<&str>) -> Vec<LedgerEntry> {
        let ledger = self.lock();
        ledger
            .entries
            .iter()
            .filter(|entry| key.is_none_or(|key| entry.public.idempotency_key == key))
            .map(|entry| entry.public.clone())
            .collect()
    }
}

fn charge_of(entry: &LedgerEntry) -> Charge {
    Charge {
        transaction_id: entry.transaction_id.clone(),
        status: entry.status,
    }
}

// ---------------------------------------------------------------------------
// HTTP

/// An error answer: `{"error": code, "message": …}`.
struct Rejection {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.code, "message": self.message });
        (self.status, Json(body)).into_response()
    }
}

fn error(status: StatusCode, code: &'static str, message: impl Into<String>) -> Rejection {
    Rejection {
        status,
        code,
        message: message.into(),
    }
}

fn key_from_headers(headers: &HeaderMap) -> Result<IdempotencyKey, Rejection> {
    let mut values = headers.get_all("idempotency-key").iter();
    let Some(value) = values.next() else {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "missing_idempotency_key",
            "the Idempotency-Key header is required",
        ));
    };
    if values.next().is_some() {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "invalid_idempotency_key",
            "the Idempotency-Key header must appear once",
        ));
    }
    let text = value.to_str().map_err(|_| {
        error(
            StatusCode::BAD_REQUEST,
            "invalid_idempotency_key",
            "the Idempotency-Key header is not visible ASCII",
        )
    })?;
    IdempotencyKey::try_from(text).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            "invalid_idempotency_key",
            e.to_string(),
        )
    })
}

/// The body is parsed here rather than by axum's `Json`: its rejection texts can
/// quote the body (and so the payment method), and its 422 would be confused with
/// "key reused with another body".
fn request_from_body(body: &[u8]) -> Result<ChargeRequest, Rejection> {
    let invalid = |message: String| error(StatusCode::BAD_REQUEST, "invalid_request", message);
    let request: ChargeRequest = serde_json::from_slice(body).map_err(|e| {
        invalid(format!(
            "the body must be a JSON object {{amount_minor, currency, payment_method}} \
             ({:?} error at line {}, column {})",
            e.classify(),
            e.line(),
            e.column()
        ))
    })?;
    if request.amount_minor < 1 {
        return Err(invalid("amount_minor must be at least 1".into()));
    }
    if !(request.currency.len() == 3 && request.currency.bytes().all(|b| b.is_ascii_uppercase())) {
        return Err(invalid("currency must be three upper-case letters".into()));
    }
    if request.payment_method.is_empty() {
        return Err(invalid("payment_method must not be empty".into()));
    }
    Ok(request)
}

async fn post_charge(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let key = match key_from_headers(&headers) {
        Ok(key) => key,
        Err(rejection) => return rejection.into_response(),
    };
    let request = match request_from_body(&body) {
        Ok(request) => request,
        Err(rejection) => return rejection.into_response(),
    };
    if let Some(traceparent) = headers.get("traceparent").and_then(|v| v.to_str().ok()) {
        let mut seen = shared
            .traceparents
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        seen.entry(key.as_str().to_owned())
            .or_insert_with(|| traceparent.to_owned());
    }
    if shared.config.latency_ms > 0 {
        tokio::time::sleep(Duration::from_millis(shared.config.latency_ms)).await;
    }
    match shared.decide(&key, &request) {
        Decision::Unavailable => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "injected fault; nothing was charged",
        )
        .into_response(),
        Decision::Conflict => error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency_key_reused",
            "this Idempotency-Key was first used with a different request body",
        )
        .into_response(),
        Decision::Answer { charge, late } => {
            // The charge is already booked: a client that gives up while this
            // sleeps leaves a charge it has no answer for, as with a real gateway.
            let mut hold = shared
                .slow_keys
                .get(key.as_str())
                .copied()
                .unwrap_or_default();
            if late {
                hold += Duration::from_millis(shared.config.late_by_ms);
            }
            if !hold.is_zero() {
                tokio::time::sleep(hold).await;
            }
            Json(charge).into_response()
        }
    }
}

async fn get_charge(State(shared): State<Arc<Shared>>, Path(key): Path<String>) -> Response {
    if shared.config.latency_ms > 0 {
        tokio::time::sleep(Duration::from_millis(shared.config.latency_ms)).await;
    }
    match shared.lookup(&key) {
        Some(charge) => Json(charge).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            "not_found",
            "no charge was made under this idempotency key",
        )
        .into_response(),
    }
}

#[derive(serde::Deserialize)]
struct LedgerQuery {
    idempotency_key: Option<String>,
}

async fn get_ledger(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<LedgerQuery>,
) -> Json<Vec<LedgerEntry>> {
    Json(shared.snapshot(query.idempotency_key.as_deref()))
}

fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/charges", get(get_ledger).post(post_charge))
        .route("/charges/{key}", get(get_charge))
        .with_state(shared)
}

// ---------------------------------------------------------------------------
// Server

/// A bound, not yet serving, simulator.
pub struct GatewaySimulator {
    listener: std::net::TcpListener,
    local_addr: SocketAddr,
    seed: u64,
    shared: Arc<Shared>,
}

impl GatewaySimulator {
    /// Binds before serving, so `127.0.0.1:0` yields its port to the caller first.
    pub fn bind(addr: SocketAddr, config: SimulatorConfig) -> anyhow::Result<Self> {
        config.validate()?;
        let listener = std::net::TcpListener::bind(addr)
            .with_context(|| format!("gateway simulator cannot listen on {addr}"))?;
        // Tokio adopts it in `serve`; it must not block the runtime there.
        listener
            .set_nonblocking(true)
            .context("setting the simulator listener non-blocking")?;
        let local_addr = listener.local_addr()?;
        let seed = config.seed.unwrap_or_else(rand::random);
        let slow_keys = config
            .slow_keys
            .iter()
            .map(|slow| (slow.key.as_str().to_owned(), slow.delay))
            .collect();
        let shared = Arc::new(Shared {
            slow_keys,
            ledger: Mutex::new(Ledger {
                entries: Vec::new(),
                latest: HashMap::new(),
                rng: StdRng::seed_from_u64(seed),
            }),
            traceparents: Mutex::new(HashMap::new()),
            config,
        });
        Ok(Self {
            listener,
            local_addr,
            seed,
            shared,
        })
    }

    /// The address the simulator is bound to (port 0 resolved).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The RNG seed in use (the `--seed` given, or the random one drawn).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Serves until `shutdown` completes, then lets requests in flight finish for
    /// up to [`SHUTDOWN_GRACE`] before closing their connections.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let listener = tokio::net::TcpListener::from_std(self.listener)
            .context("registering the simulator listener")?
            .tap_io(|tcp| {
                // Small request/response pairs: Nagle would only add latency.
                let _ = tcp.set_nodelay(true);
            });
        let stopping = CancellationToken::new();
        let trigger = stopping.clone();
        let server = axum::serve(listener, router(self.shared))
            .with_graceful_shutdown(async move {
                shutdown.await;
                trigger.cancel();
            })
            .into_future();
        tokio::select! {
            result = server => result.context("gateway simulator server failed"),
            () = async {
                stopping.cancelled().await;
                tokio::time::sleep(SHUTDOWN_GRACE).await;
            } => Ok(()),
        }
    }

    /// Serves on the current Tokio runtime in the background (in-process tests).
    /// The server stops when the returned handle is dropped or shut down. Must be
    /// called inside a Tokio runtime (it spawns a task).
    pub fn spawn(self) -> RunningSimulator {
        let addr = self.local_addr;
        let shared = Arc::clone(&self.shared);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let handle = tokio::spawn(self.serve(async move {
            // A dropped sender means stop too.
            let _ = stopped.await;
        }));
        RunningSimulator {
            addr,
            shared,
            stop: Some(stop),
            handle: Some(handle),
        }
    }
}

impl GatewaySimulator {
    /// Serves on a thread of its own, named `name`, with a single-threaded runtime:
    /// the CPU it spends can then be told from its caller's (the bench reads it per
    /// thread). Stops like [`Self::spawn`]; must be called inside a Tokio runtime.
    pub fn spawn_on_thread(self, name: &str) -> anyhow::Result<RunningSimulator> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("building the simulator's runtime")?;
        let addr = self.local_addr;
        let shared = Arc::clone(&self.shared);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (served, result) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                let outcome = runtime.block_on(self.serve(async move {
                    let _ = stopped.await;
                }));
                let _ = served.send(outcome);
            })
            .context("starting the simulator's thread")?;
        let handle = tokio::spawn(async move {
            result
                .await
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the simulator's thread panicked")))
        });
        Ok(RunningSimulator {
            addr,
            shared,
            stop: Some(stop),
            handle: Some(handle),
        })
    }
}

/// A simulator serving in the background; stops on drop.
pub struct RunningSimulator {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    handle: Option<JoinHandle<anyhow::Result<()>>>,
}

impl RunningSimulator {
    /// The address the running simulator serves on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, ready for [`super::HttpGateway::new`].
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The ledger as `GET /charges` would return it, without HTTP.
    pub fn ledger(&self) -> Vec<LedgerEntry> {
        self.shared.snapshot(None)
    }

    /// The `traceparent` header of the first charge request for `key`, if it had one.
    pub fn traceparent_of(&self, key: &str) -> Option<String> {
        let seen = self
            .shared
            .traceparents
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        seen.get(key).cloned()
    }

    /// Stops serving and waits for the server to finish.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.handle.take() {
            Some(handle) => handle.await.context("gateway simulator task failed")?,
            None => Ok(()),
        }
    }
}

impl Drop for RunningSimulator {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl std::fmt::Debug for RunningSimulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningSimulator")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// `payment-worker gateway-sim --listen ADDR`: binds, prints
/// `gateway-sim listening on ADDR` as the first line on stdout (scripts and tests
/// read the port from it), and serves until SIGTERM or Ctrl-C.
pub async fn run_cli(listen: SocketAddr, config: SimulatorConfig) -> anyhow::Result<()> {
    // Handlers first: a SIGTERM sent right after the line is read must already
    // find them installed.
    let shutdown = shutdown_signal()?;
    let simulator = GatewaySimulator::bind(listen, config)?;
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(
            stdout,
            "gateway-sim listening on {}",
            simulator.local_addr()
        )?;
        stdout.flush()?;
    }
    tracing::info!(
        addr = %simulator.local_addr(),
        seed = simulator.seed(),
        config = ?simulator.shared.config,
        "gateway simulator serving"
    );
    simulator.serve(shutdown).await?;
    tracing::info!("gateway simulator stopped");
    Ok(())
}

#[cfg(unix)]
fn shutdown_signal() -> anyhow::Result<impl Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate =
        signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    })
}

#[cfg(not(unix))]
fn shutdown_signal() -> anyhow::Result<impl Future<Output = ()> + Send + 'static> {
    Ok(async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        config: SimulatorConfig,
    }

    #[test]
    fn flags_parse() {
        let cli = Cli::try_parse_from([
            "sim",
            "--latency-ms",
            "20",
            "--error-rate",
            "0.5",
            "--decline-rate",
            "1",
            "--timeout-after-charge-rate",
            "0.25",
            "--late-by-ms",
            "2000",
            "--ignore-idempotency-key",
            "--seed",
            "7",
            "--slow-key",
            "k-1=500",
            "--slow-key",
            "k-2=0",
        ])
        .unwrap();
        let c = cli.config;
        assert_eq!(c.latency_ms, 20);
        assert_eq!(c.error_rate, 0.5);
        assert_eq!(c.decline_rate, 1.0);
        assert_eq!(c.timeout_after_charge_rate, 0.25);
        assert_eq!(c.late_by_ms, 2000);
        assert!(c.ignore_idempotency_key);
        assert_eq!(c.seed, Some(7));
        assert_eq!(c.slow_keys.len(), 2);
        assert_eq!(c.slow_keys[0].key.as_str(), "k-1");
        assert_eq!(c.slow_keys[0].delay, Duration::from_millis(500));

        let defaults = Cli::try_parse_from(["sim"]).unwrap().config;
        assert_eq!(defaults.late_by_ms, SimulatorConfig::default().late_by_ms);
        assert_eq!(defaults.seed, None);

        for bad in [
            vec!["sim", "--error-rate", "1.5"],
            vec!["sim", "--decline-rate", "-0.1"],
            vec!["sim", "--error-rate", "NaN"],
            vec!["sim", "--slow-key", "nokey"],
            vec!["sim", "--slow-key", "a b=10"],
            vec!["sim", "--slow-key", "k=soon"],
        ] {
            assert!(Cli::try_parse_from(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn bind_rejects_bad_rates() {
        let config = SimulatorConfig {
            error_rate: 2.0,
            ..SimulatorConfig::default()
        };
        let bound = GatewaySimulator::bind("127.0.0.1:0".parse().unwrap(), config);
        assert!(bound.is_err());
    }

    #[test]
    fn seeded_runs_are_reproducible() {
        let config = SimulatorConfig {
            decline_rate: 0.5,
            seed: Some(42),
            ..SimulatorConfig::default()
        };
        let run = || {
            let sim =
                GatewaySimulator::bind("127.0.0.1:0".parse().unwrap(), config.clone()).unwrap();
            (0..20)
                .map(|i| {
                    let key = IdempotencyKey::try_from(format!("k{i}")).unwrap();
                    let request = ChargeRequest {
                        amount_minor: 100,
                        currency: "USD".into(),
                        payment_method: "pm_card_visa".into(),
                    };
                    match sim.shared.decide(&key, &request) {
                        Decision::Answer { charge, .. } => charge,
                        _ => panic!("unexpected decision"),
                    }
                })
                .collect::<Vec<_>>()
        };
        let first = run();
        assert_eq!(first, run());
        assert!(first.iter().any(|c| c.status == ChargeStatus::Declined));
        assert!(first.iter().any(|c| c.status == ChargeStatus::Approved));
    }
}
