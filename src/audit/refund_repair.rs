//! `--repair` of refunds left `processing` past a lease: their outcome is unknown
//! and their amount stays reserved. One is settled only from what the gateway
//! says it refunded under its key, looked up under the row's lock (the lock a
//! worker takes before asking the gateway, so the two never settle one refund at
//! once). A refund the gateway does not show is left as it is, however old: the
//! POST may still land, and releasing its reservation could let another refund
//! give back the same money twice.

use sqlx::PgPool;

use super::refund_rows::{refund_rows, RefundRow};
use super::repair::{RepairAction, TokenRepair};
use crate::gateway::{PaymentGateway, RefundRequest};
use crate::payment::{lock_refund, record_refund, Locked, RefundStatus};
use crate::token::IdempotencyKey;

fn repair(row: &RefundRow, action: RepairAction, detail: impl Into<String>) -> TokenRepair {
    TokenRepair {
        idempotency_key: row.idempotency_key.clone(),
        action,
        detail: detail.into(),
    }
}

/// Settles every refund row of the audited keys that is `processing` past its
/// lease, one after the other.
pub(super) async fn repair_stuck_refunds(
    pool: &PgPool,
    gateway: &dyn PaymentGateway,
    key_prefix: &str,
    lease: std::time::Duration,
) -> anyhow::Result<Vec<TokenRepair>> {
    let rows = refund_rows(pool, key_prefix, lease).await?;
    let mut repairs = Vec::new();
    for row in rows.iter().filter(|row| row.stale) {
        repairs.push(settle_stuck_refund(pool, gateway, row).await);
    }
    Ok(repairs)
}

/// One stuck refund: recorded from the gateway's refund under its key, or left.
async fn settle_stuck_refund(
    pool: &PgPool,
    gateway: &dyn PaymentGateway,
    row: &RefundRow,
) -> TokenRepair {
    let (Ok(key), Some(charge)) = (
        IdempotencyKey::try_from(row.idempotency_key.as_str()),
        row.payment_transaction_id.clone(),
    ) else {
        return repair(
            row,
            RepairAction::Failed,
            "its key or its payment's transaction id is unusable",
        );
    };
    let request = RefundRequest {
        payment_transaction_id: charge,
        amount_minor: row.amount_minor,
        currency: row.currency.clone(),
        refund_id: Some(row.id),
    };
    match settle_locked(pool, gateway, row, &key, &request).await {
        Ok(done) => done,
        // The transaction rolls back: the row stays `processing`, still listed.
        Err(error) => repair(row, RepairAction::Failed, format!("{error:#}")),
    }
}

/// Inside one transaction: the row locked, the gateway asked, the answer recorded.
async fn settle_locked(
    pool: &PgPool,
    gateway: &dyn PaymentGateway,
    row: &RefundRow,
    key: &IdempotencyKey,
    request: &RefundRequest,
) -> anyhow::Result<TokenRepair> {
    let mut tx = pool.begin().await?;
    // Locked the way a worker locks it before asking the gateway, without waiting:
    // the audit and a worker never settle one refund at once.
    if lock_refund(&mut tx, row.id).await? != Locked::Status(RefundStatus::Processing) {
        return Ok(repair(
            row,
            RepairAction::AlreadyMoved,
            "a worker holds or has settled it",
        ));
    }
    let found = gateway.lookup_refund(key, request).await?;
    let Some(entry) = found else {
        return Ok(repair(
            row,
            RepairAction::LeftForWorker,
            "the gateway shows no refund under its key; its amount stays reserved until one shows or an operator decides",
        ));
    };
    if !entry.matches(request) {
        return Ok(repair(
            row,
            RepairAction::LeftForWorker,
            format!(
                "the gateway's refund {} under its key is of another charge or amount; an operator must decide",
                entry.transaction_id
            ),
        ));
    }
    let answer = entry.answer();
    if !record_refund(&mut tx, row.id, &answer).await? {
        return Ok(repair(row, RepairAction::AlreadyMoved, "settled meanwhile"));
    }
    tx.commit().await?;
    Ok(repair(
        row,
        RepairAction::Recorded,
        format!(
            "gateway refund {} {}",
            entry.transaction_id,
            answer.status.as_str()
        ),
    ))
}
