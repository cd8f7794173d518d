//! One assigned partition: commands of different keys run concurrently (bounded),
//! commands of one key strictly in order, and the stored offset never passes a
//! command that is not finished (invariant I3).
//!
//! A panic while handling one record is caught here, counted and treated as an
//! unknown outcome: the record is handled again after a pause (its token was left
//! to its lease, so the next attempt looks the charge up), and the third panic
//! dead-letters it as `internal`. The partition task itself never dies of it. The
//! count outlives the task (`PanicCounts`): in exactly-once mode a panic after the
//! command answered aborts the transaction, and the rewind restarts its partition
//! with a new task.

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;

use rdkafka::consumer::{BaseConsumer, ConsumerContext};
use rdkafka::message::{Message, OwnedMessage};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::answer_sink::{AnswerHold, AnswerPlace, AnswerSink, PartitionAnswers};
use super::handler::Handler;
use super::offsets::OffsetTracker;
use super::spans::{command_span_named, PartitionNames};
use super::supervision::panic_message;
use crate::telemetry::events::{CommandEnded, CommandStarted, CommandsAbandoned, HandlerPanicked};

/// Records of one key wait behind the one running; keyless records share one lane.
/// Shared, not copied: the queue map and the command's task each hold it.
type Lane = Option<Arc<[u8]>>;

/// The partition-local serialisation key of a record: its Kafka key.
pub fn lane_of(message: &OwnedMessage) -> Option<Arc<[u8]>> {
    message.key().map(Arc::from)
}

/// The panic that dead-letters a record as `internal`.
pub const PANICS_BEFORE_DEAD_LETTER: u32 = 3;

/// How often handling each record of this member panicked, kept by the process and
/// not by a partition task: a task restarted by an exactly-once rewind would
/// otherwise count from zero, so a record that panics after answering would abort
/// every transaction of the member and never be dead-lettered.
#[derive(Debug, Default)]
pub struct PanicCounts {
    counts: Mutex<HashMap<(String, i32, i64), u32>>,
}

impl PanicCounts {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, i32, i64), u32>> {
        // Every mutation is a single insert/remove/increment: a poisoned map is valid.
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Panics so far of the record at this position.
    fn of(&self, topic: &str, partition: i32, offset: i64) -> u32 {
        let counts = self.lock();
        if counts.is_empty() {
            return 0;
        }
        counts
            .get(&(topic.to_owned(), partition, offset))
            .copied()
            .unwrap_or(0)
    }

    /// Counts one more panic of the record; returns the count.
    fn record(&self, topic: &str, partition: i32, offset: i64) -> u32 {
        let mut counts = self.lock();
        let count = counts
            .entry((topic.to_owned(), partition, offset))
            .or_default();
        *count += 1;
        *count
    }

    /// The record settled: nothing to remember about it.
    fn settled(&self, topic: &str, partition: i32, offset: i64) {
        let mut counts = self.lock();
        if !counts.is_empty() {
            counts.remove(&(topic.to_owned(), partition, offset));
        }
    }
}

/// How a command task ended.
enum Ending {
    /// The outcome is final and acknowledged (exactly-once: in the open transaction,
    /// whose gate it holds until the tracker recorded the command as settled, see
    /// `transactions.rs`): the offset may move past it.
    Settled(AnswerHold),
    /// A drain stopped it first: the offset stays pending.
    Interrupted,
    /// Handling it panicked (this many times so far, counted when it was caught);
    /// the record comes back to be tried again.
    Panicked(OwnedMessage, u32),
}

struct Finished {
    offset: i64,
    lane: Lane,
    ending: Ending,
    /// Kept open so the offset commit is recorded inside the command's trace.
    span: tracing::Span,
}

/// One command's task: what it needs once spawned.
struct CommandTask {
    handler: Arc<Handler>,
    message: OwnedMessage,
    lane: Lane,
    place: AnswerPlace,
    draining: CancellationToken,
    span: tracing::Span,
    counts: Arc<PanicCounts>,
    partition: i32,
    offset: i64,
    /// Times handling this record panicked so far.
    panics: u32,
}

