//! Group membership changes and offset commits.
//!
//! Under the cooperative protocol (KIP-429, `cooperative-sticky`, the default) an
//! assignment or a revocation names only the partitions that move: the member keeps
//! working on the others, drains and commits only those it gives up, and does so
//! while the group is stable, so the commit is accepted. The callback therefore
//! calls `incremental_assign` / `incremental_unassign`; under an eager assignor
//! (set by an operator through `KAFKA_CONFIG_PARTITION_ASSIGNMENT_STRATEGY`) every
//! revoke is of everything, and `assign` / `unassign` apply.
//!
//! Offsets are committed as soon as they move (by a commit thread, one commit at a
//! time), after every drain, and before the member leaves. A
//! drain whose commit failed leaves its offsets here: if the partition comes back
//! to this member and the group's committed offset is still behind, the member
//! resumes from where it got and commits that once the group is stable again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};
use rdkafka::{Offset, TopicPartitionList};

use super::consumer::MemberContext;
use crate::configuration::{KafkaSettings, WorkerSettings};

pub(super) type PartitionId = (String, i32);

/// Even without new progress, stored offsets are offered for commit this often, so a
/// commit refused during a rebalance is made good (librdkafka sends only offsets
/// ahead of the committed ones; otherwise the call returns at once).
const COMMIT_SWEEP: Duration = Duration::from_secs(1);
/// After a failed commit, the next attempt waits this long.
const COMMIT_RETRY_PAUSE: Duration = Duration::from_millis(500);
/// How often the committer looks for progress.
const COMMIT_LOOK: Duration = Duration::from_millis(10);

#[derive(Default)]
pub(super) struct Commits {
    /// Set by a partition task whenever it stored a higher offset.
    progress: Arc<AtomicBool>,
    /// Offsets a drain reached whose commit failed.
    unsettled: Mutex<HashMap<PartitionId, i64>>,
}

