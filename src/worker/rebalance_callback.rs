//! librdkafka's rebalance callback for this member: an assignment (resume points
//! first), a revocation (drain, then commit or settle the transaction), cooperative
//! or eager, and the partition lists it logs.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use rdkafka::consumer::{BaseConsumer, Consumer, RebalanceProtocol};
use rdkafka::error::KafkaError;
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};
use rdkafka::{Offset, TopicPartitionList};

use super::answer_sink::AnswerSink;
use super::commits::PartitionId;
use super::member::MemberContext;

/// `0,3,5`: partition numbers for a log line.
fn partition_list(ids: &[PartitionId]) -> String {
    let mut numbers: Vec<i32> = ids.iter().map(|(_, p)| *p).collect();
    numbers.sort_unstable();
    numbers
        .iter()
        .map(i32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// `0:120,3:97`: partition and offset pairs for a log line.
pub(super) fn offsets_list(offsets: &HashMap<PartitionId, i64>) -> String {
    let mut pairs: Vec<(i32, i64)> = offsets.iter().map(|((_, p), o)| (*p, *o)).collect();
    pairs.sort_unstable();
    pairs
        .iter()
        .map(|(p, o)| format!("{p}:{o}"))
        .collect::<Vec<_>>()
        .join(",")
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
                Ok(()) => self.partitions.commits.mark_progress(),
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
        let member = super::kafka::group_generation(consumer);
        tracing::info!(
            partitions = held,
            added = ids.len(),
            partition_ids = %partition_list(&ids),
            generation = member.as_ref().map(|m| m.generation),
            member_id = member.as_ref().map(|m| m.member_id.as_str()),
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
        let member = super::kafka::group_generation(consumer);
        tracing::info!(
            partitions = ids.len(),
            held,
            lost,
            cooperative,
            partition_ids = %partition_list(&ids),
            generation = member.as_ref().map(|m| m.generation),
            member_id = member.as_ref().map(|m| m.member_id.as_str()),
            "revoked; draining"
        );
        let started = Instant::now();
        let reached = self.partitions.drain(&ids);
        if let AnswerSink::Transactional(transactions) = &self.partitions.sink {
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
        let commits = &self.partitions.commits;
        // A revoke while leaving finds its partitions drained by the shutdown already.
        let leaving = commits.take_leaving(ids);
        let mut offsets = leaving.clone();
        offsets.extend(reached);
        let commit = if lost {
            // The group moved on without this member: the commit would be refused.
            Err(KafkaError::ConsumerCommit(
                RDKafkaErrorCode::UnknownMemberId,
            ))
        } else {
            commits.commit_final(consumer, &offsets)
        };
        match commit {
            Ok(()) => tracing::info!(
                partitions = ids.len(),
                drained_ms = started.elapsed().as_millis() as u64,
                reached = %offsets_list(&offsets),
                "drained and committed"
            ),
            // Nothing drained (the final revoke while closing): nothing to keep.
            Err(error) if offsets.is_empty() => {
                tracing::debug!(%error, "commit after an empty drain failed")
            }
            Err(error) => {
                tracing::warn!(%error, partitions = offsets.len(), reached = %offsets_list(&offsets), "commit after the drain failed; kept for a later retry");
                // The leave goes on committing what the shutdown drained.
                commits.leaving(&leaving);
                commits.remember(offsets);
            }
        }
    }
}
