//! `payment-worker-devtools`: the product's commands and the development tools.

// The same allocator as the product's binary: the bench's workers are this binary.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // Before anything can panic: the default hook would print a panic's message, which
    // may quote a record's data, to stderr unmasked.
    payment_worker::redaction::install_panic_hook();
    let cli = payment_worker::cli::parse_masked::<payment_worker_devtools::cli::DevCli>();
    let telemetry = payment_worker::telemetry::init(cli.command.log_filter());
    let result = payment_worker_devtools::cli::run(cli).await;
    telemetry.shutdown();
    payment_worker::cli::finish(result)
}
