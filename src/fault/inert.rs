//! What the payment path sees of the crash points in a shipped build (no
//! `fault-injection` feature): nothing. `Faults` is empty, `hit` always goes on, and
//! no environment variable is read, so no setting can freeze or panic a production
//! worker.

use super::FaultPoint;

/// No fault can be armed in this build.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults;

/// A fault injected at a point: never, in this build.
#[derive(Debug)]
pub enum InjectedFault {}

impl std::fmt::Display for InjectedFault {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {}
    }
}

impl std::error::Error for InjectedFault {}

impl Faults {
    /// No fault anywhere.
    pub fn none() -> Self {
        Self
    }

    /// No fault anywhere: this build has no crash points to arm.
    pub fn from_env() -> Self {
        Self
    }

    /// Never armed.
    pub fn is_armed(&self) -> bool {
        false
    }

    /// The poll thread never freezes on purpose.
    pub fn stalls_poll_loop() -> bool {
        false
    }

    /// Never asked for ([`Faults::stalls_poll_loop`] is false): goes on.
    pub fn stall_poll_thread() {}

    /// Goes on at once.
    #[inline(always)]
    pub async fn hit(&self, _point: FaultPoint, _key: &str) -> Result<(), InjectedFault> {
        Ok(())
    }
}
