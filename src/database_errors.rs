//! What a failed Postgres call means, read from its error and SQLSTATE: worth
//! another attempt, data the database refuses for good, or a bug in our own SQL;
//! and whether a server answered read-only, so the pools stop handing out the
//! connections opened before it said so. Also the deadline one statement answers
//! within, or is given up on.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Postgres failures that a later attempt can overcome: the connection, the pool,
/// and the server states that abort a transaction without it being our fault.
pub fn is_transient_sqlx(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => {
            matches!(
                db.code().as_deref(),
                // serialization_failure, deadlock_detected, lock_not_available,
                // admin/crash shutdown, cannot_connect_now, too_many_connections,
                // query_canceled (statement timeout), connection exceptions (08xxx).
                Some("40001" | "40P01" | "55P03" | "57P01" | "57P02" | "57P03" | "53300" | "57014")
            ) || db.code().is_some_and(|c| c.starts_with("08"))
        }
        _ => false,
    }
}

/// What a failed database call means for the command that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatabaseFailure {
    /// A later attempt can succeed (see [`is_transient_sqlx`]), or we cannot tell.
    Retryable,
    /// The database refused the command's data for good: SQLSTATE class 22 (data
    /// exception, e.g. a NUL in text) or 23 (integrity constraint; the unique key
    /// the design relies on is handled with `ON CONFLICT` and never gets here).
    RefusedData,
    /// Our own SQL is wrong (class 42: syntax, undefined table or column,
    /// permission). Retrying cannot help and would hold the partition for the
    /// whole retry budget.
    Bug,
}

/// Classifies a failed database call by its SQLSTATE class.
pub fn classify_sqlx(error: &sqlx::Error) -> DatabaseFailure {
    if is_transient_sqlx(error) {
        return DatabaseFailure::Retryable;
    }
    let sqlx::Error::Database(db) = error else {
        return DatabaseFailure::Retryable;
    };
    match db
        .code()
        .as_deref()
        .map(|code| code.get(..2).unwrap_or(code))
    {
        Some("22" | "23") => DatabaseFailure::RefusedData,
        Some("42") => DatabaseFailure::Bug,
        _ => DatabaseFailure::Retryable,
    }
}

/// SQLSTATE 25006, read_only_sql_transaction: the server is a standby now (the old
/// primary of a failover, back as a standby, or a standby a service briefly pointed
/// at).
pub fn is_read_only(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db) if db.code().as_deref() == Some("25006"))
}

/// When a server last answered read-only, in nanoseconds after [`clock_start`] plus
/// one (0: never).
static READ_ONLY_ANSWERED: AtomicU64 = AtomicU64::new(0);

fn clock_start() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

fn now_on_clock() -> u64 {
    let elapsed = Instant::now().saturating_duration_since(clock_start());
    u64::try_from(elapsed.as_nanos())
        .unwrap_or(u64::MAX - 1)
        .saturating_add(1)
}

/// Remembers `error` when it is a read-only answer ([`is_read_only`]); says whether
/// it was. Every pooled connection opened before it is closed when it is next
/// handed out ([`opened_before_a_read_only_answer`]): the pool would hand each one
/// out again, and every statement on it would fail the same way until the pool
/// recycled it, half an hour later. (One answer drops the connections of every pool
/// in the process: they are opened again to wherever the server's address leads
/// now, which costs a connect each.)
pub fn note_read_only(error: &sqlx::Error) -> bool {
    let read_only = is_read_only(error);
    if read_only {
        // At most once a second: while the address still leads to a standby, each
        // answer would otherwise drop the connections just opened, and every retry
        // would pay a new connection.
        let now = now_on_clock();
        let last = READ_ONLY_ANSWERED.load(Ordering::SeqCst);
        if last == 0 || now.saturating_sub(last) >= MARK_AT_MOST_EVERY.as_nanos() as u64 {
            READ_ONLY_ANSWERED.fetch_max(now, Ordering::SeqCst);
        }
    }
    read_only
}

/// How often a read-only answer may drop the pools' connections.
const MARK_AT_MOST_EVERY: Duration = Duration::from_secs(1);

/// Whether a pooled connection `age` old was opened before a server last answered
/// read-only.
pub fn opened_before_a_read_only_answer(age: Duration) -> bool {
    let answered = READ_ONLY_ANSWERED.load(Ordering::SeqCst);
    if answered == 0 {
        return false;
    }
    let age = u64::try_from(age.as_nanos()).unwrap_or(u64::MAX);
    now_on_clock().saturating_sub(age) <= answered
}

/// How long one statement may take (a payment's, or the Stripe adapter's records).
/// A row lock held by another attempt's transaction while its gateway call runs
/// (itself bounded by the gateway timeout) is the longest legitimate wait; cut, it
/// is retried like any outage.
pub const STATEMENT_DEADLINE: Duration = Duration::from_secs(5);

/// `statement` within [`STATEMENT_DEADLINE`], or an I/O time-out naming `what` (a
/// transient failure, as the driver reports a dead connection); a read-only answer
/// is noted ([`note_read_only`]).
pub async fn within_deadline<T>(
    what: &str,
    statement: impl Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, sqlx::Error> {
    match tokio::time::timeout(STATEMENT_DEADLINE, statement).await {
        Ok(Err(error)) => {
            note_read_only(&error);
            Err(error)
        }
        Ok(answer) => answer,
        Err(_) => Err(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("{what}: no answer from Postgres within {STATEMENT_DEADLINE:?}"),
        ))),
    }
}

/// Whether the connection `error` came from must not be used again: its statement
/// went unanswered ([`within_deadline`]), or the server is read-only.
pub fn connection_unusable(error: &sqlx::Error) -> bool {
    is_read_only(error)
        || matches!(error, sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut)
}
