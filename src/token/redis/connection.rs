//! Where the Redis token store sends its commands: one node (`redis://`, `rediss://`),
//! a Redis Cluster (`redis+cluster://h1:p1,h2:p2`, or a comma-separated list of
//! nodes with `REDIS_CLUSTER=true`), or the master a group of Sentinels names
//! (`redis+sentinel://h1:p1,h2:p2,h3:p3/<master>`, `sentinel.rs`). The cluster
//! client routes each script by its key's slot and follows `MOVED`/`ASK`; scans go
//! to every master in turn. Over TLS the servers are verified against the system
//! roots or `REDIS_CA_CERT`, and a client certificate is presented when given.

use std::time::Duration;

use anyhow::Context;
use redis::aio::{ConnectionLike, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{
    AsyncConnectionConfig, ClientTlsConfig, Cmd, IntoConnectionInfo, Pipeline, RedisFuture,
    TlsCertificates, Value,
};

use super::node::{tcp_settings, NodeConnection};
use super::sentinel::{SentinelConnection, SentinelService};
use crate::redaction::{redact_url, Secret};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// The parsed `REDIS_URL`: its nodes (each a `redis://` or `rediss://` URL; the
/// sentinels for a Sentinel URL), whether they form a cluster or which master the
/// sentinels are asked for, the CA that verifies their TLS certificates (system
/// roots when none is given) and the certificate this client presents.
#[derive(Clone)]
pub struct RedisTarget {
    /// The node URLs (the seed nodes of a cluster, the sentinels of a master).
    pub nodes: Vec<String>,
    /// Whether the nodes are a Redis Cluster.
    pub cluster: bool,
    /// The master the nodes (sentinels) are asked for.
    pub sentinel: Option<SentinelService>,
    /// PEM of the CA that signs the servers' certificates (`None`: system roots).
    pub ca_pem: Option<Vec<u8>>,
    /// The client certificate (chain) and its key, PEM (mutual TLS).
    pub client_identity: Option<ClientIdentity>,
}

/// A client certificate and its private key, PEM. `Debug` shows neither.
#[derive(Clone)]
pub struct ClientIdentity {
    /// The certificate chain.
    pub cert_pem: Vec<u8>,
    /// The private key.
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientIdentity(<redacted>)")
    }
}

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes: Vec<String> = self.nodes.iter().map(|n| redact_url(n)).collect();
        f.debug_struct("RedisTarget")
            .field("nodes", &nodes)
            .field("cluster", &self.cluster)
            .field("sentinel", &self.sentinel)
            .field("custom_ca", &self.ca_pem.is_some())
            .field("client_certificate", &self.client_identity.is_some())
            .finish()
    }
}

/// `redis[s]+sentinel://[user:pass@]h1:p1,h2:p2/<master>[/<db>][?sentinel_auth=same]`.
fn parse_sentinel(scheme: &str, rest: &str) -> anyhow::Result<RedisTarget> {
    anyhow::ensure!(
        matches!(scheme, "redis" | "rediss"),
        "unsupported Redis URL scheme {scheme:?}+sentinel"
    );
    let (credentials, rest) = match rest.rsplit_once('@') {
        Some((credentials, rest)) => (Some(credentials), rest),
        None => (None, rest),
    };
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut path = path.split('/').filter(|p| !p.is_empty());
    let master = path
        .next()
        .context("a Sentinel URL names its master: redis+sentinel://h1:p1,h2:p2/<master>")?;
    let db = match path.next() {
        Some(db) => db
            .parse::<i64>()
            .with_context(|| format!("database {db:?} is not a number"))?,
        None => 0,
    };
    let master = master.to_owned();
    let mut sentinel_auth = false;
    for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
        match (name.as_ref(), value.as_ref()) {
            ("sentinel_auth", "same") => sentinel_auth = true,
            ("sentinel_auth", "none") => sentinel_auth = false,
            (name, _) => anyhow::bail!("unknown Sentinel URL parameter {name:?}"),
        }
    }
    // redis-rs decodes the percent-escapes of user and password as it does for
    // every `redis://` URL.
    let (username, password) = match credentials {
        Some(credentials) => {
            let info = redis::IntoConnectionInfo::into_connection_info(format!(
                "redis://{credentials}@sentinel"
            ))
            .map_err(|_| anyhow::anyhow!("the URL's user or password cannot be read"))?;
            let settings = info.redis_settings();
            (
                settings.username().map(str::to_owned),
                settings.password().map(Secret::from),
            )
        }
        None => (None, None),
    };
    let nodes: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|host| format!("{scheme}://{host}"))
        .collect();
    anyhow::ensure!(
        !nodes.is_empty(),
        "a Sentinel URL needs at least one sentinel"
    );
    Ok(RedisTarget {
        nodes,
        cluster: false,
        sentinel: Some(SentinelService {
            master,
            db,
            tls: scheme == "rediss",
            username,
            password,
            sentinel_auth,
        }),
        ca_pem: None,
        client_identity: None,
    })
}

