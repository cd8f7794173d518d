//! Real processes for crash tests: the `payment-worker` binary (run, produce, replay,
//! audit), the development tools' (dev-kafka, gateway-sim) and a private Postgres
//! server.
//!
//! No child may outlive its test: `Drop` SIGKILLs and reaps it (also while a failed
//! assertion unwinds), and every child gets `PR_SET_PDEATHSIG = SIGKILL`, so even a
//! test binary killed from outside takes its children along.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

pub const BINARY: &str = env!("CARGO_BIN_EXE_payment-worker");

/// The development tools' binary (`payment-worker-devtools`: `dev-kafka`,
/// `gateway-sim`, `demo`, `bench`). Another package's binary, so cargo names no
/// variable for it: it is built beside [`BINARY`] by `cargo test --workspace` (and
/// `cargo nextest run --workspace`); `PW_TEST_DEVTOOLS` names another one.
pub fn devtools_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("PW_TEST_DEVTOOLS") {
        return PathBuf::from(path);
    }
    let path = Path::new(BINARY).with_file_name("payment-worker-devtools");
    assert!(
        path.exists(),
        "{} is missing: the tests run the development tools' binary, which \
         `cargo test --workspace` builds (or `cargo build -p payment-worker-devtools`)",
        path.display()
    );
    path
}

extern "C" {
    // glibc's prctl(2); declared here because `libc` is not a direct dependency.
    fn prctl(option: std::ffi::c_int, ...) -> std::ffi::c_int;
}

const PR_SET_PDEATHSIG: std::ffi::c_int = 1;
const SIGKILL: std::ffi::c_ulong = 9;

/// The parent-death signal fires when the *thread* that forked exits, so children
/// must be spawned from a thread that lives as long as the test (the test thread or a
/// runtime worker), never from `spawn_blocking`.
fn die_with_parent(command: &mut Command) {
    // SAFETY: prctl is async-signal-safe and touches only the calling (child) process.
    unsafe {
        command.pre_exec(|| {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            Ok(())
        });
    }
}

type Lines = Arc<Mutex<Vec<String>>>;

fn collect(stream: impl Read + Send + 'static, lines: Lines) {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut buffer = Vec::new();
        loop {
            buffer.clear();
            match reader.read_until(b'\n', &mut buffer) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buffer).trim_end().to_owned();
                    lines.lock().unwrap().push(line);
                }
            }
        }
    });
}

/// One child process with its stdout and stderr lines collected in order.
pub struct Proc {
    pub name: String,
    child: Child,
    lines: Lines,
    exited: Option<ExitStatus>,
}

