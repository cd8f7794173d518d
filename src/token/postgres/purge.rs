//! Housekeeping of the Postgres token table: rows past their life are as good as
//! absent to every statement of the store, but they stay on disk until deleted. The
//! workers delete them in small batches (see `startup::spawn_token_purge`); `audit`
//! reports how big the table is and how long its oldest dead row has waited.

use std::time::Duration;

use sqlx::PgPool;

use crate::token::Housekeeping;

/// One batch: the oldest dead rows first (the `expires_at` index), at most `$1` of
/// them, addressed by `ctid` so the `DELETE` touches exactly the rows the index scan
/// found. Rows another transaction holds right now are skipped, never waited for: a
/// reservation racing the purge wins and the row is simply not purged this time.
/// "Dead" is the store's own definition: past its deadline and not under a running
/// lease (a `processing` row lives as long as its lease does). A `processing` row
/// is kept `$2` ms longer (issued mode: the completed-token TTL) as the tombstone
/// that says an attempt held it when it expired (`Reservation::Unsettled`).
const PURGE_BATCH: &str = "
DELETE FROM idempotency_tokens
 WHERE ctid = ANY (ARRAY(
           SELECT ctid
             FROM idempotency_tokens
            WHERE expires_at <= now()
              AND (status <> 'processing'
                   OR GREATEST(expires_at, lease_expires_at)
                          + $2::bigint * interval '1 millisecond' <= now())
            ORDER BY expires_at
            LIMIT $1
              FOR UPDATE SKIP LOCKED))
   AND expires_at <= now()
   AND (status <> 'processing'
        OR GREATEST(expires_at, lease_expires_at)
               + $2::bigint * interval '1 millisecond' <= now())";

/// How long ago a dead row died: its deadline, or its lease's end when that came later.
const HOUSEKEEPING: &str = "
SELECT count(*)::bigint AS rows,
       count(*) FILTER (WHERE dead)::bigint AS expired_rows,
       pg_total_relation_size('idempotency_tokens')::bigint AS table_bytes,
       ceil(EXTRACT(EPOCH FROM now() - min(died_at) FILTER (WHERE dead)) * 1000)::bigint
           AS oldest_expired_ms
  FROM (SELECT expires_at <= now()
                   AND (status <> 'processing' OR lease_expires_at <= now()) AS dead,
               CASE WHEN status = 'processing'
                    THEN GREATEST(expires_at, lease_expires_at)
                    ELSE expires_at END AS died_at
          FROM idempotency_tokens) AS t";

/// Deletes at most `batch` dead rows; returns how many went.
pub(super) async fn purge_batch(
    pool: &PgPool,
    batch: usize,
    tombstone_ms: i64,
) -> Result<u64, sqlx::Error> {
    let limit = i64::try_from(batch.max(1)).unwrap_or(i64::MAX);
    let done = sqlx::query(PURGE_BATCH)
        .bind(limit)
        .bind(tombstone_ms)
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
}

pub(super) async fn housekeeping(pool: &PgPool) -> Result<Housekeeping, sqlx::Error> {
    let (rows, expired_rows, table_bytes, oldest_ms): (i64, i64, i64, Option<i64>) =
        sqlx::query_as(HOUSEKEEPING).fetch_one(pool).await?;
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok(Housekeeping {
        rows: count(rows),
        expired_rows: count(expired_rows),
        table_bytes: count(table_bytes),
        oldest_expired_for: oldest_ms
            .and_then(|ms| u64::try_from(ms).ok())
            .map(Duration::from_millis),
    })
}
