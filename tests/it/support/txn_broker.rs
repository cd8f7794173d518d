//! `txn-broker`: librdkafka's mock cluster patched to carry out Kafka transactions
//! (`tests/txn_broker/`): commit and abort markers, the last stable offset,
//! aborted transactions in `read_committed` fetches, offsets sent with a
//! transaction kept pending until it commits, the group generation checked (a
//! zombie is fenced), and transactions past their timeout aborted by the broker.
//! The stock mock answers these requests without doing any of it.
//!
//! Built from the librdkafka sources rdkafka-sys vendors, once per patch, under the
//! target directory; run as a process of its own like `dev-kafka`.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use payment_worker::configuration::KafkaSettings;

use super::procs::{self, Proc};

fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/txn_broker")
}

/// The librdkafka tree of the rdkafka-sys crate this build links.
fn librdkafka_source() -> PathBuf {
    let output = Command::new(source_dir().join("build"))
        .arg("--print-source")
        .env("CARGO", env!("CARGO"))
        .output()
        .expect("running tests/txn_broker/build --print-source");
    assert!(
        output.status.success(),
        "tests/txn_broker/build --print-source: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
}

/// The broker binary, built on first use (a minute or two) and kept under target/.
/// `PW_TEST_TXN_BROKER` runs another build instead (`broker.c` linked with the stock
/// mock, to watch the exactly-once tests fail without the patch).
fn binary() -> PathBuf {
    if let Ok(path) = std::env::var("PW_TEST_TXN_BROKER") {
        return PathBuf::from(path);
    }
    static BUILT: Mutex<Option<PathBuf>> = Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(path) = built.as_ref() {
        return path.clone();
    }
    let librdkafka = librdkafka_source();
    let mut hasher = DefaultHasher::new();
    librdkafka.hash(&mut hasher);
    for file in ["build", "broker.c", "mock-transactions.patch"] {
        std::fs::read(source_dir().join(file))
            .unwrap()
            .hash(&mut hasher);
    }
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("txn-broker-{:016x}", hasher.finish()));
    // nextest runs each test in a process of its own: the first test to get here
    // builds, the others wait on the lock and then find the binary.
    let lock = std::fs::File::create(path.with_extension("lock")).expect("txn-broker lock file");
    lock.lock().expect("locking the txn-broker build");
    if !path.exists() {
        eprintln!("building {} (once per patch)", path.display());
        let status = Command::new(source_dir().join("build"))
            .arg(&librdkafka)
            .arg(&path)
            .status()
            .expect("running tests/txn_broker/build");
        assert!(status.success(), "tests/txn_broker/build failed: {status}");
    }
    drop(lock);
    *built = Some(path.clone());
    path
}

/// Starts a txn-broker of three brokers with the payment topics of `settings`
/// (`partitions` each); returns it with its bootstrap address.
pub(crate) async fn start(partitions: i32, settings: &KafkaSettings) -> (Proc, String) {
    start_with(partitions, settings, None).await
}

/// As [`start`], with a broker-side size limit on `settings`' dead-letter topic
/// (Kafka's topic setting `max.message.bytes`): a record batch above it is refused
/// with MESSAGE_TOO_LARGE.
pub(crate) async fn start_with_dead_letter_limit(
    partitions: i32,
    settings: &KafkaSettings,
    max_message_bytes: usize,
) -> (Proc, String) {
    start_with(
        partitions,
        settings,
        Some((&settings.dlq_topic, max_message_bytes)),
    )
    .await
}

/// As [`start_with_dead_letter_limit`], the limit on `settings`' results topic.
pub(crate) async fn start_with_results_limit(
    partitions: i32,
    settings: &KafkaSettings,
    max_message_bytes: usize,
) -> (Proc, String) {
    start_with(
        partitions,
        settings,
        Some((&settings.results_topic, max_message_bytes)),
    )
    .await
}

async fn start_with(
    partitions: i32,
    settings: &KafkaSettings,
    limit: Option<(&str, usize)>,
) -> (Proc, String) {
    let binary = tokio::task::spawn_blocking(binary).await.unwrap();
    let mut command = Command::new(binary);
    if let Some((topic, bytes)) = limit {
        command.args(["--max-message-bytes".to_owned(), format!("{topic}={bytes}")]);
    }
    command.args([
        "3",
        &partitions.to_string(),
        &settings.commands_topic,
        &settings.results_topic,
        &settings.dlq_topic,
    ]);
    procs::spawn_announced("txn-broker", command, "txn-broker bootstrap ").await
}
