//! The master a group of Redis Sentinels names (`redis+sentinel://h1:p1,h2:p2/<master>`),
//! followed through failovers.
//!
//! The connection goes to the master the sentinels name (confirmed by its own
//! `ROLE`). When that node stops being the master, two things tell: Sentinel closes
//! every client connection of the nodes it reconfigures, and a script sent to a
//! demoted master is refused with `READONLY`. Either way the master is asked for
//! again; a `READONLY` command is sent once more to the new master, since a replica
//! refused it before it changed anything. A connection that broke mid-command is
//! not sent again: whether the command ran is unknown, and the token store's callers
//! retry under their own rules, as after any lost connection.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ErrorKind, Pipeline, RedisError, RedisFuture,
    RedisResult, ServerErrorKind, TlsCertificates, TlsMode, Value,
};

use crate::redaction::Secret;

/// How long asking the sentinels for the master and connecting to it may take.
const FIND_MASTER_TIMEOUT: Duration = Duration::from_secs(5);

/// What a Sentinel URL asks the sentinels for: the master's name, the database,
/// whether its nodes speak TLS, the credentials for the master and its replicas
/// (`user:password@` of the URL), and whether the sentinels get them too
/// (`?sentinel_auth=same`, for sentinels with the data nodes' password).
#[derive(Clone)]
pub struct SentinelService {
    /// The master's name in the sentinels' configuration.
    pub master: String,
    /// The database number (`/<master>/<db>`).
    pub db: i64,
    /// `rediss+sentinel://`: sentinels and data nodes over TLS.
    pub tls: bool,
    /// User name for the master.
    pub username: Option<String>,
    /// Password for the master.
    pub password: Option<Secret>,
    /// The sentinels take the same credentials.
    pub sentinel_auth: bool,
}

impl std::fmt::Debug for SentinelService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelService")
            .field("master", &self.master)
            .field("db", &self.db)
            .field("tls", &self.tls)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("sentinel_auth", &self.sentinel_auth)
            .finish()
    }
}

/// The current master's connection, replaced when the master changes.
#[derive(Clone)]
pub struct SentinelConnection {
    shared: Arc<Shared>,
    db: i64,
}

struct Shared {
    sentinels: tokio::sync::Mutex<SentinelClient>,
    config: AsyncConnectionConfig,
    /// The connection and how many times the master was looked up before it.
    current: RwLock<(u64, MultiplexedConnection)>,
}

impl SentinelConnection {
    /// Asks the `sentinels` (`redis://host:port` URLs) for `service`'s master and
    /// connects to it, with `certificates` for TLS when given.
    pub(super) async fn connect(
        sentinels: &[String],
        service: &SentinelService,
        certificates: Option<TlsCertificates>,
        config: AsyncConnectionConfig,
    ) -> anyhow::Result<Self> {
        let mut sentinels = sentinel_client(sentinels, service, certificates)?;
        let connection = find_master(&mut sentinels, &config).await?;
        Ok(Self {
            shared: Arc::new(Shared {
                sentinels: tokio::sync::Mutex::new(sentinels),
                config,
                current: RwLock::new((0, connection)),
            }),
            db: service.db,
        })
    }

    fn current(&self) -> (u64, MultiplexedConnection) {
        match self.shared.current.read() {
            Ok(guard) => (guard.0, guard.1.clone()),
            Err(poisoned) => {
                let guard = poisoned.into_inner();
                (guard.0, guard.1.clone())
            }
        }
    }

    /// Looks the master up again unless someone already did since `seen`; false
    /// when the sentinels named none that answers.
    async fn follow(&self, seen: u64) -> bool {
        let mut sentinels = self.shared.sentinels.lock().await;
        if self.current().0 != seen {
            return true;
        }
        match find_master(&mut sentinels, &self.shared.config).await {
            Ok(connection) => {
                let mut current = match self.shared.current.write() {
                    Ok(guard) => guard,
                    Err(poisoned) => poisoned.into_inner(),
                };
                *current = (seen + 1, connection);
                tracing::info!("Redis master looked up again through the sentinels");
                true
            }
            Err(error) => {
                tracing::warn!(
                    error = format!("{error:#}"),
                    "no Redis master found through the sentinels"
                );
                false
            }
        }
    }

    async fn send<T, F>(&self, request: F) -> RedisResult<T>
    where
        F: Fn(MultiplexedConnection) -> RedisFuture<'static, T>,
    {
        let (seen, connection) = self.current();
        match request(connection).await {
            Err(error) if refused_by_a_replica(&error) => {
                if self.follow(seen).await {
                    request(self.current().1).await
                } else {
                    Err(error)
                }
            }
            Err(error) if lost_the_node(&error) => {
                self.follow(seen).await;
                Err(error)
            }
            answer => answer,
        }
    }
}

