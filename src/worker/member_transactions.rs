//! Exactly-once on the member's side: committing or aborting the open transaction
//! and, after an abort, rewinding the partitions this member owns. Apart from the
//! partitions' bookkeeping in `member.rs`, which it only drives.

use std::collections::HashSet;
use std::time::Duration;

use rdkafka::consumer::Consumer;

use super::answer_sink::AnswerSink;
use super::commits::PartitionId;
use super::member::{pause, Assigned, Member, Partitions};
use super::supervision::WorkerFailure;
use super::transactions::TransactionFailure;

impl Partitions {
    /// Exactly-once: commits the open transaction; when it aborts instead, rewinds
    /// every partition to its last committed offset before the next transaction
    /// takes answers. Runs on the poll thread.
    pub(super) fn commit_transaction(&self, consumer: &Member) {
        let AnswerSink::Transactional(transactions) = &self.sink else {
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
        let AnswerSink::Transactional(transactions) = &self.sink else {
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

    pub(super) fn fail(&self, reason: String) {
        let mut failure = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        failure.get_or_insert(WorkerFailure::FatalBroker(reason));
    }

    /// Stops every partition task at once: commands that run are abandoned (their
    /// offsets stay uncommitted, their tokens wait for their leases). Runs on the
    /// poll thread.
    pub(super) fn abandon_all(&self) {
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
        let AnswerSink::Transactional(transactions) = &self.sink else {
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
}
