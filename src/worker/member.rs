//! The member's partitions and what a rebalance does to them. `Partitions` holds the
//! partition tasks the poll thread feeds; `MemberContext` is librdkafka's context
//! for the member: its rebalance callback assigns partitions, and drains and commits
//! (or, exactly-once, settles the transaction of) those it revokes, while the group
//! stays stable. Under the cooperative protocol (KIP-429, `cooperative-sticky`, the
//! default) an assignment or a revocation names only the partitions that move, so
//! the callback calls `incremental_assign` / `incremental_unassign`; under an eager
//! assignor every revoke is of everything, and `assign` / `unassign` apply. The
//! commits themselves are `commits.rs`'s; the callback's steps are in
//! `rebalance_callback.rs`, the exactly-once settling and rewinding in
//! `member_transactions.rs`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, TopicPartitionList};
use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::answer_sink::AnswerSink;
use super::commits::{Commits, PartitionId};
use super::handler::Handler;
use super::health::Liveness;
use super::partition::{PanicCounts, PartitionTask};
use super::supervision::WorkerFailure;
use crate::configuration::{KafkaSettings, WorkerSettings};
use crate::telemetry::events::ConsumerLagMeasured;

/// The group member's consumer.
pub(super) type Member = BaseConsumer<MemberContext>;

pub(super) struct Assigned {
    inbox: mpsc::Sender<OwnedMessage>,
    /// Records the inbox had no room for; the partition is paused meanwhile.
    overflow: VecDeque<OwnedMessage>,
    pub(super) abandon: CancellationToken,
    /// Ends with the last offset the task stored, if any.
    pub(super) task: JoinHandle<Option<i64>>,
}

/// Partitions this member is working on. Touched only from the poll thread (the
/// rebalance callbacks run there too); the mutex only satisfies `Sync`.
pub(super) struct Partitions {
    assigned: Mutex<HashMap<(String, i32), Assigned>>,
    /// The group's current assignment to this member (a partition is here before
    /// its first record arrives, unlike in `assigned`).
    pub(super) owned: Mutex<HashSet<PartitionId>>,
    pub(super) commits: Arc<Commits>,
    pub(super) handler: Arc<Handler>,
    pub(super) runtime: Handle,
    max_in_flight: usize,
    drain_deadline: Duration,
    consumer: OnceLock<std::sync::Weak<Member>>,
    group_id: Arc<str>,
    pub(super) liveness: Arc<Liveness>,
    /// A static member (`group.instance.id`) does not leave the group on shutdown.
    pub(super) static_member: bool,
    pub(super) session_timeout: Duration,
    /// Where answers and offsets go, the handler's (exactly-once: the open
    /// transaction).
    pub(super) sink: AnswerSink,
    /// How often each record panicked, across the partition tasks that handled it.
    panics: Arc<PanicCounts>,
    /// A failure found inside a rebalance callback, reported by the poll loop.
    pub(super) failure: Mutex<Option<WorkerFailure>>,
}

impl Partitions {
    /// The partitions of a member that holds none yet; `attach` gives it its consumer.
    pub(super) fn new(
        kafka: &KafkaSettings,
        worker: &WorkerSettings,
        handler: Arc<Handler>,
        liveness: Arc<Liveness>,
    ) -> Self {
        Self {
            assigned: Mutex::new(HashMap::new()),
            owned: Mutex::new(HashSet::new()),
            commits: Arc::new(Commits::default()),
            sink: handler.sink().clone(),
            handler,
            runtime: Handle::current(),
            max_in_flight: worker.max_in_flight,
            drain_deadline: worker.drain_deadline,
            consumer: OnceLock::new(),
            group_id: Arc::from(kafka.group_id.as_str()),
            liveness,
            static_member: kafka.group_instance_id.is_some(),
            session_timeout: kafka.session_timeout,
            panics: Arc::default(),
            failure: Mutex::new(None),
        }
    }

