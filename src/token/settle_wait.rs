//! Waiting for another owner's settle. A reservation that meets a live lease
//! (`InFlight`) registers here before it backs off; the store's listener (Redis
//! pub/sub, Postgres `LISTEN`) wakes it as soon as the holder confirms or restores
//! the token, so the duplicate is answered right after the settle instead of after
//! its backoff. The backoff stays the fallback: a lost notification only costs time.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};

/// Why a [`SettleWatch`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woken {
    /// The holder's settle was announced (the notification path).
    Notification,
    /// The token was no longer `processing` when the watch was set up: it was settled
    /// between the reservation that saw the lease and the subscription.
    AlreadySettled,
    /// The listener lost its connection and may have missed the announcement: look
    /// again rather than wait for a message that may never come.
    ListenerReconnected,
}

impl Woken {
    /// The label of the `woken_by` metric attribute and span field.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Notification => "notification",
            Self::AlreadySettled => "already_settled",
            Self::ListenerReconnected => "listener_reconnected",
        }
    }
}

/// A registration for the next settle of one token. Dropping it unregisters.
#[derive(Debug)]
pub struct SettleWatch {
    state: WatchState,
}

#[derive(Debug)]
enum WatchState {
    Ready(Woken),
    Waiting {
        receiver: oneshot::Receiver<Woken>,
        _registration: Registration,
    },
}

impl SettleWatch {
    /// A watch that ends at once: there is nothing left to wait for.
    pub fn ready(why: Woken) -> Self {
        Self {
            state: WatchState::Ready(why),
        }
    }

    fn waiting(receiver: oneshot::Receiver<Woken>, registration: Registration) -> Self {
        Self {
            state: WatchState::Waiting {
                receiver,
                _registration: registration,
            },
        }
    }

    /// Resolves when the token is settled (or the listener cannot tell any more).
    /// Never resolves when the listener is gone for good: the caller's backoff ends
    /// the wait then.
    pub async fn settled(self) -> Woken {
        match self.state {
            WatchState::Ready(why) => why,
            WatchState::Waiting {
                receiver,
                _registration,
            } => match receiver.await {
                Ok(why) => why,
                Err(_) => std::future::pending().await,
            },
        }
    }
}

type Senders = Vec<(u64, oneshot::Sender<Woken>)>;

/// Who waits for which channel in this process. One per store; shared with its
/// listener task, which wakes them.
#[derive(Debug, Default)]
pub(super) struct Waiters {
    by_channel: Mutex<HashMap<String, Senders>>,
    next_id: AtomicU64,
    /// Told the channels nobody waits for any more (a Redis listener unsubscribes).
    idle: Option<mpsc::UnboundedSender<String>>,
}

impl Waiters {
    /// A registry that reports channels left without waiters to `idle`.
    pub(super) fn reporting_idle(idle: mpsc::UnboundedSender<String>) -> Self {
        Self {
            idle: Some(idle),
            ..Self::default()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Senders>> {
        // A panic while holding this lock leaves plain data behind: keep using it.
        self.by_channel
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Registers a waiter for `channel`; the watch ends on its next [`Self::wake`].
    pub(super) fn register(self: &Arc<Self>, channel: &str) -> SettleWatch {
        let (sender, receiver) = oneshot::channel();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.lock()
            .entry(channel.to_owned())
            .or_default()
            .push((id, sender));
        SettleWatch::waiting(
            receiver,
            Registration {
                waiters: Arc::clone(self),
                channel: channel.to_owned(),
                id,
            },
        )
    }

    /// Whether anybody waits for `channel` right now.
    pub(super) fn has_waiters(&self, channel: &str) -> bool {
        self.lock().contains_key(channel)
    }

    /// Wakes everybody waiting for `channel`.
    pub(super) fn wake(&self, channel: &str) {
        let woken = self.lock().remove(channel);
        if let Some(senders) = woken {
            for (_, sender) in senders {
                let _ = sender.send(Woken::Notification);
            }
            self.report_idle(channel);
        }
    }

    /// Wakes everybody: the listener's connection was replaced and what was
    /// announced meanwhile is lost.
    pub(super) fn wake_all(&self, why: Woken) {
        let all = std::mem::take(&mut *self.lock());
        for (channel, senders) in all {
            for (_, sender) in senders {
                let _ = sender.send(why);
            }
            self.report_idle(&channel);
        }
    }

    fn report_idle(&self, channel: &str) {
        if let Some(idle) = &self.idle {
            let _ = idle.send(channel.to_owned());
        }
    }
}

/// Removes its waiter when the watch is dropped unwoken (its backoff ended first).
#[derive(Debug)]
struct Registration {
    waiters: Arc<Waiters>,
    channel: String,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let emptied = {
            let mut map = self.waiters.lock();
            match map.get_mut(&self.channel) {
                Some(senders) => {
                    senders.retain(|(id, _)| *id != self.id);
                    let empty = senders.is_empty();
                    if empty {
                        map.remove(&self.channel);
                    }
                    empty
                }
                None => false,
            }
        };
        if emptied {
            self.waiters.report_idle(&self.channel);
        }
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;

    #[tokio::test]
    async fn a_wake_ends_every_watch_of_its_channel_and_no_other() {
        let (idle, mut idle_rx) = mpsc::unbounded_channel();
        let waiters = Arc::new(Waiters::reporting_idle(idle));
        let first = waiters.register("a");
        let second = waiters.register("a");
        let other = waiters.register("b");
        waiters.wake("a");
        assert_eq!(first.settled().await, Woken::Notification);
        assert_eq!(second.settled().await, Woken::Notification);
        assert_eq!(idle_rx.recv().await.as_deref(), Some("a"));
        assert!(waiters.has_waiters("b"));
        assert!(
            other.settled().now_or_never().is_none(),
            "b was never woken"
        );
        // Dropping the last watch of `b` leaves it idle.
        assert_eq!(idle_rx.recv().await.as_deref(), Some("b"));
        assert!(!waiters.has_waiters("b"));
    }

    #[tokio::test]
    async fn a_dropped_watch_unregisters_and_the_rest_still_wake() {
        let waiters = Arc::new(Waiters::default());
        let dropped = waiters.register("k");
        let kept = waiters.register("k");
        drop(dropped);
        assert!(waiters.has_waiters("k"));
        waiters.wake_all(Woken::ListenerReconnected);
        assert_eq!(kept.settled().await, Woken::ListenerReconnected);
        assert!(!waiters.has_waiters("k"));
        assert_eq!(
            SettleWatch::ready(Woken::AlreadySettled).settled().await,
            Woken::AlreadySettled
        );
    }
}
