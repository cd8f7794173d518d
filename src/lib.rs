//! payment-worker: charges each payment command exactly once, however often it is
//! delivered, replayed, or the worker crashes. See `docs/ARCHITECTURE.md`.

pub mod audit;
pub mod cli;
pub mod configuration;
pub mod database_errors;
pub mod fault;
pub mod gateway;
pub mod kafka_headers;
pub mod operator;
/// Payment commands: reading and validating them, processing one attempt, the `payments` table.
pub mod payment;
pub mod redaction;
pub mod retry;
pub mod startup;
pub mod telemetry;
/// Idempotency tokens: the lifecycle, its Redis and Postgres stores, the key type.
pub mod token;
pub mod worker;
