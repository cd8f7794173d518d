//! Mutation check for the enforcement code that `cargo-mutants` cannot mutate: the Lua
//! scripts, the SQL statements, and the processor checks it does not generate.
//!
//! Every entry of [`MUTANTS`] (`mutants/table.rs`) breaks exactly one enforcement (an owner check, a fence
//! check, a status check, an expiry or lease check, the unique-key handling) by a text
//! substitution, and names the tests that must then fail. The runner applies each
//! substitution to a scratch copy of the crate, rebuilds the `it` test target and runs
//! those tests; a mutant that leaves them green is a hole in the suite.
//!
//! - `cargo test --test mutants` checks the table against the sources (fast, always run).
//! - `cargo test --test mutants -- --ignored --nocapture` runs the mutants (one
//!   incremental rebuild each). `MUTANTS_ONLY=<text>` keeps the entries whose file or
//!   description contains `<text>`.
//!
//! The scratch copy lives in `<target>/lua-sql-mutants/crate` and builds into
//! `<target>/lua-sql-mutants/target`, seeded once with the dependencies built in
//! `<target>/debug`: only the crate itself is compiled, incrementally, and nothing the
//! checkout builds is touched.
//!
//! `MUTANTS_IN_PLACE=1` (CI, on a clean clone that just built and ran the suite)
//! mutates the checkout itself instead and builds in its own target directory: no copy
//! to seed and no first build of the crate, only one incremental rebuild per mutant.
//! It refuses a checkout with uncommitted changes, and puts every file back as it was,
//! also when a mutant's run panics.

