//! Two things the compiler cannot find out by itself:
//! - the git commit the binary is built from, for `--version`
//!   (`PAYMENT_WORKER_COMMIT` overrides it where there is no `.git`, as in an image
//!   build);
//! - for the integration tests only, the linker flags that route two functions of
//!   librdkafka's mock broker to the development tools' replacements
//!   (`devtools/native/`, compiled and linked by `devtools/build.rs`; the tests run
//!   the local Kafka in process). A build script's flags reach its own package's
//!   targets only, so this one repeats them for `tests/`; the product's binary gets
//!   none.
//!
//! Also rebuilds the crate when a migration is added.

use std::env;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // `sqlx::migrate!` embeds `migrations/` at compile time and tracks the files it
    // read, not the directory: without this a new migration is missed by an
    // incremental build.
    println!("cargo:rerun-if-changed=migrations");
    println!(
        "cargo:rustc-env=PAYMENT_WORKER_COMMIT={}",
        commit().unwrap_or_else(|| "unknown".to_owned())
    );
    mock_changes_for_tests();
}

/// The commit checked out, abbreviated as `git log --oneline` shows it.
fn commit() -> Option<String> {
    println!("cargo:rerun-if-env-changed=PAYMENT_WORKER_COMMIT");
    if let Some(given) = env::var("PAYMENT_WORKER_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
    {
        return Some(given);
    }
    let git = |args: &[&str]| -> Option<String> {
        let output = Command::new("git").args(args).output().ok()?;
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
    };
    // A new commit moves HEAD or the branch it names (a loose ref, or packed-refs
    // after a gc); those files changing reruns this, so the crate is rebuilt once per
    // commit, not per build. A path that does not exist would rerun it every time.
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    let watched = ["HEAD", branch.as_deref().unwrap_or("HEAD"), "packed-refs"];
    for file in watched {
        if let Some(path) = git(&["rev-parse", "--git-path", file]) {
            if std::path::Path::new(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    git(&["rev-parse", "--short=12", "HEAD"])
}

/// Each mock function the development tools replace, with the file that replaces it:
/// `devtools/build.rs` compiles those files from the same list.
const MOCK_FUNCTIONS_REPLACED: [(&str, &str); 2] = include!("devtools/native/replaced.rs");

/// `--wrap` for the integration tests, under the condition `devtools/build.rs`
/// compiles the replacements: GNU ld (or lld) on Linux, librdkafka's build directory
/// known.
fn mock_changes_for_tests() {
    if env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux")
        || env::var_os("DEP_RDKAFKA_ROOT").is_none()
    {
        return;
    }
    println!("cargo:rerun-if-changed=devtools/native/replaced.rs");
    for (function, _) in MOCK_FUNCTIONS_REPLACED {
        println!("cargo:rustc-link-arg-tests=-Wl,--wrap={function}");
    }
}
