//! Where the CPU went during a phase, from `/proc`: Postgres backends, Redis, the
//! bench process (local Kafka, simulator, reader and any in-process worker), a
//! worker child process, and everything else on the machine. Divided by the
//! payments of the phase it says what one payment costs each party, which is what
//! bounds the ratios on a machine where all of them share the cores.

use std::collections::BTreeMap;

use serde::Serialize;

/// Linux reports process times in clock ticks of `USER_HZ`, 100 on every
/// mainstream architecture (the kernel ABI fixes it, whatever `CONFIG_HZ` is).
const TICKS_PER_SECOND: f64 = 100.0;

#[derive(Debug, Clone, Default)]
pub struct CpuSample {
    /// Busy and idle time of the whole machine, in ticks (all CPUs together).
    busy: u64,
    idle: u64,
    /// Ticks per party, for processes alive at the time of the sample.
    parties: BTreeMap<&'static str, u64>,
    /// Ticks of the bench process's own threads, by what they do.
    bench_threads: BTreeMap<&'static str, u64>,
}

/// CPU milliseconds per payment (or per transaction), by party.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CpuCost {
    pub operations: usize,
    pub wall_s: f64,
    /// Share of the machine's CPU time that was idle during the phase.
    pub machine_idle_share: f64,
    pub ms_per_operation: BTreeMap<String, f64>,
    /// `bench_process` split by thread: the local Kafka's mock broker, the Kafka
    /// clients (the in-process worker's and the bench's), the tokio runtime (the
    /// in-process worker), the gateway simulator and the results reader.
    pub bench_threads_ms_per_operation: BTreeMap<String, f64>,
}

fn process_ticks(stat: &str) -> Option<(String, u64)> {
    // `pid (comm) state ppid …`: comm may hold spaces and parentheses, so split at
    // the last ')'.
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_owned();
    let fields: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    // After the comm: state is field 3, utime 14 and stime 15 (1-based, man proc).
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((comm, utime + stime))
}

fn machine_ticks(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let values: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let idle = values.get(3)? + values.get(4).unwrap_or(&0);
    let busy: u64 = values.iter().take(8).sum::<u64>() - idle;
    Some((busy, idle))
}

/// Which Postgres process this is, from its title (`postgres: USER DB HOST(PORT)
/// STATE` for a backend, `postgres: walwriter` and so on for the server's own).
fn postgres_party(cmdline: &str, database: &str) -> Option<&'static str> {
    let title = cmdline.replace('\0', " ");
    let mut words = title.split_whitespace();
    if words.next() != Some("postgres:") {
        // The postmaster itself.
        return Some("postgres_server");
    }
    let mut rest: Vec<&str> = words.collect();
    // `cluster_name`, when set, comes first: `postgres: 15/main: walwriter`.
    if rest.first().is_some_and(|w| w.ends_with(':')) {
        rest.remove(0);
    }
    let is_backend = rest
        .get(2)
        .is_some_and(|host| host.ends_with(')') || *host == "[local]");
    match (is_backend, rest.get(1)) {
        (true, Some(db)) if *db == database => Some("postgres"),
        // Another database's backend: somebody else's load.
        (true, _) => None,
        // WAL writer, checkpointer, background writer, …: they serve every database.
        (false, _) => Some("postgres_server"),
    }
}

/// The gateway simulator's thread in the bench process.
pub const SIMULATOR_THREAD: &str = "gateway-sim";

/// What a thread of the bench process does, from the name librdkafka, tokio or
/// the bench gave it.
fn bench_thread_role(name: &str) -> &'static str {
    if name.starts_with("rdk:mock") {
        "local_kafka"
    } else if name.starts_with("rdk:") {
        "kafka_clients"
    } else if name.starts_with("tokio") {
        "runtime"
    } else if name == SIMULATOR_THREAD {
        "gateway_simulator"
    } else if name == "bench-results" {
        "results_reader"
    } else {
        "other_threads"
    }
}

fn bench_threads() -> BTreeMap<&'static str, u64> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for entry in entries.flatten() {
        if let Some((name, ticks)) = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .as_deref()
            .and_then(process_ticks)
        {
            *out.entry(bench_thread_role(&name)).or_default() += ticks;
        }
    }
    out
}

/// Samples the machine and the parties; `worker` is a worker child process and
/// `database` the bench's database (other databases' backends count as other).
pub fn sample(worker: Option<u32>, database: &str) -> CpuSample {
    let mut out = CpuSample::default();
    if let Some((busy, idle)) = std::fs::read_to_string("/proc/stat")
        .ok()
        .as_deref()
        .and_then(machine_ticks)
    {
        out.busy = busy;
        out.idle = idle;
    }
    out.bench_threads = bench_threads();
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Some((comm, ticks)) = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .as_deref()
            .and_then(process_ticks)
        else {
            continue;
        };
        let party = if pid == me {
            "bench_process"
        } else if Some(pid) == worker {
            "worker_process"
        } else if comm == "postgres" {
            let cmdline = std::fs::read_to_string(entry.path().join("cmdline")).unwrap_or_default();
            match postgres_party(&cmdline, database) {
                Some(party) => party,
                None => continue,
            }
        } else if comm.starts_with("redis-server") {
            "redis"
        } else {
            continue;
        };
        *out.parties.entry(party).or_default() += ticks;
    }
    out
}

