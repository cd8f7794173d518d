//! One assigned partition: commands of different keys run concurrently (bounded),
//! commands of one key strictly in order, and the stored offset never passes a
//! command that is not finished (SPEC I3).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::handler::{command_span, lane_of, Handler};
use super::offsets::OffsetTracker;

/// Records of one key wait behind the one running; keyless records share one lane.
type Lane = Option<Vec<u8>>;

/// A command task's end: `settled` when its outcome is final and acknowledged.
struct Finished {
    offset: i64,
    lane: Lane,
    settled: bool,
    /// Kept open so the offset commit is recorded inside the command's trace.
    span: tracing::Span,
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
}

impl<C: ConsumerContext + 'static> PartitionTask<C> {
    pub async fn run(mut self) {
        let mut offsets = OffsetTracker::default();
        let mut waiting: HashMap<Lane, VecDeque<OwnedMessage>> = HashMap::new();
        let mut running: JoinSet<Finished> = JoinSet::new();
        let draining = CancellationToken::new();
        let mut admitted = 0usize;
        let mut inbox_open = true;
        // A revoke drops the inbox's sender, but `recv` still hands out what was
        // buffered (up to the inbox's capacity): the closure itself is the signal to
        // start nothing new, checked on every wake-up and at least every 50 ms.
        let mut closure_check = tokio::time::interval(std::time::Duration::from_millis(50));
        closure_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if inbox_open && self.inbox.is_closed() {
                // Revoked or shutting down: finish what runs, start nothing new.
                // Queued records stay pending, so their offsets are not committed.
                inbox_open = false;
                waiting.clear();
                draining.cancel();
                if running.is_empty() {
                    break;
                }
            }
            tokio::select! {
                biased;
                _ = self.abandon.cancelled() => {
                    // Abandoned commands keep their offsets pending: the next owner of
                    // the partition processes them again, and their tokens' leases expire.
                    running.abort_all();
                    break;
                }
                Some(joined) = running.join_next(), if !running.is_empty() => {
                    let Ok(Finished { offset, lane, settled, span }) = joined else { continue };
                    admitted -= 1;
                    crate::telemetry::metrics().in_flight.add(-1, &[]);
                    if settled {
                        offsets.complete(offset);
                        span.in_scope(|| self.store(&mut offsets));
                    }
                    let next = waiting.get_mut(&lane).and_then(VecDeque::pop_front);
                    match next {
                        Some(message) if inbox_open && !self.inbox.is_closed() => {
                            self.start(&mut running, message, lane, &draining)
                        }
                        _ => { waiting.remove(&lane); }
                    }
                }
                received = self.inbox.recv(), if inbox_open && admitted < self.max_in_flight => {
                    // Closed: the check at the top of the loop stops admitting; this
                    // record stays pending like the rest of the queue.
                    let Some(message) = received.filter(|_| !self.inbox.is_closed()) else {
                        continue;
                    };
                    admitted += 1;
                    offsets.admit(message.offset());
                    let lane = lane_of(&message);
                    if let Some(queue) = waiting.get_mut(&lane) {
                        queue.push_back(message);
                    } else {
                        waiting.insert(lane.clone(), VecDeque::new());
                        self.start(&mut running, message, lane, &draining);
                    }
                }
                _ = closure_check.tick(), if inbox_open => {}
            }
            if !inbox_open && running.is_empty() {
                break;
            }
        }
        self.store(&mut offsets);
        tracing::debug!(topic = %self.topic, partition = self.partition, "partition drained");
    }

    fn start(
        &self,
        running: &mut JoinSet<Finished>,
        message: OwnedMessage,
        lane: Lane,
        draining: &CancellationToken,
    ) {
        let handler = Arc::clone(&self.handler);
        let draining = draining.clone();
        let span = command_span(&message, &self.group_id);
        crate::telemetry::metrics().in_flight.add(1, &[]);
        running.spawn(async move {
            let settled = handler
                .handle(&message, &draining)
                .instrument(span.clone())
                .await
                .is_some();
            Finished {
                offset: message.offset(),
                lane,
                settled,
                span,
            }
        });
    }

    fn store(&self, offsets: &mut OffsetTracker) {
        let Some(next) = offsets.advance() else {
            return;
        };
        // librdkafka commits stored offsets within `auto.commit.interval.ms`, and
        // synchronously on revoke and shutdown.
        let _span = tracing::info_span!(
            "offset commit",
            otel.kind = "client",
            messaging.system = "kafka",
            messaging.operation.type = "settle",
            messaging.destination.partition.id = self.partition.to_string(),
            messaging.kafka.offset = next,
        )
        .entered();
        let mut list = TopicPartitionList::new();
        if list
            .add_partition_offset(&self.topic, self.partition, Offset::Offset(next))
            .is_err()
        {
            return;
        }
        // Fails only once the partition is no longer ours; the new owner decides then.
        if let Err(error) = self.consumer.store_offsets(&list) {
            tracing::debug!(%error, partition = self.partition, "offset not stored");
        }
    }
}
