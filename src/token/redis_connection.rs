//! Where the Redis token store sends its commands: one node (`redis://`, `rediss://`)
//! or a Redis Cluster (`redis+cluster://h1:p1,h2:p2`, or a comma-separated list of
//! nodes with `REDIS_CLUSTER=true`). The cluster client routes each script by its key's
//! slot and follows `MOVED`/`ASK`; scans go to every master in turn.

use std::time::Duration;

use anyhow::Context;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Pipeline, RedisFuture, TlsCertificates, Value};

use crate::redaction::redact_url;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// The parsed `REDIS_URL`: its nodes (each a `redis://` or `rediss://` URL), whether
/// they form a cluster, and the CA that verifies their TLS certificates (system
/// roots when none is given).
#[derive(Clone)]
pub struct RedisTarget {
    /// The node URLs (the seed nodes of a cluster).
    pub nodes: Vec<String>,
    /// Whether the nodes are a Redis Cluster.
    pub cluster: bool,
    /// PEM of the CA that signs the servers' certificates (`None`: system roots).
    pub ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes: Vec<String> = self.nodes.iter().map(|n| redact_url(n)).collect();
        f.debug_struct("RedisTarget")
            .field("nodes", &nodes)
            .field("cluster", &self.cluster)
            .field("custom_ca", &self.ca_pem.is_some())
            .finish()
    }
}

impl RedisTarget {
    /// `redis[s]+cluster://[user:pass@]h1:p1,h2:p2[/…]` is a cluster; so is a
    /// comma-separated list of URLs or `host:port` when `cluster` is set; anything
    /// else is one node.
    pub fn parse(url: &str, cluster: bool) -> anyhow::Result<Self> {
        let url = url.trim();
        if let Some((scheme, rest)) = url.split_once("+cluster://") {
            anyhow::ensure!(
                matches!(scheme, "redis" | "rediss"),
                "unsupported Redis URL scheme {scheme:?}+cluster"
            );
            let (credentials, hosts) = match rest.rsplit_once('@') {
                Some((credentials, hosts)) => (format!("{credentials}@"), hosts),
                None => (String::new(), rest),
            };
            let hosts = hosts.split(['/', '?', '#']).next().unwrap_or_default();
            let nodes: Vec<String> = hosts
                .split(',')
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .map(|host| format!("{scheme}://{credentials}{host}"))
                .collect();
            anyhow::ensure!(!nodes.is_empty(), "a cluster URL needs at least one node");
            return Ok(Self {
                nodes,
                cluster: true,
                ca_pem: None,
            });
        }
        let parts: Vec<&str> = url
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .collect();
        anyhow::ensure!(
            cluster || parts.len() == 1,
            "several Redis nodes given: set REDIS_CLUSTER=true or use redis+cluster://h1:p1,h2:p2"
        );
        let scheme = parts
            .first()
            .and_then(|p| p.split_once("://"))
            .map_or("redis", |(scheme, _)| scheme);
        let nodes = parts
            .iter()
            .map(|p| {
                if p.contains("://") {
                    (*p).to_owned()
                } else {
                    format!("{scheme}://{p}")
                }
            })
            .collect();
        Ok(Self {
            nodes,
            cluster,
            ca_pem: None,
        })
    }

    /// The same target with this CA.
    pub fn with_ca_pem(mut self, pem: Option<Vec<u8>>) -> Self {
        self.ca_pem = pem;
        self
    }

    fn certificates(&self) -> Option<TlsCertificates> {
        self.ca_pem.as_ref().map(|pem| TlsCertificates {
            client_tls: None,
            root_cert: Some(pem.clone()),
        })
    }

    fn shown(&self) -> String {
        self.nodes
            .iter()
            .map(|n| redact_url(n))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Connects, failing fast: the worker has its own retry policy.
    pub async fn connect(&self) -> anyhow::Result<RedisConnection> {
        let shown = self.shown();
        let connecting = async {
            if self.cluster {
                let mut builder = ClusterClient::builder(self.nodes.clone())
                    .connection_timeout(CONNECT_TIMEOUT)
                    .response_timeout(RESPONSE_TIMEOUT)
                    .retries(3);
                if let Some(certs) = self.certificates() {
                    builder = builder.certs(certs);
                }
                let client = builder
                    .build()
                    .with_context(|| format!("invalid Redis Cluster nodes {shown}"))?;
                let conn = client
                    .get_async_connection()
                    .await
                    .with_context(|| format!("cannot connect to Redis Cluster at {shown}"))?;
                Ok(RedisConnection::Cluster(conn))
            } else {
                let url = self.nodes.first().context("no Redis node given")?;
                let client = match self.certificates() {
                    Some(certs) => redis::Client::build_with_tls(url.as_str(), certs),
                    None => redis::Client::open(url.as_str()),
                }
                .with_context(|| format!("invalid Redis URL {shown}"))?;
                let conn = ConnectionManager::new_with_config(client, single_node_config())
                    .await
                    .with_context(|| format!("cannot connect to Redis at {shown}"))?;
                Ok(RedisConnection::Single(conn))
            }
        };
        // An I/O timeout, as the client reports one: the same outage as a refused
        // connection to whoever asks (`process` exits 75 for either).
        tokio::time::timeout(Duration::from_secs(5), connecting)
            .await
            .map_err(|_| {
                anyhow::Error::new(redis::RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no answer within 5s",
                )))
                .context(format!("no connection to Redis at {shown}"))
            })?
    }
}

