//! Exit statuses: the table `--help` and the manual show, the typed failures a
//! command ends with, and the status each error maps to.

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
        "`process`: the command is invalid (malformed JSON or a broken rule); `tokens issue`: a key holds a card number",
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
pub(super) fn exit_status_roff() -> String {
    let mut out = String::from(".SH \"EXIT STATUS\"\n");
    for (code, meaning) in EXIT_STATUSES {
        let meaning = meaning.replace('\\', "\\e").replace('-', "\\-");
        out.push_str(&format!(".TP\n\\fB{code}\\fR\n{meaning}\n"));
    }
    out
}

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

/// How a binary ends once its command returned: nothing printed on success; an error
/// printed whole on standard error and mapped to its exit status ([`exit_code`]).
/// Both binaries (the product's and the development tools') end through it.
pub fn finish(result: anyhow::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::from(exit_code(&error))
        }
    }
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

#[cfg(test)]
mod tests {
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
