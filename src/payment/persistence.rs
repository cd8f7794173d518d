//! The `payments` table. Every function takes an executor so the processor decides
//! what runs inside its one transaction.
//!
//! Every statement here is checked at compile time (`sqlx::query!` and friends)
//! against the schema `migrations/` make, through the offline cache `.sqlx/` at the
//! workspace root (docs/ARCHITECTURE.md, "Checked SQL"): a statement whose text
//! changes needs that cache regenerated.

use sqlx::PgConnection;
use tracing::Instrument;
use uuid::Uuid;

use super::{Fingerprint, PaymentCommand};
use crate::gateway::{Charge, ChargeStatus};

/// A row's `status`: `processing` until the charge is recorded, then final.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaymentStatus {
    /// Written before the gateway call; never committed (a CHECK forbids it).
    Processing,
    /// Charged.
    Succeeded,
    /// Declined by the gateway.
    Declined,
}

impl PaymentStatus {
    /// The status as the `status` column spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Processing => "processing",
            Self::Succeeded => "succeeded",
            Self::Declined => "declined",
        }
    }

    /// The status a row spells as `value`; `None` for anything else.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "processing" => Some(Self::Processing),
            "succeeded" => Some(Self::Succeeded),
            "declined" => Some(Self::Declined),
            _ => None,
        }
    }
}

impl From<ChargeStatus> for PaymentStatus {
    fn from(status: ChargeStatus) -> Self {
        match status {
            ChargeStatus::Approved => Self::Succeeded,
            ChargeStatus::Declined => Self::Declined,
        }
    }
}

/// A row as the books see it: what `audit`, the demo and the bench reconcile
/// against the gateway ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BookedPayment {
    /// The row's key.
    pub idempotency_key: String,
    /// The row's status.
    pub status: PaymentStatus,
    /// The gateway's transaction id (`None` while `processing`).
    pub gateway_transaction_id: Option<String>,
    /// `processing` for longer than the lease given to [`booked_payments`].
    pub stale: bool,
}

/// Every row whose idempotency key starts with `key_prefix` (all rows for an
/// empty prefix); a `processing` row last updated more than `lease` ago is `stale`.
pub async fn booked_payments(
    pool: &sqlx::PgPool,
    key_prefix: &str,
    lease: std::time::Duration,
) -> Result<Vec<BookedPayment>, sqlx::Error> {
    // `stale!`: both operands are NOT NULL columns, but Postgres cannot tell of an
    // expression; a NULL would be a decode error, as it was before the macros.
    let rows = sqlx::query!(
        r#"SELECT idempotency_key, status, gateway_transaction_id,
                status = 'processing' AND updated_at < now() - make_interval(secs => $2)
                    AS "stale!"
           FROM payments
          WHERE left(idempotency_key, char_length($1)) = $1"#,
        key_prefix,
        lease.as_secs_f64(),
    )
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|row| {
            Ok(BookedPayment {
                idempotency_key: row.idempotency_key,
                status: parse_status(&row.status)?,
                gateway_transaction_id: row.gateway_transaction_id,
                stale: row.stale,
            })
        })
        .collect()
}

/// Deletes every row whose idempotency key starts with `key_prefix` (the bench
/// clears its own keys between runs); returns the rows deleted.
pub async fn delete_payments_with_prefix(
    pool: &sqlx::PgPool,
    key_prefix: &str,
) -> Result<u64, sqlx::Error> {
    let done = sqlx::query!(
        "DELETE FROM payments WHERE starts_with(idempotency_key, $1)",
        key_prefix
    )
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}

/// Which of `keys` have a payment row (whatever its status).
pub async fn keys_with_rows(
    pool: &sqlx::PgPool,
    keys: &[String],
) -> Result<std::collections::HashSet<String>, sqlx::Error> {
    let found: Vec<String> = sqlx::query_scalar!(
        "SELECT idempotency_key FROM payments WHERE idempotency_key = ANY($1)",
        keys
    )
    .fetch_all(pool)
    .await?;
    Ok(found.into_iter().collect())
}