impl CommandTask {
    /// Handles the record after a pause that grows with each panic, or, at the
    /// limit, dead-letters it as `internal` without handling it again.
    async fn run(self) -> Finished {
        let Self {
            handler,
            message,
            lane,
            place,
            draining,
            span,
            counts,
            partition,
            offset,
            panics,
        } = self;
        if panics > 0 {
            let pause = Duration::from_millis(200 << panics.min(5));
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = draining.cancelled() => {}
            }
        }
        // Boxed so that wrapping it (span, unwind guard) moves a pointer, not the
        // handler's multi-kilobyte future.
        let work = Box::pin(async {
            if panics >= PANICS_BEFORE_DEAD_LETTER {
                handler.give_up_after_panics(&message, panics, place).await
            } else if panics > 0 && draining.is_cancelled() {
                // Handling it again is a retry, and a drain stops retries.
                None
            } else {
                handler.handle(&message, &draining, place).await
            }
        });
        let caught = AssertUnwindSafe(work.instrument(span.clone()))
            .catch_unwind()
            .await;
        let ending = match caught {
            Ok(Some(answer)) => Ending::Settled(answer.hold),
            Ok(None) => Ending::Interrupted,
            Err(panic) => {
                // Counted here, where it was caught: an exactly-once abort may
                // abandon this partition task before it joins this one, and a
                // panic counted only there would be forgotten and handled again.
                let count = counts.record(message.topic(), partition, offset);
                span.in_scope(|| {
                    crate::telemetry::emit(HandlerPanicked {
                        partition,
                        offset,
                        panics: count,
                        panic: &panic_message(panic.as_ref()),
                    })
                });
                Ending::Panicked(message, count)
            }
        };
        Finished {
            offset,
            lane,
            ending,
            span,
        }
    }
}

/// The partition task's commands: admitted, queued behind their key, running.
struct Commands {
    offsets: OffsetTracker,
    waiting: HashMap<Lane, VecDeque<OwnedMessage>>,
    running: JoinSet<Finished>,
    /// Cancelled once the inbox closed: retries stop.
    draining: CancellationToken,
    admitted: usize,
    /// Exactly-once: the answers enter the open transaction in offset order.
    answers: PartitionAnswers,
    /// The partition's span names and ids, formatted once for all its commands.
    names: PartitionNames,
}

impl Commands {
    fn new(sink: &AnswerSink, topic: &str, partition: i32) -> Self {
        Self {
            offsets: OffsetTracker::default(),
            waiting: HashMap::new(),
            running: JoinSet::new(),
            draining: CancellationToken::new(),
            admitted: 0,
            answers: sink.partition_answers(),
            names: PartitionNames::new(topic, partition),
        }
    }
}

/// Abandoned commands keep their offsets pending: the next owner of the partition
/// processes them again, and their tokens' leases expire.
fn abandon_running(running: &mut JoinSet<Finished>) {
    // Aborted tasks are never joined: take them off the gauge here.
    crate::telemetry::emit(CommandsAbandoned {
        count: running.len(),
    });
    running.abort_all();
}

pub struct PartitionTask<C: ConsumerContext + 'static> {
    pub topic: String,
    pub partition: i32,
    pub inbox: mpsc::Receiver<OwnedMessage>,
    /// Cancelled when the drain deadline passed: abandon what still runs.
    pub abandon: CancellationToken,
    pub consumer: Arc<BaseConsumer<C>>,
    pub handler: Arc<Handler>,
    pub group_id: Arc<str>,
    pub max_in_flight: usize,
    /// Raised whenever this task stored a higher offset: the member commits soon.
    pub progress: Arc<AtomicBool>,
    /// Where answers and settled offsets go (exactly-once: the open transaction,
    /// not the consumer).
    pub sink: AnswerSink,
    /// The member's panic counts, which outlive this task.
    pub panics: Arc<PanicCounts>,
}

