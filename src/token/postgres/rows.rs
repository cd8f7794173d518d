//! The Postgres store's rows read and its errors classed: an `idempotency_tokens` row
//! becomes the store's types (a status or fence no code writes is `Corrupt`), durations
//! become the milliseconds the statements take, and `sqlx` errors are sorted retryable
//! or not. Apart from `postgres.rs` so these conversions and their unit tests stand
//! without a database.

use std::time::Duration;

use uuid::Uuid;

use crate::token::{IdempotencyKey, Predecessor, TokenError, TokenState, TokenView, Transition};

const MAX_MILLIS: u64 = 100 * 365 * 24 * 3600 * 1000;

#[derive(sqlx::FromRow)]
pub(super) struct TokenRow {
    pub(super) status: String,
    pub(super) owner: Option<String>,
    pub(super) fence: i64,
    pub(super) payment_id: Option<Uuid>,
    pub(super) fingerprint: Option<String>,
    pub(super) live: Option<bool>,
    pub(super) lease_left_ms: Option<i64>,
    pub(super) ttl_ms: Option<i64>,
}

pub(super) fn millis(duration: Duration) -> i64 {
    let ms = u64::try_from(duration.as_millis())
        .unwrap_or(MAX_MILLIS)
        .clamp(1, MAX_MILLIS);
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// Who held the token before a reservation under `fence`, from the `previous_owner`
/// the reserve statement returned: none kept means nobody for a first reservation and
/// somebody unknown after that (a completed token's tombstone ran out, or a row
/// restored before the column existed).
pub(super) fn predecessor(fence: u64, previous_owner: Option<String>) -> Predecessor {
    match previous_owner {
        Some(owner) => Predecessor::Holder(owner),
        None if fence <= 1 => Predecessor::Nobody,
        None => Predecessor::Unknown,
    }
}

pub(super) fn fence_of(key: &IdempotencyKey, fence: i64) -> Result<u64, TokenError> {
    u64::try_from(fence)
        .map_err(|_| TokenError::Corrupt(format!("token {key} has a negative fence {fence}")))
}

/// Connection trouble, timeouts and transient server states are worth retrying; values
/// this code cannot decode, or that violate the table's constraints, are not.
pub(super) fn classify(
    err: sqlx::Error,
    what: &'static str,
    subject: &dyn std::fmt::Display,
) -> TokenError {
    let data_problem = match &err {
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|code| code.starts_with("22") || code.starts_with("23")),
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::TypeNotFound { .. } => true,
        _ => false,
    };
    if data_problem {
        TokenError::Corrupt(format!("{what} {subject}: {err}"))
    } else {
        TokenError::Unavailable(anyhow::Error::new(err).context(format!("{what} {subject}")))
    }
}

pub(super) fn transition(applied: bool) -> Transition {
    if applied {
        Transition::Applied
    } else {
        Transition::Refused
    }
}

pub(super) fn view_of(key: &IdempotencyKey, row: TokenRow) -> Result<TokenView, TokenError> {
    let state = TokenState::parse(&row.status)
        .ok_or_else(|| TokenError::Corrupt(format!("token {key} has status {:?}", row.status)))?;
    let lease_left = match state {
        TokenState::Processing => Some(Duration::from_millis(
            row.lease_left_ms
                .and_then(|ms| u64::try_from(ms).ok())
                .unwrap_or(0),
        )),
        _ => None,
    };
    Ok(TokenView {
        state,
        owner: row.owner,
        fence: fence_of(key, row.fence)?,
        lease_left,
        ttl: row
            .ttl_ms
            .and_then(|ms| u64::try_from(ms).ok())
            .map(Duration::from_millis),
        payment_id: row.payment_id,
    })
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;

    /// A first reservation follows nobody; a later one without a kept holder follows
    /// somebody unknown (a row restored before `previous_owner` existed), which the
    /// processor treats as a takeover: look up first.
    #[test]
    fn a_reservation_names_its_predecessor_from_the_kept_owner_and_the_fence() {
        assert_eq!(predecessor(1, None), Predecessor::Nobody);
        assert_eq!(predecessor(0, None), Predecessor::Nobody);
        assert_eq!(predecessor(2, None), Predecessor::Unknown);
        assert_eq!(predecessor(7, None), Predecessor::Unknown);
        assert_eq!(
            predecessor(2, Some("w-1".to_owned())),
            Predecessor::Holder("w-1".to_owned())
        );
        assert_eq!(
            predecessor(1, Some("w-1".to_owned())),
            Predecessor::Holder("w-1".to_owned())
        );
    }

    /// A server error with only an SQLSTATE, as Postgres would send it.
    #[derive(Debug)]
    struct ServerError(&'static str);

    impl std::fmt::Display for ServerError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "SQLSTATE {}", self.0)
        }
    }

    impl std::error::Error for ServerError {}

    impl sqlx::error::DatabaseError for ServerError {
        fn message(&self) -> &str {
            "server error"
        }
        fn code(&self) -> Option<Cow<'_, str>> {
            Some(Cow::Borrowed(self.0))
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    #[test]
    fn a_store_error_masks_a_card_number_in_its_key() {
        let card = IdempotencyKey::try_from("4111111111111111").expect("a valid key");
        for error in [
            sqlx::Error::ColumnNotFound("status".into()),
            sqlx::Error::PoolTimedOut,
        ] {
            let text = format!(
                "{:#}",
                anyhow::Error::new(classify(error, "confirm", &card))
            );
            assert!(text.contains("confirm"), "{text}");
            assert!(!text.contains("4111111111111111"), "{text}");
        }
    }

    fn retried(error: sqlx::Error) -> bool {
        let key = IdempotencyKey::try_from("k").expect("a valid key");
        classify(error, "reserve", &key).is_retryable()
    }

    /// What the processor retries: a retry cannot fix bad data (SQLSTATE classes 22
    /// and 23, values that do not decode), while the server going away, a serialization
    /// failure or a cancelled statement pass.
    #[test]
    fn only_failures_that_pass_are_retryable() {
        let server = |code| sqlx::Error::Database(Box::new(ServerError(code)));
        assert!(!retried(server("22003")), "numeric value out of range");
        assert!(!retried(server("23514")), "check violation");
        assert!(retried(server("40001")), "serialization failure");
        assert!(retried(server("57014")), "statement cancelled");
        assert!(!retried(sqlx::Error::ColumnNotFound("fence".into())));
        assert!(!retried(sqlx::Error::Decode("bad".into())));
        assert!(retried(sqlx::Error::PoolTimedOut));
        assert!(retried(sqlx::Error::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset
        ))));
    }
}
