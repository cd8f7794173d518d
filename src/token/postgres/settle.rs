//! The Postgres store's settle announcements: a reservation that meets a live lease
//! marks the row (`waiters = true`), and the settling statement (`CONFIRM`,
//! `RESTORE`) calls `pg_notify` only for a marked row. NOTIFY serialises the commits
//! of every notifying transaction on one lock, so announcing each of thousands of
//! settles a second would cost the payments their group commit; only the few a
//! duplicate waits for are announced. The notification is delivered at COMMIT, so a
//! woken duplicate finds the payment committed.
//!
//! Each process LISTENs on one connection of its own (opened at the first wait,
//! outside the payment pool) and wakes its waiters by the key in the payload.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPoolOptions};
use sqlx::PgPool;
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use crate::token::settle_wait::{SettleWatch, Waiters, Woken};

/// The channel every settle of a marked row is announced on; the payload is the key.
pub(super) const SETTLE_CHANNEL: &str = "payment_worker_token_settled";

/// Pause after the listener's connection failed before it tries again.
const RECONNECT_PAUSE: Duration = Duration::from_millis(500);

/// The process's listener, started at the first wait; stopped (its connection
/// closed) when the store and every clone of it are gone.
#[derive(Debug, Default)]
pub(super) struct PgSettle {
    listener: OnceCell<Option<Arc<Waiters>>>,
    stop: CancellationToken,
}

impl Drop for PgSettle {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl PgSettle {
    /// Registers for the next announcement about `key`, once the listener LISTENs;
    /// `None` when it cannot (the caller backs off as it always did).
    pub(super) async fn watch(&self, maintenance: &PgPool, key: &str) -> Option<SettleWatch> {
        let waiters = self
            .listener
            .get_or_init(|| start(maintenance, self.stop.clone()))
            .await
            .as_ref()?;
        Some(waiters.register(key))
    }
}

/// Opens the listener's own connection (same server and credentials as `maintenance`)
/// and LISTENs before returning, so no announcement after it is missed.
async fn start(maintenance: &PgPool, stop: CancellationToken) -> Option<Arc<Waiters>> {
    let options = (*maintenance.connect_options()).clone();
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy_with(options);
    let listening = async {
        let mut listener = PgListener::connect_with(&pool).await?;
        listener.listen(SETTLE_CHANNEL).await?;
        Ok::<_, sqlx::Error>(listener)
    };
    match tokio::time::timeout(Duration::from_secs(5), listening).await {
        Ok(Ok(listener)) => {
            let waiters = Arc::new(Waiters::default());
            tokio::spawn(run(listener, Arc::clone(&waiters), stop));
            Some(waiters)
        }
        Ok(Err(error)) => {
            tracing::warn!(%error, "settle notifications: cannot LISTEN; duplicates only back off");
            None
        }
        Err(_) => {
            tracing::warn!("settle notifications: no LISTEN within 5s; duplicates only back off");
            None
        }
    }
}

async fn run(mut listener: PgListener, waiters: Arc<Waiters>, stop: CancellationToken) {
    loop {
        let received = tokio::select! {
            received = listener.try_recv() => received,
            _ = stop.cancelled() => return,
        };
        match received {
            Ok(Some(notification)) => waiters.wake(notification.payload()),
            // The connection was lost and replaced (LISTEN again): what was announced
            // meanwhile is gone, so every waiter looks again.
            Ok(None) => waiters.wake_all(Woken::ListenerReconnected),
            Err(error) => {
                tracing::warn!(%error, "settle notifications: listener failed; retrying");
                waiters.wake_all(Woken::ListenerReconnected);
                tokio::time::sleep(RECONNECT_PAUSE).await;
            }
        }
    }
}
