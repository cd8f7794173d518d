//! The command line. Each command parses its flags and hands over to the library;
//! nothing here decides anything about payments. `run` is the worker
//! (`startup::Application`); the other commands' own steps sit beside this file.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::configuration::{
    parse_duration, DatabaseSettings, KafkaSettings, ProcessorSettings, StoreSettings,
    WorkerSettings,
};
use crate::startup;
use crate::token::IdempotencyKey;

mod exit;
mod manual;
mod process;
mod tokens;

pub use exit::{exit_code, exit_status, exit_status_help, finish, CommandFailure};

/// `--version`: the release, the commit it was built from, and Kafka OIDC when this
/// build carries it (feature `kafka-oidc`).
#[cfg(not(feature = "kafka-oidc"))]
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("PAYMENT_WORKER_COMMIT"),
    ")"
);
/// `--version`: the release, the commit it was built from, and Kafka OIDC when this
/// build carries it (feature `kafka-oidc`).
#[cfg(feature = "kafka-oidc")]
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("PAYMENT_WORKER_COMMIT"),
    "; kafka-oidc)"
);

const PROCESS_EXIT_HELP: &str = "\
Exit status: 0 a final outcome (succeeded, declined, duplicate, rejected as
key_reused/token_missing); 65 the command is invalid; 75 no final outcome yet
(`retry`: gateway or store unavailable), send it again later; 1 any other failure,
among them `rejected` as `internal` (the worker failed on the command, or the gateway
charged and the database refused to record it: run `audit`). The outcome is printed
as one JSON line on standard output in every case but a failure before it.";

const TOKENS_SHOW_EXIT_HELP: &str = "\
Exit status: 0 the token exists; 1 no such token (`{\"state\":\"missing\"}` is
printed) or the store failed.";

const AUDIT_EXIT_HELP: &str = "\
Exit status: 0 no violation; 3 invariant violations found (the report says which);
1 the audit could not run.";

const REPLAY_EXIT_HELP: &str = "\
Exit status: 0 the group was rewound, or (--dry-run) the report was printed,
whatever the verdicts; 1 a failure (other live members, Kafka unreachable, ...).";

