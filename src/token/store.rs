use std::time::Duration;

use uuid::Uuid;

use super::{IdempotencyKey, SettleWatch};

/// What `reserve` found (scheme 3). Never a bool: the caller branches on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reservation {
    /// This caller now owns the token under `fence`, until its lease runs out.
    Reserved {
        /// The fencing number of this reservation.
        fence: u64,
        /// Who held the token before this reservation: an attempt the caller knows
        /// nothing of may have charged.
        predecessor: Predecessor,
    },
    /// Another owner holds an unexpired lease.
    InFlight {
        /// Time left on that lease.
        lease_left: Duration,
    },
    /// A final outcome was recorded. `fingerprint` is the request fingerprint the
    /// payment was made with, when the store kept it (lets the fast path spot key reuse).
    Completed {
        /// The payment the token completed with.
        payment_id: Uuid,
        /// The request fingerprint, when the store kept it.
        fingerprint: Option<String>,
    },
    /// `issued` mode only: never issued, expired, or already consumed.
    Missing,
    /// `issued` mode only: the token's deadline passed while an attempt held it
    /// (`processing`, its lease run out since). That attempt may have charged, or
    /// its request may still land at the gateway: the store keeps the token as a
    /// tombstone for the completed-token TTL, and the caller looks the charge up
    /// instead of taking the token for missing. Nothing is reserved.
    Unsettled,
}

/// Who held a token before a reservation took it. A holder that is not one of the
/// caller's own earlier attempts may have sent its charge and ended without booking
/// it (killed, partitioned, its look-ups failing): the new holder inherits an unknown
/// outcome it cannot see in its own attempts (docs/CONTRACT.md, "Unknown outcomes").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Predecessor {
    /// Nobody: the token is new (implicit mode), or an issued token is reserved for
    /// the first time.
    Nobody,
    /// The last holder, by its owner (`<worker_id>:<uuid>`, unique per attempt): it
    /// restored the token, or its lease ran out and this reservation took over.
    Holder(String),
    /// Somebody held the token and the store does not know who (a token restored by a
    /// release that did not keep the holder).
    Unknown,
}

impl Predecessor {
    /// Whether the token was held before by anyone other than `own` (the owner of the
    /// caller's own previous reservation, if it had one): then that holder's outcome
    /// is unknown to the caller.
    pub fn is_stranger(&self, own: Option<&str>) -> bool {
        match self {
            Self::Nobody => false,
            Self::Holder(owner) => own != Some(owner.as_str()),
            Self::Unknown => true,
        }
    }
}

/// Result of an owner-checked operation (confirm, restore, extend).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// The owner and fence matched; the transition happened.
    Applied,
    /// The caller is no longer the owner: its lease expired and somebody else
    /// reserved (higher fence), or the token is gone. It must not act on the token.
    Refused,
}

/// What `issue` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IssueOutcome {
    /// A new `pending` token.
    Created,
    /// The key already had a token; it was left as it is.
    AlreadyExists,
}

/// What `lock` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockOutcome {
    /// The lock is this owner's now.
    Acquired,
    /// Somebody else holds it.
    Held,
}

/// How a key the store has never seen is treated by `reserve` (docs/CONTRACT.md, "Token lifecycle").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum TokenMode {
    /// The command's idempotency key is the token: an unknown key is created in
    /// `processing` by the same atomic step.
    #[default]
    Implicit,
    /// A client must have issued the token first; an unknown key is `Missing`.
    Issued,
}

/// Durations that govern a token's life; fixed per store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenPolicy {
    /// Whether a first reservation may create a token (`implicit`) or needs one issued (`issued`).
    pub mode: TokenMode,
    /// How long a reservation is exclusive unless extended.
    pub lease: Duration,
    /// TTL of a token created implicitly (and kept on restore).
    pub pending_ttl: Duration,
    /// TTL of the `completed` tombstone.
    pub completed_ttl: Duration,
}

impl Default for TokenPolicy {
    fn default() -> Self {
        Self {
            mode: TokenMode::Implicit,
            lease: Duration::from_secs(30),
            pending_ttl: Duration::from_secs(24 * 3600),
            completed_ttl: Duration::from_secs(24 * 3600),
        }
    }
}

/// The proof of a reservation: who reserved and under which fencing number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// Who reserved (`<worker_id>:<uuid>`, unique per attempt).
    pub owner: String,
    /// The fencing number the reservation got.
    pub fence: u64,
}

/// A token's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenState {
    /// Issued (or restored), not reserved.
    Pending,
    /// Reserved by an owner under a lease.
    Processing,
    /// Final outcome recorded (a tombstone).
    Completed,
}

