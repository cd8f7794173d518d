//! Exactly-once: the answers of one partition enter the open transaction in offset
//! order, while the charges behind them still run concurrently (one key at a time).
//!
//! Why: a transaction carries the partition's gap-free offset, the lowest command
//! not yet finished. Were a later command's answer let in while an earlier one still
//! ran, a commit could make that answer visible with an offset below it; a crash
//! right after would have the next owner read the command again and publish a second
//! result for it. Entering in offset order makes the answers of every transaction a
//! prefix of the partition's commands, and the commit (which waits until each
//! answer in it is settled, see `transactions.rs`) sends an offset past all of them.
//!
//! A command that will never answer (a drain interrupted it) stops the commands
//! behind it from answering too: their offsets stay pending with its own, and the
//! next owner answers them, as duplicates carrying the original answer where they
//! already charged.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// Whether a command may put its answer into the open transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Every earlier command of the partition has entered its answer.
    Go,
    /// An earlier command will not answer: neither may this one.
    Stopped,
}

/// The commands of one partition that have not entered their answer yet.
#[derive(Debug, Default)]
struct Queue {
    /// Offset → the command's wake-up, once it waits for its turn.
    waiting: BTreeMap<i64, Option<oneshot::Sender<Turn>>>,
    /// The lowest offset that will never answer.
    stopped_at: Option<i64>,
}

impl Queue {
    fn turn_of(&self, offset: i64) -> Option<Turn> {
        if self.stopped_at.is_some_and(|stopped| stopped < offset) {
            return Some(Turn::Stopped);
        }
        match self.waiting.keys().next() {
            Some(&first) if first < offset => None,
            _ => Some(Turn::Go),
        }
    }

    /// Wakes the command whose turn it is now, if it already waits.
    fn wake_first(&mut self) {
        if let Some(sender) = self.waiting.values_mut().next().and_then(Option::take) {
            // A command that stopped waiting (its task ended) needs no wake-up.
            let _ = sender.send(Turn::Go);
        }
    }
}

/// One partition's answer order; the partition task owns it.
#[derive(Debug, Default)]
pub struct AnswerOrder {
    queue: Mutex<Queue>,
}

impl AnswerOrder {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        // Every mutation is a single insert/remove/replace: a poisoned queue is valid.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A record was admitted: its answer comes after those admitted before it.
    pub fn admit(&self, offset: i64) {
        self.lock().waiting.entry(offset).or_insert(None);
    }

    /// The command at `offset` ended without an answer: those behind it will not
    /// answer either.
    pub fn stop(&self, offset: i64) {
        let mut queue = self.lock();
        queue.stopped_at = Some(queue.stopped_at.map_or(offset, |s| s.min(offset)));
        let behind: Vec<i64> = queue.waiting.range(offset + 1..).map(|(o, _)| *o).collect();
        for later in behind {
            if let Some(sender) = queue.waiting.get_mut(&later).and_then(Option::take) {
                let _ = sender.send(Turn::Stopped);
            }
        }
    }

    /// The turn of the command at `offset`, handed to its task.
    pub fn turn(self: &Arc<Self>, offset: i64) -> AnswerTurn {
        AnswerTurn {
            order: Arc::clone(self),
            offset,
        }
    }
}

/// A command's place in its partition's answer order.
#[derive(Debug)]
pub struct AnswerTurn {
    order: Arc<AnswerOrder>,
    offset: i64,
}

impl AnswerTurn {
    /// Waits until every earlier command of the partition entered its answer, or
    /// one of them will not.
    pub async fn wait(&self) -> Turn {
        let receiver = {
            let mut queue = self.order.lock();
            if let Some(turn) = queue.turn_of(self.offset) {
                return turn;
            }
            let (sender, receiver) = oneshot::channel();
            queue.waiting.insert(self.offset, Some(sender));
            receiver
        };
        // The order is dropped only with its partition task, which ends this one too.
        receiver.await.unwrap_or(Turn::Stopped)
    }

