//! What a failed Postgres call means, read from its error and SQLSTATE: worth
//! another attempt, data the database refuses for good, or a bug in our own SQL.

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