impl TokenState {
    /// The state as stores spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Processing => "processing",
            Self::Completed => "completed",
        }
    }

    /// The state a store spells as `value`; `None` for anything else.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "pending" => Some(Self::Pending),
            "processing" => Some(Self::Processing),
            "completed" => Some(Self::Completed),
            _ => None,
        }
    }
}

/// A token as `tokens show` prints it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TokenView {
    /// The token's state.
    pub state: TokenState,
    /// The owner, while `processing`.
    pub owner: Option<String>,
    /// The fencing number (0 until first reserved).
    pub fence: u64,
    /// Time left on the lease; `None` unless processing. Zero when expired.
    #[serde(with = "humantime_serde_opt")]
    pub lease_left: Option<Duration>,
    /// Time until the token itself expires.
    #[serde(with = "humantime_serde_opt")]
    pub ttl: Option<Duration>,
    /// The payment, once `completed`.
    pub payment_id: Option<Uuid>,
}

mod humantime_serde_opt {
    use std::time::Duration;

    pub fn serialize<S: serde::Serializer>(
        value: &Option<Duration>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(d) => serializer.serialize_str(&humantime::format_duration(*d).to_string()),
            None => serializer.serialize_none(),
        }
    }
}

/// Errors of a token store. The caller branches on retryability.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The store could not be reached or timed out: try again later.
    #[error("token store unavailable: {0:#}")]
    Unavailable(#[source] anyhow::Error),
    /// The store answered with something this code never writes.
    #[error("token store returned unexpected data: {0}")]
    Corrupt(String),
}

impl TokenError {
    /// Whether trying again may succeed (the store was unreachable, not wrong).
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }
}

/// The token lifecycle (docs/CONTRACT.md). Every method is ONE atomic step on ONE key:
/// there is no check-then-act across round trips anywhere behind this trait.
#[async_trait::async_trait]
pub trait TokenStore: Send + Sync + 'static {
    /// The lifetimes and mode of this store's tokens.
    fn policy(&self) -> &TokenPolicy;

    /// Mint a `pending` token with `ttl` (`SET NX EX`).
    async fn issue(&self, key: &IdempotencyKey, ttl: Duration) -> Result<IssueOutcome, TokenError>;

    /// Scheme 1: `pending` → gone; true when this caller consumed it.
    async fn consume(&self, key: &IdempotencyKey) -> Result<bool, TokenError>;

    /// Scheme 2: take the key's lock for `ttl` as `owner`.
    async fn lock(
        &self,
        key: &IdempotencyKey,
        owner: &str,
        ttl: Duration,
    ) -> Result<LockOutcome, TokenError>;

    /// Scheme 2: release the lock only when `owner` still holds it.
    async fn release(&self, key: &IdempotencyKey, owner: &str) -> Result<bool, TokenError>;

    /// Scheme 3: `pending` (or unknown in implicit mode, or processing with an
    /// expired lease) → `processing` owned by `owner` with a new, higher fence.
    async fn reserve(&self, key: &IdempotencyKey, owner: &str) -> Result<Reservation, TokenError>;

    /// `reserve`, and a token still held by `lost` is taken too, its lease live or
    /// not: `lost` is the owner this caller's own previous attempt asked to reserve
    /// as, without an answer (the request timed out, or its answer was lost on the
    /// way back). That attempt ended when it gave up waiting, having done nothing
    /// with the reservation, so its lease guards nothing; waiting it out would hold
    /// the command a whole lease after every such partition. The fence grows as for
    /// any reservation, and the predecessor is `lost`.
    async fn reserve_reclaiming(
        &self,
        key: &IdempotencyKey,
        owner: &str,
        lost: &str,
    ) -> Result<Reservation, TokenError>;

    /// `processing` (same owner and fence) → `completed` tombstone.
    async fn confirm(
        &self,
        key: &IdempotencyKey,
        claim: &Claim,
        payment_id: Uuid,
        fingerprint: &str,
    ) -> Result<Transition, TokenError>;

    /// `processing` (same owner and fence) → `pending`, keeping the token's TTL.
    async fn restore(&self, key: &IdempotencyKey, claim: &Claim) -> Result<Transition, TokenError>;

    /// Renew the lease (same owner and fence) while a slow step runs.
    async fn extend(&self, key: &IdempotencyKey, claim: &Claim) -> Result<Transition, TokenError>;

    /// The token of `key` as `tokens show` prints it; `None` when there is none.
    async fn show(&self, key: &IdempotencyKey) -> Result<Option<TokenView>, TokenError>;

    /// Keys whose token is `processing` with an expired lease (for `audit`), at most `limit`.
    async fn expired_leases(&self, limit: usize) -> Result<Vec<IdempotencyKey>, TokenError>;

    /// Registers for the next settle (confirm or restore) of `key`'s token, for a
    /// caller that found it `InFlight` and is about to back off. The watch also ends
    /// at once when the token is found no longer `processing` while it is set up, so
    /// a settle between that reservation and this call is not missed. `None` when the
    /// store announces no settles (the caller only backs off).
    async fn watch_settle(&self, key: &IdempotencyKey) -> Option<SettleWatch> {
        let _ = key;
        None
    }

    /// A store whose tokens live in the payments database settles a token inside the
    /// payment's own transaction (see [`SettleInTransaction`]); others answer `None`
    /// and are confirmed after `COMMIT`.
    fn in_transaction(&self) -> Option<&dyn SettleInTransaction> {
        None
    }

    /// Deletes up to `batch` tokens whose life is over; returns how many went. Stores
    /// whose keys expire by themselves (Redis TTLs) have nothing to do.
    async fn purge_expired(&self, batch: usize) -> Result<u64, TokenError> {
        let _ = batch;
        Ok(0)
    }

    /// Size and age of what the store keeps, for `audit`; `None` when the store cannot
    /// tell cheaply.
    async fn housekeeping(&self) -> Result<Option<Housekeeping>, TokenError> {
        Ok(None)
    }
}

