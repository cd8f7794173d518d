mod key;
mod postgres;
mod postgres_purge;
mod postgres_reserve;
mod postgres_rows;
mod postgres_settle;
mod postgres_statements;
mod redis;
mod redis_connection;
mod redis_node;
mod redis_replies;
mod redis_scan;
mod redis_sentinel;
mod redis_settle;
mod settle_wait;
mod store;

pub use key::{IdempotencyKey, InvalidKey};
pub use postgres::PostgresTokenStore;
pub use redis::RedisTokenStore;
pub use redis_connection::{ClientIdentity, RedisConnection, RedisTarget, ScanTarget};
pub use redis_node::NodeConnection;
pub use redis_sentinel::{SentinelConnection, SentinelService};
pub use settle_wait::{SettleWatch, Woken};

pub use store::{
    Claim, Housekeeping, IssueOutcome, LockOutcome, Predecessor, Reservation, SettleInTransaction,
    TokenError, TokenMode, TokenPolicy, TokenState, TokenStore, TokenView, Transition,
};
