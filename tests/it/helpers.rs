//! Test harness: makes sure the local services run, and gives each test an isolated
//! Postgres database (random name) and Redis key prefix, so tests run in parallel.
#![allow(dead_code)]

use std::net::TcpStream;
use std::process::Command;
use std::sync::Once;
use std::time::Duration;

use payment_worker::configuration::DatabaseSettings;
use sqlx::PgPool;

pub const PG_ADDR: &str = "127.0.0.1:5432";
pub const REDIS_ADDR: &str = "127.0.0.1:6379";
pub const REDIS_URL: &str = "redis://127.0.0.1:6379";

fn reachable(addr: &str) -> bool {
    addr.parse()
        .ok()
        .and_then(|a| TcpStream::connect_timeout(&a, Duration::from_millis(300)).ok())
        .is_some()
}

fn wait_for(addr: &str) {
    for _ in 0..100 {
        if reachable(addr) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{addr} is still unreachable after starting it");
}

fn start_postgres() {
    let versions = std::fs::read_dir("/etc/postgresql").expect("no /etc/postgresql: install postgresql");
    for version in versions.flatten() {
        let _ = Command::new("pg_ctlcluster")
            .args(["--skip-systemctl-redirect"])
            .arg(version.file_name())
            .args(["main", "start"])
            .status();
    }
}

fn start_redis() {
    let _ = std::fs::create_dir_all("/var/lib/redis");
    let _ = std::fs::create_dir_all("/var/log/redis");
    let _ = Command::new("redis-server")
        .args([
            "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port", "6379", "--save", "",
            "--appendonly", "no", "--dir", "/var/lib/redis", "--logfile", "/var/log/redis/ci.log",
        ])
        .status();
}

/// Starts Postgres and Redis when they are down (CI may run on a machine where
/// they were stopped). Runs once per test binary.
pub fn ensure_services() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if !reachable(PG_ADDR) {
            start_postgres();
            wait_for(PG_ADDR);
        }
        if !reachable(REDIS_ADDR) {
            start_redis();
            wait_for(REDIS_ADDR);
        }
    });
}

pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

/// A fresh database with `migrations/` applied.
pub struct TestDb {
    pub name: String,
    pub url: String,
    pub pool: PgPool,
}

impl TestDb {
    pub async fn new() -> Self {
        ensure_services();
        let name = unique("pw_test");
        let url = format!("postgres://postgres@{PG_ADDR}/{name}");
        let pool = DatabaseSettings::with_url(&url)
            .connect_and_migrate()
            .await
            .expect("test database");
        Self { name, url, pool }
    }
}

/// A Redis connection plus a key prefix nobody else uses.
pub struct TestRedis {
    pub prefix: String,
    pub conn: redis::aio::ConnectionManager,
}

impl TestRedis {
    pub async fn new() -> Self {
        ensure_services();
        let client = redis::Client::open(REDIS_URL).expect("redis url");
        let conn = redis::aio::ConnectionManager::new(client).await.expect("redis connection");
        Self { prefix: unique("pwt"), conn }
    }
}
