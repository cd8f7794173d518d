//! The adapter's own records (`stripe_payment_intents`): one row per create
//! attempt of a payment, written on the adapter's own small pool, so each
//! statement commits at once, before the request it prepares is sent, while the
//! payment's transaction (on the payment pool) stays open. A record outlives a
//! rolled-back payment: it is how a later attempt finds the PaymentIntent an
//! earlier one made, instead of making another.
//!
//! The statements are checked at compile time (`sqlx::query!`) through the offline
//! cache `.sqlx/` at the workspace root (docs/ARCHITECTURE.md, "Checked SQL").

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use crate::database_errors::within_deadline;

// Every statement answers within the payment's statement deadline: the adapter's
// calls run under a lease that is kept renewed while they are pending, so a
// statement that never returned (a silent partition, a failover that left the
// connection half-open) would hold its key `processing` for good, and every later
// delivery of it `in_flight`. (The connection of a statement cut so goes back to
// the adapter's small pool, which pings it without a deadline: its slot stays taken
// until the path heals, and a later statement may wait the pool's acquire time-out
// for another; it ends, in either case.)

/// One create attempt of one payment.
#[derive(Debug, Clone)]
pub(super) struct IntentRecord {
    /// `n` of `Idempotency-Key: <key>:create:<n>`.
    pub create_attempt: i32,
    /// The Stripe account it was made under, and its mode.
    pub account: String,
    pub livemode: bool,
    /// Postgres's clock just before the create was sent.
    pub requested_at: DateTime<Utc>,
    /// Known once the create answered (or a listing found it).
    pub payment_intent_id: Option<String>,
    /// A decline recorded before the PaymentIntent was cancelled.
    pub decline_code: Option<String>,
}

/// The table behind the adapter's own pool.
pub(super) struct Records {
    pool: PgPool,
}

impl Records {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }

    /// Every create attempt of `key`, the latest first.
    pub async fn of(&self, key: &str) -> Result<Vec<IntentRecord>, sqlx::Error> {
        // The columns are spelled out in each statement: a macro checks a literal
        // only, so the shared `format!` of the columns went.
        within_deadline(
            "reading the key's create attempts",
            sqlx::query_as!(
                IntentRecord,
                "SELECT create_attempt, account, livemode, requested_at, payment_intent_id,
                    decline_code
             FROM stripe_payment_intents
             WHERE idempotency_key = $1 ORDER BY create_attempt DESC",
                key
            )
            .fetch_all(&self.pool),
        )
        .await
    }

    /// Records the next create attempt of `key` (its number and the time) before
    /// its request is sent, so a create whose answer is lost can be found.
    pub async fn begin_create(
        &self,
        key: &str,
        payment_id: Uuid,
        account: &str,
        livemode: bool,
    ) -> Result<IntentRecord, sqlx::Error> {
        within_deadline(
            "recording a create attempt",
            sqlx::query_as!(
                IntentRecord,
                "INSERT INTO stripe_payment_intents
                 (idempotency_key, create_attempt, payment_id, account, livemode)
             SELECT $1, COALESCE(MAX(create_attempt), 0) + 1, $2, $3, $4
             FROM stripe_payment_intents WHERE idempotency_key = $1
             RETURNING create_attempt, account, livemode, requested_at, payment_intent_id,
                       decline_code",
                key,
                payment_id,
                account,
                livemode
            )
            .fetch_one(&self.pool),
        )
        .await
    }

    /// The PaymentIntent the create attempt made, durable before it is confirmed.
    pub async fn record_intent(
        &self,
        key: &str,
        create_attempt: i32,
        id: &str,
    ) -> Result<(), sqlx::Error> {
        within_deadline(
            "recording a PaymentIntent",
            sqlx::query!(
                "UPDATE stripe_payment_intents SET payment_intent_id = $3, updated_at = now()
             WHERE idempotency_key = $1 AND create_attempt = $2",
                key,
                create_attempt,
                id
            )
            .execute(&self.pool),
        )
        .await?;
        Ok(())
    }

    /// Counts one more confirm of the attempt's PaymentIntent and returns the
    /// key's count of confirms so far, `m` of `Idempotency-Key: <key>:confirm:<m>`:
    /// durable before the confirm is sent and counted over every PaymentIntent of
    /// the key, so no confirm key is ever sent twice (Stripe would replay the first
    /// answer, a 500 included).
    pub async fn begin_confirm(&self, key: &str, create_attempt: i32) -> Result<i64, sqlx::Error> {
        // `confirms!`: NULL when no row of the attempt was bumped; decoding that is an
        // error, as it was before the macros (Postgres cannot tell of an expression).
        within_deadline(
            "counting a confirm",
            sqlx::query_scalar!(
                r#"WITH bumped AS (
                 UPDATE stripe_payment_intents
                 SET confirm_attempts = confirm_attempts + 1, updated_at = now()
                 WHERE idempotency_key = $1 AND create_attempt = $2
                 RETURNING confirm_attempts)
             SELECT (SELECT confirm_attempts FROM bumped)::bigint
                 + COALESCE((SELECT SUM(confirm_attempts) FROM stripe_payment_intents
                             WHERE idempotency_key = $1 AND create_attempt <> $2), 0)::bigint
                 AS "confirms!""#,
                key,
                create_attempt
            )
            .fetch_one(&self.pool),
        )
        .await
    }

    /// The decline of the attempt's PaymentIntent, recorded before it is cancelled.
    pub async fn record_decline(
        &self,
        key: &str,
        create_attempt: i32,
        code: &str,
    ) -> Result<(), sqlx::Error> {
        within_deadline(
            "recording a decline",
            sqlx::query!(
                "UPDATE stripe_payment_intents SET decline_code = $3, updated_at = now()
             WHERE idempotency_key = $1 AND create_attempt = $2",
                key,
                create_attempt,
                code.chars().take(255).collect::<String>()
            )
            .execute(&self.pool),
        )
        .await?;
        Ok(())
    }
}
