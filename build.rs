//! Two things the compiler cannot find out by itself:
//! - the git commit the binary is built from, for `--version`
//!   (`PAYMENT_WORKER_COMMIT` overrides it where there is no `.git`, as in an image
//!   build);
//! - with the development tools (feature `devtools`), two changes linked into
//!   librdkafka's mock broker, the local Kafka of `dev-kafka`, `bench` and the tests:
//!   a faster offset look-up (`native/mock_msgset_find.c`) and a group coordinator
//!   that takes offset commits while a rebalance is prepared, as Kafka's does
//!   (`native/mock_offset_commit.c`). The worker's own Kafka clients call neither.
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
    #[cfg(feature = "devtools")]
    local_kafka::link_mock_changes();
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

#[cfg(feature = "devtools")]
mod local_kafka {
    use std::env;
    use std::path::PathBuf;

    /// Each mock function replaced, and the file that replaces it.
    const WRAPPED: [(&str, &str); 2] = [
        ("rd_kafka_mock_msgset_find", "native/mock_msgset_find.c"),
        (
            "rd_kafka_mock_cgrp_classic_check_state",
            "native/mock_offset_commit.c",
        ),
    ];

    pub fn link_mock_changes() {
        for (_, source) in WRAPPED {
            println!("cargo:rerun-if-changed={source}");
        }
        // `--wrap` is GNU ld's (and lld's); elsewhere the mock keeps its own functions.
        if env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
            return;
        }
        // rdkafka-sys builds librdkafka in its own directory and names it here; its
        // internal headers describe the mock's partition log in that very build.
        let Some(librdkafka) = env::var_os("DEP_RDKAFKA_ROOT").map(PathBuf::from) else {
            println!(
                "cargo:warning=librdkafka's build directory is unknown (DEP_RDKAFKA_ROOT): \
                 the local Kafka keeps the mock's own offset look-up and commit checks"
            );
            return;
        };
        cc::Build::new()
            .files(WRAPPED.map(|(_, source)| source))
            // As system headers: librdkafka's internal headers are not clean under
            // -Wall -Wextra, which then still apply to the file itself.
            .flag("-isystem")
            .flag(librdkafka.join("src"))
            // Always linked: only the wrapped calls below ask for it, and the linker
            // reads librdkafka's archive after this one.
            .link_lib_modifier("+whole-archive")
            .compile("mock_changes");
        // Every call the mock's request handlers make to a wrapped function goes to
        // its `__wrap_` replacement instead.
        for (function, _) in WRAPPED {
            println!("cargo:rustc-link-arg=-Wl,--wrap={function}");
        }
    }
}
