//! The consumer-group member. librdkafka is polled on a dedicated thread so the
//! rebalance callback may block while revoked partitions drain; the commands
//! themselves run on the tokio runtime.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rdkafka::consumer::Consumer;
use tokio::sync::watch;

use super::answer_sink::AnswerSink;
use super::commits::Committer;
use super::handler::Handler;
use super::health::{serve_health, HealthChecks, Liveness};
use super::member::{Member, MemberContext, Partitions};
use super::supervision::{is_fatal_broker_error, panic_message, WorkerFailure};
use crate::configuration::{KafkaSettings, WorkerSettings};

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
    super::commits::check_drain_fits_session(kafka, worker)?;
    let assigned = Arc::new(AtomicUsize::new(0));
    let liveness = Arc::new(Liveness::default());
    liveness.polled();
    let partitions = Arc::new(Partitions::new(
        kafka,
        worker,
        Arc::clone(&handler),
        Arc::clone(&liveness),
    ));
    let consumer = subscribe(kafka, &partitions, &assigned)?;
    let committer = start_committer(&partitions, &consumer)?;
    let stopping = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stopping);
    let (report, failure) = watch::channel(None);
    let thread = std::thread::Builder::new()
        .name("kafka-poll".into())
        .spawn(move || poll_thread(consumer, partitions, committer, &flag, report))
        .context("spawning the poll thread")?;
    Ok(RunningWorker {
        stopping,
        assigned,
        liveness,
        failure,
        thread: Some(thread),
    })
}

/// The group member's consumer, subscribed to the commands topic and attached to
/// `partitions`.
fn subscribe(
    kafka: &KafkaSettings,
    partitions: &Arc<Partitions>,
    assigned: &Arc<AtomicUsize>,
) -> anyhow::Result<Arc<Member>> {
    kafka.check_passthrough()?;
    let consumer: Member = super::kafka::create_client_with_context(
        &super::kafka::consumer_config(kafka),
        MemberContext {
            partitions: Arc::clone(partitions),
            assigned: Arc::clone(assigned),
        },
    )
    .context("creating the Kafka consumer")?;
    consumer
        .subscribe(&[kafka.commands_topic.as_str()])
        .context("subscribing to the commands topic")?;
    let consumer = Arc::new(consumer);
    partitions.attach(&consumer);
    Ok(consumer)
}

/// The commit thread, unless offsets leave with the transaction.
fn start_committer(
    partitions: &Partitions,
    consumer: &Arc<Member>,
) -> anyhow::Result<Option<Committer>> {
    // In exactly-once mode offsets leave with the transaction, committed by the
    // poll loop; the consumer itself commits nothing.
    let committer = match partitions.sink {
        AnswerSink::Transactional(_) => None,
        AnswerSink::AtLeastOnce => Some(
            Committer::start(&partitions.commits, Arc::clone(consumer))
                .context("spawning the commit thread")?,
        ),
    };
    Ok(committer)
}

/// The poll thread: the poll loop, then how it ended reported (`report`), and the
/// consumer closed here.
fn poll_thread(
    consumer: Arc<Member>,
    partitions: Arc<Partitions>,
    committer: Option<Committer>,
    flag: &AtomicBool,
    report: watch::Sender<Option<WorkerFailure>>,
) {
    let (member, tasks) = (Arc::clone(&consumer), Arc::clone(&partitions));
    let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        poll_loop(consumer, partitions, committer, flag)
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
        let stood_still = poll_once(
            &consumer,
            &partitions,
            &mut last_turn,
            stall_after_first_record,
        )?;
        if let Some((topic, partition)) = partitions.dead() {
            return Err(WorkerFailure::PartitionTaskEnded { topic, partition });
        }
        if let Some(reason) = partitions.handler.producer_fatal_error() {
            // Healthy-looking but stuck otherwise: every answer would wait forever.
            return Err(WorkerFailure::FatalBroker(reason));
        }
        if let AnswerSink::Transactional(transactions) = &partitions.sink {
            if stood_still {
                tracing::warn!("the poll loop stood still longer than the session timeout");
                partitions.abort_transaction(&consumer, "the member may have been evicted");
            } else if transactions.due() {
                partitions.commit_transaction(&consumer);
            }
        }
        if let Some(failure) = take_failure(&partitions) {
            return Err(failure);
        }
    }
    // Shutdown: drain everything, commit synchronously, then leave the group.
    if let Some(committer) = committer.as_mut() {
        committer.stop();
    }
    leave(&consumer, &partitions)
}

/// One poll, its record dispatched or its error judged; returns whether the loop
/// stood still longer than a session since the last turn (`last_turn`, moved on).
fn poll_once(
    consumer: &Arc<Member>,
    partitions: &Partitions,
    last_turn: &mut std::time::Instant,
    stall_after_first_record: bool,
) -> Result<bool, WorkerFailure> {
    let wait = partitions.sink.poll_wait(POLL_WAIT);
    let polled = consumer.poll(wait);
    partitions.liveness.polled();
    // A loop that stood still longer than a session (the process was stopped,
    // or starved) must assume the group gave its partitions away meanwhile: its
    // open transaction is not committed but rolled back, whatever the broker
    // would say (a broker with KIP-447 refuses that commit anyway).
    let stood_still = last_turn.elapsed() > partitions.session_timeout;
    *last_turn = std::time::Instant::now();
    match polled {
        Some(Ok(message)) => {
            // Detach at once: a borrowed message pins librdkafka buffers and can
            // hang the consumer's close.
            let message = message.detach();
            partitions.dispatch(consumer, message);
            if stall_after_first_record {
                crate::fault::Faults::stall_poll_thread();
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
    Ok(stood_still)
}

/// A failure a part of the worker reported, taken.
fn take_failure(partitions: &Partitions) -> Option<WorkerFailure> {
    partitions
        .failure
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
}

/// Drains everything, commits synchronously, then leaves the group; returns the
/// failure met on the way out, if any.
fn leave(consumer: &Member, partitions: &Partitions) -> Result<(), WorkerFailure> {
    let reached = partitions.drain(&partitions.ids());
    tracing::info!(
        partitions = reached.len(),
        reached = %super::rebalance_callback::offsets_list(&reached),
        "drained for shutdown"
    );
    partitions.commits.leaving(&reached);
    if partitions.sink.is_transactional() {
        partitions.commit_transaction(consumer);
    } else {
        partitions
            .commits
            .commit_before_leaving(consumer, partitions.session_timeout);
    }
    if partitions.static_member {
        // Unsubscribing would send a LeaveGroup and rebalance the group; a static
        // member that closes stays in it for the session timeout, so its restart
        // under the same instance id gets the same partitions back.
        tracing::info!("static member: leaving the group to its session timeout");
    } else {
        // Half the session timeout at most: with the commit before it, a stop still
        // fits the grace period the deployments give it.
        super::commits::leave_group(consumer, partitions.session_timeout / 2);
    }
    // A fatal error met on the way out (exactly-once: the final commit, or one in
    // the last revoke, found the producer fenced) is the exit status too, not 0.
    match take_failure(partitions) {
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
