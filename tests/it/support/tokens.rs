//! A token read straight from its store, bypassing the token store under test: the
//! Redis hash (`{prefix}:token:{<key>}`, see token/redis/store.rs) and the Postgres row of
//! `idempotency_tokens`.

use std::collections::HashMap;

use sqlx::PgPool;

/// The Redis key of `key`'s token hash under `prefix`: the documented layout,
/// spelled out here independently of the store.
pub(crate) fn redis_token_key(prefix: &str, key: &str) -> String {
    format!("{prefix}:token:{{{key}}}")
}

/// The whole token hash of `key` under `prefix` (empty when there is none).
pub(crate) async fn redis_token_hash(
    conn: &mut impl redis::aio::ConnectionLike,
    prefix: &str,
    key: &str,
) -> HashMap<String, String> {
    redis::cmd("HGETALL")
        .arg(redis_token_key(prefix, key))
        .query_async(conn)
        .await
        .unwrap()
}

/// The `status` field of `key`'s token hash under `prefix`, if any.
pub(crate) async fn redis_token_status(
    conn: &mut impl redis::aio::ConnectionLike,
    prefix: &str,
    key: &str,
) -> Option<String> {
    redis::cmd("HGET")
        .arg(redis_token_key(prefix, key))
        .arg("status")
        .query_async(conn)
        .await
        .unwrap()
}

/// A row of `idempotency_tokens`, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PgTokenRow {
    pub(crate) status: String,
    pub(crate) owner: Option<String>,
    pub(crate) fence: i64,
    pub(crate) payment_id: Option<uuid::Uuid>,
}

/// The `idempotency_tokens` row of `key`, if any.
pub(crate) async fn pg_token_row(pool: &PgPool, key: &str) -> Option<PgTokenRow> {
    let row: Option<(String, Option<String>, i64, Option<uuid::Uuid>)> = sqlx::query_as(
        "SELECT status, owner, fence, payment_id FROM idempotency_tokens WHERE key = $1",
    )
    .bind(key)
    .fetch_optional(pool)
    .await
    .unwrap();
    row.map(|(status, owner, fence, payment_id)| PgTokenRow {
        status,
        owner,
        fence,
        payment_id,
    })
}

/// Every row of `idempotency_tokens`: key → status.
pub(crate) async fn pg_token_statuses(pool: &PgPool) -> HashMap<String, String> {
    sqlx::query_as::<_, (String, String)>("SELECT key, status FROM idempotency_tokens")
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}
