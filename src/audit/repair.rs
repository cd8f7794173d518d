//! `--repair`: the owner-free path that settles a token left `processing` past its
//! lease. It takes the token over like any worker would (`reserve` of an expired
//! lease fences the old owner out), and only then reads Postgres and the gateway,
//! so nothing the old owner could still do races with the decision.

use uuid::Uuid;

use crate::gateway::{PaymentGateway, Unconfirmed};
use crate::payment::{find_payment, find_refund, Fingerprint, PaymentStatus, RefundStatus};
use crate::telemetry::events::TokenInconsistencyRepaired;
use crate::token::{Claim, IdempotencyKey, Reservation, TokenStore, Transition};

/// What `--repair` did with one stuck token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RepairAction {
    /// Its payment had committed: `processing → completed` with the row's payment id.
    Completed,
    /// No payment row and no charge: `processing → pending` (gone if past its deadline).
    Restored,
    /// Between the scan and the repair a worker reserved or completed it.
    AlreadyMoved,
    /// A charge without a row (the next owner, fence > 1, must look it up and record
    /// it) or a row stuck in `processing`: left to its lease rather than guessed at.
    LeftForWorker,
    /// The store or the database failed, or the token cannot be reserved any more.
    Failed,
    /// An orphaned unconfirmed charge (Stripe: a PaymentIntent never confirmed)
    /// was cancelled, so nothing can confirm it later.
    Cancelled,
    /// A refund stuck in `processing` was settled from the gateway's refund under
    /// its key (refunded or declined), as a worker would have recorded it.
    Recorded,
}

impl RepairAction {
    /// The token no longer sits in `processing` without an owner working on it.
    pub fn resolves(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Restored | Self::AlreadyMoved | Self::Recorded
        )
    }

    /// One line for the report: what was done to the token.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Completed => "completed from its committed payment row",
            Self::Restored => "restored to pending (no row, no charge)",
            Self::AlreadyMoved => "already taken over or completed by a worker",
            Self::LeftForWorker => "left to a worker or an operator",
            Self::Failed => "not repaired",
            Self::Cancelled => "orphaned unconfirmed charge cancelled",
            Self::Recorded => "stuck refund recorded from the gateway's refund",
        }
    }
}

/// What `--repair` did to one stuck token.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TokenRepair {
    /// The token's key.
    pub idempotency_key: String,
    /// What was done.
    pub action: RepairAction,
    /// Why, in words (the row or ledger entry that decided it).
    pub detail: String,
}

fn repair(key: &IdempotencyKey, action: RepairAction, detail: impl Into<String>) -> TokenRepair {
    TokenRepair {
        idempotency_key: key.as_str().to_owned(),
        action,
        detail: detail.into(),
    }
}

/// Counts one corrected token: the log line is what operators alert on.
fn record_inconsistency(key: &IdempotencyKey, expected: &'static str, actual: &'static str) {
    crate::telemetry::emit(TokenInconsistencyRepaired {
        key,
        expected,
        actual,
    });
}

/// Settles one token that was `processing` past its lease. `charged_without_row`:
/// the audit saw a ledger charge for the key and no payment row.
pub(super) async fn repair_stuck_token(
    key: &IdempotencyKey,
    charged_without_row: bool,
    pool: &sqlx::PgPool,
    tokens: &dyn TokenStore,
    gateway: &dyn PaymentGateway,
) -> TokenRepair {
    if charged_without_row {
        // Reserving would only push the recording worker back by another lease.
        return repair(
            key,
            RepairAction::LeftForWorker,
            "charged at the gateway without a row; the next delivery records it",
        );
    }
    let claim = match take_over(key, tokens).await {
        Ok(claim) => claim,
        Err(not_taken) => return not_taken,
    };
    // A refund's token is one of the same store: its key holds a refund row, not a
    // payment row, and no charge is looked up for it.
    let rows = async {
        let mut conn = pool.acquire().await?;
        let payment = find_payment(&mut conn, key.as_str()).await?;
        let refund = match payment {
            Some(_) => None,
            None => find_refund(&mut conn, key.as_str()).await?,
        };
        Ok::<_, sqlx::Error>((payment, refund))
    }
    .await;
    let (payment, refund) = match rows {
        Ok(rows) => rows,
        // Our lease runs out like any other; a worker then decides as usual.
        Err(error) => {
            return repair(
                key,
                RepairAction::Failed,
                format!("payment look-up failed: {error}"),
            )
        }
    };
    match (payment, refund) {
        (Some(row), _) if row.status != PaymentStatus::Processing => {
            let what = format!("payment {}", row.id);
            complete_with(key, &claim, row.id, &row.fingerprint, what, tokens).await
        }
        (Some(_), _) => repair(
            key,
            RepairAction::LeftForWorker,
            "its payment row is stuck in processing; an operator must decide",
        ),
        (None, Some(row)) if row.status != RefundStatus::Processing => {
            let what = format!("refund {}", row.id);
            complete_with(key, &claim, row.id, &row.fingerprint, what, tokens).await
        }
        // The refund may be made at the gateway: the next delivery looks it up.
        (None, Some(_)) => repair(
            key,
            RepairAction::LeftForWorker,
            "its refund row is processing; the next delivery looks the refund up",
        ),
        (None, None) => restore_if_uncharged(key, &claim, tokens, gateway).await,
    }
}

