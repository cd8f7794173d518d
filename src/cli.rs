//! The command line. Each command parses its flags and hands over to
//! the library; nothing here decides anything about payments.

use std::io::Write;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::configuration::{
    parse_duration, DatabaseSettings, KafkaSettings, ProcessorSettings, StoreSettings,
    WorkerSettings,
};
use crate::payment::{Attempt, CommandContext, Outcome, PaymentCommand, RejectionKind};
use crate::startup;
use crate::token::{IdempotencyKey, IssueOutcome};
use crate::worker;

/// The exit statuses of every command, in one place: `exit_code` maps errors to
/// them, `--help` and the manual list them from [`EXIT_STATUSES`].
pub mod exit_status {
    /// The command did what was asked.
    pub const SUCCESS: u8 = 0;
    /// Any failure not listed below (a service unreachable, a bad setting, …).
    pub const FAILURE: u8 = 1;
    /// clap's own: an unknown flag or a missing argument.
    pub const USAGE: u8 = 2;
    /// `audit` found invariant violations.
    pub const VIOLATIONS: u8 = 3;
    /// `run`: a fatal Kafka error that restarting the same way cannot fix.
    pub const FATAL_BROKER: u8 = 4;
    /// sysexits.h `EX_DATAERR`: the input is invalid; sending it again will not help.
    pub const DATA_ERROR: u8 = 65;
    /// sysexits.h `EX_TEMPFAIL`: nothing final happened; try again later.
    pub const TEMPORARY_FAILURE: u8 = 75;
    /// A SIGINT (Ctrl-C) while stopping: stopped at once.
    pub const INTERRUPTED: u8 = crate::startup::INTERRUPTED_EXIT_STATUS;
}

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

/// Every exit status and what it means, for `--help` and the manual.
const EXIT_STATUSES: [(u8, &str); 8] = [
    (
        exit_status::SUCCESS,
        "success; for `process`, a final outcome (succeeded, declined, duplicate, or rejected as key_reused/token_missing)",
    ),
    (
        exit_status::FAILURE,
        "failure (a service unreachable, a bad setting, ...); `tokens show`: no such token",
    ),
    (
        exit_status::USAGE,
        "usage error (unknown flag, missing or malformed argument, a setting refused)",
    ),
    (exit_status::VIOLATIONS, "`audit`: invariant violations found"),
    (
        exit_status::FATAL_BROKER,
        "`run`: fatal Kafka error (authentication, authorisation, fenced member)",
    ),
    (
        exit_status::DATA_ERROR,
        "`process`: the command is invalid (malformed JSON or a broken rule)",
    ),
    (
        exit_status::TEMPORARY_FAILURE,
        "`process`: no final outcome yet (gateway or store unavailable); try again later",
    ),
    (
        exit_status::INTERRUPTED,
        "a SIGINT (Ctrl-C) while stopping: stopped at once, the drain and the final commit cut short (uncommitted records are delivered again)",
    ),
];

/// The exit-status table shown at the end of `payment-worker --help`, wrapped to
/// 80 columns.
pub fn exit_status_help() -> String {
    const INDENT: usize = 6;
    let mut out = String::from("Exit status:");
    for (code, meaning) in EXIT_STATUSES {
        let mut line = format!("  {code:<3} ");
        for word in meaning.split(' ') {
            if line.len() + word.len() > 80 && line.trim().len() > 3 {
                out.push('\n');
                out.push_str(line.trim_end());
                line = " ".repeat(INDENT);
            }
            line.push_str(word);
            line.push(' ');
        }
        out.push('\n');
        out.push_str(line.trim_end());
    }
    out
}

/// The manual's EXIT STATUS section (roff), from the same table.
fn exit_status_roff() -> String {
    let mut out = String::from(".SH \"EXIT STATUS\"\n");
    for (code, meaning) in EXIT_STATUSES {
        let meaning = meaning.replace('\\', "\\e").replace('-', "\\-");
        out.push_str(&format!(".TP\n\\fB{code}\\fR\n{meaning}\n"));
    }
    out
}

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

/// Fails a command in a way scripts tell apart by exit status (see [`exit_code`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandFailure {
    /// The input can never succeed as it is.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// Nothing final happened; the same input may succeed later.
    #[error("no final outcome, try again later: {0}")]
    TryAgainLater(String),
    /// What was asked about does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// The worker itself failed on the input, or charged it without booking it;
    /// someone must look (`audit` lists an unbooked charge).
    #[error("the worker failed on this command: {0}")]
    Internal(String),
}

