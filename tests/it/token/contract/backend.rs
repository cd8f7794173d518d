//! What a backend supplies (stores, and a view of the stored token read around the
//! store under test), and the keys, policies and readings every contract check shares.

use std::sync::Arc;
use std::time::Duration;

use payment_worker::token::{IdempotencyKey, Reservation, TokenMode, TokenPolicy, TokenStore};

pub const RACERS: usize = 64;
/// Rounds per race; every round uses a fresh key.
pub const RACE_ROUNDS: usize = 1_000;

/// A token as the server holds it right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawToken {
    pub status: String,
    pub owner: Option<String>,
    pub fence: u64,
    pub payment_id: Option<String>,
    pub fingerprint: Option<String>,
    /// Until the key / row is gone (Redis PTTL; for Postgres the later of the token's
    /// deadline and a processing lease). Zero or less: it is dead.
    pub ttl_ms: i64,
    /// Until the token's own deadline (what restore must bring back).
    pub expires_in_ms: i64,
    /// Until the lease ends; `None` when no lease is recorded.
    pub lease_left_ms: Option<i64>,
}

impl RawToken {
    /// The token a Redis hash (`HGETALL`) holds, its key's `PTTL` and the server's
    /// clock (`TIME`, in ms) read with it; `None` for an empty hash (no token).
    pub fn from_redis_hash(
        fields: &std::collections::HashMap<String, String>,
        pttl: i64,
        now_ms: i64,
    ) -> Option<Self> {
        if fields.is_empty() {
            return None;
        }
        let number = |name: &str| fields.get(name).map(|v| v.parse::<i64>().unwrap());
        Some(RawToken {
            status: fields["status"].clone(),
            owner: fields.get("owner").cloned(),
            fence: fields["fence"].parse().unwrap(),
            payment_id: fields.get("payment_id").cloned(),
            fingerprint: fields.get("fingerprint").cloned(),
            ttl_ms: pttl,
            expires_in_ms: number("expires_at_ms").unwrap() - now_ms,
            lease_left_ms: number("lease_until_ms").map(|until| until - now_ms),
        })
    }
}

#[async_trait::async_trait]
pub trait Backend: Send + Sync + 'static {
    /// A store with `policy` on the backend's shared namespace. Every call may open its
    /// own connection, so racers really come from different clients.
    async fn store(&self, policy: TokenPolicy) -> Arc<dyn TokenStore>;
    /// The token as stored, read directly; `None` when nothing is stored at all.
    async fn raw_token(&self, key: &IdempotencyKey) -> Option<RawToken>;
    /// The owner of the scheme-2 lock when a live lock is stored.
    async fn raw_lock(&self, key: &IdempotencyKey) -> Option<String>;
}

pub fn key(label: &str) -> IdempotencyKey {
    // Letters only after the label: a random hex id may read as a card number.
    IdempotencyKey::random(label).unwrap()
}

pub fn policy(
    mode: TokenMode,
    lease_ms: u64,
    pending_ttl_ms: u64,
    completed_ttl_ms: u64,
) -> TokenPolicy {
    TokenPolicy {
        mode,
        lease: Duration::from_millis(lease_ms),
        pending_ttl: Duration::from_millis(pending_ttl_ms),
        completed_ttl: Duration::from_millis(completed_ttl_ms),
    }
}

/// Long enough that nothing expires while a race and its checks run.
pub(crate) fn race_policy(mode: TokenMode) -> TokenPolicy {
    policy(mode, 600_000, 3_600_000, 3_600_000)
}

pub(crate) async fn live(backend: &dyn Backend, key: &IdempotencyKey) -> Option<RawToken> {
    backend.raw_token(key).await.filter(|t| t.ttl_ms > 0)
}

pub(crate) fn reserved_fence(r: Reservation) -> u64 {
    match r {
        Reservation::Reserved { fence, .. } => fence,
        other => panic!("expected Reserved, got {other:?}"),
    }
}
