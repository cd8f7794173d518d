//! Why a worker stops on its own. A worker never lives on with a dead part: the
//! process exits non-zero so the orchestrator restarts it, and the records it had
//! not committed are redelivered to the next member of the group.

use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

/// A part of the worker died; `run` ends with this error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkerFailure {
    /// The poll thread panicked (its message).
    #[error("the Kafka poll loop panicked: {0}")]
    PollLoopPanicked(String),
    /// The poll loop returned while it should run.
    #[error("the Kafka poll loop ended unexpectedly")]
    PollLoopEnded,
    /// The poll loop made no progress for this long.
    #[error("the Kafka poll loop has not polled for {0:?}")]
    PollLoopStalled(Duration),
    /// A partition task ended while it should run.
    #[error("the task of partition {topic}/{partition} ended unexpectedly")]
    PartitionTaskEnded {
        /// Its topic.
        topic: String,
        /// Its partition.
        partition: i32,
    },
    /// Authentication, authorisation, a fenced static member, or an error
    /// librdkafka itself calls fatal: restarting the same way cannot fix it.
    #[error("fatal Kafka error: {0}")]
    FatalBroker(String),
}

impl WorkerFailure {
    /// The process exit code: 4 for a fatal broker error, 1 for the rest.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::FatalBroker(_) => 4,
            _ => 1,
        }
    }
}

/// Whether a consumer error means this member cannot go on, whatever it retries.
pub fn is_fatal_broker_error(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::Fatal
                | RDKafkaErrorCode::Authentication
                | RDKafkaErrorCode::SaslAuthenticationFailed
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::GroupAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed
                | RDKafkaErrorCode::TransactionalIdAuthorizationFailed
                | RDKafkaErrorCode::FencedInstanceId
        )
    )
}

/// The text of a caught panic, card numbers masked: it is logged and may end the
/// process's last error line.
pub use crate::redaction::panic_message;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorisation_and_fencing_are_fatal_and_transport_errors_are_not() {
        for code in [
            RDKafkaErrorCode::GroupAuthorizationFailed,
            RDKafkaErrorCode::SaslAuthenticationFailed,
            RDKafkaErrorCode::FencedInstanceId,
            RDKafkaErrorCode::Fatal,
        ] {
            assert!(is_fatal_broker_error(&KafkaError::MessageConsumption(code)));
        }
        for code in [
            RDKafkaErrorCode::BrokerTransportFailure,
            RDKafkaErrorCode::AllBrokersDown,
            RDKafkaErrorCode::RebalanceInProgress,
        ] {
            assert!(!is_fatal_broker_error(&KafkaError::MessageConsumption(
                code
            )));
        }
        assert_eq!(WorkerFailure::FatalBroker("x".into()).exit_code(), 4);
        assert_eq!(WorkerFailure::PollLoopEnded.exit_code(), 1);
    }
}
