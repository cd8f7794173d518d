//! The Redis store's settle announcements: `confirm.lua` and `restore.lua` PUBLISH on
//! the token's own key name (channels and keys are separate namespaces), and each
//! process keeps ONE subscriber connection for all its waiters. A channel is
//! subscribed while somebody in this process waits for it, so a settle nobody waits
//! for costs the server one dictionary look-up. In a Redis Cluster a PUBLISH reaches
//! every node, so the subscriber may sit on any of them.
//!
//! One task owns the connection and does every SUBSCRIBE/UNSUBSCRIBE in order, so a
//! late UNSUBSCRIBE can never drop a channel a newer waiter subscribed. When the
//! connection is lost every waiter is woken (it looks again) and the task connects
//! anew at the next wait; until then waiters fall back to their backoff. Nothing
//! connects before the first wait.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot};

use crate::token::settle_wait::{SettleWatch, Waiters, Woken};

/// Longest wait for the subscriber's connection or one (UN)SUBSCRIBE.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause between two attempts to connect the subscriber.
const RECONNECT_PAUSE: Duration = Duration::from_millis(500);

enum Command {
    Subscribe(String, oneshot::Sender<bool>),
}

/// The process's subscriber: its waiters and the task that owns the connection.
#[derive(Debug)]
pub(super) struct RedisSettleListener {
    waiters: Arc<Waiters>,
    commands: mpsc::UnboundedSender<Command>,
}

impl RedisSettleListener {
    /// Starts the subscriber task on `client` (it connects on its own, and again after
    /// every loss). The task ends when the listener is dropped.
    pub(super) fn start(client: redis::Client) -> Self {
        let (commands, receiver) = mpsc::unbounded_channel();
        let (idle, idle_rx) = mpsc::unbounded_channel();
        let waiters = Arc::new(Waiters::reporting_idle(idle));
        tokio::spawn(run(client, Arc::clone(&waiters), receiver, idle_rx));
        Self { waiters, commands }
    }

    /// Registers for the next settle announced on `channel` and subscribes to it;
    /// `None` when the subscription could not be confirmed (the caller backs off as
    /// it always did).
    pub(super) async fn watch(&self, channel: &str) -> Option<SettleWatch> {
        let watch = self.waiters.register(channel);
        let (ack, acked) = oneshot::channel();
        self.commands
            .send(Command::Subscribe(channel.to_owned(), ack))
            .ok()?;
        match tokio::time::timeout(SUBSCRIBE_TIMEOUT, acked).await {
            Ok(Ok(true)) => Some(watch),
            _ => None,
        }
    }
}

async fn run(
    client: redis::Client,
    waiters: Arc<Waiters>,
    mut commands: mpsc::UnboundedReceiver<Command>,
    mut idle: mpsc::UnboundedReceiver<String>,
) {
    // Connected only once somebody waits (and again after a loss, at the next wait):
    // a tool that opens the store and never waits opens no subscriber.
    let Some(mut first) = commands.recv().await else {
        return;
    };
    loop {
        let Some(pubsub) = connect(&client).await else {
            let Command::Subscribe(_, ack) = first;
            let _ = ack.send(false);
            if !pause_answering_no(&mut commands).await {
                return;
            }
            let Some(next) = commands.recv().await else {
                return;
            };
            first = next;
            continue;
        };
        let (mut sink, mut stream) = pubsub.split();
        let served = serve(
            &mut sink,
            &mut stream,
            first,
            &waiters,
            &mut commands,
            &mut idle,
        )
        .await;
        if served == Served::ListenerDropped {
            return;
        }
        // Whatever was announced while the connection was going away is lost: every
        // waiter looks again, then registers on the next connection.
        waiters.wake_all(Woken::ListenerReconnected);
        while idle.try_recv().is_ok() {}
        let Some(next) = commands.recv().await else {
            return;
        };
        first = next;
    }
}

/// The subscriber's connection, or `None` (logged) when it cannot be had in time.
async fn connect(client: &redis::Client) -> Option<redis::aio::PubSub> {
    let connected = tokio::time::timeout(SUBSCRIBE_TIMEOUT, client.get_async_pubsub()).await;
    match connected {
        Ok(Ok(pubsub)) => Some(pubsub),
        failed => {
            match failed {
                Ok(Err(error)) => tracing::warn!(
                    %error,
                    "settle notifications: cannot connect the subscriber"
                ),
                _ => tracing::warn!("settle notifications: no subscriber connection within 2s"),
            }
            None
        }
    }
}