impl CommandFailure {
    /// The exit status this failure ends the process with.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::InvalidInput(_) => exit_status::DATA_ERROR,
            Self::TryAgainLater(_) => exit_status::TEMPORARY_FAILURE,
            Self::NotFound(_) | Self::Internal(_) => exit_status::FAILURE,
        }
    }
}

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

/// The `tokens` subcommands.
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

/// The process exit code for a command that failed, from the error's type (the
/// table is [`exit_status`]): 3 when `audit` found violations, 4 for a fatal broker
/// error, 65/75/1 for a [`CommandFailure`], 2 for a secret file or Kafka setting
/// refused at start (clap exits with 2 on its own usage errors before a command
/// runs), 1 for any other error.
pub fn exit_code(error: &anyhow::Error) -> u8 {
    if let Some(failure) = error.downcast_ref::<worker::WorkerFailure>() {
        return failure.exit_code();
    }
    if let Some(failure) = error.downcast_ref::<CommandFailure>() {
        return failure.exit_code();
    }
    if error
        .downcast_ref::<crate::configuration::SecretError>()
        .is_some_and(crate::configuration::SecretError::is_usage)
    {
        return exit_status::USAGE;
    }
    if error
        .downcast_ref::<crate::configuration::RefusedKafkaSetting>()
        .is_some()
    {
        return exit_status::USAGE;
    }
    if error
        .downcast_ref::<crate::audit::ViolationsFound>()
        .is_some()
    {
        return exit_status::VIOLATIONS;
    }
    exit_status::FAILURE
}

/// A store `process` cannot reach now is a reason to try again later (exit 75), as
/// the same outage met a moment later, inside the attempt, is; a login refused or a
/// URL that cannot be used is not, and keeps its own exit status.
fn unreachable_is_temporary(error: anyhow::Error) -> anyhow::Error {
    let unreachable = error.chain().any(|cause| {
        cause
            .downcast_ref::<sqlx::Error>()
            .is_some_and(crate::retry::is_transient_sqlx)
            || cause
                .downcast_ref::<redis::RedisError>()
                .is_some_and(|e| e.is_io_error() || e.is_connection_refusal() || e.is_timeout())
    });
    if unreachable {
        CommandFailure::TryAgainLater(format!("{error:#}")).into()
    } else {
        error
    }
}

/// The exit status `process` ends with for `attempt`: final outcomes succeed, an
/// invalid command is a data error, a retry a temporary failure, and the worker's
/// own failure (an `internal` rejection, a charge it could not book) a failure.
fn process_result(attempt: &Attempt) -> Result<(), CommandFailure> {
    match attempt {
        Attempt::Retry { reason, .. } => Err(CommandFailure::TryAgainLater(reason.clone())),
        Attempt::Final(Outcome::Rejected {
            kind: RejectionKind::Invalid,
            reason,
        }) => Err(CommandFailure::InvalidInput(reason.clone())),
        Attempt::Final(Outcome::Rejected {
            kind: RejectionKind::Internal,
            reason,
        }) => Err(CommandFailure::Internal(reason.clone())),
        // Printed as `rejected`, its reason saying the charge is unbooked.
        Attempt::Unbooked(outcome) => Err(CommandFailure::Internal(match outcome {
            Outcome::Rejected { reason, .. } => reason.clone(),
            other => format!("charged but not booked ({})", other.label()),
        })),
        Attempt::Final(
            Outcome::Succeeded { .. }
            | Outcome::Declined { .. }
            | Outcome::Duplicate { .. }
            | Outcome::Rejected { .. },
        ) => Ok(()),
    }
}

