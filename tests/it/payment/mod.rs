//! One payment end to end through the processor: races, crashes at each step, gateway
//! faults, leases and fencing, key reuse, invalid input, round trips,
//! the table checks.

mod crashes;
mod fencing;
mod gateway_faults;
mod invalid;
mod key_reuse;
mod leases;
mod races;
mod refunds;
pub(crate) mod rig;
mod round_trips;
mod schema_checks;
mod settle_wake;
