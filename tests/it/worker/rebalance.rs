//! Deploys that do not replay the backlog. Real worker processes join,
//! restart and leave a consumer group on `dev-kafka` while a paced workload runs
//! against `gateway-sim` at 20 ms; every scenario counts the command positions
//! answered more than once, the longest time a member held no partition, and the
//! drains that ran into their deadline, then checks the books and the audit.
//!
//! The scenarios use the KIP-848 group protocol unless `PW_TEST_GROUP_PROTOCOL=classic`
//! (see `Run::spawn`). `PW_TEST_BINARY=<another build>` runs the same scenarios against another build
//! of the worker (the before/after table of the issue was made that way).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use payment_worker::operator;
use payment_worker::operator::{WorkloadRecord, WorkloadSpec};

use crate::support::answers::assert_one_answer_per_command;
use crate::support::books::{answered, by_position, flush_prefix, token_statuses};
use crate::support::deployment::{Deployment, PARTITIONS};
use crate::support::helpers::{unique, TestDb, TestRedis};
use crate::support::procs::{self, membership, Membership, Proc};

/// The workers' session timeout in these tests (see `support::deployment::SESSION_TIMEOUT`).
const SESSION: Duration = Duration::from_secs(6);
const COMMANDS: usize = 1600;
/// Commands already on the topic when the first worker starts (a deploy meets a
/// backlog); the rest arrive `PER_TICK` every 200 ms for ~20 s, through every join
/// and restart of the scenarios.
const BACKLOG: usize = 600;
const PER_TICK: usize = 10;
const DEADLINE_LINE: &str = "drain deadline passed";

struct Run {
    db: TestDb,
    redis: TestRedis,
    deployment: Deployment,
    records: Vec<WorkloadRecord>,
    /// Workers stopped on purpose; their logs still count.
    retired: Vec<Proc>,
}

impl Run {
    async fn start(seed: u64) -> Self {
        let db = TestDb::new().await;
        let redis = TestRedis::new().await;
        let deployment = Deployment::start(
            PARTITIONS,
            &db.url,
            &redis.prefix,
            // A second POST for a key would be a second ledger entry: "charged
            // once" is observed, not granted by the gateway.
            &[
                "--ignore-idempotency-key",
                "--latency-ms",
                "20",
                "--seed",
                &seed.to_string(),
            ],
            &[],
        )
        .await;
        let spec = WorkloadSpec {
            count: COMMANDS,
            duplicate_ratio: 0.1,
            invalid_ratio: 0.02,
            decline_ratio: 0.05,
            seed,
        };
        let records = operator::generate(&spec, &unique("grp"));
        Self {
            db,
            redis,
            deployment,
            records,
            retired: Vec::new(),
        }
    }

    /// Publishes the backlog, then the rest in the background.
    async fn produce(&self) -> tokio::task::JoinHandle<()> {
        let (backlog, paced) = self.records.split_at(BACKLOG);
        self.deployment
            .produce_paced(backlog, backlog.len())
            .await
            .unwrap();
        self.deployment.produce_paced(paced, PER_TICK)
    }

    /// A worker for `slot`; with `static_id`, it joins as static member `pod-<slot>`.
    fn spawn(&mut self, slot: usize, static_id: bool, generation: usize) -> Proc {
        let mut env = self.deployment.worker_env.clone();
        let name = format!("worker-{slot}-{generation}");
        env.insert("WORKER_ID".into(), name.clone());
        // The KIP-848 protocol by default here: the mock paces every classic rebalance
        // round at the session timeout (a real coordinator ends a round once every
        // member rejoined), so a cooperative move takes two rounds, ~10 s of the 12 s
        // allowed, and a loaded CI machine tips it over. PW_TEST_GROUP_PROTOCOL=classic
        // runs the same scenarios on the classic protocol (cooperative-sticky); every
        // other multi-process test runs on it.
        let protocol =
            std::env::var("PW_TEST_GROUP_PROTOCOL").unwrap_or_else(|_| "consumer".to_owned());
        env.insert("KAFKA_GROUP_PROTOCOL".into(), protocol);
        if static_id {
            env.insert("KAFKA_GROUP_INSTANCE_ID".into(), format!("pod-{slot}"));
        }
        Proc::spawn(name, procs::binary(&["run"], &env))
    }