impl Proc {
    pub fn spawn(name: impl Into<String>, mut command: Command) -> Self {
        let name = name.into();
        die_with_parent(&mut command);
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {name}: {e}"));
        let lines: Lines = Arc::default();
        collect(child.stdout.take().unwrap(), Arc::clone(&lines));
        collect(child.stderr.take().unwrap(), Arc::clone(&lines));
        Self {
            name,
            child,
            lines,
            exited: None,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// The last line for which `pick` returns something.
    pub fn find_last<T>(&self, pick: impl FnMut(&String) -> Option<T>) -> Option<T> {
        self.lines.lock().unwrap().iter().rev().find_map(pick)
    }

    pub fn tail(&self, n: usize) -> String {
        let lines = self.lines.lock().unwrap();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// `Some(status)` once the process has ended (reaped).
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().ok().flatten();
        }
        self.exited
    }

    pub fn is_running(&mut self) -> bool {
        self.exit_status().is_none()
    }

    /// Panics with the process's last output if it ended on its own.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.exit_status() {
            panic!(
                "{} exited on its own ({status}); its last output:\n{}",
                self.name,
                self.tail(60)
            );
        }
    }

    /// SIGKILL and reap: the process gets no chance to clean anything up.
    pub fn sigkill(&mut self) {
        if self.is_running() {
            let _ = self.child.kill();
            // Never unwrap here: this also runs in Drop while a test unwinds.
            self.exited = self.child.wait().ok();
        }
    }

    pub fn signal(&mut self, signal: Signal) {
        if self.is_running() {
            let _ = kill(Pid::from_raw(self.pid() as i32), signal);
        }
    }

    pub async fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.exit_status() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} still running after {within:?}; its last output:\n{}",
                self.name,
                self.tail(60)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGTERM, then waits for a successful exit.
    pub async fn stop(&mut self, within: Duration) {
        self.signal(Signal::SIGTERM);
        let status = self.wait_exit(within).await;
        assert!(
            status.success(),
            "{} ended with {status} after SIGTERM:\n{}",
            self.name,
            self.tail(60)
        );
    }

    /// Waits for the first line for which `pick` returns something.
    pub async fn wait_for<T>(
        &mut self,
        within: Duration,
        mut pick: impl FnMut(&str) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + within;
        loop {
            if let Some(found) = self.lines.lock().unwrap().iter().find_map(|l| pick(l)) {
                return found;
            }
            if let Some(status) = self.exit_status() {
                // The reader threads may still be behind; give them one more look.
                std::thread::sleep(Duration::from_millis(100));
                if let Some(found) = self.lines.lock().unwrap().iter().find_map(|l| pick(l)) {
                    return found;
                }
                panic!(
                    "{} ended ({status}) before the expected line:\n{}",
                    self.name,
                    self.tail(60)
                );
            }
            assert!(
                Instant::now() < deadline,
                "{}: expected line not seen within {within:?}:\n{}",
                self.name,
                self.tail(60)
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- last output of {} ----\n{}", self.name, self.tail(40));
        }
        self.sigkill();
        // For a post-mortem of a passing run too: PW_TEST_LOG_DIR keeps every log.
        if let Ok(dir) = std::env::var("PW_TEST_LOG_DIR") {
            let path = Path::new(&dir).join(format!("{}-{}.log", self.child.id(), self.name));
            let _ = std::fs::create_dir_all(&dir);
            let _ = std::fs::write(path, self.lines().join("\n"));
        }
    }
}

/// `payment-worker <args>` with a clean environment plus `env`: nothing from the
/// test's own environment (RUST_LOG, OTEL_*, KAFKA_CONFIG_*, fault points) leaks in.
pub fn binary(args: &[&str], env: &HashMap<String, String>) -> Command {
    // PW_TEST_BINARY runs another build (e.g. the base commit's) for a before/after comparison.
    let program = std::env::var("PW_TEST_BINARY").unwrap_or_else(|_| BINARY.to_owned());
    command_of(program, args, env)
}

/// A development tool (`dev-kafka`, `gateway-sim`) of the suite's own build: the
/// test bed, never the build under test (which may be a production build without
/// them).
fn tool(args: &[&str]) -> Command {
    command_of(
        devtools_binary().display().to_string(),
        args,
        &HashMap::new(),
    )
}

fn command_of(program: String, args: &[&str], env: &HashMap<String, String>) -> Command {
    let mut command = Command::new(program);
    command.args(args).env_clear();
    if let Ok(path) = std::env::var("PATH") {
        command.env("PATH", path);
    }
    // PW_TEST_WORKER_LOG (e.g. `info,payment_worker=debug`) for a post-mortem.
    let filter = std::env::var("PW_TEST_WORKER_LOG").unwrap_or_else(|_| "info".into());
    command.env("RUST_LOG", filter).env("LOG_FORMAT", "json");
    command.envs(env);
    command
}

/// Runs a short command (produce, replay, audit) to its end; returns its output.
pub async fn run_to_end(
    name: &str,
    command: Command,
    within: Duration,
) -> (ExitStatus, Vec<String>) {
    let mut proc = Proc::spawn(name, command);
    let status = proc.wait_exit(within).await;
    // The reader threads finish right after the pipes close.
    std::thread::sleep(Duration::from_millis(100));
    (status, proc.lines())
}

/// Spawns a server that announces where it listens on a line starting with
/// `announcement`; returns it with the rest of that line.
pub async fn spawn_announced(name: &str, command: Command, announcement: &str) -> (Proc, String) {
    let mut proc = Proc::spawn(name, command);
    let rest = proc
        .wait_for(Duration::from_secs(30), |l| {
            l.strip_prefix(announcement).map(str::to_owned)
        })
        .await;
    (proc, rest)
}

