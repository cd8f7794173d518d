//! The Redis token store on the topologies production uses, each a private server
//! started by the test: one node over TLS (`rediss://` with a test CA) and a
//! 3-master Redis Cluster. The same contract suite runs on both; on the cluster the
//! keys spread over every master, the lease scan (what `audit` uses) finds stuck
//! tokens on each master, and a worker charges 1,000 commands once each.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use payment_worker::operator;
use payment_worker::operator::WorkloadSpec;
use payment_worker::token::{
    IdempotencyKey, RedisConnection, RedisTarget, RedisTokenStore, ScanTarget, TokenMode,
    TokenPolicy, TokenStore,
};
use payment_worker_devtools::SimulatorConfig;
use redis::aio::ConnectionLike;

use crate::support::helpers::{quick_worker_settings, unique, Stack};
use crate::support::pki::{path_str, TestPki};
use crate::support::procs::free_port;
use crate::support::procs::{run_to_end, Proc};
use crate::support::redis_servers::{base_args, redis_server, TempDir, TlsRedis};
use crate::support::tokens::redis_token_key;
use crate::token::contract::{self as contract, key, policy, Backend, RawToken};

/// Race rounds here: the single-node suite runs the full count; these servers only
/// have to show the same contract holds over TLS and across slots.
const ROUNDS: usize = 100;

/// The token store's contract, read back through a connection of the same topology.
struct TopologyBackend {
    prefix: String,
    target: RedisTarget,
    conn: RedisConnection,
}

impl TopologyBackend {
    async fn new(target: RedisTarget) -> Self {
        let conn = target.connect().await.expect("raw connection");
        Self {
            prefix: unique("pwt"),
            target,
            conn,
        }
    }

    /// The same servers under a namespace of its own (each contract check expects
    /// to see only its own tokens).
    fn fresh(&self) -> Self {
        Self {
            prefix: unique("pwt"),
            target: self.target.clone(),
            conn: self.conn.clone(),
        }
    }

    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        cmd.query_async(&mut self.conn.clone()).await.unwrap()
    }
}

#[async_trait::async_trait]
impl Backend for TopologyBackend {
    async fn store(&self, policy: TokenPolicy) -> Arc<dyn TokenStore> {
        Arc::new(
            RedisTokenStore::connect_to(&self.target, self.prefix.clone(), policy)
                .await
                .unwrap(),
        )
    }

    async fn raw_token(&self, key: &IdempotencyKey) -> Option<RawToken> {
        let redis_key = redis_token_key(&self.prefix, key.as_str());
        // Three reads (a cluster pipeline is not atomic either); TIME of any node: the
        // nodes share this machine's clock.
        let fields: HashMap<String, String> =
            self.query(redis::cmd("HGETALL").arg(&redis_key)).await;
        let pttl: i64 = self.query(redis::cmd("PTTL").arg(&redis_key)).await;
        let (secs, micros): (i64, i64) = self.query(&redis::cmd("TIME")).await;
        RawToken::from_redis_hash(&fields, pttl, secs * 1000 + micros / 1000)
    }

    async fn raw_lock(&self, key: &IdempotencyKey) -> Option<String> {
        self.query(redis::cmd("GET").arg(format!("{}:lock:{{{}}}", self.prefix, key.as_str())))
            .await
    }
}