/// The token-side half of the payment transaction, for a store that shares the
/// payments database: "the claim still holds the token" and "the payment is
/// committed" become one atomic step.
#[async_trait::async_trait]
pub trait SettleInTransaction: Send + Sync {
    /// On the payment transaction's connection, before `COMMIT`: `processing` (same
    /// owner and fence) → `completed`, the row locked until the transaction ends.
    /// `Applied` is also the fence check: the claim held the token at this point and
    /// nobody can take it over before the commit. `Refused` means the caller must roll
    /// back. If the transaction rolls back instead, the token is untouched.
    async fn confirm_in(
        &self,
        conn: &mut sqlx::PgConnection,
        key: &IdempotencyKey,
        claim: &Claim,
        payment_id: Uuid,
        fingerprint: &str,
    ) -> Result<Transition, TokenError>;
}

/// What `audit` reports about a store's own table.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Housekeeping {
    /// Rows in the token table (live and expired).
    pub rows: u64,
    /// Rows past their life, waiting for the purge.
    pub expired_rows: u64,
    /// On-disk size of the table with its indexes, in bytes.
    pub table_bytes: u64,
    /// How long ago the oldest expired row died; `None` when there is none.
    #[serde(with = "humantime_serde_opt")]
    pub oldest_expired_for: Option<Duration>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both stores persist the state as text and read it back with `parse`.
    #[test]
    fn every_state_reads_back_from_its_name() {
        for state in [
            TokenState::Pending,
            TokenState::Processing,
            TokenState::Completed,
        ] {
            assert_eq!(TokenState::parse(state.as_str()), Some(state));
        }
        assert_eq!(TokenState::Processing.as_str(), "processing");
        assert_eq!(TokenState::parse("done"), None);
        assert_eq!(TokenState::parse(""), None);
        assert_eq!(TokenState::parse("Pending"), None);
    }

    /// Only an unreachable store is worth retrying; corrupt data never heals itself.
    #[test]
    fn only_unavailable_is_retryable() {
        assert!(TokenError::Unavailable(anyhow::anyhow!("timed out")).is_retryable());
        assert!(!TokenError::Corrupt("status 'done'".into()).is_retryable());
    }

    #[test]
    fn only_the_callers_own_previous_reservation_is_no_stranger() {
        let holder = Predecessor::Holder("w:1".into());
        assert!(!holder.is_stranger(Some("w:1")));
        assert!(holder.is_stranger(Some("w:2")));
        assert!(holder.is_stranger(None));
        assert!(!Predecessor::Nobody.is_stranger(None));
        assert!(!Predecessor::Nobody.is_stranger(Some("w:1")));
        assert!(Predecessor::Unknown.is_stranger(Some("w:1")));
        assert!(Predecessor::Unknown.is_stranger(None));
    }

    #[test]
    fn a_view_prints_durations_for_people() {
        let view = TokenView {
            state: TokenState::Processing,
            owner: Some("w:1".into()),
            fence: 2,
            lease_left: Some(Duration::from_millis(1500)),
            ttl: None,
            payment_id: None,
        };
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(json["state"], "processing");
        assert_eq!(json["lease_left"], "1s 500ms");
        assert!(json["ttl"].is_null());
    }
}
