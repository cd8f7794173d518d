//! The `refunds` table: a refund's amount reserved under its payment's row lock
//! before the gateway is asked, its answer recorded after.
//!
//! Every statement is checked at compile time against `migrations/` (offline cache
//! `.sqlx/`), like the payments table's.

use sqlx::PgConnection;
use uuid::Uuid;

use super::super::persistence::RowContext;
use super::super::{Fingerprint, RefundCommand};
use crate::gateway::{Charge, ChargeStatus};

/// A refund row's `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefundStatus {
    /// Reserved, not yet answered by the gateway: its amount counts as refunded.
    Processing,
    /// Refunded by the gateway.
    Refunded,
    /// The gateway refused to refund; its amount is free again.
    Declined,
    /// Refused for good, nothing refunded (its reason in `failure_reason`): before
    /// anything was sent, or by the gateway. Answered the same to every later
    /// delivery.
    Rejected,
}

impl RefundStatus {
    /// The status as the `status` column spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Processing => "processing",
            Self::Refunded => "refunded",
            Self::Declined => "declined",
            Self::Rejected => "rejected",
        }
    }

    /// The status a row spells as `value`; anything else is a decode error.
    pub fn parse(value: &str) -> Result<Self, sqlx::Error> {
        match value {
            "processing" => Ok(Self::Processing),
            "refunded" => Ok(Self::Refunded),
            "declined" => Ok(Self::Declined),
            "rejected" => Ok(Self::Rejected),
            other => Err(sqlx::Error::ColumnDecode {
                index: "status".into(),
                source: format!("unknown refund status {other:?}").into(),
            }),
        }
    }
}

impl From<ChargeStatus> for RefundStatus {
    fn from(status: ChargeStatus) -> Self {
        match status {
            ChargeStatus::Approved => Self::Refunded,
            ChargeStatus::Declined => Self::Declined,
        }
    }
}

/// A refund row as the processor decides on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundRecord {
    /// The refund's id.
    pub id: Uuid,
    /// The payment refunded (`None` on a refusal for want of one).
    pub payment_id: Option<Uuid>,
    /// The refund's fingerprint.
    pub fingerprint: Fingerprint,
    /// The row's status.
    pub status: RefundStatus,
    /// The gateway's id of the refund (`None` while `processing`).
    pub gateway_transaction_id: Option<String>,
    /// The gateway's id of the charge refunded.
    pub payment_transaction_id: Option<String>,
    /// Amount refunded, minor units.
    pub amount_minor: i64,
    /// ISO 4217 code.
    pub currency: String,
    /// Why a `rejected` refund was refused (the gateway's code for a declined one).
    pub failure_reason: Option<String>,
}

/// What reserving a refund's amount came to.
#[derive(Debug)]
pub enum Reserving {
    /// A new row, `processing`, its amount reserved (commit it before the POST).
    Reserved(RefundRecord),
    /// A row already holds this key: final (a duplicate or a reused key), or
    /// `processing` (an earlier attempt reserved it and may have been refunded).
    Existing(RefundRecord),
    /// The key is a payment's key: a refund cannot reuse it.
    KeyOfAPayment,
    /// No payment is booked under the refund's payment key (yet).
    PaymentUnknown,
    /// The payment was declined: nothing to refund.
    PaymentNotCharged {
        /// The payment's id.
        payment_id: Uuid,
    },
    /// The refund's currency is not the payment's.
    CurrencyMismatch {
        /// The payment's id.
        payment_id: Uuid,
        /// The payment's currency.
        payment_currency: String,
    },
    /// Refunds booked or in flight plus this one would exceed the charge.
    ExceedsCharge {
        /// The payment's id.
        payment_id: Uuid,
        /// What is left of the charge to refund.
        left: i64,
    },
    /// Another holder of the key inserted its row while we waited for the lock.
    Raced,
}

/// The row for `key`, if any.
pub async fn find_refund(
    conn: &mut PgConnection,
    key: &str,
) -> Result<Option<RefundRecord>, sqlx::Error> {
    let row = sqlx::query!(
        r#"SELECT r.id, r.payment_id, r.fingerprint, r.status, r.gateway_transaction_id,
                  r.amount_minor, r.currency, r.failure_reason,
                  p.gateway_transaction_id AS "payment_transaction_id?"
             FROM refunds r LEFT JOIN payments p ON p.id = r.payment_id
            WHERE r.idempotency_key = $1"#,
        key
    )
    .fetch_optional(&mut *conn)
    .await?;
    row.map(|row| {
        Ok(RefundRecord {
            id: row.id,
            payment_id: row.payment_id,
            fingerprint: Fingerprint::from_hex(row.fingerprint),
            status: RefundStatus::parse(&row.status)?,
            gateway_transaction_id: row.gateway_transaction_id,
            payment_transaction_id: row.payment_transaction_id,
            amount_minor: row.amount_minor,
            currency: row.currency,
            failure_reason: row.failure_reason,
        })
    })
    .transpose()
}

