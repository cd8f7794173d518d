//! Offset commits: as the member makes progress, after a drain, before it leaves;
//! and the bounds a drain must fit in. (What a rebalance does to the partitions is
//! `member.rs`'s and `rebalance_callback.rs`'s.)
//!
//! A revoked partition is drained and committed while the group is stable, so the
//! commit is accepted. Offsets are committed as soon as they move (by a commit
//! thread, one commit at a time), after every drain, and before the member leaves.
//! A drain whose commit failed leaves its offsets here: if the partition comes back
//! to this member and the group's committed offset is still behind, the member
//! resumes from where it got and commits that once the group is stable again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

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
/// How long a final commit waits for the group's committed offsets. Longer than
/// tansu 0.6 holds a member's coordinator connection: it serves one request at a
/// time and keeps a follower's JoinGroup for 3 s, so an OffsetFetch sent meanwhile
/// is answered after it.
const GROUP_OFFSETS_WAIT: Duration = Duration::from_secs(10);

#[derive(Default)]
pub(super) struct Commits {
    /// Set by a partition task whenever it stored a higher offset.
    progress: Arc<AtomicBool>,
    /// Offsets a drain reached whose commit failed.
    unsettled: Mutex<HashMap<PartitionId, i64>>,
    /// Offsets the shutdown drain reached, until a commit took them: the revokes of
    /// the leave that follows find those partitions already drained.
    leaving: Mutex<HashMap<PartitionId, i64>>,
}

impl Commits {
    pub(super) fn progress_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.progress)
    }

    /// Offers the stored offsets to the committer's next turn.
    pub(super) fn mark_progress(&self) {
        self.progress.store(true, Ordering::SeqCst);
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

    /// A member's last word on partitions it gives up: commits `offsets` (per
    /// partition, the next offset to process) where they are ahead of what the
    /// group has committed, and leaves a partition alone where the group's offset is
    /// already there or past it. A coordinator that fences commits by generation
    /// (Kafka's) never holds an offset past this member's for a partition it owns;
    /// one that does not (tansu 0.6) may have handed the partition to another member
    /// already, and that member's commits must not be undone: moving the offset back
    /// makes the next owner answer those commands again, and the member that
    /// committed the higher offset never commits it a second time (librdkafka skips
    /// an offset it believes committed).
    pub(super) fn commit_final<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        offsets: &HashMap<PartitionId, i64>,
    ) -> KafkaResult<()> {
        if offsets.is_empty() {
            return Ok(());
        }
        let mut query = TopicPartitionList::new();
        for (topic, partition) in offsets.keys() {
            query.add_partition(topic, *partition);
        }
        // Unchecked, the commit could undo another member's: it is not sent, and the
        // next owner answers those commands again (at-least-once allows that).
        let group: HashMap<PartitionId, i64> = consumer
            .committed_offsets(query, GROUP_OFFSETS_WAIT)?
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some(((e.topic().to_owned(), e.partition()), o)),
                _ => None,
            })
            .collect();
        let mut list = TopicPartitionList::new();
        for ((topic, partition), offset) in ahead_of_the_group(offsets, &group) {
            list.add_partition_offset(&topic, partition, Offset::Offset(offset))?;
        }
        if list.count() == 0 {
            return Ok(());
        }
        consumer.commit(&list, CommitMode::Sync)
    }

    /// Keeps what the shutdown drain reached for the commits of the leave.
    pub(super) fn leaving(&self, offsets: &HashMap<PartitionId, i64>) {
        let mut leaving = self.leaving.lock().unwrap_or_else(|p| p.into_inner());
        leaving.extend(offsets.iter().map(|(id, o)| (id.clone(), *o)));
    }

    /// Takes what the shutdown drain reached for `ids` (nothing before a shutdown).
    pub(super) fn take_leaving(&self, ids: &[PartitionId]) -> HashMap<PartitionId, i64> {
        let mut leaving = self.leaving.lock().unwrap_or_else(|p| p.into_inner());
        ids.iter()
            .filter_map(|id| leaving.remove_entry(id))
            .collect()
    }

    /// The last commit before leaving: what the shutdown drain reached (see
    /// [`Commits::commit_final`]). A commit refused because the group is
    /// rebalancing (a member joins or leaves at the same moment) is tried again
    /// until the group has a new generation, for at most `within`; records that
    /// arrive meanwhile are dropped unprocessed (their offsets stay uncommitted).
    /// A revoke served meanwhile commits its partitions' share itself.
    pub(super) fn commit_before_leaving<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        within: Duration,
    ) {
        let deadline = Instant::now() + within;
        loop {
            let offsets = self
                .leaving
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            let error = match self.commit_final(consumer, &offsets) {
                Ok(()) => {
                    let ids: Vec<PartitionId> = offsets.into_keys().collect();
                    self.take_leaving(&ids);
                    return;
                }
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
    pub(super) fn remember(&self, offsets: HashMap<PartitionId, i64>) {
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
    pub(super) fn resume_points<C: ConsumerContext>(
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

/// The offsets of `ours` a final commit sends: those ahead of what the group
/// committed (`group`; a partition absent there has no commit yet). One the group
/// already passed is left alone, and said so.
fn ahead_of_the_group(
    ours: &HashMap<PartitionId, i64>,
    group: &HashMap<PartitionId, i64>,
) -> Vec<(PartitionId, i64)> {
    let mut ahead = Vec::new();
    for (id, offset) in ours {
        match group.get(id) {
            Some(committed) if committed > offset => tracing::warn!(
                partition = id.1,
                offset,
                committed,
                "the group's committed offset is past this member's: another member \
                 consumed the partition meanwhile; left as it is"
            ),
            Some(committed) if committed == offset => {}
            _ => ahead.push((id.clone(), *offset)),
        }
    }
    ahead.sort();
    ahead
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

/// How long a drain can take: every admitted command gets one attempt (no retry
/// starts once the drain began; those queued behind a command of their key are
/// duplicates, answered from the token without calling the gateway), which is
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
    fn a_final_commit_never_moves_the_group_back() {
        let id = |p: i32| ("payments.commands".to_owned(), p);
        let ours: HashMap<PartitionId, i64> =
            [(id(0), 150), (id(1), 120), (id(2), 90), (id(3), 40)].into();
        // p0: the group is behind (ours goes); p1: another member committed past
        // ours (left alone); p2: already committed; p3: nothing committed yet.
        let group: HashMap<PartitionId, i64> = [(id(0), 106), (id(1), 278), (id(2), 90)].into();
        assert_eq!(
            ahead_of_the_group(&ours, &group),
            vec![(id(0), 150), (id(3), 40)]
        );
    }

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
