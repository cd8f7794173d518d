//! The production build (`cargo build` of the product crate, as the repository's root
//! builds it) holds the product only: no development tools among its commands, none
//! of the changes the development tools link into librdkafka's mock broker, and no
//! crash point in its code.
//!
//! Built into a target directory of its own (seeded with the dependencies the suite
//! already built, so only the crate compiles): the suite's own binary, which other
//! tests run at the same time, is never replaced. The dev profile is enough: the
//! tools are another crate and the crash points a feature only tests turn on, as in a
//! release build.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::target_seed::{cargo, seed_target};

/// Commands of the production build, in `--help`'s order.
const PRODUCT_COMMANDS: &[&str] = &[
    "run",
    "migrate",
    "tokens",
    "process",
    "produce",
    "replay",
    "audit",
    "dlq",
    "healthcheck",
    "key-hash",
    "completions",
    "man",
];
const DEVELOPMENT_TOOLS: &[&str] = &["demo", "bench", "gateway-sim", "dev-kafka"];
/// A function of the development tools' changes to the mock broker
/// (`devtools/native/`): linked into their binary and the tests, never the product's.
const MOCK_CHANGE_SYMBOL: &str = "payment_worker_mock_batches_walked";
/// What the crash points put into a binary: their variables, markers and names.
const FAULT_HOOK_STRINGS: &[&str] = &[
    "PAYMENT_WORKER_FAULT",
    "frozen at fault point",
    "fault injected",
    "stall_poll_loop",
    "after_reserve",
];

fn build_product() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    // `<target>/debug/deps/it-<hash>` → `<target>`.
    let exe = std::env::current_exe().unwrap();
    let shared = exe.ancestors().nth(3).unwrap().to_path_buf();
    let own = shared.join("product-build");
    seed_target(&shared, &own);
    let output = cargo(
        &root,
        &own,
        &["build", "--locked", "--bin", "payment-worker"],
    )
    .output()
    .expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo build failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    own.join("debug/payment-worker")
}

/// The commands `--help` lists.
fn commands_listed(binary: &Path) -> Vec<String> {
    let output = Command::new(binary).arg("--help").output().unwrap();
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout).into_owned();
    help.split("Commands:")
        .nth(1)
        .and_then(|rest| rest.split("\n\n").next())
        .expect("a Commands: section")
        .lines()
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .filter(|name| name != "help")
        .collect()
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

#[test]
fn the_production_build_has_the_product_commands_only_and_no_crash_points() {
    let product = build_product();

    assert_eq!(commands_listed(&product), PRODUCT_COMMANDS);
    for tool in DEVELOPMENT_TOOLS {
        let output = Command::new(&product)
            .args([*tool, "--help"])
            .output()
            .unwrap();
        assert_eq!(
            output.status.code(),
            Some(2),
            "`{tool}` must be an unknown command in the production build"
        );
    }
    let version = Command::new(&product).arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&version.stdout).into_owned();
    assert!(
        version.starts_with(&format!(
            "payment-worker {} (commit ",
            env!("CARGO_PKG_VERSION")
        )),
        "{version}"
    );

    let bytes = std::fs::read(&product).unwrap();
    for hook in FAULT_HOOK_STRINGS {
        assert!(
            !contains(&bytes, hook),
            "the production binary carries the fault hook string {hook:?}"
        );
    }
    assert!(
        !contains(&bytes, MOCK_CHANGE_SYMBOL),
        "the production binary links the development tools' mock broker changes"
    );
    // The scan itself works: the tests' own build has every one of them, and the
    // development tools' binary lists its tools and links the mock changes.
    let tests_build = std::fs::read(crate::support::procs::BINARY).unwrap();
    for hook in FAULT_HOOK_STRINGS {
        assert!(
            contains(&tests_build, hook),
            "{hook:?} not found in the tests' build"
        );
    }
    let devtools = crate::support::procs::devtools_binary();
    assert!(contains(
        &std::fs::read(&devtools).unwrap(),
        MOCK_CHANGE_SYMBOL
    ));
    let listed = commands_listed(&devtools);
    for tool in DEVELOPMENT_TOOLS.iter().chain(PRODUCT_COMMANDS) {
        assert!(
            listed.iter().any(|c| c == tool),
            "{tool} missing from {listed:?}"
        );
    }
}