/// Writes the roff manual of `command` (and, into `out_dir`, of each subcommand).
fn write_manual(out_dir: Option<PathBuf>) -> anyhow::Result<()> {
    let command = <Cli as clap::CommandFactory>::command();
    match out_dir {
        None => {
            // The exit-status table as a real EXIT STATUS section (with .TP
            // entries), not as the reflowed text of `--help`.
            let mut page = Vec::new();
            clap_mangen::Man::new(command.after_help(None::<&str>)).render(&mut page)?;
            let page = String::from_utf8(page).context("the manual is not UTF-8")?;
            let at = page.find(".SH VERSION").unwrap_or(page.len());
            let mut out = std::io::stdout().lock();
            out.write_all(&page.as_bytes()[..at])?;
            out.write_all(exit_status_roff().as_bytes())?;
            out.write_all(&page.as_bytes()[at..])?;
        }
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            clap_mangen::generate_to(command, &dir)
                .with_context(|| format!("writing manual pages to {}", dir.display()))?;
            println!("manual pages written to {}", dir.display());
        }
    }
    Ok(())
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
            let mut shutdown = Box::pin(startup::shutdown_signal()?);
            // Before any connection (and any migration): a refused Kafka setting or
            // drain deadline is a configuration error.
            kafka.check_passthrough()?;
            worker::check_drain_fits_session(&kafka, &worker)?;
            let worker_id = worker.worker_id();
            tracing::info!(?kafka, ?worker, ?processor, %worker_id, "starting worker");
            check_drain_deadline(&worker, &processor);
            check_lifetimes(&worker, &processor);
            let settings = processor;
            let processor = tokio::select! {
                built = startup::build_processor(&settings, &worker_id) => Arc::new(built?),
                () = &mut shutdown => {
                    tracing::info!("stopped while connecting to the stores");
                    return Ok(());
                }
            };
            // Every payment connection open before the first poll: the first burst of a
            // backlog must not open them all at once while its payments wait.
            tokio::select! {
                opened = startup::open_all_connections(processor.pool()) => opened?,
                () = &mut shutdown => {
                    tracing::info!("stopped while opening the payment pool");
                    return Ok(());
                }
            }
            tracing::info!(
                payments_at_once = processor.attempt_slots(),
                admitted_per_partition = worker.max_in_flight,
                "payments run at most one per payment-pool connection; admitted commands beyond that wait before reserving their token"
            );
            let _purge = startup::spawn_token_purge(
                Arc::clone(processor.tokens()),
                &settings.stores.token_table,
            );
            let handler = startup::handler(processor, &kafka, &worker)?;
            worker::run_until(&kafka, &worker, handler, shutdown).await
        }
        Command::Migrate { database } => {
            startup::connect_and_migrate(&database).await?;
            println!("migrations applied");
            Ok(())
        }
        Command::Tokens { command } => {
            let settings = match &command {
                TokensCommand::Issue { store, .. } | TokensCommand::Show { store, .. } => store,
            };
            // Showing a token never migrates; issuing one may prepare the database.
            let (_pool, store) = match &command {
                TokensCommand::Show { .. } => startup::open_existing_stores(settings).await?,
                TokensCommand::Issue { .. } => startup::open_stores(settings).await?,
            };
            let mut out = std::io::stdout().lock();
            match command {
                TokensCommand::Issue {
                    ttl, count, keys, ..
                } => {
                    let keys: Vec<IdempotencyKey> = if keys.is_empty() {
                        (0..count)
                            .map(|_| IdempotencyKey::random("tok"))
                            .collect::<Result<_, _>>()?
                    } else {
                        keys
                    };
                    for key in keys {
                        match store.issue(&key, ttl).await? {
                            IssueOutcome::Created => writeln!(out, "{}", key.as_str())?,
                            IssueOutcome::AlreadyExists => {
                                eprintln!("{key}: already exists, left as it is")
                            }
                        }
                    }
                }
                TokensCommand::Show { key, .. } => match store.show(&key).await? {
                    Some(view) => writeln!(out, "{}", serde_json::to_string(&view)?)?,
                    None => {
                        writeln!(out, "{{\"state\":\"missing\"}}")?;
                        return Err(CommandFailure::NotFound(format!("token {key}")).into());
                    }
                },
            }
            Ok(())
        }
        Command::Process { json, processor } => {
            let json = if json == "-" {
                std::io::read_to_string(std::io::stdin()).context("reading standard input")?
            } else {
                json
            };
            // An invalid command is answered as the worker would (a `rejected`
            // outcome), before any service is needed.
            let outcome = match PaymentCommand::parse(json.as_bytes()) {
                Ok(command) => {
                    let processor = startup::build_processor(
                        &processor,
                        &WorkerSettings::default().worker_id(),
                    )
                    .await
                    .map_err(unreachable_is_temporary)?;
                    processor
                        .process(&command, &CommandContext::default())
                        .await
                }
                Err(invalid) => Attempt::Final(Outcome::Rejected {
                    kind: RejectionKind::Invalid,
                    reason: format!("{}: {invalid}", invalid.code()),
                }),
            };
            println!(
                "{}",
                serde_json::to_string(&crate::operator::OutcomeView::from(&outcome))?
            );
            Ok(process_result(&outcome)?)
        }
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
        Command::Completions { shell } => {
            // Rendered into memory first: clap_complete panics on a failed write
            // (a closed pipe), a write here is an ordinary error.
            let mut script = Vec::new();
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "payment-worker", &mut script);
            std::io::stdout().lock().write_all(&script)?;
            Ok(())
        }
        Command::Man { out_dir } => write_manual(out_dir),
    }
}

