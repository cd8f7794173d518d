//! Fault injection for crash tests: `PAYMENT_WORKER_FAULT=<point>` makes the process
//! stop dead at that point of a payment, so a test can SIGKILL it exactly there.
//! In-process tests use `Faults::fail_at` to abandon the attempt instead.

use std::io::Write;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPoint {
    /// Token reserved, transaction not begun.
    AfterReserve,
    /// `processing` row inserted (uncommitted), gateway not called.
    AfterInsert,
    /// Gateway charged, transaction not committed.
    AfterCharge,
    /// Transaction committed, token not confirmed.
    AfterCommit,
}

impl FaultPoint {
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "after_reserve" => Some(Self::AfterReserve),
            "after_insert" => Some(Self::AfterInsert),
            "after_charge" => Some(Self::AfterCharge),
            "after_commit" => Some(Self::AfterCommit),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::AfterReserve => "after_reserve",
            Self::AfterInsert => "after_insert",
            Self::AfterCharge => "after_charge",
            Self::AfterCommit => "after_commit",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FaultAction {
    /// Return an error from the step (the attempt is abandoned like a crash would,
    /// but nothing is cleaned up beyond what dropping does).
    Fail,
    /// Announce the point on stderr and freeze until killed.
    Freeze,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    armed: Option<(FaultPoint, FaultAction)>,
}

#[derive(Debug, thiserror::Error)]
#[error("fault injected at {0:?}")]
pub struct InjectedFault(pub FaultPoint);

/// The line a frozen process prints before it waits to be killed.
pub const FROZEN_MARKER: &str = "payment-worker: frozen at fault point";

impl Faults {
    pub const ENV: &'static str = "PAYMENT_WORKER_FAULT";

    pub fn none() -> Self {
        Self::default()
    }

    pub fn fail_at(point: FaultPoint) -> Self {
        Self {
            armed: Some((point, FaultAction::Fail)),
        }
    }

    pub fn from_env() -> Self {
        let armed = std::env::var(Self::ENV)
            .ok()
            .and_then(|v| FaultPoint::parse(v.trim()))
            .map(|point| (point, FaultAction::Freeze));
        Self { armed }
    }

    pub async fn hit(&self, point: FaultPoint) -> Result<(), InjectedFault> {
        match self.armed {
            Some((armed, FaultAction::Fail)) if armed == point => Err(InjectedFault(point)),
            Some((armed, FaultAction::Freeze)) if armed == point => {
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
