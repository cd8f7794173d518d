//! The consumer-group member. librdkafka is polled on a dedicated thread so the
//! rebalance callback may block while revoked partitions drain; the commands
//! themselves run on the tokio runtime.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::Context;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, TopicPartitionList};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::handler::Handler;
use super::health::{serve_health, HealthChecks, Liveness};
use super::partition::{PanicCounts, PartitionTask};
use super::rebalance::{Commits, Committer, PartitionId};
use super::supervision::{is_fatal_broker_error, panic_message, WorkerFailure};
use super::transactions::{TransactionFailure, Transactions};
use crate::configuration::{KafkaSettings, WorkerSettings};

type Member = BaseConsumer<MemberContext>;

struct Assigned {
    inbox: mpsc::Sender<OwnedMessage>,
    /// Records the inbox had no room for; the partition is paused meanwhile.
    overflow: VecDeque<OwnedMessage>,
    abandon: CancellationToken,
    /// Ends with the last offset the task stored, if any.
    task: JoinHandle<Option<i64>>,
}

/// Partitions this member is working on. Touched only from the poll thread (the
/// rebalance callbacks run there too); the mutex only satisfies `Sync`.
pub(super) struct Partitions {
    assigned: Mutex<HashMap<(String, i32), Assigned>>,
    /// The group's current assignment to this member (a partition is here before
    /// its first record arrives, unlike in `assigned`).
    owned: Mutex<HashSet<PartitionId>>,
    pub(super) commits: Arc<Commits>,
    handler: Arc<Handler>,
    runtime: Handle,
    max_in_flight: usize,
    drain_deadline: Duration,
    consumer: OnceLock<std::sync::Weak<Member>>,
    group_id: Arc<str>,
    pub(super) liveness: Arc<Liveness>,
    /// A static member (`group.instance.id`) does not leave the group on shutdown.
    static_member: bool,
    session_timeout: Duration,
    /// Exactly-once mode: the open transaction that results and offsets go into.
    pub(super) transactions: Option<Arc<Transactions>>,
    /// How often each record panicked, across the partition tasks that handled it.
    panics: Arc<PanicCounts>,
    /// A failure found inside a rebalance callback, reported by the poll loop.
    pub(super) failure: Mutex<Option<WorkerFailure>>,
}

