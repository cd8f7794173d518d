//! Real processes SIGKILLed and restarted while they work: `dev-kafka`, `gateway-sim`
//! and three `run` workers, each its own OS process.

mod back_pressure;
pub(crate) mod books;
mod chaos_run;
pub(crate) mod deployment;
mod kill_one;
mod stores;
