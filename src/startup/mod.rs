//! The I/O at start: the payments database created, connected and migrated; the
//! stores opened; processor and handler wired; signals awaited. The settings come
//! from `configuration` as plain data and everything that connects is here.
mod application;
mod database;
mod signal;
mod stores;
mod wiring;

pub use application::{Application, RunSettings, Shutdown};
pub use database::{
    connect, connect_and_migrate, connect_with_size, ensure_database, migrate,
    open_all_connections, open_database,
};
pub use signal::{shutdown_signal, INTERRUPTED_EXIT_STATUS};
pub use stores::{
    check_connection_budget, open_existing_stores, open_stores, purge_round, spawn_token_purge,
    token_store, PURGE_BATCHES_PER_ROUND,
};
pub use wiring::{
    build_processor, gateway, gateway_connections, handler, stripe_options, transport,
};