use std::collections::{BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

#[path = "mutants/table.rs"]
mod table;
#[path = "it/support/target_seed.rs"]
mod target_seed;

use table::{Mutant, MUTANTS};
use target_seed::{cargo, seed_target};

/// What the crate needs to build and run the `it` tests.
const COPIED: &[&str] = &[
    "Cargo.toml",
    "Cargo.lock",
    "build.rs",
    // The development tools: the tests run the simulator and the local Kafka.
    "devtools",
    "src",
    "tests",
    "migrations",
    // Workspace members: cargo reads their manifests to build any package of the
    // workspace.
    "model",
    "xtask",
];
/// `cargo test` of the `it` target, for both its build and its runs. `--workspace`:
/// the features every member asks for, as the suite's own build resolves them. The
/// root package alone resolves fewer (no model checker's `model-testing`, fewer of a
/// dependency's), so the first build here would compile the crate and a dozen
/// dependencies anew instead of one incremental step.
const IT_TESTS: &[&str] = &["test", "--workspace", "--test", "it"];
const BUILD_LIMIT: Duration = Duration::from_secs(30 * 60);
const TEST_LIMIT: Duration = Duration::from_secs(5 * 60);

fn crate_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn source(file: &str) -> String {
    fs::read_to_string(crate_root().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// The table is only worth something while every substitution still applies: a
/// pattern that no longer matches would silently test nothing.
#[test]
fn every_mutant_applies_to_the_current_source() {
    let mut problems = Vec::new();
    for m in MUTANTS {
        let text = source(m.file);
        let found = text.matches(m.from).count();
        if found != 1 {
            problems.push(format!(
                "{} [{}]: pattern found {found} times",
                m.file, m.breaks
            ));
        }
        if m.from == m.to {
            problems.push(format!(
                "{} [{}]: substitution changes nothing",
                m.file, m.breaks
            ));
        }
        if m.tests.is_empty() {
            problems.push(format!("{} [{}]: no test named", m.file, m.breaks));
        }
        for test in m.tests {
            let Some((module, name)) = test.rsplit_once("::") else {
                problems.push(format!("{test}: not module::name"));
                continue;
            };
            // `token::redis::fencing` lives in tests/it/token/redis.rs (or token/redis/mod.rs).
            let path = module.replace("::", "/");
            let file = format!("tests/it/{path}.rs");
            let module_source = if crate_root().join(&file).exists() {
                source(&file)
            } else {
                source(&format!("tests/it/{path}/mod.rs"))
            };
            // `fn name()`, or `fn name(pool: PgPool)` under `#[sqlx::test]`.
            if !module_source.contains(&format!("fn {name}(")) {
                problems.push(format!("{test}: no such test"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
#[ignore = "rebuilds the crate once per mutant: cargo test --test mutants -- --ignored --nocapture"]
fn every_lua_and_sql_mutant_is_caught() {
    let only = std::env::var("MUTANTS_ONLY").ok();
    let selected: Vec<&Mutant> = MUTANTS
        .iter()
        .filter(|m| {
            only.as_deref()
                .is_none_or(|o| m.file.contains(o) || m.breaks.contains(o))
        })
        .collect();
    assert!(
        !selected.is_empty(),
        "MUTANTS_ONLY={only:?} selects nothing"
    );

    let shared_target = target_dir();
    let work = shared_target.join("lua-sql-mutants");
    fs::create_dir_all(&work).unwrap();
    let (scratch, own_target) = if in_place() {
        refuse_uncommitted_changes();
        (crate_root(), shared_target.clone())
    } else {
        let scratch = work.join("crate");
        let own_target = work.join("target");
        seed_target(&shared_target, &own_target);
        sync_tree(&crate_root(), &scratch);
        (scratch, own_target)
    };
    let schema = schema_database();
    let started = Instant::now();

    let mut rows = Vec::new();
    let mut queue: VecDeque<Vec<&Mutant>> = rounds(&selected).into();
    while let Some(round) = queue.pop_front() {
        let guards: Vec<Mutated> = round
            .iter()
            .map(|m| {
                let path = scratch.join(m.file);
                let original = fs::read_to_string(&path).unwrap();
                assert_eq!(
                    original.matches(m.from).count(),
                    1,
                    "{}: {}",
                    m.file,
                    m.breaks
                );
                Mutated::apply(&path, original, m)
            })
            .collect();
        let clock = Instant::now();
        let built = build(&scratch, &own_target, &work, &schema);
        let build_time = clock.elapsed();
        if built.is_err() && round.len() > 1 {
            // Which of the two does not build: each again on its own.
            drop(guards);
            for m in round.into_iter().rev() {
                queue.push_front(vec![m]);
            }
            continue;
        }
        let shared = round.len();
        for m in round {
            let clock = Instant::now();
            let verdict = match &built {
                Ok(()) => run_named(&scratch, &own_target, &work, m.tests),
                Err(why) => Verdict::Unbuildable(why.clone()),
            };
            let took = build_time / shared as u32 + clock.elapsed();
            eprintln!(
                "mutant {}/{} {} [{}]: {} ({:.0?}{})",
                rows.len() + 1,
                selected.len(),
                m.file,
                m.breaks,
                verdict.label(),
                took,
                if shared > 1 { ", build shared" } else { "" }
            );
            rows.push((m, verdict, took));
        }
        drop(guards);
    }

    // Last, on the unmutated crate: the named tests must pass, or "caught" meant
    // nothing. In place (CI) the whole suite just passed on this very commit, these
    // tests among them: run again, they would only repeat that.
    let all_tests: BTreeSet<&str> = selected
        .iter()
        .flat_map(|m| m.tests.iter().copied())
        .collect();
    let all_tests: Vec<&str> = all_tests.into_iter().collect();
    let clock = Instant::now();
    let baseline = (!in_place()).then(|| match build(&scratch, &own_target, &work, &schema) {
        Ok(()) => run_named(&scratch, &own_target, &work, &all_tests),
        Err(why) => Verdict::Unbuildable(why),
    });
    let baseline_time = clock.elapsed();

    let report = report(&rows, &baseline, baseline_time, started.elapsed());
    println!("{report}");
    let _ = fs::write(work.join("report.md"), &report);
    if let Some(baseline) = &baseline {
        assert!(
            matches!(baseline, Verdict::Passed { tests } if *tests == all_tests.len()),
            "the unmutated crate must pass every named test: {baseline:?}"
        );
    }
    let missed: Vec<String> = rows
        .iter()
        .filter(|(_, v, _)| !v.caught())
        .map(|(m, v, _)| format!("{} [{}]: {}", m.file, m.breaks, v.label()))
        .collect();
    assert!(
        missed.is_empty(),
        "mutants not caught:\n{}",
        missed.join("\n")
    );
}

/// `MUTANTS_IN_PLACE=1`: mutate the checkout itself (see the module comment).
fn in_place() -> bool {
    std::env::var_os("MUTANTS_IN_PLACE").is_some_and(|value| value == "1")
}

/// In place, a file is rewritten for each mutant: work nobody committed could be
/// lost if the run were killed between the mutation and its undoing.
fn refuse_uncommitted_changes() {
    let status = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .current_dir(crate_root())
        .output()
        .expect("git status");
    let changed = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.status.success() && changed.trim().is_empty(),
        "MUTANTS_IN_PLACE=1 mutates the checkout itself: commit or stash first\n{changed}"
    );
}

/// One mutant applied to one file; dropping it puts the file back as it was (also
/// while a failed assertion unwinds).
struct Mutated {
    path: PathBuf,
    original: String,
}

impl Mutated {
    fn apply(path: &Path, original: String, m: &Mutant) -> Self {
        fs::write(path, original.replacen(m.from, m.to, 1)).unwrap();
        Self {
            path: path.to_owned(),
            original,
        }
    }
}

impl Drop for Mutated {
    fn drop(&mut self) {
        if let Err(error) = fs::write(&self.path, &self.original) {
            eprintln!("could not restore {}: {error}", self.path.display());
        }
    }
}

#[derive(Debug)]
enum Verdict {
    /// Every named test ran and passed.
    Passed { tests: usize },
    /// At least one named test failed.
    Failed,
    /// The tests did not finish within the limit (a hang is a failure too).
    TimedOut,
    /// The mutated crate did not build: the mutant says nothing about the tests.
    Unbuildable(String),
}

impl Verdict {
    fn caught(&self) -> bool {
        matches!(self, Verdict::Failed | Verdict::TimedOut)
    }

    fn label(&self) -> String {
        match self {
            Verdict::Passed { tests } => format!("MISSED ({tests} tests passed)"),
            Verdict::Failed => "caught".to_owned(),
            Verdict::TimedOut => "caught (timeout)".to_owned(),
            Verdict::Unbuildable(why) => format!("UNBUILDABLE: {}", why.replace('\n', " / ")),
        }
    }
}

fn report(
    rows: &[(&Mutant, Verdict, Duration)],
    baseline: &Option<Verdict>,
    baseline_time: Duration,
    total: Duration,
) -> String {
    let mut out = String::from(
        "\n| # | file | breaks | tests | result | time |\n|---|---|---|---|---|---|\n",
    );
    for (i, (m, verdict, took)) in rows.iter().enumerate() {
        let _ = writeln!(
            out,
            "| {} | `{}` | {} | `{}` | {} | {:.0} s |",
            i + 1,
            m.file,
            m.breaks,
            m.tests.join("`, `"),
            verdict.label(),
            took.as_secs_f64()
        );
    }
    let caught = rows.iter().filter(|(_, v, _)| v.caught()).count();
    let _ = writeln!(
        out,
        "\n{caught}/{} caught; unmutated baseline: {} ({:.0} s); total {:.0} s",
        rows.len(),
        baseline
            .as_ref()
            .map_or("the suite's own run (in place)".to_owned(), |b| format!(
                "{b:?}"
            )),
        baseline_time.as_secs_f64(),
        total.as_secs_f64()
    );
    out
}

/// `<target>/debug/deps/mutants-<hash>` → `<target>`.
fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().expect("test executable path");
    exe.ancestors()
        .nth(3)
        .expect("the test runs from <target>/<profile>/deps")
        .to_path_buf()
}

/// Makes `to` hold the same files as the crate's `COPIED` entries. Unchanged files are
/// not rewritten, so their modification times (which cargo compares) stay put and the
/// build stays incremental.
fn sync_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in COPIED {
        sync_entry(&from.join(entry), &to.join(entry));
    }
}

fn sync_entry(from: &Path, to: &Path) {
    if from.is_dir() {
        fs::create_dir_all(to).unwrap();
        let mut wanted = BTreeSet::new();
        for child in fs::read_dir(from).unwrap() {
            let child = child.unwrap();
            wanted.insert(child.file_name());
            sync_entry(&child.path(), &to.join(child.file_name()));
        }
        for stale in fs::read_dir(to).unwrap() {
            let stale = stale.unwrap();
            if !wanted.contains(&stale.file_name()) {
                let path = stale.path();
                if path.is_dir() {
                    fs::remove_dir_all(&path).unwrap();
                } else {
                    fs::remove_file(&path).unwrap();
                }
            }
        }
    } else {
        let bytes = fs::read(from).unwrap();
        if fs::read(to).ok().as_deref() != Some(bytes.as_slice()) {
            fs::write(to, bytes).unwrap();
        }
    }
}

/// Mutants that share one build: a Lua script runs only in the Redis token store and
/// a statement of `postgres/statements.rs` only in the Postgres one, and the tests
/// named for each exercise only their own store, so one of each, applied together,
/// cannot change what the other's tests see. Paired, they take half the rebuilds.
fn rounds<'a>(selected: &[&'a Mutant]) -> Vec<Vec<&'a Mutant>> {
    let only = |m: &Mutant, prefix: &str| m.tests.iter().all(|t| t.starts_with(prefix));
    let redis_only = |m: &Mutant| m.file.ends_with(".lua") && only(m, "token::redis::");
    let postgres_only =
        |m: &Mutant| m.file == "src/token/postgres/statements.rs" && only(m, "token::postgres::");
    let (mut lua, mut sql, mut rest) = (Vec::new(), VecDeque::new(), Vec::new());
    for &m in selected {
        if redis_only(m) {
            lua.push(m);
        } else if postgres_only(m) {
            sql.push_back(m);
        } else {
            rest.push(vec![m]);
        }
    }
    let mut rounds: Vec<Vec<&Mutant>> = lua
        .into_iter()
        .map(|m| std::iter::once(m).chain(sql.pop_front()).collect())
        .collect();
    rounds.extend(sql.into_iter().map(|m| vec![m]));
    rounds.extend(rest);
    rounds
}

/// Builds the `it` target (and so the crate) in `scratch`; the error is the build's
/// last lines.
/// The database the mutants' checked SQL is compiled against (see [`build`]): a
/// fresh one, migrated from `migrations/` as they are before any mutant (embedded in
/// this test), so a schema mutant fails its tests at run time, as it always did,
/// instead of failing every statement's check at build time. Its URL.
fn schema_database() -> String {
    use sqlx::{Connection, Executor};
    let server = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let name = "pw_lua_sql_mutants_schema";
    let mut url = url::Url::parse(&server).expect("DATABASE_URL is a URL");
    url.set_path(name);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut admin = sqlx::PgConnection::connect(&server)
            .await
            .expect("the Postgres server DATABASE_URL names (default: the local one)");
        for statement in [
            format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            format!("CREATE DATABASE {name}"),
        ] {
            admin.execute(statement.as_str()).await.unwrap();
        }
        let pool = sqlx::PgPool::connect(url.as_str()).await.unwrap();
        sqlx::migrate!().run(&pool).await.unwrap();
        pool.close().await;
    });
    url.into()
}

/// Builds the `it` target. A mutated statement is not in the offline cache `.sqlx/`
/// (it holds today's texts only, and the scratch copy has no `.sqlx/`), so the
/// checked SQL is compiled online, against `schema`: `SQLX_OFFLINE=false` wins over
/// `.cargo/config.toml`, and no `SQLX_OFFLINE_DIR` lets the build write a cache file.
fn build(scratch: &Path, target_dir: &Path, work: &Path, schema: &str) -> Result<(), String> {
    let log = work.join("last-run.log");
    let mut build = cargo(scratch, target_dir, &[IT_TESTS, &["--no-run"]].concat());
    build
        .env("SQLX_OFFLINE", "false")
        .env("DATABASE_URL", schema)
        .env_remove("SQLX_OFFLINE_DIR");
    match run_logged(build, &log, BUILD_LIMIT) {
        Some(status) if status.success() => Ok(()),
        outcome => {
            let output = fs::read_to_string(&log).unwrap_or_default();
            let tail: String = output.lines().rev().take(15).collect::<Vec<_>>().join("\n");
            Err(format!("{outcome:?}: {tail}"))
        }
    }
}

/// The development tools' binary the suite built beside this test (`<target>/debug/`):
/// the mutated tests run its gateway simulator and local Kafka, which no mutant
/// touches, so the `it` target alone is rebuilt per mutant.
fn suite_devtools() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // `<target>/debug/deps/mutants-<hash>` → `<target>/debug`.
    let debug = exe.ancestors().nth(2).expect("a target directory");
    let devtools = debug.join("payment-worker-devtools");
    assert!(
        devtools.exists(),
        "{} is missing: build the workspace first (`cargo xtask test` does)",
        devtools.display()
    );
    devtools
}