impl Commits {
    pub(super) fn progress_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.progress)
    }

    fn unsettled(&self) -> std::sync::MutexGuard<'_, HashMap<PartitionId, i64>> {
        self.unsettled.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The committer thread: commits the stored offsets as soon as one moved, one
    /// commit at a time. Synchronous commits on a thread of their own: librdkafka
    /// reports the outcome of an application's asynchronous commit only to an
    /// `offset_commit_cb`, which rdkafka does not install, so "no commit in flight"
    /// could not be known otherwise. Ends when `stop` is raised.
    pub(super) fn spawn_committer<C: ConsumerContext + 'static>(
        self: &Arc<Self>,
        consumer: Arc<BaseConsumer<C>>,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let commits = Arc::clone(self);
        std::thread::Builder::new()
            .name("kafka-commit".into())
            .spawn(move || {
                let mut last = Instant::now();
                while !stop.load(Ordering::SeqCst) {
                    let moved = commits.progress.swap(false, Ordering::SeqCst);
                    if !moved && last.elapsed() < COMMIT_SWEEP {
                        std::thread::sleep(COMMIT_LOOK);
                        continue;
                    }
                    last = Instant::now();
                    if let Err(error) = commits.commit_now(&consumer) {
                        tracing::debug!(%error, "commit failed; retried shortly");
                        commits.progress.store(true, Ordering::SeqCst);
                        std::thread::sleep(COMMIT_RETRY_PAUSE);
                    }
                }
            })
    }

    /// Synchronously commits what was stored. "No offset" just means nothing moved.
    pub(super) fn commit_now<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
    ) -> KafkaResult<()> {
        match consumer.commit_consumer_state(CommitMode::Sync) {
            Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// The last commit before leaving. A commit refused because the group is
    /// rebalancing (a member joins or leaves at the same moment) is tried again
    /// until the group has a new generation, for at most `within`; records that
    /// arrive meanwhile are dropped unprocessed (their offsets stay uncommitted).
    pub(super) fn commit_before_leaving<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        within: Duration,
    ) {
        let deadline = Instant::now() + within;
        loop {
            let error = match self.commit_now(consumer) {
                Ok(()) => return,
                Err(error) => error,
            };
            let retryable = matches!(
                error,
                KafkaError::ConsumerCommit(
                    RDKafkaErrorCode::IllegalGeneration
                        | RDKafkaErrorCode::RebalanceInProgress
                        | RDKafkaErrorCode::NotCoordinator
                        | RDKafkaErrorCode::CoordinatorLoadInProgress
                        | RDKafkaErrorCode::CoordinatorNotAvailable
                        | RDKafkaErrorCode::WaitingForCoordinator
                        | RDKafkaErrorCode::RequestTimedOut
                )
            );
            if !retryable || Instant::now() >= deadline {
                tracing::warn!(%error, "commit before leaving failed");
                return;
            }
            tracing::info!(%error, "commit before leaving refused; retrying once the group is stable");
            let until = Instant::now() + Duration::from_millis(250);
            while Instant::now() < until {
                // Serves the rebalance (callbacks included); a record is not taken on.
                drop(consumer.poll(Duration::from_millis(50)));
            }
        }
    }

    /// Keeps the offsets of a drain whose commit failed.
    fn remember(&self, offsets: HashMap<PartitionId, i64>) {
        let mut unsettled = self.unsettled();
        for (id, offset) in offsets {
            let kept = unsettled.entry(id).or_insert(offset);
            *kept = (*kept).max(offset);
        }
    }

    /// For partitions being assigned that a failed drain-commit left behind: where
    /// to resume, when that is past the group's committed offset. Everything below
    /// such an offset was settled by this member, so resuming there loses nothing;
    /// an offset the group already passed is forgotten.
    fn resume_points<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        assigned: &[PartitionId],
    ) -> Vec<(PartitionId, i64)> {
        let mine: Vec<(PartitionId, i64)> = {
            let mut unsettled = self.unsettled();
            assigned
                .iter()
                .filter_map(|id| unsettled.remove(id).map(|o| (id.clone(), o)))
                .collect()
        };
        if mine.is_empty() {
            return mine;
        }
        let mut query = TopicPartitionList::new();
        for ((topic, partition), _) in &mine {
            query.add_partition(topic, *partition);
        }
        let committed = match consumer.committed_offsets(query, Duration::from_secs(3)) {
            Ok(list) => list
                .elements()
                .iter()
                .map(|e| {
                    let offset = match e.offset() {
                        Offset::Offset(o) => o,
                        _ => -1,
                    };
                    ((e.topic().to_owned(), e.partition()), offset)
                })
                .collect::<HashMap<PartitionId, i64>>(),
            Err(error) => {
                // Without the group's offset a resume point could move it backwards.
                tracing::warn!(%error, "committed offsets unknown; unsettled offsets dropped");
                return Vec::new();
            }
        };
        mine.into_iter()
            .filter(|(id, offset)| committed.get(id).is_some_and(|c| offset > c))
            .collect()
    }
}

/// A drain that may last the whole session timeout gets the member evicted while it
/// drains: refused.
pub fn check_drain_fits_session(
    kafka: &KafkaSettings,
    worker: &WorkerSettings,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        worker.drain_deadline < kafka.session_timeout,
        "--drain-deadline ({:?}) must be below the session timeout ({:?})",
        worker.drain_deadline,
        kafka.session_timeout
    );
    Ok(())
}

/// How long a drain can take: every in-flight command finishes its current attempt
/// (no retry starts once the drain began, no queued record is started), which is
/// at most a gateway look-up and a charge, each bounded by the gateway timeout,
/// plus the stores' round trips; commands wait for a database connection when a
/// member runs more of them than its pool holds.
pub fn drain_bound(
    max_in_flight: usize,
    gateway_timeout: Duration,
    database_connections: u32,
) -> Duration {
    const STORE_ALLOWANCE: Duration = Duration::from_secs(1);
    let rounds = max_in_flight
        .max(1)
        .div_ceil(database_connections.max(1) as usize) as u32;
    (gateway_timeout * 2 + STORE_ALLOWANCE) * rounds
}