impl Partitions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, i32), Assigned>> {
        // A poisoned map is still a valid map: every mutation is a single insert/remove.
        self.assigned.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn dispatch(&self, consumer: &Arc<Member>, message: OwnedMessage) {
        let id = (message.topic().to_owned(), message.partition());
        if let Some(transactions) = &self.transactions {
            transactions.first_record(&id.0, id.1, message.offset());
        }
        let mut assigned = self.lock();
        let entry = assigned.entry(id.clone()).or_insert_with(|| {
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
                transactions: self.transactions.clone(),
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
    fn relieve(&self, consumer: &Member) {
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

    /// Stops taking records for `ids` at once (queued records are not started),
    /// lets what runs finish within the drain deadline (abandoning the rest), and
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

    /// Exactly-once: commits the open transaction; when it aborts instead, rewinds
    /// every partition to its last committed offset before the next transaction
    /// takes answers. Runs on the poll thread.
    pub(super) fn commit_transaction(&self, consumer: &Member) {
        let Some(transactions) = &self.transactions else {
            return;
        };
        match transactions.commit(consumer.group_metadata()) {
            Ok(committed) => tracing::debug!(
                answers = committed.answers,
                partitions = committed.partitions,
                "transaction committed"
            ),
            Err((TransactionFailure::Aborted(_), closed)) => {
                self.rewind(consumer);
                drop(closed);
            }
            Err((TransactionFailure::Fatal(reason), _closed)) => self.fail(reason),
        }
    }

    /// Exactly-once: rolls the open transaction back (this member may no longer
    /// own what it holds) and rewinds what it still owns.
    pub(super) fn abort_transaction(&self, consumer: &Member, reason: &str) {
        let Some(transactions) = &self.transactions else {
            return;
        };
        match transactions.abort(reason) {
            (TransactionFailure::Fatal(reason), _closed) => self.fail(reason),
            (TransactionFailure::Aborted(_), closed) => {
                self.rewind(consumer);
                drop(closed);
            }
        }
    }

    fn fail(&self, reason: String) {
        let mut failure = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        failure.get_or_insert(WorkerFailure::FatalBroker(reason));
    }

    /// Stops every partition task at once: commands that run are abandoned (their
    /// offsets stay uncommitted, their tokens wait for their leases). Runs on the
    /// poll thread.
    fn abandon_all(&self) {
        let stopped: Vec<Assigned> = self.lock().drain().map(|(_, entry)| entry).collect();
        self.runtime.block_on(async move {
            for mut entry in stopped {
                entry.abandon.cancel();
                if tokio::time::timeout(Duration::from_secs(2), &mut entry.task)
                    .await
                    .is_err()
                {
                    entry.task.abort();
                }
            }
        });
    }

    /// After an abort: every partition task is stopped at once (their commands wait
    /// at the closed gate, or run without having answered; a command that charged
    /// is answered as a duplicate when redone), and every partition this member
    /// owns is read again from where the aborted transaction began. A partition
    /// that cannot be rewound stops the worker: going on would commit past
    /// commands whose answers were rolled back.
    fn rewind(&self, consumer: &Member) {
        let Some(transactions) = &self.transactions else {
            return;
        };
        self.abandon_all();
        let owned: HashSet<PartitionId> =
            self.owned.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut rewound = 0;
        for ((topic, partition), offset) in transactions.restart_points() {
            if !owned.contains(&(topic.clone(), partition)) {
                continue;
            }
            let sought = consumer.seek(
                &topic,
                partition,
                rdkafka::Offset::Offset(offset),
                Duration::from_secs(10),
            );
            if let Err(error) = sought {
                self.fail(format!(
                    "rewinding {topic}/{partition} to {offset} after an abort failed: {error}"
                ));
                return;
            }
            pause(consumer, &(topic, partition), false);
            rewound += 1;
        }
        tracing::warn!(
            partitions = rewound,
            "transaction aborted: partitions rewound to their last committed offsets"
        );
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
    fn dead(&self) -> Option<(String, i32)> {
        self.lock()
            .iter()
            .find(|(_, entry)| entry.task.is_finished())
            .map(|(id, _)| id.clone())
    }
}

fn pause(consumer: &Member, id: &(String, i32), paused: bool) {
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
        let lag = &crate::telemetry::metrics().consumer_lag;
        for topic in statistics.topics.values() {
            for (partition, stats) in &topic.partitions {
                let fetching =
                    !matches!(stats.fetch_state.as_str(), "none" | "stopping" | "stopped");
                let value = if fetching { stats.consumer_lag } else { 0 };
                if *partition >= 0 && value >= 0 {
                    lag.record(
                        value,
                        &[opentelemetry::KeyValue::new(
                            "partition",
                            i64::from(*partition),
                        )],
                    );
                }
            }
        }
    }
}

impl ConsumerContext for MemberContext {
    /// Replaces rdkafka's default, which ignores the outcome of (incremental)
    /// assign/unassign and cannot drain before giving partitions up; see
    /// `rebalance.rs`.
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        list: &mut TopicPartitionList,
    ) {
        self.on_rebalance(consumer, err, list);
    }
}

/// A running group member.
pub struct RunningWorker {
    stopping: Arc<AtomicBool>,
    assigned: Arc<AtomicUsize>,
    liveness: Arc<Liveness>,
    failure: watch::Receiver<Option<WorkerFailure>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RunningWorker {
    /// Partitions this member currently owns (0 while a rebalance is in progress).
    pub fn assigned_partitions(&self) -> usize {
        self.assigned.load(Ordering::SeqCst)
    }

    /// What the poll thread reports about itself (health endpoints, supervision).
    pub fn liveness(&self) -> &Arc<Liveness> {
        &self.liveness
    }

    /// Resolves when a part of the worker died (never, while all is well).
    pub async fn failed(&self) -> WorkerFailure {
        let mut failure = self.failure.clone();
        let seen = match failure.wait_for(Option::is_some).await {
            Ok(failure) => failure.clone(),
            // The poll thread is gone without a word: it ended.
            Err(_) => None,
        };
        seen.unwrap_or(WorkerFailure::PollLoopEnded)
    }

    /// Drain, final commit, leave the group. Blocks: call from `spawn_blocking`.
    pub fn stop_blocking(mut self) -> anyhow::Result<()> {
        self.stopping.store(true, Ordering::SeqCst);
        self.join()
    }

    fn join(&mut self) -> anyhow::Result<()> {
        if let Some(thread) = self.thread.take() {
            // The thread catches its own panics and reports them as a failure.
            let _ = thread.join();
        }
        match self.failure.borrow().clone() {
            Some(failure) => Err(failure.into()),
            None => Ok(()),
        }
    }

    /// Stops the member: drain, commit, leave; returns how it ended.
    pub async fn stop(self) -> anyhow::Result<()> {
        tokio::task::spawn_blocking(move || self.stop_blocking())
            .await
            .context("joining the stop task")?
    }
}

impl Drop for RunningWorker {
    fn drop(&mut self) {
        // A dropped worker still leaves cleanly (in the background).
        self.stopping.store(true, Ordering::SeqCst);
    }
}

/// Joins the group and starts consuming; returns once subscribed.
pub fn start(
    kafka: &KafkaSettings,
    worker: &WorkerSettings,
    handler: Arc<Handler>,
) -> anyhow::Result<RunningWorker> {
    super::rebalance::check_drain_fits_session(kafka, worker)?;
    let assigned = Arc::new(AtomicUsize::new(0));
    let liveness = Arc::new(Liveness::default());
    liveness.polled();
    let partitions = Arc::new(Partitions {
        assigned: Mutex::new(HashMap::new()),
        owned: Mutex::new(HashSet::new()),
        commits: Arc::new(Commits::default()),
        handler: Arc::clone(&handler),
        runtime: Handle::current(),
        max_in_flight: worker.max_in_flight,
        drain_deadline: worker.drain_deadline,
        consumer: OnceLock::new(),
        group_id: Arc::from(kafka.group_id.as_str()),
        liveness: Arc::clone(&liveness),
        static_member: kafka.group_instance_id.is_some(),
        session_timeout: kafka.session_timeout,
        transactions: handler.transactions().cloned(),
        panics: Arc::default(),
        failure: Mutex::new(None),
    });
    kafka.check_passthrough()?;
    let consumer: Member = super::kafka::create_client_with_context(
        &super::kafka::consumer_config(kafka),
        MemberContext {
            partitions: Arc::clone(&partitions),
            assigned: Arc::clone(&assigned),
        },
    )
    .context("creating the Kafka consumer")?;
    consumer
        .subscribe(&[kafka.commands_topic.as_str()])
        .context("subscribing to the commands topic")?;
    let consumer = Arc::new(consumer);
    let _ = partitions.consumer.set(Arc::downgrade(&consumer));
    // In exactly-once mode offsets leave with the transaction, committed by the
    // poll loop; the consumer itself commits nothing.
    let committer = match partitions.transactions {
        Some(_) => None,
        None => Some(
            Committer::start(&partitions.commits, Arc::clone(&consumer))
                .context("spawning the commit thread")?,
        ),
    };
    let stopping = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stopping);
    let (report, failure) = watch::channel(None);
    let thread = std::thread::Builder::new()
        .name("kafka-poll".into())
        .spawn(move || {
            let (member, tasks) = (Arc::clone(&consumer), Arc::clone(&partitions));
            let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                poll_loop(consumer, partitions, committer, &flag)
            }));
            let failure = match polled {
                Ok(Ok(())) if flag.load(Ordering::SeqCst) => None,
                Ok(Ok(())) => Some(WorkerFailure::PollLoopEnded),
                Ok(Err(failure)) => Some(failure),
                Err(panic) => Some(WorkerFailure::PollLoopPanicked(panic_message(
                    panic.as_ref(),
                ))),
            };
            if let Some(failure) = failure {
                tracing::error!(%failure, "the worker cannot go on");
                // Partition tasks hold the consumer too, and whoever lets go of it
                // last closes it, serving its revoke: that must be this thread, not
                // a task on the runtime (a revoke blocks on the runtime).
                tasks.abandon_all();
                let _ = report.send(Some(failure));
            }
            drop(tasks);
            match Arc::try_unwrap(member) {
                Ok(consumer) => drop(consumer),
                Err(shared) => tracing::warn!(
                    holders = Arc::strong_count(&shared),
                    "consumer still shared at shutdown"
                ),
            }
        })
        .context("spawning the poll thread")?;
    Ok(RunningWorker {
        stopping,
        assigned,
        liveness,
        failure,
        thread: Some(thread),
    })
}

