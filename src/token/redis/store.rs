//! The Redis token store (docs/CONTRACT.md, "Token lifecycle"): every operation is ONE Lua script on ONE key, so each
//! decision is atomic on the server and Redis Cluster can route it (the idempotency key
//! is the hash tag). Deadlines come from `redis.call('TIME')`, never from this host.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use anyhow::{anyhow, Context};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::connection::{RedisConnection, RedisTarget};
use super::node::NodeConnection;
use super::replies::{classify, corrupt, parse_reservation, parse_view, transition};
use super::settle::RedisSettleListener;
use crate::token::settle_wait::{SettleWatch, Woken};
use redis::{Script, Value};
use uuid::Uuid;

use crate::redaction::redact_url;
use crate::token::{
    Claim, IdempotencyKey, IssueOutcome, LockOutcome, Reservation, TokenError, TokenMode,
    TokenPolicy, TokenState, TokenStore, TokenView, Transition,
};

/// Longest wait for one script's answer, on top of the connection's own timeouts: a
/// caller-supplied `ConnectionManager` may have none, and a hung call must surface as
/// `Unavailable` rather than stall a partition.
const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(5);

/// Durations are capped so `now + ttl` stays exact in Lua's doubles.
const MAX_MILLIS: u64 = 100 * 365 * 24 * 3600 * 1000;

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
    pub(super) conn: RedisConnection,
    pub(super) prefix: String,
    policy: TokenPolicy,
    pub(super) op_timeout: Duration,
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
    /// through one pub/sub connection of `client` (see `settle.rs`). Call inside
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
        super::connection::single_node_config()
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

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(MAX_MILLIS)
        .clamp(1, MAX_MILLIS)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key(raw: &str) -> IdempotencyKey {
        IdempotencyKey::try_from(raw).unwrap()
    }

    #[test]
    fn key_layout_hash_tags_the_idempotency_key() {
        let k = key("ord-1");
        assert_eq!(token_key("pw", &k), "pw:token:{ord-1}");
        assert_eq!(lock_key("pw", &k), "pw:lock:{ord-1}");
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_millis(250)), 250);
        assert_eq!(millis(Duration::MAX), MAX_MILLIS);
    }
}
