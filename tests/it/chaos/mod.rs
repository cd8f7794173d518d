//! Real processes SIGKILLed and restarted while they work: `dev-kafka`, `gateway-sim`
//! and three `run` workers, each its own OS process.

mod back_pressure;
mod chaos_run;
mod kill_one;
mod stores;
