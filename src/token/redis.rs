//! The Redis token store (docs/CONTRACT.md, "Token lifecycle"): every operation is ONE Lua script on ONE key, so each
//! decision is atomic on the server and Redis Cluster can route it (the idempotency key
//! is the hash tag). Deadlines come from `redis.call('TIME')`, never from this host.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use anyhow::{anyhow, Context};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::redis_connection::{RedisConnection, RedisTarget, ScanTarget};
use super::redis_node::NodeConnection;
use super::redis_settle::RedisSettleListener;
use super::settle_wait::{SettleWatch, Woken};
use redis::{ErrorKind, RedisError, Script, ServerErrorKind, Value};
use uuid::Uuid;

use super::{
    Claim, IdempotencyKey, IssueOutcome, LockOutcome, Predecessor, Reservation, TokenError,
    TokenMode, TokenPolicy, TokenState, TokenStore, TokenView, Transition,
};
use crate::redaction::redact_url;

/// Longest wait for one script's answer, on top of the connection's own timeouts: a
/// caller-supplied `ConnectionManager` may have none, and a hung call must surface as
/// `Unavailable` rather than stall a partition.
const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(5);

/// Durations are capped so `now + ttl` stays exact in Lua's doubles.
const MAX_MILLIS: u64 = 100 * 365 * 24 * 3600 * 1000;

const SCAN_BATCH: usize = 500;

struct Scripts {
    issue: Script,
    consume: Script,
    lock: Script,
    release: Script,
    reserve: Script,
    confirm: Script,
    restore: Script,
    extend: Script,
    show: Script,
}

// Built once: `Script` hashes its source, and EVALSHA falls back to loading it on NOSCRIPT.
static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    issue: Script::new(include_str!("scripts/issue.lua")),
    consume: Script::new(include_str!("scripts/consume.lua")),
    lock: Script::new(include_str!("scripts/lock.lua")),
    release: Script::new(include_str!("scripts/release.lua")),
    reserve: Script::new(include_str!("scripts/reserve.lua")),
    confirm: Script::new(include_str!("scripts/confirm.lua")),
    restore: Script::new(include_str!("scripts/restore.lua")),
    extend: Script::new(include_str!("scripts/extend.lua")),
    show: Script::new(include_str!("scripts/show.lua")),
});

/// Tokens in Redis: one hash per key, each transition one Lua script timed by `TIME`.
#[derive(Clone)]
pub struct RedisTokenStore {
    conn: RedisConnection,
    prefix: String,
    policy: TokenPolicy,
    op_timeout: Duration,
    /// The process's one subscriber for settle announcements (`None`: waiters only
    /// back off, as behind Sentinel).
    settle: Option<Arc<RedisSettleListener>>,
}

