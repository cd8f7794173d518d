//! The harness every capability shares: services up, an isolated database and Redis
//! prefix per test, the binary as a process, a deployment of worker processes and the
//! books it must balance, test certificates, a scripted gateway, a mock Kafka that
//! carries out transactions.

pub(crate) mod answers;
pub(crate) mod audit;
pub(crate) mod books;
pub(crate) mod cards;
pub(crate) mod deployment;
pub(crate) mod fault_proxy;
pub(crate) mod handover;
pub(crate) mod helpers;
pub(crate) mod pki;
pub(crate) mod procs;
pub(crate) mod redis_servers;
pub(crate) mod refund_race;
pub(crate) mod scripted_gateway;
pub(crate) mod scripted_stripe;
pub(crate) mod stripe;
pub(crate) mod target_seed;
pub(crate) mod tls_front;
pub(crate) mod tokens;
pub(crate) mod txn_broker;