/// `payment-worker dev-kafka`: a mock cluster in its own process.
pub async fn dev_kafka(partitions: i32) -> (Proc, String) {
    let partitions = partitions.to_string();
    let command = tool(&["dev-kafka", "--partitions", &partitions]);
    spawn_announced("dev-kafka", command, "dev-kafka bootstrap ").await
}

/// `payment-worker gateway-sim --listen 127.0.0.1:0 <flags>`; returns its base URL.
pub async fn gateway_sim(flags: &[&str]) -> (Proc, String) {
    let mut args = vec!["gateway-sim", "--listen", "127.0.0.1:0"];
    args.extend_from_slice(flags);
    let command = tool(&args);
    let (proc, addr) = spawn_announced("gateway-sim", command, "gateway-sim listening on ").await;
    (proc, format!("http://{addr}"))
}

/// A group-membership event from a worker's JSON log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Membership {
    Assigned(usize),
    Revoked,
}

/// The `message` of a JSON log line.
pub fn message(line: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    value
        .get("fields")?
        .get("message")?
        .as_str()
        .map(str::to_owned)
}

/// `assigned` reports the partitions held after the change; `revoked` reports
/// those still held in `held` (absent: none).
pub fn membership(line: &str) -> Option<Membership> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    let fields = value.get("fields")?;
    match fields.get("message")?.as_str()? {
        "assigned" => Some(Membership::Assigned(
            fields.get("partitions")?.as_u64()? as usize
        )),
        // Under incremental rebalancing a revoke may leave the member holding others.
        m if m.starts_with("revoked") => match fields.get("held").and_then(|h| h.as_u64()) {
            Some(held) if held > 0 => Some(Membership::Assigned(held as usize)),
            _ => Some(Membership::Revoked),
        },
        _ => None,
    }
}

/// The worker's latest membership event, if any.
pub fn current_membership(proc: &Proc) -> Option<Membership> {
    proc.find_last(|l| membership(l))
}

// ---------------------------------------------------------------------------
// A private Postgres server, so a test may restart it without disturbing the tests
// that share the machine's Postgres.

pub fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

pub fn postgres_user() -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    passwd
        .lines()
        .find_map(|l| {
            let fields: Vec<&str> = l.split(':').collect();
            (fields.first() == Some(&"postgres"))
                .then(|| (fields[2].parse().unwrap(), fields[3].parse().unwrap()))
        })
        .expect("no postgres user to run a private server as")
}

fn postgres_bindir() -> PathBuf {
    let mut versions: Vec<u32> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("no /usr/lib/postgresql: install postgresql")
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|v| v.parse().ok()))
        .collect();
    versions.sort_unstable();
    let version = versions.last().expect("no Postgres version installed");
    PathBuf::from(format!("/usr/lib/postgresql/{version}/bin"))
}

/// A port nothing listens on right now (the OS picked it for a listener just closed).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub struct PrivatePostgres {
    dir: PathBuf,
    pub port: u16,
    server: Option<Proc>,
    pub restarts: usize,
    /// Extra `-c name=value` server settings (e.g. `ssl=on`).
    settings: Vec<String>,
}

