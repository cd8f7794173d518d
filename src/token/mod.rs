mod key;
mod postgres;
mod redis;
mod settle_wait;
mod store;

pub use key::{outside_key_alphabet, IdempotencyKey, InvalidKey};
pub use postgres::PostgresTokenStore;
pub use redis::RedisTokenStore;
pub use redis::{
    ClientIdentity, NodeConnection, RedisConnection, RedisTarget, ScanTarget, SentinelConnection,
    SentinelService,
};
pub use settle_wait::{SettleWatch, Woken};

pub use store::{
    Claim, Housekeeping, IssueOutcome, LockOutcome, Predecessor, Reservation, SettleInTransaction,
    TokenError, TokenMode, TokenPolicy, TokenState, TokenStore, TokenView, Transition,
};