/// Inside the caller's transaction: the refund's amount reserved, or why not.
///
/// The payment's row is locked first, in a statement of its own, and only then the
/// sum of its refunds read: under READ COMMITTED each statement sees what was
/// committed before it began, so a sum read in the locking statement itself could
/// miss the refund whose transaction held the lock we waited for.
pub async fn reserve_refund(
    conn: &mut PgConnection,
    command: &RefundCommand,
    fingerprint: &Fingerprint,
    row: &RowContext<'_>,
) -> Result<Reserving, sqlx::Error> {
    let key = command.idempotency_key.as_str();
    if let Some(existing) = find_refund(conn, key).await? {
        return Ok(Reserving::Existing(existing));
    }
    // A charge's key, booked or not: a charge whose outcome is unknown has no row
    // (rolled back) but is remembered in `unresolved_charges`, and may be booked yet.
    let key_of_a_payment = sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM payments WHERE idempotency_key = $1)
               OR EXISTS (SELECT 1 FROM unresolved_charges
                           WHERE idempotency_key = $1 AND kind = 'charge') AS "exists!""#,
        key
    )
    .fetch_one(&mut *conn)
    .await?;
    if key_of_a_payment {
        return Ok(Reserving::KeyOfAPayment);
    }
    let payment = sqlx::query!(
        "SELECT id, status, amount_minor, currency, gateway_transaction_id
           FROM payments WHERE idempotency_key = $1 FOR UPDATE",
        command.payment_key.as_str()
    )
    .fetch_optional(&mut *conn)
    .await?;
    let Some(payment) = payment else {
        return Ok(Reserving::PaymentUnknown);
    };
    if payment.status != "succeeded" {
        return Ok(match payment.status.as_str() {
            // Only inside its own transaction, never committed: not booked yet.
            "processing" => Reserving::PaymentUnknown,
            _ => Reserving::PaymentNotCharged {
                payment_id: payment.id,
            },
        });
    }
    if payment.currency != command.currency {
        return Ok(Reserving::CurrencyMismatch {
            payment_id: payment.id,
            payment_currency: payment.currency,
        });
    }
    let taken = sqlx::query_scalar!(
        r#"SELECT coalesce(sum(amount_minor), 0)::bigint AS "taken!"
             FROM refunds
            WHERE payment_id = $1 AND status IN ('processing', 'refunded')"#,
        payment.id
    )
    .fetch_one(&mut *conn)
    .await?;
    let left = payment.amount_minor - taken;
    if command.amount_minor > left {
        return Ok(Reserving::ExceedsCharge {
            payment_id: payment.id,
            left: left.max(0),
        });
    }
    let inserted = insert_processing(conn, command, fingerprint, row, payment.id).await?;
    Ok(match inserted {
        None => Reserving::Raced,
        Some(id) => Reserving::Reserved(RefundRecord {
            id,
            payment_id: Some(payment.id),
            fingerprint: fingerprint.clone(),
            status: RefundStatus::Processing,
            gateway_transaction_id: None,
            payment_transaction_id: payment.gateway_transaction_id,
            amount_minor: command.amount_minor,
            currency: command.currency.clone(),
            failure_reason: None,
        }),
    })
}

/// The refund's row, `processing`: its id, or `None` when the key has a row already.
async fn insert_processing(
    conn: &mut PgConnection,
    command: &RefundCommand,
    fingerprint: &Fingerprint,
    row: &RowContext<'_>,
    payment_id: Uuid,
) -> Result<Option<Uuid>, sqlx::Error> {
    sqlx::query_scalar!(
        "INSERT INTO refunds (id, idempotency_key, payment_id, fingerprint, amount_minor,
                              currency, reason, status, source_topic, source_partition,
                              source_offset, trace_id, fence)
         VALUES ($1, $2, $3, $4, $5, $6, $7, 'processing', $8, $9, $10, $11, $12)
         ON CONFLICT (idempotency_key) DO NOTHING
         RETURNING id",
        Uuid::now_v7(),
        command.idempotency_key.as_str(),
        payment_id,
        fingerprint.as_str(),
        command.amount_minor,
        command.currency,
        command.reason.as_deref(),
        row.source.map(|s| s.topic.as_str()),
        row.source.map(|s| s.partition),
        row.source.map(|s| s.offset),
        row.trace_id.as_deref(),
        i64::try_from(row.fence).unwrap_or(i64::MAX),
    )
    .fetch_optional(&mut *conn)
    .await
}

