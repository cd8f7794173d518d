//! Every statement of the payment path answers within a deadline, or its connection
//! is thrown away.
//!
//! Without a deadline, a statement sent into a silent partition (no RST, no FIN)
//! waits as long as the kernel retransmits: minutes. And a connection whose
//! statement was abandoned must not go back to the pool: sqlx pings it on the way
//! back, with no deadline either, and the pool permit stays parked until the path
//! heals. So a stalled connection is detached from the pool and closed; the pool
//! opens a fresh one for the next attempt.
//!
//! A connection to a server that answers "read-only transaction" (SQLSTATE 25006:
//! the old primary of a failover, back as a standby, or a standby a service briefly
//! pointed at) is thrown away too: the pool would hand it out again, and each
//! payment on it would fail the same way until the pool recycled it.
//!
//! A statement cut by the deadline may still run when its bytes arrive. Before the
//! charge that is a plain retry (the transaction never commits: its connection is
//! gone); a COMMIT cut by it is an unknown commit outcome, which the caller already
//! treats as one ("a failed COMMIT may still have committed").

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};

use sqlx::pool::PoolConnection;
use sqlx::Postgres;

use crate::database_errors::{connection_unusable, within_deadline, STATEMENT_DEADLINE};

/// Whether a statement on one connection went unanswered, or found the server
/// read-only.
#[derive(Debug, Default)]
pub(super) struct Stall(AtomicBool);

impl Stall {
    /// `statement` within [`STATEMENT_DEADLINE`], or an I/O time-out (a transient
    /// failure, as the driver reports a dead connection), the connection marked;
    /// marked too when the server answered read-only.
    pub(super) async fn bounded<T>(
        &self,
        what: &str,
        statement: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, sqlx::Error> {
        let answer = within_deadline(what, statement).await;
        if answer.as_ref().is_err_and(connection_unusable) {
            self.0.store(true, Ordering::SeqCst);
        }
        answer
    }

    pub(super) fn stalled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// Gives the connection back to the pool, or closes it when a statement on it
    /// went unanswered.
    pub(super) fn release(&self, connection: PoolConnection<Postgres>) {
        if self.stalled() {
            tracing::warn!(
                deadline_ms = STATEMENT_DEADLINE.as_millis() as u64,
                "a Postgres statement went unanswered, or the server is read-only: \
                 its connection is closed, not reused"
            );
            // Detached, it no longer counts against the pool; dropped, its socket closes.
            drop(connection.detach());
        } else {
            drop(connection);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_statement_past_the_deadline_is_a_transient_time_out_and_marks_the_stall() {
        let stall = Stall::default();
        let answered = stall
            .bounded("quick", async { Ok::<_, sqlx::Error>(7) })
            .await;
        assert_eq!(answered.ok(), Some(7));
        assert!(!stall.stalled());

        let silent = stall
            .bounded("COMMIT", std::future::pending::<Result<(), sqlx::Error>>())
            .await;
        let error = silent.expect_err("the deadline ends a statement that never answers");
        assert!(stall.stalled());
        assert!(crate::database_errors::is_transient_sqlx(&error), "{error}");
        assert!(error.to_string().contains("COMMIT"), "{error}");
    }
}