/// Whether the `payments` table exists (`to_regclass` needs no privilege).
pub async fn payments_table_exists(pool: &sqlx::PgPool) -> Result<bool, sqlx::Error> {
    // `IS NOT NULL` is never NULL; Postgres does not say so of an expression.
    sqlx::query_scalar!(r#"SELECT to_regclass('payments') IS NOT NULL AS "exists!""#)
        .fetch_one(pool)
        .await
}

/// Where a command came from; stored on its payment row.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SourcePosition {
    /// The commands topic.
    pub topic: String,
    /// The record's partition.
    pub partition: i32,
    /// The record's offset.
    pub offset: i64,
}

/// The parts of a row the processor decides on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentRecord {
    /// The payment's id (UUIDv7).
    pub id: Uuid,
    /// The request fingerprint the payment was made with.
    pub fingerprint: Fingerprint,
    /// The row's status.
    pub status: PaymentStatus,
    /// The gateway's transaction id (`None` while `processing`).
    pub gateway_transaction_id: Option<String>,
    /// The trace that charged (hex), for links from later duplicates.
    pub trace_id: Option<String>,
    /// The span that charged (hex), for links from later duplicates.
    pub span_id: Option<String>,
}

/// A client span for one statement (OpenTelemetry database conventions).
pub(crate) fn statement_span(operation: &'static str) -> tracing::Span {
    tracing::info_span!(
        "statement",
        otel.name = format!("{operation} payments"),
        otel.kind = "client",
        db.system.name = "postgresql",
        db.operation.name = operation,
        db.collection.name = "payments",
    )
}

/// The `status` column read: a value the CHECK constraint would refuse is a decode
/// error, never a guess.
fn parse_status(status: &str) -> Result<PaymentStatus, sqlx::Error> {
    PaymentStatus::parse(status).ok_or_else(|| sqlx::Error::ColumnDecode {
        index: "status".into(),
        source: format!("unknown payment status {status:?}").into(),
    })
}

/// A column the statement's shape makes NULL-free although Postgres cannot tell
/// (a `UNION` branch): a NULL is the decode error `try_get` gave before the macros.
fn present<T>(value: Option<T>, column: &str) -> Result<T, sqlx::Error> {
    value.ok_or_else(|| sqlx::Error::ColumnDecode {
        index: column.into(),
        source: Box::new(sqlx::error::UnexpectedNullError),
    })
}

/// The row for `key`, if any.
pub async fn find_payment(
    conn: &mut PgConnection,
    key: &str,
) -> Result<Option<PaymentRecord>, sqlx::Error> {
    sqlx::query!(
        "SELECT id, fingerprint, status, gateway_transaction_id, trace_id, span_id
         FROM payments WHERE idempotency_key = $1",
        key
    )
    .fetch_optional(conn)
    .instrument(statement_span("SELECT"))
    .await?
    .map(|row| {
        Ok(PaymentRecord {
            id: row.id,
            fingerprint: Fingerprint::from_hex(row.fingerprint),
            status: parse_status(&row.status)?,
            gateway_transaction_id: row.gateway_transaction_id,
            trace_id: row.trace_id,
            span_id: row.span_id,
        })
    })
    .transpose()
}

/// What a new row carries besides the command itself.
pub(crate) struct RowContext<'a> {
    pub source: Option<&'a SourcePosition>,
    pub trace_id: Option<String>,
    pub span_id: Option<String>,
    pub fence: u64,
}

/// The values of a new row that come from the command and its context, computed
/// once for both inserts ([`insert`] and [`insert_or_find`]), which differ only in
/// their status, transaction id and what they return.
struct NewRow<'a> {
    id: Uuid,
    key: &'a str,
    fingerprint: &'a str,
    account_id: &'a str,
    amount_minor: i64,
    currency: &'a str,
    description: Option<&'a str>,
    source_topic: Option<&'a str>,
    source_partition: Option<i32>,
    source_offset: Option<i64>,
    trace_id: Option<&'a str>,
    fence: i64,
    span_id: Option<&'a str>,
}

