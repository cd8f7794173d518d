//! The summaries a phase's report is made of: latency percentiles, the backlog
//! phase's drain and the purge under the Postgres-token phase.

use serde::Serialize;

/// Nearest-rank percentile of an ascending slice; 0 for an empty one.
pub fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct LatencySummary {
    pub samples: usize,
    pub p50_ms: i64,
    pub p95_ms: i64,
    pub p99_ms: i64,
    pub p999_ms: i64,
    pub max_ms: i64,
}

impl LatencySummary {
    pub fn of(mut values: Vec<i64>) -> Self {
        values.sort_unstable();
        Self {
            samples: values.len(),
            p50_ms: percentile(&values, 50.0),
            p95_ms: percentile(&values, 95.0),
            p99_ms: percentile(&values, 99.0),
            p999_ms: percentile(&values, 99.9),
            max_ms: values.last().copied().unwrap_or(0),
        }
    }
}

/// What the backlog phase measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BacklogReport {
    pub commands: usize,
    /// Commands that repeat an earlier one's key.
    pub duplicates: usize,
    /// Of those, on another partition than the key's first answer.
    pub cross_partition_duplicates: usize,
    /// From the worker owning every partition to the last answer (s).
    pub makespan_s: f64,
    /// From the worker's start to its owning every partition (s): the group join,
    /// outside the makespan.
    pub join_s: f64,
    /// Read (earliest possible, see `backlog.rs`) to answered, per command (ms).
    pub read_to_answer: LatencySummary,
    /// The same distribution as (percentile, ms) points, up to its maximum.
    pub read_to_answer_curve: Vec<(f64, i64)>,
    /// Cross-partition duplicates read before the key's first answer: their answer
    /// minus that first answer (ms), i.e. how long after the holder settled they
    /// were answered (the holder answers right after it settles).
    pub duplicate_wake: LatencySummary,
}

/// The purge running under the `e2e-0ms-pgtokens-purging` phase.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PurgeReport {
    /// Dead token rows inserted before the phase: twice what the purge, timed first
    /// on rows of its own, deletes in the plain Postgres-token phase's time.
    pub expired_rows: u64,
    /// Rows the purge deleted before it found none left or the phase ended.
    pub purged_rows: u64,
    /// From the phase's first reservation until the purge found nothing left or the
    /// phase ended.
    pub purge_s: f64,
    /// The phase's first to last result: the purge covered it when `purge_s` ≥ this.
    pub phase_s: f64,
    /// Rows per purge statement.
    pub batch: usize,
}