/// A connection tuned to fail fast: the worker has its own retry policy, so the
/// manager only retries a reconnect a couple of times before reporting.
pub fn single_node_config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT))
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(50))
        .set_max_delay(Duration::from_millis(500))
}

/// One node (reconnecting) or a whole cluster, behind one command interface.
#[derive(Clone)]
pub enum RedisConnection {
    /// One node, reconnecting.
    Single(ConnectionManager),
    /// A Redis Cluster, commands routed by slot.
    Cluster(ClusterConnection),
}

/// A node a scan must cover: the only node, or one cluster master by address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanTarget {
    /// The only node.
    TheNode,
    /// One cluster master.
    Master {
        /// Its host.
        host: String,
        /// Its port.
        port: u16,
    },
}

impl RedisConnection {
    /// Every node holding keys: the one node, or each cluster master.
    pub async fn scan_targets(&self) -> anyhow::Result<Vec<ScanTarget>> {
        let Self::Cluster(conn) = self else {
            return Ok(vec![ScanTarget::TheNode]);
        };
        let slots = conn
            .clone()
            .route_command(
                redis::cmd("CLUSTER").arg("SLOTS").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await
            .context("CLUSTER SLOTS")?;
        let mut masters = Vec::new();
        let Value::Array(ranges) = slots else {
            anyhow::bail!("CLUSTER SLOTS answered {slots:?}");
        };
        for range in ranges {
            // [start, end, [host, port, id, …], replicas…]
            let master = match &range {
                Value::Array(fields) => fields.get(2),
                _ => None,
            };
            let Some(Value::Array(node)) = master else {
                anyhow::bail!("CLUSTER SLOTS range without a master: {range:?}");
            };
            let host = match node.first() {
                Some(Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
                Some(Value::SimpleString(text)) => text.clone(),
                other => anyhow::bail!("CLUSTER SLOTS master host {other:?}"),
            };
            let port = match node.get(1) {
                Some(Value::Int(port)) => u16::try_from(*port).context("master port")?,
                other => anyhow::bail!("CLUSTER SLOTS master port {other:?}"),
            };
            let target = ScanTarget::Master { host, port };
            if !masters.contains(&target) {
                masters.push(target);
            }
        }
        Ok(masters)
    }

    /// Runs `cmd` on one scan target (keyless commands such as SCAN or DBSIZE).
    pub async fn query_on<T: redis::FromRedisValue>(
        &self,
        target: &ScanTarget,
        cmd: &Cmd,
    ) -> redis::RedisResult<T> {
        match (self, target) {
            (Self::Cluster(conn), ScanTarget::Master { host, port }) => {
                let value = conn
                    .clone()
                    .route_command(
                        cmd.clone(),
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                            host: host.clone(),
                            port: *port,
                        }),
                    )
                    .await?;
                Ok(redis::from_redis_value(value)?)
            }
            _ => cmd.query_async(&mut self.clone()).await,
        }
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(conn) => conn.req_packed_command(cmd),
            Self::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            Self::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(conn) => conn.get_db(),
            Self::Cluster(conn) => conn.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_forms() {
        let t = RedisTarget::parse("redis+cluster://u:p@h1:7000,h2:7001/0", false).unwrap();
        assert!(t.cluster);
        assert_eq!(t.nodes, ["redis://u:p@h1:7000", "redis://u:p@h2:7001"]);
        let t = RedisTarget::parse("rediss://h1:7000, h2:7001", true).unwrap();
        assert!(t.cluster);
        assert_eq!(t.nodes, ["rediss://h1:7000", "rediss://h2:7001"]);
        let t = RedisTarget::parse("rediss://h1:6380", false).unwrap();
        assert!(!t.cluster);
        assert_eq!(t.nodes, ["rediss://h1:6380"]);
        assert!(RedisTarget::parse("redis://h1:1,redis://h2:2", false).is_err());
        assert!(RedisTarget::parse("http+cluster://h1:1", false).is_err());
        let shown = format!(
            "{:?}",
            RedisTarget::parse("redis+cluster://u:secret@h1:1", false).unwrap()
        );
        assert!(!shown.contains("secret"), "{shown}");
    }
}
