//! The Redis store's replies read and its errors classed: what each Lua script answers
//! becomes the store's types, and a reply this code never sends is `Corrupt`. Apart from
//! `redis.rs` so the parsing and its unit tests stand without a connection.

use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind, Value};
use uuid::Uuid;

use crate::token::{
    IdempotencyKey, Predecessor, Reservation, TokenError, TokenState, TokenView, Transition,
};

/// Connection trouble and server states that pass (loading, failover, cluster moves)
/// are worth retrying; data this code never writes is not.
pub(super) fn classify(err: RedisError, what: &'static str, key: &IdempotencyKey) -> TokenError {
    let data_problem = matches!(err.code(), Some("CORRUPT" | "WRONGTYPE"))
        || matches!(
            err.kind(),
            ErrorKind::Parse | ErrorKind::UnexpectedReturnType
        )
        // A script that raised at run time hit a value it could not handle.
        || (err.kind() == ErrorKind::Server(ServerErrorKind::ResponseError)
            && err.detail().is_some_and(|d| d.contains("script")));
    if data_problem {
        TokenError::Corrupt(format!("{what} {key}: {err}"))
    } else {
        TokenError::Unavailable(anyhow::Error::new(err).context(format!("{what} {key}")))
    }
}

pub(super) fn corrupt(what: &str, key: &IdempotencyKey, value: &Value) -> TokenError {
    TokenError::Corrupt(format!("{what} {key}: unexpected reply {value:?}"))
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn integer(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn non_negative_millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// `'nobody'`, `'unknown'` or `'holder', owner`: who held the token before (reserve.lua).
fn predecessor(items: &[Value]) -> Option<Predecessor> {
    match (items.first().and_then(text).as_deref(), items.get(1)) {
        (Some("nobody"), None) => Some(Predecessor::Nobody),
        (Some("unknown"), None) => Some(Predecessor::Unknown),
        (Some("holder"), Some(owner)) => text(owner).map(Predecessor::Holder),
        _ => None,
    }
}

pub(super) fn parse_reservation(
    key: &IdempotencyKey,
    value: Value,
) -> Result<Reservation, TokenError> {
    let Value::Array(items) = &value else {
        return Err(corrupt("reserve", key, &value));
    };
    let tag = items.first().and_then(text);
    let reservation = match (tag.as_deref(), items.get(1)) {
        (Some("reserved"), Some(fence)) => integer(fence)
            .and_then(|f| u64::try_from(f).ok())
            .zip(predecessor(&items[2..]))
            .map(|(fence, predecessor)| Reservation::Reserved { fence, predecessor }),
        (Some("inflight"), Some(left)) => integer(left).map(|ms| Reservation::InFlight {
            lease_left: non_negative_millis(ms),
        }),
        (Some("completed"), Some(payment_id)) => text(payment_id)
            .and_then(|p| Uuid::parse_str(&p).ok())
            .map(|payment_id| Reservation::Completed {
                payment_id,
                fingerprint: items.get(2).and_then(text),
            }),
        (Some("missing"), _) => Some(Reservation::Missing),
        (Some("unsettled"), _) => Some(Reservation::Unsettled),
        _ => None,
    };
    reservation.ok_or_else(|| corrupt("reserve", key, &value))
}

pub(super) fn parse_view(
    key: &IdempotencyKey,
    value: Value,
) -> Result<Option<TokenView>, TokenError> {
    let items = match &value {
        Value::Nil => return Ok(None),
        Value::Array(items) if items.len() == 8 => items,
        _ => return Err(corrupt("show", key, &value)),
    };
    let bad = || corrupt("show", key, &value);
    let state = text(&items[0])
        .as_deref()
        .and_then(TokenState::parse)
        .ok_or_else(bad)?;
    let fence = integer(&items[2])
        .and_then(|f| u64::try_from(f).ok())
        .ok_or_else(bad)?;
    let now = integer(&items[7]).ok_or_else(bad)?;
    let lease_left = match state {
        TokenState::Processing => {
            let until = integer(&items[3]).ok_or_else(bad)?;
            // A corrupt hash could hold any integer: out of range is corrupt too.
            Some(non_negative_millis(until.checked_sub(now).ok_or_else(bad)?))
        }
        _ => None,
    };
    let payment_id = match text(&items[5]) {
        Some(p) => Some(Uuid::parse_str(&p).map_err(|_| bad())?),
        None => None,
    };
    // PTTL is -1 for a key without expiry (never written by this code) and -2 when gone.
    let ttl = integer(&items[6])
        .filter(|ms| *ms >= 0)
        .map(non_negative_millis);
    Ok(Some(TokenView {
        state,
        owner: text(&items[1]),
        fence,
        lease_left,
        ttl,
        payment_id,
    }))
}

pub(super) fn transition(applied: bool) -> Transition {
    if applied {
        Transition::Applied
    } else {
        Transition::Refused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(raw: &str) -> IdempotencyKey {
        IdempotencyKey::try_from(raw).unwrap()
    }

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn replies_map_to_reservations() {
        let k = key("k");
        let pid = Uuid::new_v4();
        let cases = [
            (
                Value::Array(vec![bulk("reserved"), Value::Int(1), bulk("nobody")]),
                Reservation::Reserved {
                    fence: 1,
                    predecessor: Predecessor::Nobody,
                },
            ),
            (
                Value::Array(vec![
                    bulk("reserved"),
                    Value::Int(3),
                    bulk("holder"),
                    bulk("w1:abc"),
                ]),
                Reservation::Reserved {
                    fence: 3,
                    predecessor: Predecessor::Holder("w1:abc".into()),
                },
            ),
            (
                Value::Array(vec![bulk("reserved"), Value::Int(5), bulk("unknown")]),
                Reservation::Reserved {
                    fence: 5,
                    predecessor: Predecessor::Unknown,
                },
            ),
            (
                Value::Array(vec![bulk("inflight"), Value::Int(1500)]),
                Reservation::InFlight {
                    lease_left: Duration::from_millis(1500),
                },
            ),
            (
                Value::Array(vec![bulk("completed"), bulk(&pid.to_string()), bulk("fp")]),
                Reservation::Completed {
                    payment_id: pid,
                    fingerprint: Some("fp".into()),
                },
            ),
            (
                Value::Array(vec![bulk("completed"), bulk(&pid.to_string()), Value::Nil]),
                Reservation::Completed {
                    payment_id: pid,
                    fingerprint: None,
                },
            ),
            (Value::Array(vec![bulk("missing")]), Reservation::Missing),
            (
                Value::Array(vec![bulk("unsettled")]),
                Reservation::Unsettled,
            ),
            // Through a proxy or RESP3 the same answers may come as status replies
            // and numbers as strings.
            (
                Value::Array(vec![
                    Value::SimpleString("reserved".into()),
                    Value::SimpleString("4".into()),
                    Value::SimpleString("unknown".into()),
                ]),
                Reservation::Reserved {
                    fence: 4,
                    predecessor: Predecessor::Unknown,
                },
            ),
            (
                Value::Array(vec![bulk("inflight"), bulk("250")]),
                Reservation::InFlight {
                    lease_left: Duration::from_millis(250),
                },
            ),
        ];
        for (reply, expected) in cases {
            assert_eq!(parse_reservation(&k, reply).unwrap(), expected);
        }
    }

    #[test]
    fn malformed_replies_are_corrupt_not_panics() {
        let k = key("k");
        for reply in [
            Value::Nil,
            Value::Int(1),
            Value::Array(vec![]),
            Value::Array(vec![bulk("reserved")]),
            Value::Array(vec![bulk("reserved"), Value::Int(-1), bulk("nobody")]),
            Value::Array(vec![bulk("reserved"), Value::Int(2)]),
            Value::Array(vec![bulk("reserved"), Value::Int(2), bulk("holder")]),
            Value::Array(vec![
                bulk("reserved"),
                Value::Int(2),
                bulk("nobody"),
                bulk("x"),
            ]),
            Value::Array(vec![bulk("completed"), bulk("not-a-uuid")]),
            Value::Array(vec![bulk("completed"), Value::Nil]),
            Value::Array(vec![bulk("bogus"), Value::Int(1)]),
        ] {
            assert!(matches!(
                parse_reservation(&k, reply),
                Err(TokenError::Corrupt(_))
            ));
        }
        for items in [vec![bulk("weird"); 8], vec![bulk("pending"); 7], vec![]] {
            assert!(matches!(
                parse_view(&k, Value::Array(items)),
                Err(TokenError::Corrupt(_))
            ));
        }
        assert!(matches!(parse_view(&k, Value::Nil), Ok(None)));
    }

    fn reply_error(resp: &[u8]) -> RedisError {
        match redis::parse_redis_value(resp).map(Value::extract_error) {
            Ok(Err(error)) | Err(error) => error,
            Ok(Ok(value)) => panic!("not an error reply: {value:?}"),
        }
    }

    /// What the processor retries: a retry cannot fix data this code never writes
    /// (a foreign type under the key, an unreadable reply, a script that raised), while
    /// a server that is loading, failing over or unreachable passes.
    #[test]
    fn only_failures_that_pass_are_retryable() {
        let k = key("k");
        let retried = |error: RedisError| classify(error, "reserve", &k).is_retryable();
        assert!(!retried(reply_error(
            b"-WRONGTYPE Operation against a key\r\n"
        )));
        assert!(!retried(reply_error(
            b"-ERR user_script:7: Script attempted to access a non local key\r\n"
        )));
        assert!(!retried(RedisError::from((ErrorKind::Parse, "bad reply"))));
        assert!(!retried(RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "not an integer"
        ))));
        assert!(retried(reply_error(
            b"-ERR max number of clients reached\r\n"
        )));
        assert!(retried(reply_error(b"-LOADING Redis is loading\r\n")));
        assert!(retried(reply_error(
            b"-READONLY You can't write against a replica\r\n"
        )));
        assert!(retried(RedisError::from(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset
        ))));
    }
}