    /// The consumer whose partitions these are (held weakly: the consumer's context
    /// holds these partitions).
    pub(super) fn attach(&self, consumer: &Arc<Member>) {
        let _ = self.consumer.set(Arc::downgrade(consumer));
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, i32), Assigned>> {
        // A poisoned map is still a valid map: every mutation is a single insert/remove.
        self.assigned.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn dispatch(&self, consumer: &Arc<Member>, message: OwnedMessage) {
        let id = (message.topic().to_owned(), message.partition());
        self.sink.first_record(&id.0, id.1, message.offset());
        let mut assigned = self.lock();
        let entry = assigned.entry(id.clone()).or_insert_with(|| {
            // Where this member's ownership of the partition begins: with the
            // previous owner's last offset, it tells whether the two overlapped.
            let member = super::kafka::group_generation(consumer.as_ref());
            tracing::info!(
                partition = id.1,
                offset = message.offset(),
                generation = member.as_ref().map(|m| m.generation),
                member_id = member.as_ref().map(|m| m.member_id.as_str()),
                "first record of the partition"
            );
            // librdkafka resumes a paused partition only at its broker thread's next
            // wake-up (up to 1 s later), so the inbox holds about a second of work;
            // sized to max_in_flight alone, every pause idled the partition (bench:
            // ~160 payments/s whatever the gateway latency).
            let (inbox, receiver) = mpsc::channel(self.max_in_flight.max(1).max(1024));
            let abandon = CancellationToken::new();
            let task = PartitionTask {
                topic: id.0.clone(),
                partition: id.1,
                inbox: receiver,
                abandon: abandon.clone(),
                consumer: Arc::clone(consumer),
                handler: Arc::clone(&self.handler),
                group_id: Arc::clone(&self.group_id),
                max_in_flight: self.max_in_flight.max(1),
                progress: self.commits.progress_flag(),
                sink: self.sink.clone(),
                panics: Arc::clone(&self.panics),
            };
            let task = self.runtime.spawn(task.run());
            Assigned {
                inbox,
                overflow: VecDeque::new(),
                abandon,
                task,
            }
        });
        if !entry.overflow.is_empty() {
            entry.overflow.push_back(message);
            return;
        }
        match entry.inbox.try_send(message) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(message)) => {
                entry.overflow.push_back(message);
                pause(consumer, &id, true);
            }
            // The partition task is gone; the record stays uncommitted.
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    /// Moves held records into inboxes with room, and resumes partitions that caught up.
    pub(super) fn relieve(&self, consumer: &Member) {
        let mut assigned = self.lock();
        for (id, entry) in assigned.iter_mut().filter(|(_, e)| !e.overflow.is_empty()) {
            while let Some(message) = entry.overflow.pop_front() {
                match entry.inbox.try_send(message) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(message)) => {
                        entry.overflow.push_front(message);
                        break;
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => {
                        entry.overflow.clear();
                        break;
                    }
                }
            }
            if entry.overflow.is_empty() {
                pause(consumer, id, false);
            }
        }
    }

