//! `process`: one command without Kafka, its outcome printed, its exit status the
//! outcome's.

use anyhow::Context;

use super::CommandFailure;
use crate::configuration::{ProcessorSettings, WorkerSettings};
use crate::payment::{Attempt, Command, CommandContext, Outcome, RejectionKind};
use crate::startup;

/// Processes `json` (`-`: standard input) and prints its outcome as one JSON line.
pub(super) async fn run(json: String, processor: ProcessorSettings) -> anyhow::Result<()> {
    let json = if json == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading standard input")?
    } else {
        json
    };
    // An invalid command is answered as the worker would (a `rejected`
    // outcome), before any service is needed.
    let outcome = match Command::parse(json.as_bytes()) {
        Ok(command) => {
            let processor =
                startup::build_processor(&processor, &WorkerSettings::default().worker_id())
                    .await
                    .map_err(unreachable_is_temporary)?;
            processor
                .process_watching(&command, &CommandContext::default())
                .await
                .attempt
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

/// A store `process` cannot reach now is a reason to try again later (exit 75), as
/// the same outage met a moment later, inside the attempt, is; a login refused or a
/// URL that cannot be used is not, and keeps its own exit status.
fn unreachable_is_temporary(error: anyhow::Error) -> anyhow::Error {
    let unreachable = error.chain().any(|cause| {
        cause
            .downcast_ref::<sqlx::Error>()
            .is_some_and(crate::database_errors::is_transient_sqlx)
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
            | Outcome::Refunded { .. }
            | Outcome::RefundDeclined { .. }
            | Outcome::Duplicate { .. }
            | Outcome::Rejected { .. },
        ) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn process_fails_when_the_worker_failed_on_the_command_or_left_a_charge_unbooked() {
        use super::process_result;
        use crate::cli::exit_status;
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
}
