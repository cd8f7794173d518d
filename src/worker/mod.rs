//! The Kafka consumer-group worker (invariant I3: offsets move only past finished commands).
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
mod transactions;

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
pub use transactions::{AnswerGuard, TransactionFailure, Transactions};
mod dry_run;
mod tools;
mod workload;

pub use dry_run::{
    dry_run_report, dry_run_verdicts, DryRunReport, DryRunScope, DryRunVerdict, VERDICTS,
};
pub use tools::{
    partition_count, produce, publish_records, read_partitions, read_ranges, redrive, replay,
    rewind_group, OutcomeView, PartitionRange, ProduceArgs, RedriveArgs, ReplayArgs,
};
pub use workload::{generate, RecordKind, WorkloadRecord, WorkloadSpec};
