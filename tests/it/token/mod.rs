//! The token lifecycle: one contract run against every store and topology, and each
//! store's own behaviour.

pub(crate) mod contract;
mod postgres;
mod postgres_store;
mod redis;
mod redis_sentinel;
mod redis_topologies;
