//! The faults a network shows that killing a process does not: silent partitions,
//! one-way partitions, latency, resets and refused connections, each dependency
//! (Redis, Postgres, the gateway) cut on its own, through the fault proxy of
//! `support/fault_proxy.rs`. Every run ends with the books: no double charge,
//! nothing lost, every unknown flagged, `audit` clean, offsets only past answers.

mod failover;
mod lost_reservations;
mod partitions;
mod proxy;
mod rig;
mod stale_replies;
