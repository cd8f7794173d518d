//! The token lifecycle contract, run unchanged against every backend.
//!
//! Each backend supplies stores and an independent view of what is really stored (the
//! Redis hash, the Postgres row), read without going through the store under test, so
//! the assertions are about the server's state and not only about return values. Not
//! every backend runs every check (a topology may skip the long races), so some of
//! these functions have one caller only in some builds.
#![allow(dead_code)]

mod backend;
mod deadlines;
mod lifecycle;
mod races;
mod schemes;
mod wakes;

pub use backend::{key, policy, Backend, RawToken, RACERS, RACE_ROUNDS};
pub use deadlines::*;
pub use lifecycle::*;
pub use races::*;
pub use schemes::*;
pub use wakes::*;