impl PrivatePostgres {
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// A private server with extra `name=value` settings.
    pub async fn start_with(settings: &[String]) -> Self {
        let dir = std::env::temp_dir().join(format!("pw-pg-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        if is_root() {
            // Postgres refuses to run as root.
            let (uid, gid) = postgres_user();
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
        }
        let data = dir.join("data");
        let mut initdb = Self::as_postgres(&postgres_bindir().join("initdb"));
        initdb
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "-D",
            ])
            .arg(&data);
        let (status, lines) = run_to_end("initdb", initdb, Duration::from_secs(120)).await;
        assert!(status.success(), "initdb failed:\n{}", lines.join("\n"));
        let mut pg = Self {
            dir,
            port: free_port(),
            server: None,
            restarts: 0,
            settings: settings.to_vec(),
        };
        for _ in 0..5 {
            if pg.launch().await {
                return pg;
            }
            pg.port = free_port();
        }
        panic!("private Postgres never started");
    }

    fn as_postgres(program: &Path) -> Command {
        if is_root() {
            let mut command = Command::new("setpriv");
            // setpriv sets the death signal after switching users (a uid change
            // clears one set earlier).
            command
                .args([
                    "--reuid=postgres",
                    "--regid=postgres",
                    "--init-groups",
                    "--pdeathsig",
                    "KILL",
                    "--",
                ])
                .arg(program);
            command
        } else {
            Command::new(program)
        }
    }

    /// Starts the server on `self.port`; false when it ended before it was ready
    /// (the port was taken meanwhile).
    async fn launch(&mut self) -> bool {
        let mut command = Self::as_postgres(&postgres_bindir().join("postgres"));
        command
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-p", &self.port.to_string()])
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "max_connections=300",
            ])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", self.dir.display()));
        for setting in &self.settings {
            command.arg("-c").arg(setting);
        }
        let mut server = Proc::spawn("private-postgres", command);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            // "ready to accept connections", or "… read-only connections" (a standby).
            if server
                .find_last(|l| l.contains("ready to accept").then_some(()))
                .is_some()
            {
                self.server = Some(server);
                return true;
            }
            if !server.is_running() {
                eprintln!("private Postgres did not start:\n{}", server.tail(20));
                return false;
            }
            assert!(
                Instant::now() < deadline,
                "private Postgres not ready:\n{}",
                server.tail(40)
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// A streaming standby of `primary` (`pg_basebackup -R`: a copy of its data
    /// directory that follows its WAL), running on a port of its own with the
    /// primary's settings and `extra` ones.
    pub async fn standby_of(primary: &PrivatePostgres, extra: &[String]) -> Self {
        let dir = std::env::temp_dir().join(format!("pw-pg-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        if is_root() {
            let (uid, gid) = postgres_user();
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
        }
        let mut backup = Self::as_postgres(&postgres_bindir().join("pg_basebackup"));
        backup
            .args(["-h", "127.0.0.1", "-p", &primary.port.to_string()])
            .args([
                "-U",
                "postgres",
                "-R",
                "-X",
                "stream",
                "--no-sync",
                "--checkpoint=fast",
                "-D",
            ])
            .arg(dir.join("data"));
        let (status, lines) = run_to_end("pg_basebackup", backup, Duration::from_secs(120)).await;
        assert!(
            status.success(),
            "pg_basebackup failed:\n{}",
            lines.join("\n")
        );
        let mut standby = Self {
            dir,
            port: free_port(),
            server: None,
            restarts: 0,
            settings: primary.settings.iter().chain(extra).cloned().collect(),
        };
        for _ in 0..5 {
            if standby.launch().await {
                return standby;
            }
            standby.port = free_port();
        }
        panic!("standby never started");
    }

    /// Stops the server hard (immediate shutdown: no checkpoint, every backend ends
    /// at once, as when its host fails); it is not started again.
    pub async fn crash(&mut self) {
        let mut server = self.server.take().expect("server running");
        server.signal(Signal::SIGQUIT);
        server.wait_exit(Duration::from_secs(30)).await;
    }

    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Fast shutdown (what `pg_ctl restart` does: open transactions abort, every
    /// client is disconnected), a moment down, then up again on the same port.
    pub async fn restart(&mut self, down_for: Duration) {
        let mut server = self.server.take().expect("server running");
        server.signal(Signal::SIGINT);
        server.wait_exit(Duration::from_secs(60)).await;
        tokio::time::sleep(down_for).await;
        assert!(self.launch().await, "private Postgres did not come back");
        self.restarts += 1;
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        if let Some(mut server) = self.server.take() {
            // Immediate shutdown takes the backends along; SIGKILL of the postmaster
            // alone would leave them to notice by themselves.
            server.signal(Signal::SIGQUIT);
            let deadline = Instant::now() + Duration::from_secs(10);
            while server.is_running() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