fn ids_of(list: &TopicPartitionList) -> Vec<PartitionId> {
    list.elements()
        .iter()
        .map(|e| (e.topic().to_owned(), e.partition()))
        .collect()
}

impl MemberContext {
    /// librdkafka's rebalance callback, served on the poll thread.
    pub(super) fn on_rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        list: &mut TopicPartitionList,
    ) {
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                self.assign(consumer, list, cooperative)
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                self.revoke(consumer, list, cooperative)
            }
            other => {
                // librdkafka's advice: give everything up and let the group re-sync.
                let code: RDKafkaErrorCode = other.into();
                tracing::error!(error = %code, "rebalance failed; giving up every partition");
                let owned = TopicPartitionList::from_topic_map(
                    &self
                        .partitions
                        .ids()
                        .into_iter()
                        .map(|id| (id, Offset::Invalid))
                        .collect(),
                );
                match owned {
                    Ok(mut owned) => self.revoke(consumer, &mut owned, cooperative),
                    Err(error) => tracing::error!(%error, "listing the owned partitions"),
                }
            }
        }
    }

    fn assign(
        &self,
        consumer: &BaseConsumer<Self>,
        list: &mut TopicPartitionList,
        cooperative: bool,
    ) {
        let ids = ids_of(list);
        let resume = self.partitions.commits.resume_points(consumer, &ids);
        for ((topic, partition), offset) in &resume {
            if let Err(error) =
                list.set_partition_offset(topic, *partition, Offset::Offset(*offset))
            {
                tracing::warn!(%error, partition, "resume point not set");
            }
        }
        let applied = if cooperative {
            consumer.incremental_assign(list)
        } else {
            consumer.assign(list)
        };
        if let Err(error) = applied {
            tracing::error!(%error, "applying the assignment failed");
        }
        // librdkafka keeps a partition's pause across a revoke and a later
        // re-assignment, while the overflow that would have resumed it was dropped
        // with the revoke: without this a partition paused for back pressure when
        // it was revoked comes back paused and is never consumed again.
        if list.count() > 0 {
            if let Err(error) = consumer.resume(list) {
                tracing::warn!(%error, "resuming the assigned partitions failed");
            }
        }
        if !resume.is_empty() {
            // Committed by the next progress commit, now that the group is stable.
            let mut store = TopicPartitionList::new();
            for ((topic, partition), offset) in &resume {
                let _ = store.add_partition_offset(topic, *partition, Offset::Offset(*offset));
            }
            match consumer.store_offsets(&store) {
                Ok(()) => self
                    .partitions
                    .commits
                    .progress
                    .store(true, Ordering::SeqCst),
                Err(error) => tracing::warn!(%error, "storing resume points failed"),
            }
            tracing::info!(
                partitions = resume.len(),
                "resuming where a failed drain commit left off"
            );
        }
        let held = self.partitions.own(&ids, true);
        self.assigned.store(held, Ordering::SeqCst);
        self.partitions.liveness.set_in_group(true);
        tracing::info!(
            partitions = held,
            added = ids.len(),
            cooperative,
            "assigned"
        );
    }

    fn revoke(
        &self,
        consumer: &BaseConsumer<Self>,
        list: &mut TopicPartitionList,
        cooperative: bool,
    ) {
        let ids = ids_of(list);
        let lost = consumer.assignment_lost();
        let held = self.partitions.own(&ids, false);
        self.assigned.store(held, Ordering::SeqCst);
        // An incremental revoke keeps the membership; an eager one or a lost
        // assignment means the member is out until its next assignment.
        if !cooperative || lost {
            self.partitions.liveness.set_in_group(false);
        }
        tracing::info!(
            partitions = ids.len(),
            held,
            lost,
            cooperative,
            "revoked; draining"
        );
        let started = Instant::now();
        let reached = self.partitions.drain(&ids);
        if let Some(transactions) = &self.partitions.transactions {
            // Exactly-once: the drained partitions' answers and offsets leave in one
            // transaction before they are given up. A lost assignment means another
            // member may already redo them: roll back instead.
            if lost {
                self.partitions
                    .abort_transaction(consumer, "the assignment was lost");
            } else {
                self.partitions.commit_transaction(consumer);
            }
            transactions.forget(&ids);
            tracing::info!(
                partitions = ids.len(),
                drained_ms = started.elapsed().as_millis() as u64,
                lost,
                "drained; transaction settled"
            );
        } else {
            self.commit_drained(consumer, &ids, reached, lost, started);
        }
        let applied = if cooperative {
            consumer.incremental_unassign(list)
        } else {
            consumer.unassign()
        };
        if let Err(error) = applied {
            tracing::error!(%error, "giving up the revoked partitions failed");
        }
    }

    /// At-least-once: commits the stored offsets after a drain, or keeps them for
    /// a later attempt.
    fn commit_drained(
        &self,
        consumer: &BaseConsumer<Self>,
        ids: &[PartitionId],
        reached: HashMap<PartitionId, i64>,
        lost: bool,
        started: Instant,
    ) {
        let commit = if lost {
            // The group moved on without this member: the commit would be refused.
            Err(KafkaError::ConsumerCommit(
                RDKafkaErrorCode::UnknownMemberId,
            ))
        } else {
            self.partitions.commits.commit_now(consumer)
        };
        match commit {
            Ok(()) => tracing::info!(
                partitions = ids.len(),
                drained_ms = started.elapsed().as_millis() as u64,
                "drained and committed"
            ),
            // Nothing drained (e.g. the final revoke while closing): nothing to keep.
            Err(error) if reached.is_empty() => {
                tracing::debug!(%error, "commit after an empty drain failed")
            }
            Err(error) => {
                tracing::warn!(%error, partitions = reached.len(), "commit after the drain failed; kept for a later retry");
                self.partitions.commits.remember(reached);
            }
        }
    }
}