/// A write sent to a node that is no longer the master: nothing was changed.
fn refused_by_a_replica(error: &RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
}

fn lost_the_node(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
}

async fn find_master(
    sentinels: &mut SentinelClient,
    config: &AsyncConnectionConfig,
) -> anyhow::Result<MultiplexedConnection> {
    let finding = async {
        let master = sentinels
            .async_get_client()
            .await
            .context("asking the sentinels for the master")?;
        master
            .get_multiplexed_async_connection_with_config(config)
            .await
            .context("connecting to the master the sentinels named")
    };
    tokio::time::timeout(FIND_MASTER_TIMEOUT, finding)
        .await
        .map_err(|_| {
            anyhow::Error::new(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no master found within 5s",
            )))
        })?
}

/// `host:port` of a sentinel URL (`redis://h:p`), the port 26379 when none is given.
fn sentinel_address(node: &str, tls: bool) -> anyhow::Result<ConnectionAddr> {
    let host_port = node.split_once("://").map_or(node, |(_, rest)| rest);
    let (host, port) = match host_port.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(']') || host.starts_with('[') => (
            host,
            port.parse::<u16>()
                .with_context(|| format!("sentinel {host_port}: the port is not a number"))?,
        ),
        _ => (host_port, 26379),
    };
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    anyhow::ensure!(!host.is_empty(), "a sentinel without a host");
    Ok(if tls {
        ConnectionAddr::TcpTls {
            host,
            port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(host, port)
    })
}

fn sentinel_client(
    sentinels: &[String],
    service: &SentinelService,
    certificates: Option<TlsCertificates>,
) -> anyhow::Result<SentinelClient> {
    let addresses = sentinels
        .iter()
        .map(|node| sentinel_address(node, service.tls))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut builder = SentinelClientBuilder::new(
        addresses,
        service.master.clone(),
        SentinelServerType::Master,
    )
    .context("sentinel settings")?
    .set_client_to_redis_db(service.db)
    .set_client_to_redis_tcp_settings(super::node::tcp_settings())
    .set_client_to_sentinel_tcp_settings(super::node::tcp_settings());
    if let Some(username) = &service.username {
        builder = builder.set_client_to_redis_username(username);
        if service.sentinel_auth {
            builder = builder.set_client_to_sentinel_username(username);
        }
    }
    if let Some(password) = &service.password {
        builder = builder.set_client_to_redis_password(password.expose());
        if service.sentinel_auth {
            builder = builder.set_client_to_sentinel_password(password.expose());
        }
    }
    if service.tls {
        builder = builder
            .set_client_to_redis_tls_mode(TlsMode::Secure)
            .set_client_to_sentinel_tls_mode(TlsMode::Secure);
    }
    if let Some(certificates) = certificates {
        anyhow::ensure!(
            service.tls,
            "REDIS_CA_CERT and REDIS_CLIENT_CERT need TLS: use rediss+sentinel://"
        );
        builder = builder
            .set_client_to_redis_certificates(certificates.clone())
            .set_client_to_sentinel_certificates(certificates);
    }
    builder.build().context("sentinel settings")
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let cmd = cmd.clone();
        Box::pin(async move {
            self.send(move |mut connection| {
                let cmd = cmd.clone();
                Box::pin(async move { connection.req_packed_command(&cmd).await })
            })
            .await
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let pipeline = pipeline.clone();
        Box::pin(async move {
            self.send(move |mut connection| {
                let pipeline = pipeline.clone();
                Box::pin(async move {
                    connection
                        .req_packed_commands(&pipeline, offset, count)
                        .await
                })
            })
            .await
        })
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_addresses() {
        let address = sentinel_address("redis://10.0.0.1:26380", false).unwrap();
        assert_eq!(address, ConnectionAddr::Tcp("10.0.0.1".into(), 26380));
        let address = sentinel_address("redis://sentinel-0.sentinel", false).unwrap();
        assert_eq!(
            address,
            ConnectionAddr::Tcp("sentinel-0.sentinel".into(), 26379)
        );
        let address = sentinel_address("redis://[::1]:5000", false).unwrap();
        assert_eq!(address, ConnectionAddr::Tcp("::1".into(), 5000));
        assert!(matches!(
            sentinel_address("rediss://h:1", true).unwrap(),
            ConnectionAddr::TcpTls {
                insecure: false,
                ..
            }
        ));
        assert!(sentinel_address("redis://h:port", false).is_err());
    }
}