/// Reserves the stuck token under an owner of the audit's own, fencing the old
/// owner out; or what the repair comes to when it cannot.
async fn take_over(key: &IdempotencyKey, tokens: &dyn TokenStore) -> Result<Claim, TokenRepair> {
    let owner = format!("audit:{}", Uuid::new_v4().simple());
    let fence = match tokens.reserve(key, &owner).await {
        Ok(Reservation::Reserved { fence, .. }) => fence,
        Ok(Reservation::InFlight { .. } | Reservation::Completed { .. }) => {
            return Err(repair(
                key,
                RepairAction::AlreadyMoved,
                "a worker got to it first",
            ))
        }
        Ok(Reservation::Missing) => {
            return Err(repair(
                key,
                RepairAction::Failed,
                "the token is past its deadline (issued mode)",
            ))
        }
        Ok(Reservation::Unsettled) => {
            return Err(repair(
                key,
                RepairAction::LeftForWorker,
                "the token expired while an attempt held it (issued mode): its charge is unknown; the next delivery looks it up",
            ))
        }
        Err(error) => {
            return Err(repair(
                key,
                RepairAction::Failed,
                format!("reserve failed: {error}"),
            ))
        }
    };
    Ok(Claim { owner, fence })
}

/// The payment (or refund) committed final: completes the token with its row's id
/// and fingerprint, as the worker would have.
async fn complete_with(
    key: &IdempotencyKey,
    claim: &Claim,
    row_id: Uuid,
    fingerprint: &Fingerprint,
    what: String,
    tokens: &dyn TokenStore,
) -> TokenRepair {
    match tokens
        .confirm(key, claim, row_id, fingerprint.as_str())
        .await
    {
        Ok(Transition::Applied) => {
            record_inconsistency(key, "completed", "processing");
            repair(key, RepairAction::Completed, what)
        }
        Ok(Transition::Refused) => repair(key, RepairAction::AlreadyMoved, "confirm refused"),
        Err(error) => repair(
            key,
            RepairAction::Failed,
            format!("confirm failed: {error}"),
        ),
    }
}

/// No payment or refund row: gives the token back to `pending`, unless the gateway holds a
/// charge for the key after all.
async fn restore_if_uncharged(
    key: &IdempotencyKey,
    claim: &Claim,
    tokens: &dyn TokenStore,
    gateway: &dyn PaymentGateway,
) -> TokenRepair {
    // The fenced-out owner may have charged just before we took over.
    let charged_now = match gateway.lookup(key).await {
        Ok(found) => found.is_some(),
        Err(error) => {
            return repair(
                key,
                RepairAction::Failed,
                format!("gateway look-up failed: {error}"),
            )
        }
    };
    if charged_now {
        return repair(
            key,
            RepairAction::LeftForWorker,
            "charged at the gateway without a row; the next delivery records it",
        );
    }
    match tokens.restore(key, claim).await {
        Ok(Transition::Applied) => {
            record_inconsistency(key, "pending", "processing");
            repair(key, RepairAction::Restored, "no payment row, no charge")
        }
        Ok(Transition::Refused) => repair(key, RepairAction::AlreadyMoved, "restore refused"),
        Err(error) => repair(
            key,
            RepairAction::Failed,
            format!("restore failed: {error}"),
        ),
    }
}

/// Cancels an orphaned unconfirmed charge without racing a live confirm: when its
/// key has a final payment row, every delivery of the key is answered from the row
/// and nothing confirms it; otherwise the token is taken first (a worker holding
/// it means the payment is in progress: left alone), the charge cancelled, and the
/// token given back, so the payment's next attempt looks up (fence > 1) and makes
/// a new one.
pub(super) async fn cancel_orphan(
    orphan: &Unconfirmed,
    final_row: bool,
    tokens: &dyn TokenStore,
    gateway: &dyn PaymentGateway,
) -> TokenRepair {
    let Ok(key) = IdempotencyKey::try_from(orphan.idempotency_key.as_str()) else {
        return TokenRepair {
            idempotency_key: orphan.idempotency_key.clone(),
            action: RepairAction::Failed,
            detail: format!("{}: its key is not a valid idempotency key", orphan.id),
        };
    };
    let cancel = || async {
        match gateway.cancel_unconfirmed(orphan).await {
            Ok(()) => repair(&key, RepairAction::Cancelled, orphan.id.clone()),
            Err(error) => repair(
                &key,
                RepairAction::Failed,
                format!("cancelling {} failed: {error}", orphan.id),
            ),
        }
    };
    if final_row {
        return cancel().await;
    }
    let owner = format!("audit:{}", Uuid::new_v4().simple());
    let fence = match tokens.reserve(&key, &owner).await {
        Ok(Reservation::Reserved { fence, .. }) => fence,
        Ok(Reservation::InFlight { .. }) => {
            return repair(
                &key,
                RepairAction::LeftForWorker,
                format!(
                    "{}: a worker holds the token, the payment is in progress",
                    orphan.id
                ),
            )
        }
        Ok(Reservation::Completed { .. } | Reservation::Missing | Reservation::Unsettled) => {
            return repair(
                &key,
                RepairAction::LeftForWorker,
                format!("{}: no token to hold while cancelling it", orphan.id),
            )
        }
        Err(error) => {
            return repair(
                &key,
                RepairAction::Failed,
                format!("reserve failed: {error}"),
            )
        }
    };
    let done = cancel().await;
    if let Err(error) = tokens.restore(&key, &Claim { owner, fence }).await {
        tracing::warn!(idempotency_key = %key, %error, "giving the token back after cancelling an orphan failed; its lease expires");
    }
    done
}
