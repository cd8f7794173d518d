//! Crash points for the tests: where a test build can make an attempt freeze, panic,
//! fail or pause (`armed.rs`, feature `fault-injection`, which only test builds turn
//! on). A shipped build compiles the same calls against `inert.rs`, where they do
//! nothing and no setting can arm them.
#[cfg(feature = "fault-injection")]
mod armed;
#[cfg(not(feature = "fault-injection"))]
mod inert;
mod point;

#[cfg(feature = "fault-injection")]
pub use armed::{Faults, InjectedFault, Pause, FROZEN_MARKER};
#[cfg(not(feature = "fault-injection"))]
pub use inert::{Faults, InjectedFault};
pub use point::FaultPoint;
