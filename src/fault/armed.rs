//! The crash points themselves, compiled into test builds only (feature
//! `fault-injection`): `PAYMENT_WORKER_FAULT=<point>` makes the process stop dead at
//! that point of a payment, so a test can SIGKILL it exactly there.
//! `PAYMENT_WORKER_FAULT=panic:<point>` panics there instead (panic containment),
//! and `PAYMENT_WORKER_FAULT_KEY=<key>` limits either to one idempotency key.
//! `PAYMENT_WORKER_FAULT=stall_poll_loop` freezes the Kafka poll thread after its
//! first record (supervision and health). In-process tests use `Faults::fail_at`
//! to abandon the attempt instead, or `Faults::pause_at` to hold it at the point
//! while they change the world around it.

use std::io::Write;
use std::sync::Arc;

use super::FaultPoint;

#[derive(Debug, Clone)]
enum FaultAction {
    /// Return an error from the step (the attempt is abandoned like a crash would,
    /// but nothing is cleaned up beyond what dropping does).
    Fail,
    /// Announce the point on stderr and freeze until killed.
    Freeze,
    /// Panic, as a bug in the handling of one record would.
    Panic,
    /// Report the arrival to the holder of the [`Pause`] and wait until it releases
    /// the point; then carry on as if nothing happened.
    Pause(Pause),
}

/// The faults armed for a processor: none in production.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    armed: Option<(FaultPoint, FaultAction)>,
    /// Only commands with this idempotency key hit the fault.
    only_key: Option<String>,
}

/// A test's hold on a paused fault point: it learns when an attempt got there, does
/// what it wants to happen in that window (a lease takeover, say), then lets every
/// attempt held there go on. Makes a race window deterministic without sleeping.
#[derive(Debug, Clone)]
pub struct Pause {
    shared: Arc<PauseState>,
}

#[derive(Debug)]
struct PauseState {
    /// One permit per attempt that reached the point.
    arrivals: tokio::sync::Semaphore,
    released: tokio::sync::watch::Sender<bool>,
}

impl Pause {
    fn new() -> Self {
        Self {
            shared: Arc::new(PauseState {
                arrivals: tokio::sync::Semaphore::new(0),
                released: tokio::sync::watch::Sender::new(false),
            }),
        }
    }

    /// Waits until one more attempt has reached the point (and is held there).
    pub async fn arrival(&self) {
        if let Ok(permit) = self.shared.arrivals.acquire().await {
            permit.forget();
        }
    }

    /// Lets the attempts held at the point, and all later ones, go on.
    pub fn release(&self) {
        self.shared.released.send_replace(true);
    }

    async fn hold(&self) {
        let mut released = self.shared.released.subscribe();
        self.shared.arrivals.add_permits(1);
        // The sender lives in `shared`, which `self` keeps alive: this only ends on release.
        let _ = released.wait_for(|released| *released).await;
    }
}

/// The error an attempt fails with at an armed point.
#[derive(Debug, thiserror::Error)]
#[error("fault injected at {0:?}")]
pub struct InjectedFault(pub FaultPoint);

/// The line a frozen process prints before it waits to be killed.
pub const FROZEN_MARKER: &str = "payment-worker: frozen at fault point";

impl Faults {
    /// The variable that arms a fault: a point's name (`after_reserve`, …) freezes the attempt there, `panic:<point>` panics there, `stall_poll_loop` freezes the poll thread.
    pub const ENV: &'static str = "PAYMENT_WORKER_FAULT";
    /// Restricts the fault to commands with this idempotency key.
    pub const KEY_ENV: &'static str = "PAYMENT_WORKER_FAULT_KEY";
    /// The `PAYMENT_WORKER_FAULT` value that freezes the poll thread.
    pub const STALL_POLL_LOOP: &'static str = "stall_poll_loop";

    /// No fault anywhere (production).
    pub fn none() -> Self {
        Self::default()
    }

    /// Every attempt fails at `point`.
    pub fn fail_at(point: FaultPoint) -> Self {
        Self {
            armed: Some((point, FaultAction::Fail)),
            only_key: None,
        }
    }

    /// Holds every attempt that reaches `point` until the returned [`Pause`] releases it.
    pub fn pause_at(point: FaultPoint) -> (Self, Pause) {
        let pause = Pause::new();
        let faults = Self {
            armed: Some((point, FaultAction::Pause(pause.clone()))),
            only_key: None,
        };
        (faults, pause)
    }

    /// The faults `PAYMENT_WORKER_FAULT` and `PAYMENT_WORKER_FAULT_KEY` arm (none when unset).
    pub fn from_env() -> Self {
        let value = std::env::var(Self::ENV).unwrap_or_default();
        let value = value.trim();
        let armed = match value.strip_prefix("panic:") {
            Some(point) => FaultPoint::parse(point).map(|p| (p, FaultAction::Panic)),
            None => FaultPoint::parse(value).map(|p| (p, FaultAction::Freeze)),
        };
        let only_key = std::env::var(Self::KEY_ENV).ok().filter(|k| !k.is_empty());
        Self { armed, only_key }
    }

    /// Whether any point is armed (never in production): lets a hot path skip
    /// building what `hit` needs.
    pub fn is_armed(&self) -> bool {
        self.armed.is_some()
    }

    /// Whether the poll thread should freeze after its first record.
    pub fn stalls_poll_loop() -> bool {
        std::env::var(Self::ENV).is_ok_and(|v| v.trim() == Self::STALL_POLL_LOOP)
    }

    /// Freezes the calling (poll) thread for good.
    pub fn stall_poll_thread() {
        tracing::warn!("fault injected: the poll loop stalls");
        loop {
            std::thread::park();
        }
    }

    /// Reaches `point` while handling the command with idempotency key `key`.
    pub async fn hit(&self, point: FaultPoint, key: &str) -> Result<(), InjectedFault> {
        if self.only_key.as_deref().is_some_and(|only| only != key) {
            return Ok(());
        }
        match &self.armed {
            Some((armed, FaultAction::Fail)) if *armed == point => Err(InjectedFault(point)),
            Some((armed, FaultAction::Panic)) if *armed == point => {
                // With the key, as a real bug's message may quote the data that caused
                // it: the panic hook and the worker's log of it must mask it.
                panic!("fault injected: panic at {} for key {key}", point.as_str())
            }
            Some((armed, FaultAction::Pause(pause))) if *armed == point => {
                pause.hold().await;
                Ok(())
            }
            Some((armed, FaultAction::Freeze)) if *armed == point => {
                {
                    let mut stderr = std::io::stderr().lock();
                    let _ = writeln!(stderr, "{FROZEN_MARKER} {}", point.as_str());
                    let _ = stderr.flush();
                }
                std::future::pending::<()>().await;
                Ok(())
            }
            _ => Ok(()),
        }
    }
}
