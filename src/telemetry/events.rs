//! Typed telemetry events, after Vector's `internal_events`: one type per thing that
//! happened, whose `emit` writes its log line (if it has one) and records its metrics
//! in one place. Call sites say `emit(CommandFinished { … })` and never touch an
//! instrument: the instruments (`metrics.rs`) are private to `telemetry`, so a metric
//! name, its attributes and the log line that goes with it are read here, once.
//!
//! Attribute values are `&'static str` or small numbers (never a key, a token or an
//! error text), so recording formats nothing. Values an event only logs (keys, error
//! texts) are borrowed as `&dyn Display`: the call site's own type decides how it is
//! written (an idempotency key redacts a card number itself), and `telemetry` stays a
//! leaf module that imports none of the modules it observes.
//!
//! One file per domain: `commands.rs` (a command's life in the worker), `tokens.rs`
//! (the token store), `gateway.rs`, `database.rs` (the payment pool), `consumer.rs`
//! (Kafka consumer statistics).

mod commands;
mod consumer;
mod database;
mod gateway;
mod tokens;

pub use commands::{
    CommandEnded, CommandFinished, CommandRetried, CommandStarted, CommandsAbandoned,
    HandlerPanicked, RecordDeadLettered,
};
pub use consumer::ConsumerLagMeasured;
pub use database::PoolAcquireEnded;
pub use gateway::{GatewayCallFailed, GatewayListingIncomplete};
pub use tokens::{
    SettleRefused, SettleTransition, SettleWaitEnded, TokenInconsistencyRepaired,
    TokenOperationFailed, TokensPurged,
};

/// Something that happened, told to logs and metrics by the event itself.
pub trait InternalEvent {
    /// Writes the event's log line (if any) and records its metrics.
    fn emit(self);
}

/// Emits `event`: the one way the product records a metric.
pub fn emit(event: impl InternalEvent) {
    event.emit();
}
