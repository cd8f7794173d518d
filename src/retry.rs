//! The one place that says which failures are worth retrying, and how.

use std::time::Duration;

use backon::ExponentialBuilder;

/// Exponential backoff with jitter, bounded by a total budget (retries are exhausted
/// after 5 minutes by default). backon's jitter adds up to the delay again, so each
/// wait is between the current delay and twice it.
///
/// The longest delay is short (1 s, so at most 2 s between attempts) because it is
/// also how late a worker notices that a dependency came back: with 10 s, the
/// commands that failed through a 6 s partition slept up to 20 s after it healed,
/// and recovery took three times as long as the fault. The cost of short delays
/// during a long outage is an attempt per waiting command every second or two,
/// each failing fast.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// First wait between attempts.
    pub min_delay: Duration,
    /// Longest wait between attempts.
    pub max_delay: Duration,
    /// No retry starts once this much time has passed since the first attempt.
    pub budget: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            min_delay: Duration::from_millis(50),
            max_delay: Duration::from_secs(1),
            budget: Duration::from_secs(300),
        }
    }
}

impl RetryPolicy {
    /// Exponential backoff with jitter between `min_delay` and `max_delay`.
    pub fn backoff(&self) -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_min_delay(self.min_delay)
            .with_max_delay(self.max_delay)
            .with_total_delay(Some(self.budget))
            .without_max_times()
            .with_jitter()
    }
}

/// Postgres failures that a later attempt can overcome: the connection, the pool,
/// and the server states that abort a transaction without it being our fault.
pub fn is_transient_sqlx(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => {
            matches!(
                db.code().as_deref(),
                // serialization_failure, deadlock_detected, lock_not_available,
                // admin/crash shutdown, cannot_connect_now, too_many_connections,
                // query_canceled (statement timeout), connection exceptions (08xxx).
                Some("40001" | "40P01" | "55P03" | "57P01" | "57P02" | "57P03" | "53300" | "57014")
            ) || db.code().is_some_and(|c| c.starts_with("08"))
        }
        _ => false,
    }
}

/// What a failed database call means for the command that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatabaseFailure {
    /// A later attempt can succeed (see [`is_transient_sqlx`]), or we cannot tell.
    Retryable,
    /// The database refused the command's data for good: SQLSTATE class 22 (data
    /// exception, e.g. a NUL in text) or 23 (integrity constraint; the unique key
    /// the design relies on is handled with `ON CONFLICT` and never gets here).
    RefusedData,
    /// Our own SQL is wrong (class 42: syntax, undefined table or column,
    /// permission). Retrying cannot help and would hold the partition for the
    /// whole retry budget.
    Bug,
}

/// Classifies a failed database call by its SQLSTATE class.
pub fn classify_sqlx(error: &sqlx::Error) -> DatabaseFailure {
    if is_transient_sqlx(error) {
        return DatabaseFailure::Retryable;
    }
    let sqlx::Error::Database(db) = error else {
        return DatabaseFailure::Retryable;
    };
    match db
        .code()
        .as_deref()
        .map(|code| code.get(..2).unwrap_or(code))
    {
        Some("22" | "23") => DatabaseFailure::RefusedData,
        Some("42") => DatabaseFailure::Bug,
        _ => DatabaseFailure::Retryable,
    }
}
