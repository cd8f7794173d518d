//! What `audit` reads of the `refunds` table, and the one statement `--repair`
//! writes to it. Checked at compile time against `migrations/` (offline cache
//! `.sqlx/`), like the payments table's statements.

use sqlx::PgPool;
use uuid::Uuid;

use crate::payment::RefundStatus;

/// One refund row as the audit compares it with the gateway's refunds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RefundRow {
    /// The row's id.
    pub id: Uuid,
    /// The refund's own key.
    pub idempotency_key: String,
    /// The key of the payment it refunds.
    pub payment_key: String,
    /// The row's status.
    pub status: RefundStatus,
    /// The gateway's id of the refund (`None` while `processing`).
    pub gateway_transaction_id: Option<String>,
    /// The gateway's id of the charge refunded.
    pub payment_transaction_id: Option<String>,
    /// Amount refunded (or reserved), minor units.
    pub amount_minor: i64,
    /// ISO 4217 code.
    pub currency: String,
    /// `processing` and last updated more than a lease ago: nobody is settling it.
    pub stale: bool,
}

/// A payment whose refunds (refunded and reserved) add up to more than its amount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Overdrawn {
    /// The payment's key.
    pub payment_key: String,
    /// What was charged.
    pub amount_minor: i64,
    /// Refunded plus reserved (`processing`).
    pub taken: i64,
}

/// Every refund row (but the refusals kept as `rejected`: nothing was refunded for them) whose own key starts with `key_prefix` (all for an empty
/// prefix), sorted by key; a `processing` row updated more than `lease` ago is
/// `stale`.
pub(super) async fn refund_rows(
    pool: &PgPool,
    key_prefix: &str,
    lease: std::time::Duration,
) -> Result<Vec<RefundRow>, sqlx::Error> {
    // `stale!`: both operands are NOT NULL columns, but Postgres cannot tell of an
    // expression.
    let rows = sqlx::query!(
        r#"SELECT r.id, r.idempotency_key, r.status, r.gateway_transaction_id,
                  r.amount_minor, r.currency,
                  p.idempotency_key AS payment_key,
                  p.gateway_transaction_id AS "payment_transaction_id?",
                  r.status = 'processing' AND r.updated_at < now() - make_interval(secs => $2)
                      AS "stale!"
             FROM refunds r JOIN payments p ON p.id = r.payment_id
            WHERE left(r.idempotency_key, char_length($1)) = $1
              AND r.status <> 'rejected'
            ORDER BY r.idempotency_key"#,
        key_prefix,
        lease.as_secs_f64(),
    )
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|row| {
            Ok(RefundRow {
                id: row.id,
                idempotency_key: row.idempotency_key,
                payment_key: row.payment_key,
                status: RefundStatus::parse(&row.status)?,
                gateway_transaction_id: row.gateway_transaction_id,
                payment_transaction_id: row.payment_transaction_id,
                amount_minor: row.amount_minor,
                currency: row.currency,
                stale: row.stale,
            })
        })
        .collect()
}

/// The keys starting with `key_prefix` whose refund was refused for good and kept
/// (`rejected`): final rows, with nothing at the gateway to reconcile them with.
pub(super) async fn refused_keys(
    pool: &PgPool,
    key_prefix: &str,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar!(
        "SELECT idempotency_key FROM refunds
          WHERE left(idempotency_key, char_length($1)) = $1 AND status = 'rejected'",
        key_prefix,
    )
    .fetch_all(pool)
    .await
}

/// Payments whose refunded and reserved refunds exceed the amount charged, among
/// the payments whose key, or one of whose refunds' keys, starts with `key_prefix`.
/// Every refund of such a payment counts, whatever its key.
pub(super) async fn overdrawn_payments(
    pool: &PgPool,
    key_prefix: &str,
) -> Result<Vec<Overdrawn>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT p.idempotency_key AS payment_key, p.amount_minor,
                  sum(r.amount_minor)::bigint AS "taken!"
             FROM payments p JOIN refunds r ON r.payment_id = p.id
            WHERE r.status IN ('processing', 'refunded')
            GROUP BY p.id, p.idempotency_key, p.amount_minor
           HAVING sum(r.amount_minor) > p.amount_minor
              AND (left(p.idempotency_key, char_length($1)) = $1
                   OR bool_or(left(r.idempotency_key, char_length($1)) = $1))
            ORDER BY p.idempotency_key"#,
        key_prefix,
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| Overdrawn {
            payment_key: row.payment_key,
            amount_minor: row.amount_minor,
            taken: row.taken,
        })
        .collect())
}
