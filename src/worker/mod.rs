//! The Kafka consumer-group worker (invariant I3: offsets move only past finished commands).
mod answer_order;
mod answer_sink;
mod commits;
mod consumer;
mod dead_letter;
mod handler;
mod health;
mod inbound;
mod kafka;
mod member;
mod member_transactions;
mod messages;
mod offsets;
mod oversized;
mod partition;
mod publisher;
mod rebalance_callback;
mod record_echo;
mod spans;
mod supervision;
mod transactions;

pub use answer_order::{AnswerOrder, AnswerTurn, Turn};
pub use answer_sink::{AnswerHold, AnswerPlace, AnswerSink};
pub use commits::{check_drain_fits_session, drain_bound};
pub use consumer::{run_until, start, RunningWorker};
pub use dead_letter::{dead_letter_headers, DeadLetter};
pub use handler::Handler;
pub use health::{serve_health, HealthChecks, HealthServer, Liveness, PostgresProbe};
pub use inbound::{record_key, source_of, Inbound, Undecodable};
pub use kafka::{
    base_config, consumer_config, create_client, create_client_with_context, group_generation,
    producer_config, GroupGeneration,
};
pub use messages::{
    without_dead_letter_headers, ResultRecord, ATTEMPTS, CHARGE_UNKNOWN, ERROR_KIND, ERROR_REASON,
    HEADERS_REDACTED, KEY_HMAC_SHA256, LEGACY_KEY_SHA256, ORIGINAL_DROPPED, PAYLOAD_DROPPED,
    PAYLOAD_REDACTED,
};
pub use offsets::OffsetTracker;
pub use partition::lane_of;
pub use publisher::Publisher;
pub use record_echo::KeyScan;
pub use spans::command_span;
pub use supervision::WorkerFailure;
pub use transactions::{AnswerGuard, TransactionFailure, Transactions};
