//! The Redis token store: the store and its Lua scripts (`store.rs`, `scripts/`), the
//! scripts' replies read (`replies.rs`), expired leases found by SCAN (`scan.rs`),
//! settle wake-ups over pub/sub (`settle.rs`), and the connection behind it all: one
//! node, a Redis Cluster or a Sentinel-named master (`connection.rs`, `node.rs`,
//! `sentinel.rs`).

mod connection;
mod node;
mod replies;
mod scan;
mod sentinel;
mod settle;
mod store;

pub use connection::{ClientIdentity, RedisConnection, RedisTarget, ScanTarget};
pub use node::NodeConnection;
pub use sentinel::{SentinelConnection, SentinelService};
pub use store::RedisTokenStore;
