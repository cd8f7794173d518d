//! A command's life in the worker: admitted, retried, dead-lettered, finished, or
//! lost to a panic or an abandoned partition.

use std::fmt::Display;
use std::time::Duration;

use opentelemetry::KeyValue;

use super::InternalEvent;
use crate::telemetry::metrics::metrics;

/// A record's task started (`payment_worker.commands.in_flight` +1).
pub struct CommandStarted;

impl InternalEvent for CommandStarted {
    fn emit(self) {
        metrics().in_flight.add(1, &[]);
    }
}

/// A record's task was joined, however it ended (`payment_worker.commands.in_flight` −1).
pub struct CommandEnded;

impl InternalEvent for CommandEnded {
    fn emit(self) {
        metrics().in_flight.add(-1, &[]);
    }
}

/// Running tasks aborted with their partition: they are never joined, so they leave
/// the in-flight gauge here.
pub struct CommandsAbandoned {
    /// Tasks aborted.
    pub count: usize,
}

impl InternalEvent for CommandsAbandoned {
    fn emit(self) {
        let count = i64::try_from(self.count).unwrap_or(i64::MAX);
        metrics().in_flight.add(-count, &[]);
    }
}

/// A command answered (`payment_worker.commands` and `payment_worker.command.duration`,
/// by outcome).
pub struct CommandFinished {
    /// The outcome's label (`Outcome::label`).
    pub outcome: &'static str,
    /// From the first attempt to the published answer.
    pub duration: Duration,
}

impl InternalEvent for CommandFinished {
    fn emit(self) {
        let labels = [KeyValue::new("outcome", self.outcome)];
        let metrics = metrics();
        metrics.commands.add(1, &labels);
        metrics
            .processing_duration
            .record(self.duration.as_secs_f64(), &labels);
    }
}

/// An attempt ended in a retry (`payment_worker.command.retries`).
pub struct CommandRetried<'a> {
    /// Why the attempt was not final.
    pub reason: &'a str,
    /// The wait before the next attempt.
    pub after: Duration,
}

impl InternalEvent for CommandRetried<'_> {
    fn emit(self) {
        metrics().retries.add(1, &[]);
        tracing::debug!(reason = %self.reason, after = ?self.after, "retrying command");
    }
}

/// A command rejected: its answer goes to the dead-letter topic
/// (`payment_worker.dead_letters`, by kind).
pub struct RecordDeadLettered<'a> {
    /// The rejection's code (`RejectionKind::as_str`).
    pub kind: &'static str,
    /// The rejection in words (logged, never a label).
    pub reason: &'a dyn Display,
    /// The record's partition.
    pub partition: i32,
    /// The record's offset.
    pub offset: i64,
}

impl InternalEvent for RecordDeadLettered<'_> {
    fn emit(self) {
        tracing::info!(
            kind = self.kind,
            reason = %self.reason,
            partition = self.partition,
            offset = self.offset,
            "dead-lettering"
        );
        metrics()
            .dead_letters
            .add(1, &[KeyValue::new("kind", self.kind)]);
    }
}

/// Handling a record panicked (`payment_worker.panics`); logged at `error`.
pub struct HandlerPanicked<'a> {
    /// The record's partition.
    pub partition: i32,
    /// The record's offset.
    pub offset: i64,
    /// Panics of this record so far, this one included.
    pub panics: u32,
    /// The panic's message, card numbers already redacted.
    pub panic: &'a str,
}

impl InternalEvent for HandlerPanicked<'_> {
    fn emit(self) {
        metrics().panics.add(1, &[]);
        tracing::error!(
            partition = self.partition,
            offset = self.offset,
            panics = self.panics,
            panic = %self.panic,
            "handling a record panicked; its token is left to its lease"
        );
    }
}
