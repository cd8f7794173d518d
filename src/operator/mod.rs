//! Operator commands around the worker: `produce`, `replay` (and its dry run),
//! `dlq redrive`, `healthcheck`, `key-hash`, and the outcome `process` prints. They use the worker's Kafka
//! settings and message formats; the worker itself never calls them.
mod dry_run;
mod dry_run_report;
mod group_members;
mod healthcheck;
mod key_hash;
mod outcome_view;
mod produce;
mod redrive;
mod refund_workload;
mod replay;
mod restarts;
mod topics;
mod workload;

pub use dry_run::{dry_run_report, dry_run_verdicts, DryRunScope};
pub use dry_run_report::{DryRunReport, DryRunVerdict, VERDICTS};
pub use healthcheck::{healthcheck, HealthcheckArgs, Probe};
pub use key_hash::{key_hash, KeyHashArgs};
pub use outcome_view::OutcomeView;
pub use produce::{produce, publish_records, ProduceArgs};
pub use redrive::{redrive, RedriveArgs};
pub use refund_workload::{expected_refunds, fit_refunds, refunds_for, RefundExpectation};
pub use replay::{replay, rewind_group, ReplayArgs};
pub use topics::{partition_count, read_partitions, read_ranges, PartitionRange};
pub use workload::{generate, numbered_key, RecordKind, WorkloadRecord, WorkloadSpec};
