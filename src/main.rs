use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = payment_worker::cli::Cli::parse();
    // The demo prints its own report; its workers' info logs would bury it.
    let default_filter = match cli.command {
        payment_worker::cli::Command::Demo(_) => "error",
        _ => "info",
    };
    let telemetry = payment_worker::telemetry::init(default_filter);
    let result = payment_worker::cli::run(cli).await;
    telemetry.shutdown();
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