    /// This command's answer is in the transaction: the next one may enter.
    pub fn entered(self) {
        let mut queue = self.order.lock();
        queue.waiting.remove(&self.offset);
        queue.wake_first();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn order_of(offsets: &[i64]) -> Arc<AnswerOrder> {
        let order = Arc::new(AnswerOrder::default());
        for &offset in offsets {
            order.admit(offset);
        }
        order
    }

    async fn turn_within(turn: &AnswerTurn, millis: u64) -> Option<Turn> {
        tokio::time::timeout(Duration::from_millis(millis), turn.wait())
            .await
            .ok()
    }

    /// The turn, where one is expected at once: a wrong order fails, never hangs.
    async fn turn_now(turn: &AnswerTurn) -> Option<Turn> {
        turn_within(turn, 5_000).await
    }

    #[tokio::test]
    async fn the_first_admitted_goes_at_once_and_the_rest_in_offset_order() {
        let order = order_of(&[3, 5, 9]);
        let (first, second, third) = (order.turn(3), order.turn(5), order.turn(9));
        assert_eq!(turn_within(&third, 20).await, None, "9 waits for 3 and 5");
        assert_eq!(turn_within(&second, 20).await, None, "5 waits for 3");
        assert_eq!(turn_now(&first).await, Some(Turn::Go));
        first.entered();
        assert_eq!(turn_now(&second).await, Some(Turn::Go));
        assert_eq!(turn_within(&third, 20).await, None, "9 still waits for 5");
        second.entered();
        assert_eq!(turn_now(&third).await, Some(Turn::Go));
    }

    #[tokio::test]
    async fn a_waiting_command_is_woken_when_its_predecessor_enters() {
        let order = order_of(&[0, 1]);
        let (first, second) = (order.turn(0), order.turn(1));
        let waiter = tokio::spawn(async move { second.wait().await });
        tokio::task::yield_now().await;
        first.entered();
        let woken = tokio::time::timeout(Duration::from_secs(5), waiter).await;
        assert_eq!(woken.ok().and_then(Result::ok), Some(Turn::Go));
    }

    #[tokio::test]
    async fn a_command_that_will_not_answer_stops_those_behind_it_only() {
        let order = order_of(&[0, 1, 2, 3]);
        let (first, second, fourth) = (order.turn(0), order.turn(1), order.turn(3));
        // Both wait already when 2 stops: the one ahead of it must not be woken.
        let ahead = tokio::spawn(async move { second.wait().await });
        let behind = tokio::spawn(async move { fourth.wait().await });
        tokio::task::yield_now().await;
        order.stop(2);
        let stopped = tokio::time::timeout(Duration::from_secs(5), behind).await;
        assert_eq!(stopped.ok().and_then(Result::ok), Some(Turn::Stopped));
        first.entered();
        let woken = tokio::time::timeout(Duration::from_secs(5), ahead).await;
        assert_eq!(
            woken.ok().and_then(Result::ok),
            Some(Turn::Go),
            "1 is ahead of the stop"
        );
        assert_eq!(
            turn_now(&order.turn(7)).await,
            Some(Turn::Stopped),
            "a later record too"
        );
    }

    #[tokio::test]
    async fn a_command_redone_after_its_task_ended_keeps_its_place() {
        // A panicking handler drops its wait; the record is handled again at the
        // same offset and must still come before the records behind it.
        let order = order_of(&[0, 1, 2]);
        let (first, second, third) = (order.turn(0), order.turn(1), order.turn(2));
        assert_eq!(turn_within(&second, 20).await, None);
        first.entered();
        let again = order.turn(1);
        assert_eq!(
            turn_within(&third, 20).await,
            None,
            "2 waits for the redone 1"
        );
        assert_eq!(turn_now(&again).await, Some(Turn::Go));
        again.entered();
        assert_eq!(turn_now(&third).await, Some(Turn::Go));
        drop(second);
    }
}