/// Inside the caller's transaction, the refund's row locked for the gateway call,
/// without waiting: `Held` when another holder of the key has it locked (its own
/// call in flight), else the row's status now.
pub async fn lock_refund(conn: &mut PgConnection, refund_id: Uuid) -> Result<Locked, sqlx::Error> {
    let locked = sqlx::query_scalar!(
        "SELECT status FROM refunds WHERE id = $1 FOR UPDATE NOWAIT",
        refund_id
    )
    .fetch_optional(&mut *conn)
    .await;
    match locked {
        Ok(Some(status)) => Ok(Locked::Status(RefundStatus::parse(&status)?)),
        Ok(None) => Ok(Locked::Gone),
        // lock_not_available: another transaction holds the row.
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("55P03") => Ok(Locked::Held),
        Err(error) => Err(error),
    }
}

/// What locking a refund's row found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Locked {
    /// Ours now, in this status.
    Status(RefundStatus),
    /// Another holder of the key has it locked: its gateway call is in flight.
    Held,
    /// The row is gone (released: its key was used at the gateway for another
    /// request).
    Gone,
}

/// The gateway's answer recorded on a row still `processing`; `false` when the row
/// was no longer `processing` (another holder recorded it first).
pub async fn record_refund(
    conn: &mut PgConnection,
    refund_id: Uuid,
    answer: &Charge,
) -> Result<bool, sqlx::Error> {
    let status = RefundStatus::from(answer.status);
    let done = sqlx::query!(
        "UPDATE refunds
            SET status = $2, gateway_transaction_id = $3, failure_reason = $4,
                updated_at = now()
          WHERE id = $1 AND status = 'processing'",
        refund_id,
        status.as_str(),
        answer.transaction_id,
        answer.decline_code.as_deref(),
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The longest `failure_reason` a row holds, in characters.
pub const MAX_FAILURE_REASON: usize = 512;

/// A refund the gateway refused for good (nothing refunded), kept on its row still
/// `processing` as `rejected` with the refusal's reason: its amount is freed (only
/// `processing` and `refunded` rows count), and the row answers every later
/// delivery. `false` when the row was no longer `processing`.
pub async fn record_gateway_refusal(
    conn: &mut PgConnection,
    refund_id: Uuid,
    reason: &str,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query!(
        "UPDATE refunds
            SET status = 'rejected', failure_reason = $2, updated_at = now()
          WHERE id = $1 AND status = 'processing'",
        refund_id,
        reason,
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// A reservation whose key was used at the gateway for another request (nothing
/// refunded): its amount freed, the row gone.
pub async fn release_refund(conn: &mut PgConnection, refund_id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "DELETE FROM refunds WHERE id = $1 AND status = 'processing'",
        refund_id
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// A refund row's totals for one payment, as the books see them: refunded and in
/// flight, in minor units (tests, audit).
pub async fn refunded_of(
    pool: &sqlx::PgPool,
    payment_key: &str,
) -> Result<(i64, i64), sqlx::Error> {
    let row = sqlx::query!(
        r#"SELECT coalesce(sum(r.amount_minor) FILTER (WHERE r.status = 'refunded'), 0)::bigint
                      AS "refunded!",
                  coalesce(sum(r.amount_minor) FILTER (WHERE r.status = 'processing'), 0)::bigint
                      AS "in_flight!"
             FROM refunds r JOIN payments p ON p.id = r.payment_id
            WHERE p.idempotency_key = $1"#,
        payment_key
    )
    .fetch_one(pool)
    .await?;
    Ok((row.refunded, row.in_flight))
}

/// Which of `keys` are refunds whose row is final (refunded or declined).
pub async fn settled_refund_keys(
    pool: &sqlx::PgPool,
    keys: &[String],
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar!(
        "SELECT idempotency_key FROM refunds
          WHERE idempotency_key = ANY($1) AND status <> 'processing'",
        keys
    )
    .fetch_all(pool)
    .await
}

/// A refund refused for good before anything was sent, kept as a `rejected` row with
/// its reason: its id, or `None` when the key has a row already.
pub async fn record_rejection(
    conn: &mut PgConnection,
    command: &RefundCommand,
    fingerprint: &Fingerprint,
    payment_id: Option<Uuid>,
    reason: &str,
) -> Result<Option<Uuid>, sqlx::Error> {
    let reason: String = reason.chars().take(MAX_FAILURE_REASON).collect();
    sqlx::query_scalar!(
        "INSERT INTO refunds (id, idempotency_key, payment_id, fingerprint, amount_minor,
                              currency, reason, status, failure_reason)
         VALUES ($1, $2, $3, $4, $5, $6, $7, 'rejected', $8)
         ON CONFLICT (idempotency_key) DO NOTHING
         RETURNING id",
        Uuid::now_v7(),
        command.idempotency_key.as_str(),
        payment_id,
        fingerprint.as_str(),
        command.amount_minor,
        command.currency,
        command.reason.as_deref(),
        reason,
    )
    .fetch_optional(&mut *conn)
    .await
}
