//! `payment-worker-devtools`: every product command, and the development tools
//! beside them. One binary for both because the tools start the product: the bench
//! launches its workers as `<this binary> run`, and the local stack of
//! docker-compose.yml runs the simulator from the same image as its workers.

use clap::{Parser, Subcommand};
use payment_worker::cli::Command as ProductCommand;

use crate::{BenchArgs, DemoArgs, DevKafkaArgs, SimulatorConfig};

/// The command line of the development tools' binary.
#[derive(Debug, Parser)]
#[command(
    name = "payment-worker-devtools",
    version = payment_worker::cli::VERSION,
    about = "payment-worker's commands and its development tools (demo, bench, gateway simulator, local Kafka)",
    after_help = payment_worker::cli::exit_status_help()
)]
pub struct DevCli {
    /// The command to run.
    #[command(subcommand)]
    pub command: DevCommand,
}

/// A development tool, or any product command.
// Parsed once per process: boxing the larger settings would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum DevCommand {
    /// The whole product on embedded defaults: local Kafka, gateway simulator,
    /// Redis/Postgres at the default URLs; a workload, a worker group, a replay.
    Demo(DemoArgs),
    /// Throughput, latency and memory against a Postgres ceiling measured in the same run.
    Bench(BenchArgs),
    /// HTTP gateway simulator: charges and refunds, look-ups by idempotency key, a ledger, injected faults.
    GatewaySim {
        /// Address to serve on (port 0 picks a free port and prints it).
        #[arg(long, env = "GATEWAY_SIM_LISTEN", default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// The faults and latency the simulator injects.
        #[command(flatten)]
        config: SimulatorConfig,
    },
    /// A standalone local Kafka (librdkafka mock cluster) for development.
    DevKafka(DevKafkaArgs),
    /// The product's commands, as `payment-worker` runs them.
    #[command(flatten)]
    Product(ProductCommand),
}

impl DevCommand {
    /// `demo` and `bench` print their own reports; their workers' info logs would
    /// bury them.
    pub fn log_filter(&self) -> &'static str {
        match self {
            Self::Demo(_) | Self::Bench(_) => "error",
            Self::GatewaySim { .. } | Self::DevKafka(_) | Self::Product(_) => "info",
        }
    }
}

/// Runs one command to its end.
pub async fn run(cli: DevCli) -> anyhow::Result<()> {
    match cli.command {
        DevCommand::Demo(args) => crate::run_demo(args).await,
        DevCommand::Bench(args) => crate::run_bench(args).await,
        DevCommand::GatewaySim { listen, config } => crate::run_simulator(listen, config).await,
        DevCommand::DevKafka(args) => crate::run_dev_kafka(args).await,
        DevCommand::Product(command) => payment_worker::cli::run_command(command).await,
    }
}
