//! Links a faster offset look-up into librdkafka's mock broker, the local Kafka of
//! `dev-kafka`, `bench` and the tests (see `native/mock_msgset_find.c` for why).
//! The worker's own Kafka clients do not call it.
//! Also rebuilds the crate when a migration is added.

use std::env;
use std::path::PathBuf;

const LOOKUP: &str = "rd_kafka_mock_msgset_find";
const SOURCE: &str = "native/mock_msgset_find.c";

fn main() {
    println!("cargo:rerun-if-changed={SOURCE}");
    println!("cargo:rerun-if-changed=build.rs");
    // `sqlx::migrate!` embeds `migrations/` at compile time and tracks the files it
    // read, not the directory: without this a new migration is missed by an
    // incremental build.
    println!("cargo:rerun-if-changed=migrations");
    // `--wrap` is GNU ld's (and lld's); elsewhere the mock keeps its own look-up.
    if env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        return;
    }
    // rdkafka-sys builds librdkafka in its own directory and names it here; its
    // internal headers describe the mock's partition log in that very build.
    let Some(librdkafka) = env::var_os("DEP_RDKAFKA_ROOT").map(PathBuf::from) else {
        println!(
            "cargo:warning=librdkafka's build directory is unknown (DEP_RDKAFKA_ROOT): \
             the local Kafka keeps its slow offset look-up"
        );
        return;
    };
    cc::Build::new()
        .file(SOURCE)
        // As system headers: librdkafka's internal headers are not clean under
        // -Wall -Wextra, which then still apply to the file itself.
        .flag("-isystem")
        .flag(librdkafka.join("src"))
        // Always linked: only the wrapped call below asks for it, and the linker
        // reads librdkafka's archive after this one.
        .link_lib_modifier("+whole-archive")
        .compile("mock_msgset_find");
    // Every call the mock's request handlers make to the look-up goes to
    // `__wrap_rd_kafka_mock_msgset_find` instead.
    println!("cargo:rustc-link-arg=-Wl,--wrap={LOOKUP}");
}
