//! `payment-worker`: the product's binary (its commands: `src/cli.rs`).

// glibc's allocator spent about a sixth of the worker's instructions per payment
// (callgrind, `scripts/profile-worker`); mimalloc does the same work in fewer.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // Before anything can panic: the default hook would print a panic's message, which
    // may quote a record's data, to stderr unmasked.
    payment_worker::redaction::install_panic_hook();
    let cli = payment_worker::cli::parse_masked::<payment_worker::cli::Cli>();
    let telemetry = payment_worker::telemetry::init("info");
    let result = payment_worker::cli::run(cli).await;
    telemetry.shutdown();
    payment_worker::cli::finish(result)
}
