//! How failures are retried: the backoff between attempts and the budget they fit
//! in. Which database failures are worth retrying is `database_errors.rs`'s.

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