/// How long one poll waits for a record: short, so the loop turns often enough to
/// relieve back pressure, serve callbacks and feed the liveness clock.
const POLL_WAIT: Duration = Duration::from_millis(50);

fn poll_loop(
    consumer: Arc<Member>,
    partitions: Arc<Partitions>,
    mut committer: Option<Committer>,
    stopping: &AtomicBool,
) -> Result<(), WorkerFailure> {
    let stall_after_first_record = crate::fault::Faults::stalls_poll_loop();
    let mut last_turn = std::time::Instant::now();
    while !stopping.load(Ordering::SeqCst) {
        partitions.relieve(&consumer);
        let wait = match &partitions.transactions {
            Some(transactions) => transactions.until_due().min(POLL_WAIT),
            None => POLL_WAIT,
        };
        let polled = consumer.poll(wait);
        partitions.liveness.polled();
        // A loop that stood still longer than a session (the process was stopped,
        // or starved) must assume the group gave its partitions away meanwhile: its
        // open transaction is not committed but rolled back, whatever the broker
        // would say (a broker with KIP-447 refuses that commit anyway).
        let stood_still = last_turn.elapsed() > partitions.session_timeout;
        last_turn = std::time::Instant::now();
        match polled {
            Some(Ok(message)) => {
                // Detach at once: a borrowed message pins librdkafka buffers and can
                // hang the consumer's close.
                let message = message.detach();
                partitions.dispatch(&consumer, message);
                if stall_after_first_record {
                    tracing::warn!("fault injected: the poll loop stalls");
                    loop {
                        std::thread::park();
                    }
                }
            }
            Some(Err(error)) if is_fatal_broker_error(&error) => {
                return Err(WorkerFailure::FatalBroker(error.to_string()));
            }
            Some(Err(error)) => {
                if let Some((code, reason)) = consumer.client().fatal_error() {
                    return Err(WorkerFailure::FatalBroker(format!("{code:?}: {reason}")));
                }
                tracing::warn!(%error, "consumer error");
            }
            None => {}
        }
        if let Some((topic, partition)) = partitions.dead() {
            return Err(WorkerFailure::PartitionTaskEnded { topic, partition });
        }
        if let Some(reason) = partitions.handler.producer_fatal_error() {
            // Healthy-looking but stuck otherwise: every answer would wait forever.
            return Err(WorkerFailure::FatalBroker(reason));
        }
        if let Some(transactions) = &partitions.transactions {
            if stood_still {
                tracing::warn!("the poll loop stood still longer than the session timeout");
                partitions.abort_transaction(&consumer, "the member may have been evicted");
            } else if transactions.due() {
                partitions.commit_transaction(&consumer);
            }
        }
        if let Some(failure) = partitions
            .failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            return Err(failure);
        }
    }
    // Shutdown: drain everything, commit synchronously, then leave the group.
    if let Some(committer) = committer.as_mut() {
        committer.stop();
    }
    partitions.drain(&partitions.ids());
    if partitions.transactions.is_some() {
        partitions.commit_transaction(&consumer);
    } else {
        partitions
            .commits
            .commit_before_leaving(&consumer, partitions.session_timeout);
    }
    if partitions.static_member {
        // Unsubscribing would send a LeaveGroup and rebalance the group; a static
        // member that closes stays in it for the session timeout, so its restart
        // under the same instance id gets the same partitions back.
        tracing::info!("static member: leaving the group to its session timeout");
    } else {
        // Half the session timeout at most: with the commit before it, a stop still
        // fits the grace period the deployments give it.
        super::rebalance::leave_group(&consumer, partitions.session_timeout / 2);
    }
    // A fatal error met on the way out (exactly-once: the final commit, or one in
    // the last revoke, found the producer fenced) is the exit status too, not 0.
    match partitions
        .failure
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
    {
        Some(failure) => Err(failure),
        None => Ok(()),
    }
}

