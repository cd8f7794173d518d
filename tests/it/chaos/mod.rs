//! Real processes SIGKILLed and restarted while they work: `dev-kafka` (or
//! `txn-broker`), `gateway-sim` and three `run` workers, each its own OS process.

mod back_pressure;
mod backlog_drain;
mod chaos_run;
mod exactly_once;
mod kill_one;
mod late_commit;
mod refund_race;
mod replay_after_kill;
mod stores;
