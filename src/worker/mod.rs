//! The Kafka consumer-group worker (SPEC §1, I3).
mod consumer;
mod handler;
mod kafka;
mod messages;
mod offsets;
mod partition;
mod publisher;

pub use consumer::{run_until, start, RunningWorker};
pub use handler::Handler;
pub use kafka::{base_config, consumer_config, producer_config, LocalKafka};
pub use messages::{decode, ResultRecord, ATTEMPTS, CHARGE_UNKNOWN, ERROR_KIND, ERROR_REASON};
pub use offsets::OffsetTracker;
pub use publisher::Publisher;
mod tools;
mod workload;

pub use tools::{
    dry_run_verdicts, partition_count, produce, publish_records, read_partitions, redrive, replay,
    rewind_group, serve_health, DryRunVerdict, HealthServer, OutcomeView, ProduceArgs, RedriveArgs,
    ReplayArgs,
};
pub use workload::{generate, RecordKind, WorkloadRecord, WorkloadSpec};
