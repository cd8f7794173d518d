//! The Postgres token store: the store (`store.rs`), its statements
//! (`statements.rs`), a reservation tried statement by statement (`reserve.rs`), rows
//! read and errors classed (`rows.rs`), settle wake-ups (`settle.rs`) and the purge of
//! expired rows (`purge.rs`).

mod purge;
mod reserve;
mod rows;
mod settle;
mod statements;
mod store;

pub use store::PostgresTokenStore;