    /// Stops taking records for `ids` at once (the inboxes' records are not started),
    /// lets what was admitted finish within the drain deadline (abandoning the rest), and
    /// leaves the final offsets stored; returns them.
    pub(super) fn drain(&self, ids: &[(String, i32)]) -> HashMap<PartitionId, i64> {
        let drained: Vec<(PartitionId, Assigned)> = {
            let mut assigned = self.lock();
            ids.iter()
                .filter_map(|id| assigned.remove_entry(id))
                .collect()
        };
        if drained.is_empty() {
            return HashMap::new();
        }
        let deadline = tokio::time::Instant::now() + self.drain_deadline;
        self.runtime.block_on(async move {
            // Dropping the inboxes (with the overflow) tells every task to start
            // nothing new; only commands already running go on.
            let tasks: Vec<(PartitionId, CancellationToken, JoinHandle<Option<i64>>)> = drained
                .into_iter()
                .map(|(id, entry)| (id, entry.abandon, entry.task))
                .collect();
            let mut reached = HashMap::new();
            for (id, abandon, mut task) in tasks {
                // Each handle is awaited to completion exactly once.
                let stored = match tokio::time::timeout_at(deadline, &mut task).await {
                    Ok(joined) => joined.ok().flatten(),
                    Err(_) => {
                        tracing::warn!(
                            partition = id.1,
                            "drain deadline passed; abandoning in-flight commands"
                        );
                        abandon.cancel();
                        match tokio::time::timeout(Duration::from_secs(2), &mut task).await {
                            Ok(joined) => joined.ok().flatten(),
                            Err(_) => {
                                // Not even abandoning ended it (a command stuck in
                                // blocking code): it must not outlive the partition.
                                task.abort();
                                None
                            }
                        }
                    }
                };
                if let Some(offset) = stored {
                    reached.insert(id, offset);
                }
            }
            reached
        })
    }

    /// Adds (`owned`) or removes `ids` from this member's assignment; returns how
    /// many partitions it holds now.
    pub(super) fn own(&self, ids: &[PartitionId], owned: bool) -> usize {
        let mut set = self.owned.lock().unwrap_or_else(|p| p.into_inner());
        for id in ids {
            if owned {
                set.insert(id.clone());
            } else {
                set.remove(id);
            }
        }
        set.len()
    }

    /// Every partition of the current assignment.
    pub(super) fn ids(&self) -> Vec<(String, i32)> {
        let owned = self.owned.lock().unwrap_or_else(|p| p.into_inner());
        let mut ids: HashSet<PartitionId> = owned.iter().cloned().collect();
        ids.extend(self.lock().keys().cloned());
        ids.into_iter().collect()
    }

    /// A partition whose task ended while still assigned: only a drain ends a task
    /// on purpose (and removes it first), so this one died.
    pub(super) fn dead(&self) -> Option<(String, i32)> {
        self.lock()
            .iter()
            .find(|(_, entry)| entry.task.is_finished())
            .map(|(id, _)| id.clone())
    }
}

pub(super) fn pause(consumer: &Member, id: &(String, i32), paused: bool) {
    let mut list = TopicPartitionList::new();
    list.add_partition(&id.0, id.1);
    let result = if paused {
        consumer.pause(&list)
    } else {
        consumer.resume(&list)
    };
    if let Err(error) = result {
        tracing::debug!(%error, partition = id.1, paused, "pause/resume failed");
    }
}

pub struct MemberContext {
    pub(super) partitions: Arc<Partitions>,
    pub(super) assigned: Arc<AtomicUsize>,
}

impl ClientContext for MemberContext {
    /// librdkafka statistics (enabled with metrics): consumer lag per partition.
    /// A partition this member does not fetch (revoked, or never assigned) reports 0:
    /// the gauge would otherwise keep the last value it had here, and dashboards fold
    /// the members' reports with `max by (partition)`.
    fn stats(&self, statistics: rdkafka::Statistics) {
        for topic in statistics.topics.values() {
            for (partition, stats) in &topic.partitions {
                let fetching =
                    !matches!(stats.fetch_state.as_str(), "none" | "stopping" | "stopped");
                let value = if fetching { stats.consumer_lag } else { 0 };
                if *partition >= 0 && value >= 0 {
                    crate::telemetry::emit(ConsumerLagMeasured {
                        partition: *partition,
                        lag: value,
                    });
                }
            }
        }
    }
}

impl ConsumerContext for MemberContext {
    /// Replaces rdkafka's default, which ignores the outcome of (incremental)
    /// assign/unassign and cannot drain before giving partitions up; see
    /// `commits.rs`.
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        list: &mut TopicPartitionList,
    ) {
        self.on_rebalance(consumer, err, list);
    }
}
