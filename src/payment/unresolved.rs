//! The `unresolved_charges` table: commands answered without a booked charge while
//! one may exist (retries exhausted after an unknown outcome, a panic after the
//! POST, a charge the database refused to record, a look-up answer that does not
//! match the command). The worker writes a row when it gives up; every later
//! attempt for such a key looks the charge up before charging; `audit` lists every
//! row whose key has no payment row yet, against the ledger.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::persistence::SourcePosition;
use super::ChargeAtStake;

/// Longest reason kept (the dead letter carries the same text).
const MAX_REASON_CHARS: usize = 512;

/// One command given up on with its charge outcome unknown.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct UnresolvedCharge {
    /// The command's key.
    pub idempotency_key: String,
    /// Amount asked for, in minor units.
    pub amount_minor: i64,
    /// ISO 4217 code.
    pub currency: String,
    /// Why the last attempt failed.
    pub reason: String,
    /// Attempts made.
    pub attempts: i32,
    /// When it was dead-lettered.
    pub dead_lettered_at: DateTime<Utc>,
    /// `charge` or `refund`: which ledger of the gateway the key is looked for in.
    pub kind: String,
}

/// Remembers the command behind `command` (what the attempt that may have charged
/// kept of it) as given up on with its charge unknown. A key given up on again
/// (after a redrive) keeps one row, with the latest attempt's details.
pub async fn record_unresolved_stake(
    pool: &PgPool,
    command: &ChargeAtStake,
    source: &SourcePosition,
    reason: &str,
    attempts: u32,
) -> Result<(), sqlx::Error> {
    let reason: String = reason.chars().take(MAX_REASON_CHARS).collect();
    sqlx::query!(
        "INSERT INTO unresolved_charges
             (idempotency_key, amount_minor, currency, reason, attempts,
              source_topic, source_partition, source_offset, kind)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
         ON CONFLICT (idempotency_key) DO UPDATE
            SET amount_minor = EXCLUDED.amount_minor,
                currency = EXCLUDED.currency,
                reason = EXCLUDED.reason,
                attempts = EXCLUDED.attempts,
                source_topic = EXCLUDED.source_topic,
                source_partition = EXCLUDED.source_partition,
                source_offset = EXCLUDED.source_offset,
                kind = EXCLUDED.kind,
                dead_lettered_at = now()",
        command.idempotency_key.as_str(),
        command.amount_minor,
        &command.currency,
        reason,
        i32::try_from(attempts).unwrap_or(i32::MAX),
        &source.topic,
        source.partition,
        source.offset,
        command.kind.as_str(),
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Every remembered command whose key starts with `key_prefix` and has no payment
/// row (a row means a later delivery booked or settled it), or, for a refund, no
/// final refund row.
pub async fn unresolved_charges(
    pool: &PgPool,
    key_prefix: &str,
) -> Result<Vec<UnresolvedCharge>, sqlx::Error> {
    let remembered: Vec<UnresolvedCharge> = sqlx::query_as!(
        UnresolvedCharge,
        "SELECT idempotency_key, amount_minor, currency, reason, attempts, dead_lettered_at,
                kind
           FROM unresolved_charges
          WHERE left(idempotency_key, char_length($1)) = $1
          ORDER BY idempotency_key",
        key_prefix
    )
    .fetch_all(pool)
    .await?;
    // The payments side is asked through its owner, persistence.rs.
    let keys: Vec<String> = remembered
        .iter()
        .map(|u| u.idempotency_key.clone())
        .collect();
    let mut booked = super::persistence::keys_with_rows(pool, &keys).await?;
    // A refund is booked once its row is final (a row `processing` is the unknown).
    booked.extend(super::refunds::settled_refund_keys(pool, &keys).await?);
    Ok(remembered
        .into_iter()
        .filter(|u| !booked.contains(&u.idempotency_key))
        .collect())
}
