//! The Kafka consumer-group worker (SPEC §1, I3).
mod consumer;
mod handler;
pub mod headers;
mod health;
mod kafka;
mod messages;
mod offsets;
mod partition;
mod publisher;
mod rebalance;
mod supervision;

pub use consumer::{run_until, start, RunningWorker};
pub use handler::{command_span, lane_of, Handler};
pub use health::{serve_health, HealthChecks, HealthServer, Liveness};
pub use kafka::{base_config, consumer_config, producer_config, LocalKafka};
pub use messages::{
    dead_letter_headers, decode, record_key, DeadLetter, ResultRecord, Undecodable, ATTEMPTS,
    CHARGE_UNKNOWN, ERROR_KIND, ERROR_REASON, PAYLOAD_REDACTED,
};
pub use offsets::OffsetTracker;
pub use publisher::Publisher;
pub use rebalance::drain_bound;
pub use supervision::WorkerFailure;
mod tools;
mod workload;

pub use tools::{
    dry_run_verdicts, partition_count, produce, publish_records, read_partitions, redrive, replay,
    rewind_group, DryRunVerdict, OutcomeView, ProduceArgs, RedriveArgs, ReplayArgs,
};
pub use workload::{generate, RecordKind, WorkloadRecord, WorkloadSpec};