impl std::fmt::Debug for RedisTokenStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTokenStore")
            .field("prefix", &self.prefix)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl RedisTokenStore {
    /// A store over an open connection, keys under `prefix`.
    pub fn new(
        conn: ConnectionManager,
        key_prefix: impl Into<String>,
        policy: TokenPolicy,
    ) -> Self {
        Self::with_connection(
            RedisConnection::Single(NodeConnection::fixed(conn)),
            key_prefix,
            policy,
        )
    }

    /// A store on one node or a cluster: the same scripts, the same contract.
    pub fn with_connection(
        conn: RedisConnection,
        key_prefix: impl Into<String>,
        policy: TokenPolicy,
    ) -> Self {
        Self {
            conn,
            prefix: key_prefix.into(),
            policy,
            op_timeout: DEFAULT_OP_TIMEOUT,
            settle: None,
        }
    }

    /// Wakes the reservations that met a live lease as soon as its holder settles,
    /// through one pub/sub connection of `client` (see `redis_settle.rs`). Call inside
    /// the tokio runtime: the subscriber is a task of its own.
    pub fn with_settle_notifications(mut self, client: redis::Client) -> Self {
        self.settle = Some(Arc::new(RedisSettleListener::start(client)));
        self
    }

    /// Caps how long one operation may wait for Redis before it is `Unavailable`.
    pub fn with_op_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = timeout;
        self
    }

    /// A connection tuned to fail fast: the worker has its own retry policy, so the
    /// manager only retries a reconnect a couple of times before reporting.
    pub fn connection_config() -> ConnectionManagerConfig {
        super::redis_connection::single_node_config()
    }

    /// One node (`redis://`, `rediss://`) or a cluster (`redis+cluster://h1:p1,h2:p2`).
    pub async fn connect(
        url: &str,
        key_prefix: impl Into<String>,
        policy: TokenPolicy,
    ) -> Result<Self, TokenError> {
        let target = RedisTarget::parse(url, false)
            .with_context(|| format!("invalid Redis URL {}", redact_url(url)))
            .map_err(TokenError::Unavailable)?;
        Self::connect_to(&target, key_prefix, policy).await
    }

    /// Connects to `target` and loads the scripts.
    pub async fn connect_to(
        target: &RedisTarget,
        key_prefix: impl Into<String>,
        policy: TokenPolicy,
    ) -> Result<Self, TokenError> {
        let conn = target.connect().await.map_err(TokenError::Unavailable)?;
        let store = Self::with_connection(conn, key_prefix, policy);
        Ok(
            match target.settle_client().map_err(TokenError::Unavailable)? {
                Some(client) => store.with_settle_notifications(client),
                None => store,
            },
        )
    }

    /// The connection the store uses (tests read the raw state through it).
    pub fn connection(&self) -> &RedisConnection {
        &self.conn
    }

    /// `<prefix>:token:{<key>}`: the braces make the key its own cluster hash tag.
    pub fn token_key(&self, key: &IdempotencyKey) -> String {
        token_key(&self.prefix, key)
    }

    /// `<prefix>:lock:{<key>}`: scheme 2 lives in its own key.
    pub fn lock_key(&self, key: &IdempotencyKey) -> String {
        lock_key(&self.prefix, key)
    }

    /// How long a `processing` token outlives its deadline and its lease: in issued
    /// mode the completed-token TTL, so a token that expires while an attempt holds
    /// it is still there to say its charge is unknown (`Reservation::Unsettled`);
    /// implicit mode reserves such a token afresh (fence + 1, looked up first).
    fn tombstone_ms(&self) -> u64 {
        match self.policy.mode {
            TokenMode::Issued => millis(self.policy.completed_ttl),
            TokenMode::Implicit => 0,
        }
    }

    async fn run(
        &self,
        what: &'static str,
        key: &IdempotencyKey,
        invocation: redis::ScriptInvocation<'_>,
    ) -> Result<Value, TokenError> {
        let mut conn = self.conn.clone();
        match tokio::time::timeout(self.op_timeout, invocation.invoke_async::<Value>(&mut conn))
            .await
        {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(classify(e, what, key)),
            Err(_) => Err(TokenError::Unavailable(anyhow!(
                "{what} {key}: no answer from Redis within {:?}",
                self.op_timeout
            ))),
        }
    }

    async fn run_flag(
        &self,
        what: &'static str,
        key: &IdempotencyKey,
        invocation: redis::ScriptInvocation<'_>,
    ) -> Result<bool, TokenError> {
        match self.run(what, key, invocation).await? {
            Value::Int(1) => Ok(true),
            Value::Int(0) => Ok(false),
            other => Err(corrupt(what, key, &other)),
        }
    }
}

pub(crate) fn token_key(prefix: &str, key: &IdempotencyKey) -> String {
    format!("{prefix}:token:{{{}}}", key.as_str())
}

pub(crate) fn lock_key(prefix: &str, key: &IdempotencyKey) -> String {
    format!("{prefix}:lock:{{{}}}", key.as_str())
}

fn idempotency_key_of(prefix: &str, redis_key: &str) -> Option<IdempotencyKey> {
    let rest = redis_key
        .strip_prefix(prefix)?
        .strip_prefix(":token:{")?
        .strip_suffix('}')?;
    IdempotencyKey::try_from(rest).ok()
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(MAX_MILLIS)
        .clamp(1, MAX_MILLIS)
}

