mod key;
mod postgres;
mod redis;
mod store;

pub use key::{IdempotencyKey, InvalidKey};
pub use postgres::PostgresTokenStore;
pub use redis::RedisTokenStore;

pub use store::{
    Claim, IssueOutcome, LockOutcome, Reservation, TokenError, TokenMode, TokenPolicy, TokenState,
    TokenStore, TokenView, Transition,
};