impl CpuSample {
    /// What happened between `self` and `later`, per operation. Processes that
    /// ended in between are lost to their party and show up under `other`.
    pub fn cost_until(&self, later: &CpuSample, operations: usize, wall_s: f64) -> CpuCost {
        let per_op =
            |ticks: u64| ticks as f64 * 1000.0 / TICKS_PER_SECOND / operations.max(1) as f64;
        let mut ms_per_operation = BTreeMap::new();
        let mut accounted = 0u64;
        for (party, after) in &later.parties {
            let before = self.parties.get(party).copied().unwrap_or(0);
            let spent = after.saturating_sub(before);
            accounted += spent;
            ms_per_operation.insert((*party).to_owned(), per_op(spent));
        }
        let busy = later.busy.saturating_sub(self.busy);
        let idle = later.idle.saturating_sub(self.idle);
        ms_per_operation.insert("other".to_owned(), per_op(busy.saturating_sub(accounted)));
        ms_per_operation.insert("total".to_owned(), per_op(busy));
        // Threads that ended in between are lost to their role.
        let bench_threads_ms_per_operation = later
            .bench_threads
            .iter()
            .map(|(role, after)| {
                let before = self.bench_threads.get(role).copied().unwrap_or(0);
                ((*role).to_owned(), per_op(after.saturating_sub(before)))
            })
            .collect();
        CpuCost {
            operations,
            wall_s,
            machine_idle_share: if busy + idle > 0 {
                idle as f64 / (busy + idle) as f64
            } else {
                0.0
            },
            ms_per_operation,
            bench_threads_ms_per_operation,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_process_line_whose_name_has_spaces_and_parentheses() {
        let stat =
            "4242 (tokio (rt) 1) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 8 0 1000 0 0";
        assert_eq!(process_ticks(stat), Some(("tokio (rt) 1".to_owned(), 300)));
    }

    #[test]
    fn reads_busy_and_idle_time_of_the_machine() {
        let stat = "cpu  100 5 50 800 20 1 2 3 0 0\ncpu0 50 2 25 400 10 0 1 1 0 0\n";
        assert_eq!(machine_ticks(stat), Some((161, 820)));
    }

    #[test]
    fn costs_are_per_operation_and_the_rest_is_other() {
        let before = CpuSample {
            busy: 1000,
            idle: 1000,
            parties: BTreeMap::from([("postgres", 100), ("bench_process", 50)]),
            bench_threads: BTreeMap::from([("local_kafka", 10), ("runtime", 40)]),
        };
        let after = CpuSample {
            busy: 1300,
            idle: 1100,
            parties: BTreeMap::from([("postgres", 250), ("bench_process", 150)]),
            bench_threads: BTreeMap::from([("local_kafka", 40), ("runtime", 110)]),
        };
        let cost = before.cost_until(&after, 1000, 2.0);
        // 150 ticks = 1500 ms over 1000 operations.
        assert_eq!(cost.ms_per_operation["postgres"], 1.5);
        assert_eq!(cost.ms_per_operation["bench_process"], 1.0);
        assert_eq!(cost.ms_per_operation["other"], 0.5);
        assert_eq!(cost.ms_per_operation["total"], 3.0);
        assert!((cost.machine_idle_share - 0.25).abs() < 1e-9);
        assert_eq!(cost.bench_threads_ms_per_operation["local_kafka"], 0.3);
        assert_eq!(cost.bench_threads_ms_per_operation["runtime"], 0.7);
    }

    #[test]
    fn bench_threads_are_told_apart_by_their_names() {
        assert_eq!(bench_thread_role("rdk:mock"), "local_kafka");
        assert_eq!(bench_thread_role("rdk:broker1"), "kafka_clients");
        assert_eq!(bench_thread_role("rdk:main"), "kafka_clients");
        assert_eq!(bench_thread_role("tokio-runtime-w"), "runtime");
        assert_eq!(bench_thread_role("bench-results"), "results_reader");
        assert_eq!(bench_thread_role(SIMULATOR_THREAD), "gateway_simulator");
        assert_eq!(bench_thread_role("payment-worker"), "other_threads");
    }

    #[test]
    fn postgres_processes_are_told_apart_by_their_title() {
        let ours = "postgres: postgres payments_bench 127.0.0.1(51234) idle\0\0";
        assert_eq!(postgres_party(ours, "payments_bench"), Some("postgres"));
        let theirs = "postgres: postgres pw_test_1 127.0.0.1(51236) INSERT";
        assert_eq!(postgres_party(theirs, "payments_bench"), None);
        assert_eq!(
            postgres_party("postgres: walwriter ", "payments_bench"),
            Some("postgres_server")
        );
        let clustered = "postgres: 15/main: postgres payments_bench 127.0.0.1(42310) idle\0\0";
        assert_eq!(
            postgres_party(clustered, "payments_bench"),
            Some("postgres")
        );
        let local = "postgres: 15/main: postgres payments_bench [local] COMMIT";
        assert_eq!(postgres_party(local, "payments_bench"), Some("postgres"));
        assert_eq!(
            postgres_party("postgres: 15/main: checkpointer ", "payments_bench"),
            Some("postgres_server")
        );
        assert_eq!(
            postgres_party(
                "/usr/lib/postgresql/15/bin/postgres\0-D\0/var/lib",
                "payments_bench"
            ),
            Some("postgres_server")
        );
    }

    #[test]
    fn this_machine_can_be_sampled() {
        let first = sample(None, "payments_bench");
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(30) {}
        let second = sample(None, "payments_bench");
        assert!(second.busy >= first.busy);
        assert!(second.parties.contains_key("bench_process"));
    }
}
