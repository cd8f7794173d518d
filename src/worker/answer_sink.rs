//! Where answers and the offsets past them go, chosen once when the worker starts
//! (`--results`): acknowledged record by record, the offset stored after them
//! (at-least-once), or into the open transaction together with the offsets
//! (exactly-once, `transactions.rs`). The layers between the poll loop and the
//! publisher carry one `AnswerSink` and one per-command handle of each kind
//! (`AnswerPlace`, `AnswerHold`), whose at-least-once variants do nothing; the
//! mode is decided here and in the exactly-once files alone.
//!
//! Invariants both modes keep: an answer is durable (acknowledged, or in the
//! transaction whose commit carries its offset) before its offset can move past
//! it; in exactly-once mode the answers of a partition enter the transaction in
//! offset order (`answer_order.rs`), and a command holds the transaction's gate
//! from its answer until its partition recorded it as settled.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::{Offset, TopicPartitionList};

use super::answer_order::{AnswerOrder, AnswerTurn, Turn};
use super::oversized::Oversized;
use super::transactions::{AnswerGuard, Transactions};
use crate::payment::SourcePosition;

/// How this worker's answers and offsets leave it; one for the process.
#[derive(Clone)]
pub enum AnswerSink {
    /// Each answer acknowledged (`acks=all`) before its offset is stored; the
    /// consumer's commit thread commits the stored offsets.
    AtLeastOnce,
    /// Answers and the settled offsets in one Kafka transaction.
    Transactional(Arc<Transactions>),
}

impl AnswerSink {
    /// Whether answers go into a transaction (then the consumer commits nothing).
    pub fn is_transactional(&self) -> bool {
        matches!(self, Self::Transactional(_))
    }

    /// What aborted transactions learnt of refused records; at-least-once a smaller
    /// form follows a refused one at once, so there is nothing to remember.
    pub(super) fn oversized(&self) -> Option<&Oversized> {
        match self {
            Self::AtLeastOnce => None,
            Self::Transactional(transactions) => Some(transactions.oversized()),
        }
    }

    /// The answers of one newly started partition task.
    pub(super) fn partition_answers(&self) -> PartitionAnswers {
        match self {
            Self::AtLeastOnce => PartitionAnswers::AsTheyCome,
            Self::Transactional(_) => {
                PartitionAnswers::InOffsetOrder(Arc::new(AnswerOrder::default()))
            }
        }
    }

    /// The first record this member got for a partition since it was assigned or
    /// rewound: exactly-once, where an abort rewinds it to while nothing committed.
    pub(super) fn first_record(&self, topic: &str, partition: i32, offset: i64) {
        if let Self::Transactional(transactions) = self {
            transactions.first_record(topic, partition, offset);
        }
    }

    /// Every command of the partition below `next` is settled. At-least-once the
    /// offset is stored for the commit thread (returns whether it was: it fails
    /// only once the partition is no longer ours); exactly-once it goes with the
    /// open transaction and the consumer stores nothing (returns `false`).
    pub(super) fn settle<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        topic: &str,
        partition: i32,
        next: i64,
    ) -> bool {
        if let Self::Transactional(transactions) = self {
            transactions.settle(topic, partition, next);
            return false;
        }
        let mut list = TopicPartitionList::new();
        if list
            .add_partition_offset(topic, partition, Offset::Offset(next))
            .is_err()
        {
            return false;
        }
        match consumer.store_offsets(&list) {
            Ok(()) => true,
            Err(error) => {
                tracing::debug!(%error, partition, "offset not stored");
                false
            }
        }
    }

    /// How long the poll loop may wait for a record: at most `poll_wait`, and not
    /// past the moment the open transaction is due.
    pub(super) fn poll_wait(&self, poll_wait: Duration) -> Duration {
        match self {
            Self::AtLeastOnce => poll_wait,
            Self::Transactional(transactions) => transactions.until_due().min(poll_wait),
        }
    }

    /// Admits the answer of the command at `source`: exactly-once once every
    /// earlier command of its partition entered its answer (`place`) and no commit
    /// runs. `None` when an earlier command will not answer: then neither may this
    /// one, and its offset stays pending.
    pub(super) async fn enter(
        &self,
        place: AnswerPlace,
        source: &SourcePosition,
    ) -> Option<AnswerHold> {
        let Self::Transactional(transactions) = self else {
            return Some(AnswerHold::Acknowledged);
        };
        match place {
            AnswerPlace::InOrder(turn) => {
                if turn.wait().await == Turn::Stopped {
                    return None;
                }
                let guard = transactions.enter(source).await;
                turn.entered();
                Some(AnswerHold::InTransaction(guard))
            }
            // A command handled without a partition task (a tool, a test): nothing
            // to wait for but a commit.
            AnswerPlace::Free => Some(AnswerHold::InTransaction(transactions.enter(source).await)),
        }
    }
}

/// One partition's answers: as they come (at-least-once), or in offset order
/// (exactly-once, `answer_order.rs`). The partition task owns it.
pub(super) enum PartitionAnswers {
    AsTheyCome,
    InOffsetOrder(Arc<AnswerOrder>),
}

impl PartitionAnswers {
    /// A record was admitted: its answer comes after those admitted before it.
    pub(super) fn admit(&self, offset: i64) {
        if let Self::InOffsetOrder(order) = self {
            order.admit(offset);
        }
    }

    /// The record at `offset` will not be answered here, so neither will those
    /// behind it (their offsets stay pending with its own).
    pub(super) fn stop(&self, offset: i64) {
        if let Self::InOffsetOrder(order) = self {
            order.stop(offset);
        }
    }

    /// The place of the command at `offset`, handed to its task.
    pub(super) fn place(&self, offset: i64) -> AnswerPlace {
        match self {
            Self::AsTheyCome => AnswerPlace::Free,
            Self::InOffsetOrder(order) => AnswerPlace::InOrder(order.turn(offset)),
        }
    }
}

/// A command's place among its partition's answers, before it answers.
#[derive(Debug)]
pub enum AnswerPlace {
    /// Nothing to wait for: at-least-once, or a command handled on its own.
    Free,
    /// Exactly-once: after every earlier command of the partition.
    InOrder(AnswerTurn),
}

/// What a command holds from its answer until its partition recorded it as settled.
pub enum AnswerHold {
    /// At-least-once: the answer is acknowledged, nothing is held.
    Acknowledged,
    /// Exactly-once: its place in the open transaction; a commit waits for it.
    InTransaction(AnswerGuard),
}

impl AnswerHold {
    /// The partition recorded the command as settled: a commit may carry its answer.
    pub fn settled(self) {
        if let Self::InTransaction(guard) = self {
            guard.settled();
        }
    }
}