impl<'a> NewRow<'a> {
    fn of(
        command: &'a PaymentCommand,
        fingerprint: &'a Fingerprint,
        context: &'a RowContext<'_>,
    ) -> Self {
        Self {
            id: Uuid::now_v7(),
            key: command.idempotency_key.as_str(),
            fingerprint: fingerprint.as_str(),
            account_id: &command.account_id,
            amount_minor: command.amount_minor,
            currency: &command.currency,
            description: command.description.as_deref(),
            source_topic: context.source.map(|s| s.topic.as_str()),
            source_partition: context.source.map(|s| s.partition),
            source_offset: context.source.map(|s| s.offset),
            trace_id: context.trace_id.as_deref(),
            // A fence past i64 cannot happen (one reservation per attempt); saturate
            // rather than fail the row.
            fence: i64::try_from(context.fence).unwrap_or(i64::MAX),
            span_id: context.span_id.as_deref(),
        }
    }
}

/// Inserts the row. `charge` is `None` for the usual `processing` row written before
/// the gateway call, `Some` when recording a charge that already exists.
/// Returns `None` when another transaction committed a row for this key first.
pub(crate) async fn insert(
    conn: &mut PgConnection,
    command: &PaymentCommand,
    fingerprint: &Fingerprint,
    context: &RowContext<'_>,
    charge: Option<&Charge>,
) -> Result<Option<Uuid>, sqlx::Error> {
    let status = charge.map_or(PaymentStatus::Processing, |c| c.status.into());
    let row = NewRow::of(command, fingerprint, context);
    // ON CONFLICT DO NOTHING waits for a concurrent uncommitted insert of the same
    // key, then yields no row if that one committed: the unique index serialises.
    sqlx::query_scalar!(
        "INSERT INTO payments (id, idempotency_key, fingerprint, account_id, amount_minor,
             currency, description, status, gateway_transaction_id, source_topic,
             source_partition, source_offset, trace_id, fence, span_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
         ON CONFLICT (idempotency_key) DO NOTHING
         RETURNING id",
        row.id,
        row.key,
        row.fingerprint,
        row.account_id,
        row.amount_minor,
        row.currency,
        row.description,
        status.as_str(),
        charge.map(|c| c.transaction_id.as_str()),
        row.source_topic,
        row.source_partition,
        row.source_offset,
        row.trace_id,
        row.fence,
        row.span_id,
    )
    .fetch_optional(conn)
    .instrument(statement_span("INSERT"))
    .await
}

/// What [`insert_or_find`] found for the key.
pub(crate) enum Insertion {
    /// The new `processing` row, and what is remembered of the key.
    Inserted(Uuid, Remembered),
    /// A row committed before this statement began decides the command.
    Existing(PaymentRecord),
    /// Another transaction committed the key while this statement waited on the
    /// unique index: the row exists but this statement's snapshot cannot see it.
    Raced,
    /// The key is a refund's: a charge may not share it (`key_reused`), also once the
    /// refund's token no longer tells (lost, or its completed record expired).
    KeyOfARefund,
}

/// What the database remembers of a key that has no payment row yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Remembered {
    /// Nothing.
    Nothing,
    /// The key is in `unresolved_charges`: a delivery of it was given up on while a
    /// charge may exist, so the charge is looked up before any POST.
    ChargeUnknown,
}

