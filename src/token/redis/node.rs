//! One Redis node's connection, replaced when it stops answering.
//!
//! redis-rs's `ConnectionManager` reconnects when its socket breaks, not when it goes
//! silent: after a silent partition (no RST, no FIN) every command times out, and the
//! same socket is used again, for as long as the kernel keeps it (with unacknowledged
//! data, TCP_USER_TIMEOUT bounds that; without, nothing does). Two answers missing in
//! a row, with no answer in between, replace the connection with a new one that
//! connects on its next command. One timeout alone does not: a latency spike would
//! churn connections.
//!
//! What a replaced connection leaves behind is safe: its multiplexer pairs each reply
//! with the request that asked, so a late reply is dropped, never handed to the next
//! command (a plain connection reused after a timeout reads the previous command's
//! answer). A command that timed out may still run when its bytes arrive: the token
//! store's callers treat it as an unknown outcome, as after any lost connection.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::io::tcp::{socket2::TcpKeepalive, TcpSettings};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

/// The sockets to every Redis node: no Nagle delay on small request/answer pairs;
/// keepalive probes, so an idle connection to a host that vanished is found out in
/// about 11 s instead of the kernel's two hours; and TCP_USER_TIMEOUT, so one whose
/// sent bytes go unacknowledged (a silent partition) breaks after 10 s instead of the
/// ~15 minutes of retransmissions, and is reconnected.
pub(super) fn tcp_settings() -> TcpSettings {
    TcpSettings::default()
        .set_nodelay(true)
        .set_keepalive(
            TcpKeepalive::new()
                .with_time(Duration::from_secs(5))
                .with_interval(Duration::from_secs(2))
                .with_retries(3),
        )
        .set_user_timeout(Duration::from_secs(10))
}

/// Timeouts in a row, with no answer between them, that replace the connection.
const TIMEOUTS_BEFORE_REPLACING: u32 = 2;

/// A node's connection; clones share it.
#[derive(Clone)]
pub struct NodeConnection {
    shared: Arc<Shared>,
}

struct Shared {
    /// What a replacement connects with; `None` for a connection handed in, which
    /// is never replaced.
    renewal: Option<(redis::Client, ConnectionManagerConfig)>,
    /// The connection and how many replaced it before.
    current: RwLock<(u64, ConnectionManager)>,
    /// Timeouts since the last answer.
    silent: AtomicU32,
}

impl NodeConnection {
    /// Connects to `client`'s node; replaced with the same `config` when silent.
    pub async fn connect(
        client: redis::Client,
        config: ConnectionManagerConfig,
    ) -> RedisResult<Self> {
        let manager = ConnectionManager::new_with_config(client.clone(), config.clone()).await?;
        Ok(Self::with(Some((client, config)), manager))
    }

    /// A connection made elsewhere, used as it is (never replaced).
    pub fn fixed(manager: ConnectionManager) -> Self {
        Self::with(None, manager)
    }

    fn with(
        renewal: Option<(redis::Client, ConnectionManagerConfig)>,
        manager: ConnectionManager,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                renewal,
                current: RwLock::new((0, manager)),
                silent: AtomicU32::new(0),
            }),
        }
    }

    /// How many times the connection was replaced.
    pub fn replacements(&self) -> u64 {
        self.current().0
    }

    fn current(&self) -> (u64, ConnectionManager) {
        let guard = self
            .shared
            .current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        (guard.0, guard.1.clone())
    }

    /// Counts an answer or its absence; replaces the connection `generation` after
    /// too many absences in a row (unless another caller already did).
    fn observe<T>(&self, generation: u64, answer: &RedisResult<T>) {
        match answer {
            Err(error) if error.is_timeout() => {
                let silent = self.shared.silent.fetch_add(1, Ordering::SeqCst) + 1;
                if silent >= TIMEOUTS_BEFORE_REPLACING {
                    self.replace(generation);
                }
            }
            // A reply, an error reply included: the connection answers.
            _ => self.shared.silent.store(0, Ordering::SeqCst),
        }
    }

    fn replace(&self, generation: u64) {
        let Some((client, config)) = &self.shared.renewal else {
            return;
        };
        let mut current = self
            .shared
            .current
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if current.0 != generation {
            return;
        }
        // Lazy: it connects on its next command, so a partition that still holds
        // costs that command its connect timeout, not this caller.
        match ConnectionManager::new_lazy_with_config(client.clone(), config.clone()) {
            Ok(manager) => {
                *current = (generation + 1, manager);
                self.shared.silent.store(0, Ordering::SeqCst);
                tracing::warn!(
                    timeouts = TIMEOUTS_BEFORE_REPLACING,
                    "Redis stopped answering on its connection: replaced by a new one"
                );
            }
            Err(error) => {
                tracing::warn!(error = %error, "cannot replace the silent Redis connection");
            }
        }
    }
}

impl ConnectionLike for NodeConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (generation, mut connection) = self.current();
            let answer = connection.req_packed_command(cmd).await;
            self.observe(generation, &answer);
            answer
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (generation, mut connection) = self.current();
            let answer = connection
                .req_packed_commands(pipeline, offset, count)
                .await;
            self.observe(generation, &answer);
            answer
        })
    }

    fn get_db(&self) -> i64 {
        self.current().1.get_db()
    }
}