/// `run`: consume until `shutdown` resolves, then drain, commit and leave. Serves
/// the health endpoints meanwhile. Ends early with a [`WorkerFailure`] when a part
/// of the worker dies, or when the poll loop stalls for twice the session timeout
/// (`/healthz` has been failing for one session timeout by then).
pub async fn run_until(
    kafka: &KafkaSettings,
    worker: &WorkerSettings,
    handler: Arc<Handler>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let processor = Arc::clone(handler.processor());
    let running = start(kafka, worker, handler)?;
    let liveness = Arc::clone(running.liveness());
    let checks = HealthChecks {
        liveness: Arc::clone(&liveness),
        stall_limit: kafka.session_timeout,
        processor,
        probe: super::health::PostgresProbe::default(),
    };
    let _health = serve_health(worker.health_listen, checks).await?;
    let stall_exit = kafka.session_timeout * 2;
    let mut watchdog = tokio::time::interval(Duration::from_millis(250));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            failure = running.failed() => {
                tracing::error!(%failure, "exiting: the worker cannot go on");
                return Err(failure.into());
            }
            _ = watchdog.tick() => {
                let since = liveness.since_last_poll();
                if since > stall_exit {
                    let failure = WorkerFailure::PollLoopStalled(since);
                    tracing::error!(%failure, "exiting: the worker cannot go on");
                    return Err(failure.into());
                }
            }
        }
    }
    // Orchestrators stop counting on a draining member.
    liveness.set_draining();
    tracing::info!("shutting down: draining in-flight commands");
    running.stop().await
}