/// The command line: one subcommand.
#[derive(Debug, Parser)]
#[command(
    name = "payment-worker",
    version = VERSION,
    about = "Charges each payment command exactly once",
    after_help = exit_status_help()
)]
pub struct Cli {
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The process's command line parsed as `P` (the product's, or the development
/// tools' that carry its commands). Whatever clap prints on the way is shown with
/// card numbers masked: an error quotes the argument it refuses (`invalid value '…'
/// for '--worker-id'`), and `--help` shows each setting's value from the environment
/// (`[env: WORKER_ID=…]`); what an operator pasted or exported there may be a card
/// number. Ends the process as clap would: help and version on standard output with
/// status 0, errors on standard error with status 2.
pub fn parse_masked<P: Parser>() -> P {
    match P::try_parse() {
        Ok(parsed) => parsed,
        Err(error) => {
            use std::io::Write as _;
            let text = error.render().to_string();
            let text = crate::redaction::masked_text(&text);
            if error.use_stderr() {
                eprint!("{text}");
            } else {
                print!("{text}");
                let _ = std::io::stdout().flush();
            }
            std::process::exit(error.exit_code())
        }
    }
}

/// Every `payment-worker` command.
// Parsed once per process: boxing the larger settings would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a consumer-group member; SIGTERM drains, commits and leaves the group.
    Run {
        /// The worker's Kafka topics, group and client settings.
        #[command(flatten)]
        kafka: KafkaSettings,
        /// How the worker admits, retries and drains commands.
        #[command(flatten)]
        worker: WorkerSettings,
        /// Stores and gateway.
        #[command(flatten)]
        processor: ProcessorSettings,
    },
    /// Apply `migrations/` to the database.
    Migrate {
        /// The database to migrate.
        #[command(flatten)]
        database: DatabaseSettings,
    },
    /// Issue and inspect idempotency tokens.
    Tokens {
        /// `issue` or `show`.
        #[command(subcommand)]
        command: TokensCommand,
    },
    /// Process one command (JSON) without Kafka and print its outcome.
    #[command(after_help = PROCESS_EXIT_HELP)]
    Process {
        /// The command as JSON; `-` reads it from standard input.
        json: String,
        /// Stores and gateway.
        #[command(flatten)]
        processor: ProcessorSettings,
    },
    /// Publish commands from a JSON-lines file or a generated workload.
    Produce(crate::operator::ProduceArgs),
    /// Rewind a consumer group (the group must have no live members).
    #[command(after_help = REPLAY_EXIT_HELP)]
    Replay(crate::operator::ReplayArgs),
    /// Reconcile Redis tokens, Postgres payments and the gateway ledger; exits
    /// non-zero on any invariant violation. `--repair` settles stuck tokens.
    #[command(after_help = AUDIT_EXIT_HELP)]
    Audit(crate::audit::AuditArgs),
    /// Dead-letter topic tools.
    Dlq {
        /// The dead-letter command to run.
        #[command(subcommand)]
        command: DlqCommand,
    },
    /// Probe a running worker's `/healthz` (`--probe readyz`: `/readyz`): exit 0 when it answers
    /// 2xx, 1 otherwise. For container health checks, without shell tools.
    Healthcheck(crate::operator::HealthcheckArgs),
    /// Print the `x-key-hmac-sha256` of a record key (under KEY_HASH_SECRET_FILE, as the
    /// workers compute it), to find the answers of a key they show masked.
    KeyHash(crate::operator::KeyHashArgs),
    /// Print a shell completion script: `payment-worker completions bash > /etc/bash_completion.d/payment-worker`.
    Completions {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff): `payment-worker man | man -l -`. With
    /// `--out-dir`, write one page per command there instead.
    Man {
        /// Write one page per command into this directory.
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
}

/// `tokens issue --ttl`: a duration of at least a second (a token's expiry is kept
/// in whole milliseconds, and one that expires before its key is printed is none).
fn parse_token_ttl(value: &str) -> Result<Duration, String> {
    let ttl = parse_duration(value)?;
    if ttl < Duration::from_secs(1) {
        return Err("a token must live at least 1s".to_owned());
    }
    Ok(ttl)
}

/// The `tokens` subcommands.
#[derive(Debug, Subcommand)]
pub enum TokensCommand {
    /// Mint pending tokens and print one per line (random keys unless KEYs are given).
    Issue {
        /// How long each token stays valid (at least one second).
        #[arg(long, default_value = "24h", value_parser = parse_token_ttl)]
        ttl: Duration,
        /// Random keys to mint when no KEY is given (1 to 1,000,000: the keys are
        /// made before the first is issued).
        #[arg(long, default_value_t = 1, conflicts_with = "keys",
              value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
        count: usize,
        /// Idempotency keys to mint tokens for.
        keys: Vec<IdempotencyKey>,
        /// Where the tokens live.
        #[command(flatten)]
        store: StoreSettings,
    },
    /// Print a token's state, owner, fence, lease left and TTL as JSON.
    #[command(after_help = TOKENS_SHOW_EXIT_HELP)]
    Show {
        /// The idempotency key.
        key: IdempotencyKey,
        /// Where the tokens live.
        #[command(flatten)]
        store: StoreSettings,
    },
}

/// The `dlq` subcommands.
#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Put dead-lettered records back on the commands topic.
    Redrive(crate::operator::RedriveArgs),
}

/// Runs the parsed command to its end; the error decides the exit status ([`exit_code`]).
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    run_command(cli.command).await
}

/// Runs one product command (the development tools' binary runs them too).
pub async fn run_command(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run {
            kafka,
            worker,
            processor,
        } => {
            // Before anything that takes time: a SIGTERM while the worker connects
            // to its stores ends it at once (exit 0), one while its Kafka clients
            // start stops it as soon as they have.
            let mut shutdown: startup::Shutdown = Box::pin(startup::shutdown_signal()?);
            let settings = startup::RunSettings {
                kafka,
                worker,
                processor,
            };
            match startup::Application::build(settings, &mut shutdown).await? {
                Some(application) => application.run_until(shutdown).await,
                None => Ok(()),
            }
        }
        Command::Migrate { database } => {
            startup::connect_and_migrate(&database).await?;
            println!("migrations applied");
            Ok(())
        }
        Command::Tokens { command } => tokens::run(command).await,
        Command::Process { json, processor } => process::run(json, processor).await,
        Command::Produce(args) => crate::operator::produce(args).await,
        Command::Replay(args) => crate::operator::replay(args).await,
        Command::Audit(args) => crate::audit::run(args).await,
        Command::Dlq {
            command: DlqCommand::Redrive(args),
        } => crate::operator::redrive(args).await,
        Command::Healthcheck(args) => crate::operator::healthcheck(args).await,
        Command::KeyHash(args) => {
            crate::operator::key_hash(&args, std::io::stdin().lock(), std::io::stdout().lock())
        }
        Command::Completions { shell } => manual::write_completions(shell),
        Command::Man { out_dir } => manual::write_manual(out_dir),
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