/// Runs the named tests of the `it` target as last built.
fn run_named(scratch: &Path, target_dir: &Path, work: &Path, tests: &[&str]) -> Verdict {
    let log = work.join("last-run.log");
    // One test at a time: on a loaded machine the timing-sensitive ones flake when run
    // side by side, and a flake would count as a catch.
    let mut args = [IT_TESTS, &["--", "--exact", "--test-threads=1"]].concat();
    args.extend_from_slice(tests);
    let mut run = cargo(scratch, target_dir, &args);
    run.env("PW_TEST_DEVTOOLS", suite_devtools());
    let Some(status) = run_logged(run, &log, TEST_LIMIT) else {
        return Verdict::TimedOut;
    };
    let output = fs::read_to_string(&log).unwrap_or_default();
    if status.success() {
        let passed = output
            .lines()
            .filter_map(|l| l.strip_prefix("test result: ok. "))
            .filter_map(|rest| rest.split(' ').next()?.parse::<usize>().ok())
            .sum();
        Verdict::Passed { tests: passed }
    } else if output.contains("test result: FAILED") {
        Verdict::Failed
    } else {
        Verdict::Unbuildable(output.lines().rev().take(15).collect::<Vec<_>>().join("\n"))
    }
}

/// Runs `command` with its output in `log`; `None` when it outlived `limit` (then its
/// whole process group is killed, test binaries and their children included).
fn run_logged(mut command: Command, log: &Path, limit: Duration) -> Option<ExitStatus> {
    let file = fs::File::create(log).unwrap();
    let mut child = command
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .process_group(0)
        .spawn()
        .expect("cargo starts");
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() > deadline {
            let group = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