/// The running committer thread; stopped and joined on drop, so it never outlives
/// the poll loop (it holds the consumer, which must be closed last).
pub(super) struct Committer {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Committer {
    pub(super) fn start<C: ConsumerContext + 'static>(
        commits: &Arc<Commits>,
        consumer: Arc<BaseConsumer<C>>,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = commits.spawn_committer(consumer, Arc::clone(&stop))?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    pub(super) fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Unsubscribes, then serves callbacks until the final revoke has emptied the
/// assignment (at most `within`), so the group sees us leave now rather than at the
/// session timeout. Closing while an (un)assignment is still in flight can abort the
/// whole process inside librdkafka (`rd_kafka_cgrp_terminated: assert:
/// !rd_kafka_assignment_in_progress`, confluentinc/librdkafka#4792), most often when
/// a rebalance caused by another member leaving reaches this one as it closes.
/// Records polled here are dropped: their offsets were never stored, so the next
/// owner reads them again.
pub(super) fn leave_group<C: ConsumerContext>(consumer: &BaseConsumer<C>, within: Duration) {
    consumer.unsubscribe();
    let deadline = std::time::Instant::now() + within;
    loop {
        let _ = consumer.poll(Duration::from_millis(100));
        let assigned = consumer.assignment().map_or(0, |list| list.count());
        if assigned == 0 {
            // One more turn for the stopped partitions' fetchers to wind down.
            let _ = consumer.poll(Duration::from_millis(100));
            return;
        }
        if std::time::Instant::now() >= deadline {
            tracing::warn!(assigned, "partitions still assigned when leaving the group");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drain_bound_is_one_attempt_per_round_of_database_connections() {
        let gateway = Duration::from_secs(5);
        // Every in-flight command has a connection: one attempt, look-up and charge.
        assert_eq!(drain_bound(32, gateway, 48), Duration::from_secs(11));
        // 64 commands over 16 connections: four rounds.
        assert_eq!(drain_bound(64, gateway, 16), Duration::from_secs(44));
        // At the tests' 20 ms gateway, far inside a 3 s deadline.
        assert!(drain_bound(32, Duration::from_millis(20), 16) < Duration::from_secs(3));
    }
}
