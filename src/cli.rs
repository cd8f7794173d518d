//! The command line of SPEC §6. Each command parses its flags and hands over to
//! the library; nothing here decides anything about payments.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::configuration::{
    parse_duration, DatabaseSettings, KafkaSettings, StoreSettings, WorkerSettings,
};
use crate::gateway::SimulatorConfig;
use crate::payment::{CommandContext, PaymentCommand};
use crate::startup::{self, ProcessorSettings};
use crate::token::{IdempotencyKey, IssueOutcome};
use crate::worker::{self, LocalKafka};

#[derive(Debug, Parser)]
#[command(
    name = "payment-worker",
    version,
    about = "Charges each payment command exactly once"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a consumer-group member; SIGTERM drains, commits and leaves the group.
    Run {
        #[command(flatten)]
        kafka: KafkaSettings,
        #[command(flatten)]
        worker: WorkerSettings,
        #[command(flatten)]
        processor: ProcessorSettings,
    },
    /// The whole product on embedded defaults: local Kafka, gateway simulator,
    /// Redis/Postgres at the default URLs; a workload, a worker group, a replay.
    Demo(crate::demo::DemoArgs),
    /// Apply `migrations/` to the database.
    Migrate {
        #[command(flatten)]
        database: DatabaseSettings,
    },
    /// Issue and inspect idempotency tokens.
    Tokens {
        #[command(subcommand)]
        command: TokensCommand,
    },
    /// Process one command (JSON) without Kafka and print its outcome.
    Process {
        /// The command as JSON; `-` reads it from standard input.
        json: String,
        #[command(flatten)]
        processor: ProcessorSettings,
    },
    /// Publish commands from a JSON-lines file or a generated workload.
    Produce(crate::worker::ProduceArgs),
    /// Rewind a consumer group (the group must have no live members).
    Replay(crate::worker::ReplayArgs),
    /// Reconcile Redis tokens, Postgres payments and the gateway ledger; exits
    /// non-zero on any invariant violation. `--repair` settles stuck tokens.
    Audit(crate::audit::AuditArgs),
    /// Dead-letter topic tools.
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
    },
    /// A standalone local Kafka (librdkafka mock cluster) for development.
    DevKafka {
        /// Host to advertise; the mock cluster picks its own ports and prints them.
        #[arg(long, default_value = "127.0.0.1")]
        listen: String,
        /// Partitions of each payment topic.
        #[arg(long, default_value_t = 6)]
        partitions: i32,
        /// Mock brokers in the cluster. Its own id: the flattened KafkaSettings
        /// already owns the argument id `brokers` (`--kafka-brokers`).
        #[arg(id = "mock_brokers", long = "brokers", default_value_t = 3)]
        brokers: i32,
        /// Also write the bootstrap address to this file.
        #[arg(long)]
        bootstrap_file: Option<PathBuf>,
        #[command(flatten)]
        kafka: KafkaSettings,
    },
    /// Throughput, latency and memory against a Postgres ceiling (SPEC §8).
    Bench(crate::bench::BenchArgs),
    /// HTTP gateway simulator (SPEC §7).
    GatewaySim {
        /// Address to serve on (port 0 picks a free port and prints it).
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        #[command(flatten)]
        config: SimulatorConfig,
    },
}

#[derive(Debug, Subcommand)]
pub enum TokensCommand {
    /// Mint pending tokens and print one per line (random keys unless KEYs are given).
    Issue {
        /// How long each token stays valid.
        #[arg(long, default_value = "24h", value_parser = parse_duration)]
        ttl: Duration,
        /// Random keys to mint when no KEY is given.
        #[arg(long, default_value_t = 1)]
        count: usize,
        /// Idempotency keys to mint tokens for.
        keys: Vec<String>,
        #[command(flatten)]
        store: StoreSettings,
    },
    /// Print a token's state, owner, fence, lease left and TTL as JSON.
    Show {
        /// The idempotency key.
        key: String,
        #[command(flatten)]
        store: StoreSettings,
    },
}

#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Put dead-lettered records back on the commands topic.
    Redrive(crate::worker::RedriveArgs),
}