/// A drain that can outlast its deadline abandons in-flight commands at every
/// rebalance (safe, but they are redone by the next owner after their lease).
fn check_drain_deadline(worker: &WorkerSettings, processor: &ProcessorSettings) {
    let bound = worker::drain_bound(
        worker.max_in_flight,
        processor.gateway.timeout,
        processor.stores.database.max_connections,
    );
    if worker.drain_deadline < bound {
        tracing::warn!(
            drain_deadline = ?worker.drain_deadline,
            drain_bound = ?bound,
            "a drain may outlast --drain-deadline when the gateway answers at its timeout: \
             lower --gateway-timeout or --max-in-flight, or raise --drain-deadline (below the session timeout)"
        );
    } else {
        tracing::info!(drain_deadline = ?worker.drain_deadline, drain_bound = ?bound, "drains fit their deadline");
    }
}

/// Two lifetimes must outlast a charge whose outcome is unknown, which waits for its
/// lease to end (the token is ours until then) and is then looked up: the retry
/// budget, or the command is dead-lettered `retries_exhausted` before the look-up
/// could settle it; and the token's own TTL, or a restore deletes the expired token
/// and the next reservation, fence 1 again, charges without looking up first.
fn check_lifetimes(worker: &WorkerSettings, processor: &ProcessorSettings) {
    let tokens = &processor.stores.tokens;
    let unknown_settles_within = tokens.lease + processor.gateway.timeout * 2;
    if worker.retry_budget < unknown_settles_within {
        tracing::warn!(
            retry_budget = ?worker.retry_budget,
            lease = ?tokens.lease,
            gateway_timeout = ?processor.gateway.timeout,
            "a charge with an unknown outcome waits out its lease before it is looked up: \
             a retry budget shorter than the lease plus two gateway timeouts dead-letters it \
             as retries_exhausted first; raise --retry-budget or lower --lease"
        );
    }
    if tokens.pending_ttl < unknown_settles_within {
        tracing::warn!(
            token_ttl = ?tokens.pending_ttl,
            lease = ?tokens.lease,
            gateway_timeout = ?processor.gateway.timeout,
            "a token may expire while its charge is unknown; the next reservation then \
             starts a new token and charges without looking up first: raise --token-ttl"
        );
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn command_line_is_consistent() {
        super::Cli::command().debug_assert();
    }

    #[test]
    fn process_fails_when_the_worker_failed_on_the_command_or_left_a_charge_unbooked() {
        use super::{exit_status, process_result};
        use crate::payment::{Attempt, Outcome, RejectionKind};
        let rejected = |kind| Outcome::Rejected {
            kind,
            reason: "why".into(),
        };
        let status = |attempt: &Attempt| match process_result(attempt) {
            Ok(()) => exit_status::SUCCESS,
            Err(failure) => failure.exit_code(),
        };
        assert_eq!(
            status(&Attempt::Unbooked(rejected(RejectionKind::Internal))),
            exit_status::FAILURE
        );
        assert_eq!(
            status(&Attempt::Final(rejected(RejectionKind::Internal))),
            exit_status::FAILURE
        );
        assert_eq!(
            status(&Attempt::Final(rejected(RejectionKind::Invalid))),
            exit_status::DATA_ERROR
        );
        for final_refusal in [RejectionKind::KeyReused, RejectionKind::TokenMissing] {
            assert_eq!(
                status(&Attempt::Final(rejected(final_refusal))),
                exit_status::SUCCESS
            );
        }
    }

    #[test]
    fn each_typed_error_has_its_documented_exit_status() {
        use super::{exit_code, CommandFailure, EXIT_STATUSES};
        let errors: Vec<anyhow::Error> = vec![
            CommandFailure::InvalidInput("x".into()).into(),
            CommandFailure::TryAgainLater("x".into()).into(),
            CommandFailure::NotFound("x".into()).into(),
            CommandFailure::Internal("x".into()).into(),
            crate::audit::ViolationsFound(2).into(),
            crate::worker::WorkerFailure::FatalBroker("x".into()).into(),
            crate::worker::WorkerFailure::PollLoopEnded.into(),
            anyhow::anyhow!("anything else"),
            // Context added on the way up keeps the status.
            anyhow::Error::from(CommandFailure::TryAgainLater("x".into())).context("processing"),
        ];
        let codes: Vec<u8> = errors.iter().map(exit_code).collect();
        assert_eq!(codes, [65, 75, 1, 1, 3, 4, 1, 1, 75]);
        let documented: Vec<u8> = EXIT_STATUSES.iter().map(|(code, _)| *code).collect();
        for code in codes {
            assert!(documented.contains(&code), "{code} is not documented");
        }
        let help = super::exit_status_help();
        assert!(help.lines().all(|l| l.len() <= 80), "{help}");
    }
}