impl<C: ConsumerContext + 'static> PartitionTask<C> {
    /// Returns the last offset stored (where the next owner should start).
    pub async fn run(mut self) -> Option<i64> {
        let mut commands = Commands::new(&self.sink, &self.topic, self.partition);
        let mut inbox_open = true;
        // A revoke drops the inbox's sender, but `recv` still hands out what was
        // buffered (up to the inbox's capacity): the closure itself is the signal to
        // start nothing new, checked on every wake-up and at least every 50 ms.
        let mut closure_check = tokio::time::interval(std::time::Duration::from_millis(50));
        closure_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if inbox_open && self.inbox.is_closed() {
                // Revoked or shutting down: admit nothing new, and finish every
                // command already admitted, those queued behind their key included.
                // The inbox holds only offsets above them, so the offset stored at the
                // end is the first one never admitted: a command left pending below
                // answered ones would make the next owner answer those again. Retries
                // stop (`draining`); the drain deadline bounds the rest.
                inbox_open = false;
                commands.draining.cancel();
                if commands.running.is_empty() {
                    break;
                }
            }
            tokio::select! {
                biased;
                _ = self.abandon.cancelled() => {
                    abandon_running(&mut commands.running);
                    break;
                }
                Some(joined) = commands.running.join_next(), if !commands.running.is_empty() => {
                    crate::telemetry::emit(CommandEnded);
                    // Every task catches its own panics; an error here is an abort.
                    let Ok(finished) = joined else { continue };
                    self.finished(&mut commands, finished, inbox_open);
                }
                received = self.inbox.recv(), if inbox_open && commands.admitted < self.max_in_flight => {
                    // Closed: the check at the top of the loop stops admitting; this
                    // record stays pending like the rest of the queue.
                    let Some(message) = received.filter(|_| !self.inbox.is_closed()) else {
                        continue;
                    };
                    self.admit(&mut commands, message);
                }
                _ = closure_check.tick(), if inbox_open => {}
            }
            if !inbox_open && commands.running.is_empty() {
                break;
            }
        }
        self.store(&mut commands);
        tracing::debug!(topic = %self.topic, partition = self.partition, "partition drained");
        commands.offsets.stored()
    }

    /// A command task ended: settled, its offset may move and the next command of its
    /// key starts; otherwise the key's queued commands are left to the next owner.
    /// A panicked record is handled again in its place while the inbox is open.
    fn finished(&self, commands: &mut Commands, finished: Finished, inbox_open: bool) {
        let Finished {
            offset,
            lane,
            ending,
            span,
        } = finished;
        let settled = matches!(ending, Ending::Settled(_));
        match ending {
            Ending::Settled(hold) => {
                self.panics.settled(&self.topic, self.partition, offset);
                commands.offsets.complete(offset);
                span.in_scope(|| self.store(commands));
                // Only now may a commit run: its offsets include this one.
                hold.settled();
            }
            Ending::Interrupted => commands.answers.stop(offset),
            Ending::Panicked(message, count) => {
                if inbox_open && !self.inbox.is_closed() {
                    // Same lane, same place: the records behind it wait.
                    self.spawn(commands, message, lane, count);
                    return;
                }
                commands.answers.stop(offset);
            }
        }
        commands.admitted -= 1;
        if settled {
            match commands
                .waiting
                .get_mut(&lane)
                .and_then(VecDeque::pop_front)
            {
                Some(message) => self.start(commands, message, lane),
                None => {
                    commands.waiting.remove(&lane);
                }
            }
        } else {
            // Not answered: the key's later commands wait for the next
            // owner too, which answers them in order after this one.
            for queued in commands.waiting.remove(&lane).into_iter().flatten() {
                commands.admitted -= 1;
                commands.answers.stop(queued.offset());
            }
        }
    }

    /// A record received: admitted, and started unless a command of its key runs
    /// (then it waits behind it).
    fn admit(&self, commands: &mut Commands, message: OwnedMessage) {
        commands.admitted += 1;
        commands.offsets.admit(message.offset());
        commands.answers.admit(message.offset());
        let lane = lane_of(&message);
        if let Some(queue) = commands.waiting.get_mut(&lane) {
            queue.push_back(message);
        } else {
            commands.waiting.insert(lane.clone(), VecDeque::new());
            self.start(commands, message, lane);
        }
    }

    fn start(&self, commands: &mut Commands, message: OwnedMessage, lane: Lane) {
        let panics = self
            .panics
            .of(&self.topic, self.partition, message.offset());
        self.spawn(commands, message, lane, panics);
    }

    /// Handles `message`, which has made its handler panic `panics` times so far:
    /// after a pause that grows with each panic, or, at the limit, by dead-lettering
    /// it as `internal` without handling it again.
    fn spawn(&self, commands: &mut Commands, message: OwnedMessage, lane: Lane, panics: u32) {
        let task = CommandTask {
            handler: Arc::clone(&self.handler),
            place: commands.answers.place(message.offset()),
            draining: commands.draining.clone(),
            span: command_span_named(&message, &self.group_id, &commands.names),
            counts: Arc::clone(&self.panics),
            partition: self.partition,
            offset: message.offset(),
            message,
            lane,
            panics,
        };
        crate::telemetry::emit(CommandStarted);
        // Boxed: the task's future holds the whole handling of a command (token,
        // transaction, gateway POST, answer), several kilobytes that tokio would
        // otherwise copy into the task's cell on every spawn.
        commands.running.spawn(Box::pin(task.run()));
    }

    fn store(&self, commands: &mut Commands) {
        let Some(next) = commands.offsets.advance() else {
            return;
        };
        // The member's commit thread commits stored offsets as soon as they move (one
        // commit at a time); a drain and the shutdown commit too.
        let _span = tracing::info_span!(
            "offset commit",
            otel.kind = "client",
            messaging.system = "kafka",
            messaging.operation.type = "settle",
            messaging.destination.partition.id = commands.names.partition_id(),
            messaging.kafka.offset = next,
        )
        .entered();
        // At-least-once the consumer stores it, which fails only once the
        // partition is no longer ours (the new owner decides then); exactly-once it
        // goes with the open transaction.
        if self
            .sink
            .settle(&self.consumer, &self.topic, self.partition, next)
        {
            self.progress.store(true, Ordering::SeqCst);
        }
    }
}
