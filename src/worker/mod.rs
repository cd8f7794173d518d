//! The Kafka consumer-group worker (invariant I3: offsets move only past finished commands).
mod consumer;
mod handler;
mod health;
mod kafka;
mod messages;
mod offsets;
mod partition;
mod publisher;
mod rebalance;
mod supervision;
mod transactions;

pub use consumer::{run_until, start, RunningWorker};
pub use handler::{command_span, lane_of, Handler};
pub use health::{serve_health, HealthChecks, HealthServer, Liveness};
pub use kafka::{base_config, consumer_config, producer_config};
pub use messages::{
    dead_letter_headers, decode, record_key, without_dead_letter_headers, DeadLetter, ResultRecord,
    Undecodable, ATTEMPTS, CHARGE_UNKNOWN, ERROR_KIND, ERROR_REASON, PAYLOAD_REDACTED,
};
pub use offsets::OffsetTracker;
pub use publisher::Publisher;
pub use rebalance::drain_bound;
pub use supervision::WorkerFailure;
pub use transactions::{AnswerGuard, TransactionFailure, Transactions};