/// The process exit code for a command that failed: 3 when `audit` found
/// violations, 4 for a fatal broker error, 1 for any other error (clap exits with 2
/// on a usage error before a command runs).
pub fn exit_code(error: &anyhow::Error) -> u8 {
    if let Some(failure) = error.downcast_ref::<worker::WorkerFailure>() {
        return failure.exit_code();
    }
    if error
        .downcast_ref::<crate::audit::ViolationsFound>()
        .is_some()
    {
        return 3;
    }
    1
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run {
            kafka,
            worker,
            processor,
        } => {
            // Before any connection: a refused Kafka setting is a configuration error.
            kafka.check_passthrough()?;
            let worker_id = worker.worker_id();
            tracing::info!(?kafka, ?worker, ?processor, %worker_id, "starting worker");
            let processor = Arc::new(processor.build(&worker_id).await?);
            let handler = startup::handler(processor, &kafka, &worker)?;
            worker::run_until(&kafka, &worker, handler, startup::shutdown_signal()).await
        }
        Command::Demo(args) => crate::demo::run(args).await,
        Command::Migrate { database } => {
            database.connect_and_migrate().await?;
            println!("migrations applied");
            Ok(())
        }
        Command::Tokens { command } => {
            let settings = match &command {
                TokensCommand::Issue { store, .. } | TokensCommand::Show { store, .. } => store,
            };
            let (_pool, store) = settings.open().await?;
            let mut out = std::io::stdout().lock();
            match command {
                TokensCommand::Issue {
                    ttl, count, keys, ..
                } => {
                    let keys: Vec<IdempotencyKey> = if keys.is_empty() {
                        (0..count)
                            .map(|_| {
                                IdempotencyKey::try_from(format!(
                                    "tok-{}",
                                    uuid::Uuid::new_v4().simple()
                                ))
                            })
                            .collect::<Result<_, _>>()?
                    } else {
                        keys.into_iter()
                            .map(|k| {
                                IdempotencyKey::try_from(k.as_str())
                                    .with_context(|| format!("key {k:?}"))
                            })
                            .collect::<anyhow::Result<_>>()?
                    };
                    for key in keys {
                        match store.issue(&key, ttl).await? {
                            IssueOutcome::Created => writeln!(out, "{key}")?,
                            IssueOutcome::AlreadyExists => {
                                eprintln!("{key}: already exists, left as it is")
                            }
                        }
                    }
                }
                TokensCommand::Show { key, .. } => {
                    let key = IdempotencyKey::try_from(key.as_str())?;
                    match store.show(&key).await? {
                        Some(view) => writeln!(out, "{}", serde_json::to_string(&view)?)?,
                        None => {
                            writeln!(out, "{{\"state\":\"missing\"}}")?;
                        }
                    }
                }
            }
            Ok(())
        }
        Command::Process { json, processor } => {
            let json = if json == "-" {
                std::io::read_to_string(std::io::stdin()).context("reading standard input")?
            } else {
                json
            };
            let command = PaymentCommand::parse(json.as_bytes())
                .map_err(|e| anyhow::anyhow!("{}: {e}", e.code()))?;
            let processor = processor
                .build(&WorkerSettings::default().worker_id())
                .await?;
            let outcome = processor
                .process(&command, &CommandContext::default())
                .await;
            println!(
                "{}",
                serde_json::to_string(&crate::worker::OutcomeView::from(&outcome))?
            );
            Ok(())
        }
        Command::Produce(args) => worker::produce(args).await,
        Command::Replay(args) => worker::replay(args).await,
        Command::Audit(args) => crate::audit::run(args).await,
        Command::Dlq {
            command: DlqCommand::Redrive(args),
        } => worker::redrive(args).await,
        Command::DevKafka {
            listen,
            partitions,
            brokers,
            bootstrap_file,
            kafka,
        } => {
            let local = LocalKafka::start(brokers)?;
            local.create_payment_topics(&kafka, partitions)?;
            let bootstrap = local.bootstrap_servers();
            let advertised = if listen == "127.0.0.1" {
                bootstrap.clone()
            } else {
                bootstrap.replace("127.0.0.1", &listen)
            };
            if let Some(path) = bootstrap_file {
                std::fs::write(&path, &advertised)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            println!("dev-kafka bootstrap {advertised}");
            std::io::stdout().flush()?;
            startup::shutdown_signal().await;
            tokio::task::spawn_blocking(move || drop(local)).await?;
            Ok(())
        }
        Command::Bench(args) => crate::bench::run(args).await,
        Command::GatewaySim { listen, config } => {
            crate::gateway::run_simulator(listen, config).await
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn command_line_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
