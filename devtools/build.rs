//! Two changes linked into librdkafka's mock broker, the local Kafka of `dev-kafka`,
//! `demo`, `bench` and the tests: a faster offset look-up (`native/mock_msgset_find.c`)
//! and a group coordinator that takes offset commits while a rebalance is prepared,
//! as Kafka's does (`native/mock_offset_commit.c`). The worker's own Kafka clients
//! call neither, and the product's build links neither.
//!
//! The product's build script gives its integration tests (which run this crate's
//! local Kafka in process) the same `--wrap` flags, from the same list
//! (`native/replaced.rs`).

use std::env;
use std::path::PathBuf;

/// Each mock function replaced, and the file that replaces it (one list, which the
/// root `build.rs` reads too).
const WRAPPED: [(&str, &str); 2] = include!("native/replaced.rs");

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=native/replaced.rs");
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