/// Connection trouble and server states that pass (loading, failover, cluster moves)
/// are worth retrying; data this code never writes is not.
fn classify(err: RedisError, what: &'static str, key: &IdempotencyKey) -> TokenError {
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

fn corrupt(what: &str, key: &IdempotencyKey, value: &Value) -> TokenError {
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

fn parse_reservation(key: &IdempotencyKey, value: Value) -> Result<Reservation, TokenError> {
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

fn parse_view(key: &IdempotencyKey, value: Value) -> Result<Option<TokenView>, TokenError> {
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
            Some(non_negative_millis(until - now))
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

/// MATCH treats these as glob syntax; a prefix must match literally.
fn glob_escape(raw: &str) -> String {
    let mut escaped = String::with_capacity(raw.len());
    for c in raw.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

impl RedisTokenStore {
    /// `reserve.lua` as `owner`, taking the token from `lost` too when it holds it.
    async fn reserve_as(
        &self,
        key: &IdempotencyKey,
        owner: &str,
        lost: Option<&str>,
    ) -> Result<Reservation, TokenError> {
        let implicit = match self.policy.mode {
            TokenMode::Implicit => "1",
            TokenMode::Issued => "0",
        };
        let mut invocation = SCRIPTS.reserve.prepare_invoke();
        invocation
            .key(self.token_key(key))
            .arg(owner)
            .arg(millis(self.policy.lease))
            .arg(implicit)
            .arg(millis(self.policy.pending_ttl))
            .arg(self.tombstone_ms())
            .arg(lost.unwrap_or(""));
        let value = self.run("reserve", key, invocation).await?;
        parse_reservation(key, value)
    }
}

#[async_trait::async_trait]
impl TokenStore for RedisTokenStore {
    fn policy(&self) -> &TokenPolicy {
        &self.policy
    }

    async fn issue(&self, key: &IdempotencyKey, ttl: Duration) -> Result<IssueOutcome, TokenError> {
        let mut invocation = SCRIPTS.issue.prepare_invoke();
        invocation.key(self.token_key(key)).arg(millis(ttl));
        Ok(if self.run_flag("issue", key, invocation).await? {
            IssueOutcome::Created
        } else {
            IssueOutcome::AlreadyExists
        })
    }

    async fn consume(&self, key: &IdempotencyKey) -> Result<bool, TokenError> {
        let mut invocation = SCRIPTS.consume.prepare_invoke();
        invocation.key(self.token_key(key));
        self.run_flag("consume", key, invocation).await
    }

    async fn lock(
        &self,
        key: &IdempotencyKey,
        owner: &str,
        ttl: Duration,
    ) -> Result<LockOutcome, TokenError> {
        let mut invocation = SCRIPTS.lock.prepare_invoke();
        invocation
            .key(self.lock_key(key))
            .arg(owner)
            .arg(millis(ttl));
        Ok(if self.run_flag("lock", key, invocation).await? {
            LockOutcome::Acquired
        } else {
            LockOutcome::Held
        })
    }

    async fn release(&self, key: &IdempotencyKey, owner: &str) -> Result<bool, TokenError> {
        let mut invocation = SCRIPTS.release.prepare_invoke();
        invocation.key(self.lock_key(key)).arg(owner);
        self.run_flag("release", key, invocation).await
    }

    async fn reserve(&self, key: &IdempotencyKey, owner: &str) -> Result<Reservation, TokenError> {
        self.reserve_as(key, owner, None).await
    }

    async fn reserve_reclaiming(
        &self,
        key: &IdempotencyKey,
        owner: &str,
        lost: &str,
    ) -> Result<Reservation, TokenError> {
        self.reserve_as(key, owner, Some(lost)).await
    }

    async fn confirm(
        &self,
        key: &IdempotencyKey,
        claim: &Claim,
        payment_id: Uuid,
        fingerprint: &str,
    ) -> Result<Transition, TokenError> {
        let mut invocation = SCRIPTS.confirm.prepare_invoke();
        invocation
            .key(self.token_key(key))
            .arg(&claim.owner)
            .arg(claim.fence)
            .arg(payment_id.to_string())
            .arg(fingerprint)
            .arg(millis(self.policy.completed_ttl));
        Ok(transition(self.run_flag("confirm", key, invocation).await?))
    }

    async fn restore(&self, key: &IdempotencyKey, claim: &Claim) -> Result<Transition, TokenError> {
        let mut invocation = SCRIPTS.restore.prepare_invoke();
        invocation
            .key(self.token_key(key))
            .arg(&claim.owner)
            .arg(claim.fence);
        Ok(transition(self.run_flag("restore", key, invocation).await?))
    }

    async fn extend(&self, key: &IdempotencyKey, claim: &Claim) -> Result<Transition, TokenError> {
        let mut invocation = SCRIPTS.extend.prepare_invoke();
        invocation
            .key(self.token_key(key))
            .arg(&claim.owner)
            .arg(claim.fence)
            .arg(millis(self.policy.lease))
            .arg(self.tombstone_ms());
        Ok(transition(self.run_flag("extend", key, invocation).await?))
    }

    async fn watch_settle(&self, key: &IdempotencyKey) -> Option<SettleWatch> {
        let listener = self.settle.as_ref()?;
        let channel = self.token_key(key);
        let watch = listener.watch(&channel).await?;
        // The reservation that saw the lease ran before the subscription: a settle in
        // between was announced to nobody, so look at the token once more.
        let mut conn = self.conn.clone();
        let status = tokio::time::timeout(
            self.op_timeout,
            redis::cmd("HGET")
                .arg(&channel)
                .arg("status")
                .query_async::<Option<String>>(&mut conn),
        )
        .await;
        match status {
            Ok(Ok(Some(status))) if status == TokenState::Processing.as_str() => Some(watch),
            Ok(Ok(_)) => Some(SettleWatch::ready(Woken::AlreadySettled)),
            // Unknown: keep the watch; the backoff bounds the wait as before.
            _ => Some(watch),
        }
    }

    async fn show(&self, key: &IdempotencyKey) -> Result<Option<TokenView>, TokenError> {
        let mut invocation = SCRIPTS.show.prepare_invoke();
        invocation.key(self.token_key(key));
        let value = self.run("show", key, invocation).await?;
        parse_view(key, value)
    }

    async fn expired_leases(&self, limit: usize) -> Result<Vec<IdempotencyKey>, TokenError> {
        // A cluster spreads the tokens over its masters: each one is scanned in turn.
        let targets = tokio::time::timeout(self.op_timeout, self.conn.scan_targets())
            .await
            .map_err(|_| {
                anyhow!(
                    "listing Redis masters: no answer within {:?}",
                    self.op_timeout
                )
            })
            .and_then(|r| r)
            .map_err(TokenError::Unavailable)?;
        let mut found = Vec::new();
        for target in &targets {
            self.expired_leases_on(target, limit, &mut found).await?;
            if found.len() >= limit {
                break;
            }
        }
        Ok(found)
    }
}

impl RedisTokenStore {
    async fn expired_leases_on(
        &self,
        target: &ScanTarget,
        limit: usize,
        found: &mut Vec<IdempotencyKey>,
    ) -> Result<(), TokenError> {
        let pattern = format!("{}:token:*", glob_escape(&self.prefix));
        let mut cursor: u64 = 0;
        loop {
            let mut command = redis::cmd("SCAN");
            command
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_BATCH);
            let scan = self.conn.query_on::<(u64, Vec<String>)>(target, &command);
            let (next, batch) = tokio::time::timeout(self.op_timeout, scan)
                .await
                .map_err(|_| anyhow!("SCAN {pattern}: no answer within {:?}", self.op_timeout))
                .and_then(|r| r.with_context(|| format!("SCAN {pattern} on {target:?}")))
                .map_err(TokenError::Unavailable)?;
            for redis_key in batch {
                if found.len() >= limit {
                    return Ok(());
                }
                let Some(key) = idempotency_key_of(&self.prefix, &redis_key) else {
                    tracing::warn!(
                        redis_key,
                        "skipping a key that is not a token of this store"
                    );
                    continue;
                };
                // Each key is judged by its own script, on the server clock, at that moment.
                if let Some(view) = self.show(&key).await? {
                    if view.state == TokenState::Processing
                        && view.lease_left == Some(Duration::ZERO)
                    {
                        found.push(key);
                    }
                }
            }
            if next == 0 || found.len() >= limit {
                return Ok(());
            }
            cursor = next;
        }
    }
}

fn transition(applied: bool) -> Transition {
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

    #[test]
    fn key_layout_hash_tags_the_idempotency_key() {
        let k = key("ord-1");
        assert_eq!(token_key("pw", &k), "pw:token:{ord-1}");
        assert_eq!(lock_key("pw", &k), "pw:lock:{ord-1}");
        assert_eq!(idempotency_key_of("pw", "pw:token:{ord-1}"), Some(k));
        assert_eq!(idempotency_key_of("pw", "pw:lock:{ord-1}"), None);
        assert_eq!(idempotency_key_of("pw", "pw:token:{a{b}"), None);
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_millis(250)), 250);
        assert_eq!(millis(Duration::MAX), MAX_MILLIS);
    }
}