    /// SIGTERM (drain, commit, leave), then the same slot starts again; returns how
    /// long the new process took to hold partitions.
    async fn restart(&mut self, slot: usize, static_id: bool, generation: usize) -> Duration {
        self.deployment.assert_workers_running();
        self.deployment.workers[slot]
            .stop(Duration::from_secs(30))
            .await;
        let started = Instant::now();
        let fresh = self.spawn(slot, static_id, generation);
        let old = std::mem::replace(&mut self.deployment.workers[slot], fresh);
        self.retired.push(old);
        self.deployment.workers[slot]
            .wait_for(SESSION * 2, |l| {
                matches!(membership(l), Some(Membership::Assigned(n)) if n > 0).then_some(())
            })
            .await;
        started.elapsed()
    }

    /// Waits for every result, stops the workers, checks the books and the audit;
    /// returns what the scenario measured.
    async fn finish(mut self, name: &str, producer: tokio::task::JoinHandle<()>) -> Measured {
        producer.await.unwrap();
        let results = self
            .deployment
            .wait_until_settled(self.records.len(), HashMap::new(), Duration::from_secs(180))
            .await;
        // Logs of the live workers up to here: their final leave is no rebalance.
        let mut logs: Vec<Vec<String>> = self.retired.iter().map(Proc::lines).collect();
        logs.extend(self.deployment.workers.iter().map(Proc::lines));
        // Who answered a position twice, and at which hand-over (see support::handover).
        let named: Vec<(String, Vec<String>)> = self
            .retired
            .iter()
            .chain(&self.deployment.workers)
            .map(|p| (p.name.clone(), p.lines()))
            .collect();
        crate::support::handover::report(&results, &named);
        self.deployment.stop_workers().await;

        let answers = by_position(&results);
        let repeated = answers.values().filter(|l| l.len() > 1).count();
        let measured = Measured {
            positions: answered(&results),
            repeated,
            longest_unassigned: logs.iter().map(|l| longest_unassigned(l)).max().unwrap(),
            deadline_drains: logs
                .iter()
                .flatten()
                .filter(|l| l.contains(DEADLINE_LINE))
                .count(),
        };
        eprintln!("rebalance scenario {name}: {measured}");

        let tokens = token_statuses(&mut self.redis.conn, &self.redis.prefix).await;
        self.deployment
            .holdings(&self.db.pool)
            .await
            .check(&self.records, &results, &tokens);

        self.deployment.audit().await;
        flush_prefix(&mut self.redis.conn, &self.redis.prefix).await;
        measured
    }
}

struct Measured {
    positions: usize,
    repeated: usize,
    longest_unassigned: Duration,
    deadline_drains: usize,
}

impl Measured {
    fn repeat_share(&self) -> f64 {
        self.repeated as f64 / self.positions.max(1) as f64
    }
}

impl std::fmt::Display for Measured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} positions answered more than once ({:.1}%), longest time without \
             an assignment {:.1}s, {} drains hit the deadline",
            self.repeated,
            self.positions,
            self.repeat_share() * 100.0,
            self.longest_unassigned.as_secs_f64(),
            self.deadline_drains
        )
    }
}

/// The longest stretch a worker held no partition while it was in the group's
/// life: from its first log line (start-up) or from a revoke that left it nothing,
/// to its next assignment. The stretch after its last revoke (leaving) is not one.
fn longest_unassigned(lines: &[String]) -> Duration {
    let time = |line: &str| -> Option<chrono::DateTime<chrono::FixedOffset>> {
        let value: serde_json::Value = serde_json::from_str(line).ok()?;
        chrono::DateTime::parse_from_rfc3339(value.get("timestamp")?.as_str()?).ok()
    };
    let mut longest = Duration::ZERO;
    let mut without_since = lines.iter().find_map(|l| time(l));
    for line in lines {
        let (Some(event), Some(at)) = (membership(line), time(line)) else {
            continue;
        };
        match event {
            Membership::Assigned(n) if n > 0 => {
                if let Some(since) = without_since.take() {
                    longest = longest.max((at - since).to_std().unwrap_or_default());
                }
            }
            _ => {
                without_since.get_or_insert(at);
            }
        }
    }
    longest
}

/// (a) Three workers start 3 s apart while the workload arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_workers_joining_one_by_one_answer_almost_every_command_once() {
    let mut run = Run::start(171).await;
    let producer = run.produce().await;
    for slot in 0..3 {
        if slot > 0 {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        let worker = run.spawn(slot, false, 0);
        run.deployment.workers.push(worker);
    }
    let measured = run.finish("a (joins 3 s apart)", producer).await;
    assert!(
        measured.repeat_share() <= 0.02,
        "too many commands answered twice: {measured}"
    );
}