/// How serving one connection ended.
#[derive(Debug, PartialEq, Eq)]
enum Served {
    /// The connection failed: reconnect at the next wait.
    Lost,
    /// The listener was dropped: the task ends.
    ListenerDropped,
}

/// Serves one connection (its halves stay the caller's, open until it connects
/// anew), starting with the subscription `first` asked for: the
/// subscriptions asked for, the channels nobody waits for anymore, the announcements.
async fn serve(
    sink: &mut redis::aio::PubSubSink,
    stream: &mut redis::aio::PubSubStream,
    first: Command,
    waiters: &Waiters,
    commands: &mut mpsc::UnboundedReceiver<Command>,
    idle: &mut mpsc::UnboundedReceiver<String>,
) -> Served {
    let mut subscribed: HashSet<String> = HashSet::new();
    let Command::Subscribe(channel, ack) = first;
    if !subscribe(sink, &mut subscribed, channel, ack).await {
        return Served::Lost;
    }
    loop {
        tokio::select! {
            command = commands.recv() => {
                let Some(Command::Subscribe(channel, ack)) = command else {
                    return Served::ListenerDropped;
                };
                if !subscribe(sink, &mut subscribed, channel, ack).await {
                    return Served::Lost;
                }
            }
            Some(channel) = idle.recv() => {
                if !unsubscribe_idle(sink, &mut subscribed, waiters, &channel).await {
                    return Served::Lost;
                }
            }
            message = stream.next() => {
                let Some(message) = message else {
                    tracing::warn!("settle notifications: subscriber connection lost; reconnecting");
                    return Served::Lost;
                };
                waiters.wake(message.get_channel_name());
            }
        }
    }
}

/// UNSUBSCRIBEs `channel`, reported idle, if nobody waits for it now; false when the
/// connection failed (the caller reconnects).
async fn unsubscribe_idle(
    sink: &mut redis::aio::PubSubSink,
    subscribed: &mut HashSet<String>,
    waiters: &Waiters,
    channel: &str,
) -> bool {
    // Checked when processed, not when reported: a waiter registered
    // since keeps the channel, and one registering later finds it
    // missing from `subscribed` and subscribes it again.
    if !waiters.has_waiters(channel) && subscribed.remove(channel) {
        let unsubscribed = tokio::time::timeout(SUBSCRIBE_TIMEOUT, sink.unsubscribe(channel)).await;
        if !matches!(unsubscribed, Ok(Ok(()))) {
            tracing::warn!("settle notifications: UNSUBSCRIBE failed; reconnecting");
            return false;
        }
    }
    true
}

/// SUBSCRIBEs `channel` unless it already is, and answers `ack`; false when the
/// connection failed (the caller reconnects).
async fn subscribe(
    sink: &mut redis::aio::PubSubSink,
    subscribed: &mut HashSet<String>,
    channel: String,
    ack: oneshot::Sender<bool>,
) -> bool {
    if subscribed.contains(&channel) {
        let _ = ack.send(true);
        return true;
    }
    match tokio::time::timeout(SUBSCRIBE_TIMEOUT, sink.subscribe(&channel)).await {
        Ok(Ok(())) => {
            subscribed.insert(channel);
            let _ = ack.send(true);
            true
        }
        _ => {
            let _ = ack.send(false);
            tracing::warn!("settle notifications: SUBSCRIBE failed; reconnecting");
            false
        }
    }
}

/// Waits before the next connection attempt, refusing the subscriptions asked for
/// meanwhile; false once the listener was dropped.
async fn pause_answering_no(commands: &mut mpsc::UnboundedReceiver<Command>) -> bool {
    let pause = tokio::time::sleep(RECONNECT_PAUSE);
    tokio::pin!(pause);
    loop {
        tokio::select! {
            _ = &mut pause => return true,
            command = commands.recv() => match command {
                Some(Command::Subscribe(_, ack)) => { let _ = ack.send(false); }
                None => return false,
            },
        }
    }
}