/// The pre-existing check and the insert of the `processing` row in one round trip:
/// inserts the row, or returns the row already there. A new row also says whether
/// the key is in `unresolved_charges` and whether a refund holds it, in the same
/// statement (no extra round trip on the path of a fresh payment).
pub(crate) async fn insert_or_find(
    conn: &mut PgConnection,
    command: &PaymentCommand,
    fingerprint: &Fingerprint,
    context: &RowContext<'_>,
) -> Result<Insertion, sqlx::Error> {
    // Under READ COMMITTED the whole statement reads one snapshot: the second branch
    // sees a row committed before it began, never one it waited for (`Raced`).
    let row = NewRow::of(command, fingerprint, context);
    // Every column is declared nullable (`?`): what sqlx infers through a UNION
    // comes from the plan Postgres picks, which varied between builds; the branch
    // taken decides which are NULL, checked below.
    let found = sqlx::query!(
        r#"WITH inserted AS (
             INSERT INTO payments (id, idempotency_key, fingerprint, account_id, amount_minor,
                 currency, description, status, gateway_transaction_id, source_topic,
                 source_partition, source_offset, trace_id, fence, span_id)
             VALUES ($1, $2, $3, $4, $5, $6, $7, 'processing', NULL, $8, $9, $10, $11, $12, $13)
             ON CONFLICT (idempotency_key) DO NOTHING
             RETURNING id)
         SELECT true AS "inserted?", id AS "id?", NULL::text AS "fingerprint?",
                NULL::text AS "status?", NULL::text AS "gateway_transaction_id?",
                NULL::text AS "trace_id?", NULL::text AS "span_id?",
                EXISTS (SELECT 1 FROM unresolved_charges
                         WHERE idempotency_key = $2 AND kind = 'charge') AS "charge_unknown?",
                EXISTS (SELECT 1 FROM refunds
                         WHERE idempotency_key = $2) AS "key_of_a_refund?"
         FROM inserted
         UNION ALL
         SELECT false, id, fingerprint, status, gateway_transaction_id, trace_id, span_id,
                false, false
         FROM payments
         WHERE idempotency_key = $2 AND NOT EXISTS (SELECT 1 FROM inserted)"#,
        row.id,
        row.key,
        row.fingerprint,
        row.account_id,
        row.amount_minor,
        row.currency,
        row.description,
        row.source_topic,
        row.source_partition,
        row.source_offset,
        row.trace_id,
        row.fence,
        row.span_id,
    )
    .fetch_optional(conn)
    .instrument(statement_span("INSERT"))
    .await?;
    let Some(found) = found else {
        return Ok(Insertion::Raced);
    };
    let id = present(found.id, "id")?;
    if present(found.inserted, "inserted")? {
        let remembered = if present(found.charge_unknown, "charge_unknown")? {
            Remembered::ChargeUnknown
        } else {
            Remembered::Nothing
        };
        // A charge may already exist under a key remembered unknown: it is looked up
        // whatever else holds the key, never refused unasked.
        if present(found.key_of_a_refund, "key_of_a_refund")? && remembered == Remembered::Nothing {
            // The row just inserted goes with the caller's transaction, rolled back.
            return Ok(Insertion::KeyOfARefund);
        }
        return Ok(Insertion::Inserted(id, remembered));
    }
    let status = present(found.status, "status")?;
    Ok(Insertion::Existing(PaymentRecord {
        id,
        fingerprint: Fingerprint::from_hex(present(found.fingerprint, "fingerprint")?),
        status: parse_status(&status)?,
        gateway_transaction_id: found.gateway_transaction_id,
        trace_id: found.trace_id,
        span_id: found.span_id,
    }))
}

pub(crate) async fn record_charge(
    conn: &mut PgConnection,
    payment_id: Uuid,
    charge: &Charge,
) -> Result<(), sqlx::Error> {
    let status = PaymentStatus::from(charge.status);
    let reason = (status == PaymentStatus::Declined).then(|| match &charge.decline_code {
        Some(code) => format!("declined by gateway: {code}"),
        None => "declined by gateway".to_owned(),
    });
    sqlx::query!(
        "UPDATE payments
         SET status = $2, gateway_transaction_id = $3, failure_reason = $4, updated_at = now()
         WHERE id = $1 AND status = 'processing'",
        payment_id,
        status.as_str(),
        &charge.transaction_id,
        reason,
    )
    .execute(conn)
    .instrument(statement_span("UPDATE"))
    .await?;
    Ok(())
}