/// (b) The same, then three graceful rolling restarts (as a deployment does).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rolling_restarts_neither_replay_the_backlog_nor_starve_the_restarted_member() {
    let mut run = Run::start(172).await;
    let producer = run.produce().await;
    for slot in 0..3 {
        if slot > 0 {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        let worker = run.spawn(slot, false, 0);
        run.deployment.workers.push(worker);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut rejoins = Vec::new();
    for slot in 0..3 {
        rejoins.push(run.restart(slot, false, 1).await);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!("rolling restarts: restarted members held partitions after {rejoins:?}");
    let measured = run.finish("b (joins + 3 rolling restarts)", producer).await;
    assert!(
        measured.repeat_share() <= 0.02,
        "too many commands answered twice: {measured}"
    );
    // `restart` already waited at most twice the session timeout for each.
    assert!(rejoins.iter().all(|t| *t <= SESSION * 2), "{rejoins:?}");
}

/// (c) A static member (`KAFKA_GROUP_INSTANCE_ID`) restarted within the session
/// timeout gets its partitions back, and nothing is answered twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_static_member_restarted_within_the_session_timeout_repeats_nothing() {
    let mut run = Run::start(173).await;
    for slot in 0..3 {
        let worker = run.spawn(slot, true, 0);
        run.deployment.workers.push(worker);
    }
    run.deployment
        .wait_for_stable_group(Duration::from_secs(60))
        .await;
    let producer = run.produce().await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let others_before: Vec<usize> = [0, 2]
        .iter()
        .map(|&s| membership_events(&run.deployment.workers[s]))
        .collect();
    let rejoin = run.restart(1, true, 1).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let others_after: Vec<usize> = [0, 2]
        .iter()
        .map(|&s| membership_events(&run.deployment.workers[s]))
        .collect();
    eprintln!(
        "static restart: partitions back after {rejoin:?}; membership events of the \
         others {others_before:?} -> {others_after:?}"
    );
    let measured = run.finish("c (static member restarted)", producer).await;
    assert_eq!(measured.repeated, 0, "{measured}");
    assert!(rejoin <= SESSION * 2, "{rejoin:?}");
}

fn membership_events(worker: &Proc) -> usize {
    worker
        .lines()
        .iter()
        .filter(|l| membership(l).is_some())
        .count()
}

/// In process: a member that gives up half its partitions to a newcomer keeps the
/// other half, stays a group member (`/readyz`'s view) throughout, and commits what
/// it drained, so the newcomer answers nothing a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_incremental_revoke_keeps_the_rest_of_the_assignment_and_the_membership() {
    use crate::support::helpers::{quick_worker_settings, stop_all, wait_for_stable_group, Stack};
    use payment_worker_devtools::SimulatorConfig;

    let stack = Stack::new(
        PARTITIONS,
        SimulatorConfig {
            latency_ms: 20,
            ..SimulatorConfig::default()
        },
    )
    .await;
    let spec = WorkloadSpec {
        count: 600,
        duplicate_ratio: 0.0,
        invalid_ratio: 0.0,
        decline_ratio: 0.0,
        seed: 174,
    };
    let records = operator::generate(&spec, &unique("incr"));
    let (first, second) = records.split_at(300);
    stack.produce(first).await;
    let settings = quick_worker_settings();
    let a = stack.start_worker("a", &settings);
    stack
        .wait_for_results(first.len(), Duration::from_secs(60))
        .await;
    assert_eq!(a.assigned_partitions(), PARTITIONS as usize);

    // B joins while A works on more commands; A is sampled all along.
    stack.produce(second).await;
    let b = stack.start_worker("b", &settings);
    let mut held_by_a = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while b.assigned_partitions() == 0 || a.assigned_partitions() == PARTITIONS as usize {
        assert!(
            a.liveness().in_group(),
            "A left the group during an incremental revoke"
        );
        held_by_a.push(a.assigned_partitions());
        assert!(Instant::now() < deadline, "B never got partitions");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    held_by_a.push(a.assigned_partitions());
    assert!(
        held_by_a.iter().all(|n| *n > 0),
        "A held no partition at some point: {held_by_a:?}"
    );
    let workers = vec![a, b];
    wait_for_stable_group(&workers, PARTITIONS as usize).await;
    stack
        .wait_for_results(records.len(), Duration::from_secs(60))
        .await;
    stack.wait_for_commits(Duration::from_secs(15)).await;
    stop_all(workers).await;
    let results = stack.results().await;
    // No position answered twice across the rebalance.
    assert_one_answer_per_command(&results, records.len());
    stack.assert_books_balance().await;
}