impl RedisTarget {
    /// `redis[s]+cluster://[user:pass@]h1:p1,h2:p2[/…]` is a cluster; so is a
    /// comma-separated list of URLs or `host:port` when `cluster` is set; anything
    /// else is one node.
    pub fn parse(url: &str, cluster: bool) -> anyhow::Result<Self> {
        let url = url.trim();
        if let Some((scheme, rest)) = url.split_once("+sentinel://") {
            anyhow::ensure!(
                !cluster,
                "REDIS_CLUSTER=true with a Sentinel URL: a Redis Cluster has no sentinels"
            );
            return parse_sentinel(scheme, rest);
        }
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
                sentinel: None,
                ca_pem: None,
                client_identity: None,
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
            sentinel: None,
            ca_pem: None,
            client_identity: None,
        })
    }

    /// The same target with this CA.
    pub fn with_ca_pem(mut self, pem: Option<Vec<u8>>) -> Self {
        self.ca_pem = pem;
        self
    }

    /// The same target presenting this client certificate.
    pub fn with_client_identity(mut self, identity: Option<ClientIdentity>) -> Self {
        self.client_identity = identity;
        self
    }

    /// The client of the settle subscriber (`settle.rs`): the node itself, or
    /// a cluster's first seed node (a PUBLISH reaches every node of a cluster).
    /// `None` behind Sentinel, whose master moves: waiters there only back off.
    pub fn settle_client(&self) -> anyhow::Result<Option<redis::Client>> {
        if self.sentinel.is_some() {
            return Ok(None);
        }
        let url = self.nodes.first().context("no Redis node given")?;
        let client = match self.certificates() {
            Some(certs) => redis::Client::build_with_tls(url.as_str(), certs),
            None => redis::Client::open(url.as_str()),
        }
        .with_context(|| format!("invalid Redis URL {}", self.shown()))?;
        Ok(Some(client))
    }

    /// The TLS material given: a CA and/or a client certificate (`None`: neither,
    /// the system roots verify the servers).
    fn certificates(&self) -> Option<TlsCertificates> {
        if self.ca_pem.is_none() && self.client_identity.is_none() {
            return None;
        }
        Some(TlsCertificates {
            client_tls: self.client_identity.as_ref().map(|id| ClientTlsConfig {
                client_cert: id.cert_pem.clone(),
                client_key: id.key_pem.clone(),
            }),
            root_cert: self.ca_pem.clone(),
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
            if let Some(service) = &self.sentinel {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(RESPONSE_TIMEOUT));
                // Boxed: its future nests the sentinels' look-up, and unboxed it
                // deepens every start-up future past the compiler's layout limit.
                let conn = Box::pin(SentinelConnection::connect(
                    &self.nodes,
                    service,
                    self.certificates(),
                    config,
                ))
                .await
                .with_context(|| {
                    format!(
                        "cannot reach the Redis master {:?} through the sentinels {shown}",
                        service.master
                    )
                })?;
                Ok(RedisConnection::Sentinel(conn))
            } else if self.cluster {
                let mut builder = ClusterClient::builder(self.nodes.clone())
                    .tcp_settings(tcp_settings())
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
                let info = url
                    .as_str()
                    .into_connection_info()
                    .with_context(|| format!("invalid Redis URL {shown}"))?
                    .set_tcp_settings(tcp_settings());
                let client = match self.certificates() {
                    Some(certs) => redis::Client::build_with_tls(info, certs),
                    None => redis::Client::open(info),
                }
                .with_context(|| format!("invalid Redis URL {shown}"))?;
                let conn = NodeConnection::connect(client, single_node_config())
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
    /// One node, reconnecting, and replaced when it stops answering.
    Single(NodeConnection),
    /// A Redis Cluster, commands routed by slot.
    Cluster(ClusterConnection),
    /// The master a group of Sentinels names, followed through failovers.
    Sentinel(SentinelConnection),
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
            Self::Sentinel(conn) => conn.req_packed_command(cmd),
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
            Self::Sentinel(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(conn) => conn.get_db(),
            Self::Cluster(conn) => conn.get_db(),
            Self::Sentinel(conn) => conn.get_db(),
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

    #[test]
    fn sentinel_url_forms() {
        let t = RedisTarget::parse(
            "rediss+sentinel://app:p%40ss@s1:26379,s2:26380,s3/payments/2?sentinel_auth=same",
            false,
        )
        .unwrap();
        assert!(!t.cluster);
        assert_eq!(
            t.nodes,
            ["rediss://s1:26379", "rediss://s2:26380", "rediss://s3"]
        );
        let service = t.sentinel.as_ref().unwrap();
        assert_eq!(service.master, "payments");
        assert_eq!(service.db, 2);
        assert!(service.tls && service.sentinel_auth);
        assert_eq!(service.username.as_deref(), Some("app"));
        assert_eq!(service.password.as_ref().unwrap().expose(), "p@ss");
        let shown = format!("{t:?}");
        assert!(
            !shown.contains("p@ss") && !shown.contains("p%40ss"),
            "{shown}"
        );

        let t = RedisTarget::parse("redis+sentinel://:pw@s1:1/mymaster", false).unwrap();
        let service = t.sentinel.unwrap();
        assert!(!service.tls && !service.sentinel_auth);
        assert_eq!((service.master.as_str(), service.db), ("mymaster", 0));
        assert_eq!(service.username, None);
        assert!(RedisTarget::parse("redis+sentinel://s1:1", false).is_err());
        assert!(RedisTarget::parse("redis+sentinel://s1:1/m/x", false).is_err());
        assert!(RedisTarget::parse("redis+sentinel://s1:1/m?other=1", false).is_err());
        assert!(RedisTarget::parse("redis+sentinel://s1:1/m", true).is_err());
        assert!(RedisTarget::parse("http+sentinel://s1:1/m", false).is_err());
    }
}