async fn whole_contract(servers: &TopologyBackend) {
    contract::race_reserve(&servers.fresh(), TokenMode::Implicit, ROUNDS).await;
    contract::race_reserve(&servers.fresh(), TokenMode::Issued, ROUNDS).await;
    contract::race_takeover(&servers.fresh(), ROUNDS).await;
    contract::race_consume(&servers.fresh(), ROUNDS).await;
    contract::race_lock(&servers.fresh(), ROUNDS).await;
    contract::fencing(&servers.fresh()).await;
    contract::late_confirm_without_takeover(&servers.fresh()).await;
    contract::modes(&servers.fresh()).await;
    contract::lapsed_lease_is_reservable(&servers.fresh()).await;
    contract::a_lost_reservation_is_reclaimed_by_the_attempt_that_names_it_only(&servers.fresh())
        .await;
    contract::reservations_name_the_previous_holder(&servers.fresh()).await;
    contract::restore_keeps_original_ttl(&servers.fresh()).await;
    contract::restore_after_deadline_removes(&servers.fresh()).await;
    contract::tombstone_expires(&servers.fresh()).await;
    contract::missing_expired_consumed(&servers.fresh()).await;
    contract::consume_only_pending(&servers.fresh()).await;
    contract::lock_and_release(&servers.fresh()).await;
    contract::expired_leases_audit(&servers.fresh()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_token_contract_holds_over_tls() {
    let pki = TestPki::new();
    let server = TlsRedis::start(&pki, false).await;
    let url = server.url();
    let ca = std::fs::read(pki.ca()).unwrap();

    let target = RedisTarget::parse(&url, false)
        .unwrap()
        .with_ca_pem(Some(ca));
    let backend = TopologyBackend::new(target).await;
    whole_contract(&backend).await;

    // Another CA: the store refuses the server.
    let wrong = RedisTarget::parse(&url, false)
        .unwrap()
        .with_ca_pem(Some(std::fs::read(pki.wrong_ca()).unwrap()));
    let error = RedisTokenStore::connect_to(&wrong, "x", TokenPolicy::default())
        .await
        .expect_err("a server signed by another CA must be refused");
    let shown = format!("{error:#}");
    assert!(
        shown.contains("certificate") || shown.contains("UnknownIssuer"),
        "{shown}"
    );
}

/// Three masters, no replicas, on free ports of this machine.
struct PrivateCluster {
    _dir: TempDir,
    _servers: Vec<Proc>,
    ports: Vec<u16>,
}

impl PrivateCluster {
    async fn start() -> Self {
        let dir = TempDir::new("pw-redis-cluster");
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let mut servers = Vec::new();
        for port in &ports {
            let mut args = base_args(&dir.0);
            args.extend([
                "--port".to_owned(),
                port.to_string(),
                "--cluster-enabled".to_owned(),
                "yes".to_owned(),
                "--cluster-config-file".to_owned(),
                format!("nodes-{port}.conf"),
                "--cluster-node-timeout".to_owned(),
                "2000".to_owned(),
            ]);
            servers.push(redis_server(&format!("redis-cluster-{port}"), &args).await);
        }
        let mut create = std::process::Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for port in &ports {
            create.arg(format!("127.0.0.1:{port}"));
        }
        create.arg("--cluster-yes");
        let (status, lines) = run_to_end("redis-cli-create", create, Duration::from_secs(60)).await;
        assert!(status.success(), "{}", lines.join("\n"));
        let cluster = Self {
            _dir: dir,
            _servers: servers,
            ports,
        };
        cluster.wait_until_ok().await;
        cluster
    }

    async fn wait_until_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for port in &self.ports {
            let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            loop {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                if info.contains("cluster_state:ok") {
                    break;
                }
                assert!(Instant::now() < deadline, "cluster never ok: {info}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    fn url(&self) -> String {
        let hosts: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }
}

/// The token keys of `prefix` on each master, read by SCAN on that master alone.
async fn keys_per_master(conn: &RedisConnection, prefix: &str) -> Vec<HashSet<String>> {
    let masters = conn.scan_targets().await.unwrap();
    assert_eq!(masters.len(), 3, "{masters:?}");
    let mut out = Vec::new();
    for master in &masters {
        assert!(matches!(master, ScanTarget::Master { .. }));
        let mut keys = HashSet::new();
        let mut cursor = 0u64;
        loop {
            let (next, batch): (u64, Vec<String>) = conn
                .query_on(
                    master,
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(format!("{prefix}:token:*"))
                        .arg("COUNT")
                        .arg(500),
                )
                .await
                .unwrap();
            keys.extend(batch);
            if next == 0 {
                break;
            }
            cursor = next;
        }
        out.push(keys);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_token_contract_holds_on_a_three_master_cluster() {
    let cluster = PrivateCluster::start().await;
    let target = RedisTarget::parse(&cluster.url(), false).unwrap();
    assert!(target.cluster);
    let backend = TopologyBackend::new(target.clone()).await;
    assert!(backend.conn.get_db() == 0);
    whole_contract(&backend).await;

    // Stuck tokens planted all over the key space: each master holds some, and the
    // lease scan (what `audit` reports) finds every one of them.
    let prefix = unique("pwt");
    let short = RedisTokenStore::connect_to(
        &target,
        prefix.clone(),
        policy(TokenMode::Implicit, 50, 60_000, 60_000),
    )
    .await
    .unwrap();
    let mut stuck: Vec<IdempotencyKey> = (0..30).map(|_| key("stuck")).collect();
    for k in &stuck {
        short.reserve(k, "crashed").await.unwrap();
    }
    let per_master = keys_per_master(&backend.conn, &prefix).await;
    for (n, keys) in per_master.iter().enumerate() {
        assert!(!keys.is_empty(), "master {n} holds none of the 30 keys");
    }
    assert_eq!(per_master.iter().map(HashSet::len).sum::<usize>(), 30);
    tokio::time::sleep(Duration::from_millis(150)).await;
    let mut found = short.expired_leases(1000).await.unwrap();
    found.sort();
    stuck.sort();
    assert_eq!(found, stuck, "the scan must cover every master");

    // `audit` itself, pointed at the cluster, reports all of them (exit code 3).
    assert_eq!(audit_stuck_tokens(&cluster.url(), &prefix).await, 30);
}

/// `payment-worker audit --json` against the Redis at `redis_url` (keys under
/// `prefix`): how many stuck tokens it reports. It exits 3 for them.
pub(crate) async fn audit_stuck_tokens(redis_url: &str, prefix: &str) -> u64 {
    let db = crate::support::helpers::TestDb::new().await;
    let simulator = payment_worker_devtools::GatewaySimulator::bind(
        "127.0.0.1:0".parse().unwrap(),
        SimulatorConfig::default(),
    )
    .unwrap()
    .spawn();
    let env: HashMap<String, String> = [
        ("DATABASE_URL", db.url.clone()),
        ("REDIS_URL", redis_url.to_owned()),
        ("REDIS_KEY_PREFIX", prefix.to_owned()),
        ("GATEWAY_URL", simulator.url()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let output = crate::support::audit::run_audit(&["--json"], &env).await;
    assert_eq!(output.status.code(), Some(3), "{output}");
    let report = output.json();
    report["stuck_tokens"]["count"]
        .as_u64()
        .unwrap_or_else(|| panic!("{report}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_on_a_cluster_charges_each_of_1000_commands_once() {
    let cluster = PrivateCluster::start().await;
    let target = RedisTarget::parse(&cluster.url(), false).unwrap();
    let mut stack = Stack::new(3, SimulatorConfig::default()).await;
    stack.tokens = Arc::new(
        RedisTokenStore::connect_to(
            &target,
            stack.redis.prefix.clone(),
            policy(TokenMode::Implicit, 5_000, 3_600_000, 3_600_000),
        )
        .await
        .unwrap(),
    );
    let records = operator::generate(
        &WorkloadSpec {
            count: 1000,
            duplicate_ratio: 0.1,
            invalid_ratio: 0.0,
            decline_ratio: 0.0,
            seed: 13,
        },
        &unique("cluster"),
    );
    let distinct: HashSet<Vec<u8>> = records.iter().filter_map(|r| r.key.clone()).collect();
    stack.produce(&records).await;
    let running = stack.start_worker("cluster-worker", &quick_worker_settings());
    stack
        .wait_for_results(records.len(), Duration::from_secs(240))
        .await;
    crate::support::helpers::stop_all(vec![running]).await;
    stack.assert_books_balance().await;
    assert_eq!(stack.ledger().len(), distinct.len(), "one charge per key");
    let backend = TopologyBackend::new(target).await;
    let per_master = keys_per_master(&backend.conn, &stack.redis.prefix).await;
    assert!(
        per_master.iter().all(|keys| !keys.is_empty()),
        "tokens on every master"
    );
    assert_eq!(
        per_master.iter().map(HashSet::len).sum::<usize>(),
        distinct.len(),
        "one completed token per key"
    );
}

/// A Redis that asks every client for a certificate its CA signed: `tokens issue`
/// given REDIS_CLIENT_CERT and REDIS_CLIENT_KEY is served, the same command
/// without them is refused and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_requiring_client_certificates_serves_the_worker_with_one_only() {
    let pki = TestPki::new();
    let server = TlsRedis::start(&pki, true).await;
    let db = crate::support::helpers::TestDb::new().await;
    let prefix = unique("pwmtls");
    let env = |with_certificate: bool| {
        let mut env: HashMap<String, String> = [
            ("DATABASE_URL", db.url.clone()),
            ("REDIS_URL", server.url()),
            ("REDIS_CA_CERT", path_str(&pki.ca()).to_owned()),
            ("REDIS_KEY_PREFIX", prefix.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        if with_certificate {
            env.insert(
                "REDIS_CLIENT_CERT".into(),
                path_str(&pki.client_cert()).into(),
            );
            env.insert(
                "REDIS_CLIENT_KEY".into(),
                path_str(&pki.client_key()).into(),
            );
        }
        env
    };
    let issue = |key: &'static str, env: HashMap<String, String>| async move {
        run_to_end(
            "tokens-issue",
            crate::support::procs::binary(&["tokens", "issue", key], &env),
            Duration::from_secs(60),
        )
        .await
    };

    let (status, lines) = issue("mtls-anonymous", env(false)).await;
    assert!(
        !status.success(),
        "served without a certificate:\n{}",
        lines.join("\n")
    );
    let (status, lines) = issue("mtls-presented", env(true)).await;
    assert!(status.success(), "{}", lines.join("\n"));

    // What the server holds, read with the client certificate.
    let identity = payment_worker::token::ClientIdentity {
        cert_pem: std::fs::read(pki.client_cert()).unwrap(),
        key_pem: std::fs::read(pki.client_key()).unwrap(),
    };
    let target = RedisTarget::parse(&server.url(), false)
        .unwrap()
        .with_ca_pem(Some(std::fs::read(pki.ca()).unwrap()))
        .with_client_identity(Some(identity));
    let conn = target.connect().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:token:*"))
        .query_async(&mut conn.clone())
        .await
        .unwrap();
    assert_eq!(keys, [format!("{prefix}:token:{{mtls-presented}}")]);

    // Without the certificate the store cannot even connect.
    let anonymous = RedisTarget::parse(&server.url(), false)
        .unwrap()
        .with_ca_pem(Some(std::fs::read(pki.ca()).unwrap()));
    assert!(anonymous.connect().await.is_err());
}
