//! Private Redis servers a test starts on free ports of this machine (Debian's
//! `redis-server`, which also runs as a Sentinel with `--sentinel`): one node, with
//! or without TLS and a password, and a master with a replica watched by three
//! sentinels. Each lives in a directory of its own, removed on drop.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::pki::{path_str, TestPki};
use crate::support::procs::{free_port, Proc};

pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(label: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("{label}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub async fn redis_server(name: &str, args: &[String]) -> Proc {
    let mut command = std::process::Command::new("redis-server");
    command.args(args);
    let mut proc = Proc::spawn(name, command);
    proc.wait_for(Duration::from_secs(30), |l| {
        l.contains("Ready to accept connections").then_some(())
    })
    .await;
    proc
}

pub fn base_args(dir: &Path) -> Vec<String> {
    [
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        path_str(dir),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// One node over TLS only, its certificate from `pki`; with `require_clients` it
/// refuses any client that does not present a certificate `pki`'s CA signed.
pub struct TlsRedis {
    pub _dir: TempDir,
    pub _server: Proc,
    pub port: u16,
}

impl TlsRedis {
    pub async fn start(pki: &TestPki, require_clients: bool) -> Self {
        let dir = TempDir::new("pw-redis-tls");
        let port = free_port();
        let mut args = base_args(&dir.0);
        args.extend(strings(&[
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--tls-cert-file",
            path_str(&pki.server_cert()),
            "--tls-key-file",
            path_str(&pki.server_key()),
            "--tls-ca-cert-file",
            path_str(&pki.ca()),
            "--tls-auth-clients",
            if require_clients { "yes" } else { "no" },
        ]));
        let server = redis_server("redis-tls", &args).await;
        Self {
            _dir: dir,
            _server: server,
            port,
        }
    }

    pub fn url(&self) -> String {
        format!("rediss://localhost:{}", self.port)
    }
}

/// One plain node that wants `password` (`requirepass`).
pub struct PasswordRedis {
    pub _dir: TempDir,
    pub _server: Proc,
    pub port: u16,
}

impl PasswordRedis {
    pub async fn start(password: &str) -> Self {
        let dir = TempDir::new("pw-redis-auth");
        let port = free_port();
        let mut args = base_args(&dir.0);
        args.extend(strings(&[
            "--port",
            &port.to_string(),
            "--requirepass",
            password,
        ]));
        let server = redis_server("redis-auth", &args).await;
        Self {
            _dir: dir,
            _server: server,
            port,
        }
    }
}

/// The master's name the sentinels watch.
pub const SENTINEL_MASTER: &str = "pwmaster";

/// One Sentinel over TLS only, watching `master` (a TLS node of the same `pki`) and
/// reaching it over TLS too (`tls-replication yes`): what `rediss+sentinel://`
/// connects to.
pub struct TlsSentinel {
    pub _dir: TempDir,
    pub _sentinel: Proc,
    pub port: u16,
}

impl TlsSentinel {
    pub async fn start(pki: &TestPki, master: u16) -> Self {
        let dir = TempDir::new("pw-redis-tls-sentinel");
        let port = free_port();
        let config = dir.0.join("sentinel.conf");
        std::fs::write(
            &config,
            format!(
                "port 0\ntls-port {port}\nbind 127.0.0.1\ndir {}\n\
                 tls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n\
                 tls-auth-clients no\ntls-replication yes\n\
                 sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {master} 1\n",
                path_str(&dir.0),
                path_str(&pki.server_cert()),
                path_str(&pki.server_key()),
                path_str(&pki.ca()),
            ),
        )
        .unwrap();
        let mut command = std::process::Command::new("redis-server");
        command.arg(&config).arg("--sentinel");
        let mut sentinel = Proc::spawn(format!("redis-tls-sentinel-{port}"), command);
        sentinel
            .wait_for(Duration::from_secs(30), |l| {
                l.contains("+monitor master").then_some(())
            })
            .await;
        Self {
            _dir: dir,
            _sentinel: sentinel,
            port,
        }
    }

    /// `rediss+sentinel://` naming this sentinel and the master.
    pub fn url(&self) -> String {
        format!(
            "rediss+sentinel://127.0.0.1:{}/{SENTINEL_MASTER}",
            self.port
        )
    }
}

/// A master, one replica, and three sentinels (quorum 2) watching them.
pub struct PrivateSentinels {
    pub _dir: TempDir,
    /// The data nodes, by port; either may be the master after a failover.
    pub nodes: Vec<(u16, Option<Proc>)>,
    pub _sentinels: Vec<Proc>,
    pub sentinel_ports: Vec<u16>,
}

impl PrivateSentinels {
    pub async fn start() -> Self {
        let dir = TempDir::new("pw-redis-sentinel");
        let master = free_port();
        let replica = free_port();
        let mut nodes = Vec::new();
        for (port, role) in [(master, "master"), (replica, "replica")] {
            let node_dir = dir.0.join(port.to_string());
            std::fs::create_dir_all(&node_dir).unwrap();
            let mut args = base_args(&node_dir);
            args.extend(strings(&["--port", &port.to_string()]));
            if role == "replica" {
                args.extend(strings(&["--replicaof", "127.0.0.1", &master.to_string()]));
            }
            nodes.push((
                port,
                Some(redis_server(&format!("redis-{role}-{port}"), &args).await),
            ));
        }
        let mut sentinels = Vec::new();
        let mut sentinel_ports = Vec::new();
        for _ in 0..3 {
            let port = free_port();
            // Sentinel rewrites its configuration file as the topology changes.
            let config = dir.0.join(format!("sentinel-{port}.conf"));
            std::fs::write(
                &config,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\n\
                     sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {master} 2\n\
                     sentinel down-after-milliseconds {SENTINEL_MASTER} 2000\n\
                     sentinel failover-timeout {SENTINEL_MASTER} 10000\n\
                     sentinel parallel-syncs {SENTINEL_MASTER} 1\n",
                    path_str(&dir.0)
                ),
            )
            .unwrap();
            let mut command = std::process::Command::new("redis-server");
            command.arg(&config).arg("--sentinel");
            let mut proc = Proc::spawn(format!("redis-sentinel-{port}"), command);
            proc.wait_for(Duration::from_secs(30), |l| {
                l.contains("+monitor master").then_some(())
            })
            .await;
            sentinels.push(proc);
            sentinel_ports.push(port);
        }
        let group = Self {
            _dir: dir,
            nodes,
            _sentinels: sentinels,
            sentinel_ports,
        };
        group.wait_until_sentinels_see_the_replica().await;
        group
    }

    /// `redis+sentinel://` naming the three sentinels and the master.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinel_ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+sentinel://{}/{SENTINEL_MASTER}", hosts.join(","))
    }

    /// A plain connection to one node or sentinel, patient enough for `WAIT`.
    pub async fn connection(port: u16) -> redis::aio::MultiplexedConnection {
        let config =
            redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(15)));
        redis::Client::open(format!("redis://127.0.0.1:{port}"))
            .unwrap()
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .unwrap()
    }

    async fn sentinel(&self) -> redis::aio::MultiplexedConnection {
        Self::connection(self.sentinel_ports[0]).await
    }

    /// The master's port as the sentinels report it.
    pub async fn master_port(&self) -> u16 {
        let (_, port): (String, String) = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(SENTINEL_MASTER)
            .query_async(&mut self.sentinel().await)
            .await
            .unwrap();
        port.parse().unwrap()
    }

    /// A failover only promotes a replica the sentinels know of.
    async fn wait_until_sentinels_see_the_replica(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        for port in &self.sentinel_ports {
            let mut sentinel = Self::connection(*port).await;
            loop {
                let replicas: Vec<redis::Value> = redis::cmd("SENTINEL")
                    .arg("REPLICAS")
                    .arg(SENTINEL_MASTER)
                    .query_async(&mut sentinel)
                    .await
                    .unwrap();
                if !replicas.is_empty() {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "sentinel {port} never saw the replica"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }

    /// `SENTINEL FAILOVER`, then waits until the old master serves as the new
    /// one's replica; returns the new master's port.
    pub async fn failover(&self) -> u16 {
        let before = self.master_port().await;
        let _: () = redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(SENTINEL_MASTER)
            .query_async(&mut self.sentinel().await)
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let now = self.master_port().await;
            // The old master drops its clients while the sentinels turn it into a
            // replica: a reset connection means "not yet", not a failed test.
            if now != before && Self::serves_as_a_connected_replica(before).await {
                return now;
            }
            assert!(Instant::now() < deadline, "the failover did not complete");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn serves_as_a_connected_replica(port: u16) -> bool {
        let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}")) else {
            return false;
        };
        let Ok(mut node) = client.get_multiplexed_async_connection().await else {
            return false;
        };
        let Ok(role) = redis::cmd("ROLE")
            .query_async::<Vec<redis::Value>>(&mut node)
            .await
        else {
            return false;
        };
        matches!(
            role.first(),
            Some(redis::Value::BulkString(r)) if r == b"slave"
        ) && matches!(
            role.get(3),
            Some(redis::Value::BulkString(state)) if state == b"connected"
        )
    }

    /// Stops the data node on `port` (SIGKILL).
    pub fn kill_node(&mut self, port: u16) {
        for (p, proc) in &mut self.nodes {
            if *p == port {
                *proc = None;
            }
        }
    }
}

/// A file holding `contents`, readable by its owner only (as a secret should be).
pub fn private_file(dir: &Path, name: &str, contents: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}
