//! The one payment transaction of an attempt, on one connection of the payment
//! pool: pre-existing check and insert, charge, record, fence check, commit.

use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, Postgres};

use super::*;
use crate::telemetry::events::PoolAcquireEnded;

/// How the transaction on its connection ended: settled, or raced by another holder
/// that committed this key while we waited on the unique index (read again once the
/// connection is back in the pool).
pub(super) enum Transacted {
    Settled(Settlement),
    Raced,
}

impl From<Settlement> for Transacted {
    fn from(settlement: Settlement) -> Self {
        Self::Settled(settlement)
    }
}

impl Processor {
    /// The one transaction: pre-existing check, insert, charge, record, commit, on
    /// one connection of the payment pool (closed, not reused, when a statement on it
    /// went unanswered).
    pub(super) async fn transact(
        &self,
        command: &PaymentCommand,
        fingerprint: &Fingerprint,
        context: &CommandContext<'_>,
        lease: &Lease<'_>,
    ) -> Settlement {
        let mut conn = match self.payment_connection().await {
            Ok(conn) => conn,
            Err(error) => return Settlement::Restore(database_failure("begin", &error)),
        };
        let stall = Stall::default();
        let transacted = self
            .transact_on(&mut conn, &stall, command, fingerprint, context, lease)
            .await;
        // Back to the pool first: an attempt holds one connection at a time.
        stall.release(conn);
        match transacted {
            Transacted::Settled(settlement) => settlement,
            // Another holder committed this key while we waited on the unique index.
            Transacted::Raced => match self.find_existing(&command.idempotency_key).await {
                Ok(Some(existing)) => self.settle_existing(existing, fingerprint),
                Ok(None) => Settlement::Restore(retry("payment row vanished after a conflict")),
                Err(error) => {
                    Settlement::Restore(database_failure("re-read after conflict", &error))
                }
            },
        }
    }

    /// The transaction's steps on `conn`, in order: BEGIN, the row (or the payment
    /// found under the key), the charge under the lease, its record, the fence check,
    /// COMMIT.
    pub(super) async fn transact_on(
        &self,
        conn: &mut PoolConnection<Postgres>,
        stall: &Stall,
        command: &PaymentCommand,
        fingerprint: &Fingerprint,
        context: &CommandContext<'_>,
        lease: &Lease<'_>,
    ) -> Transacted {
        let key = &command.idempotency_key;
        let mut tx = match stall
            .bounded("BEGIN", sqlx::Acquire::begin(&mut **conn))
            .instrument(persistence::statement_span("BEGIN"))
            .await
        {
            Ok(tx) => tx,
            Err(error) => return before_charge("begin", error),
        };
        let (payment_id, history) = match self
            .insert_row(&mut tx, stall, command, fingerprint, context, lease.claim)
            .await
        {
            Ok(inserted) => inserted,
            Err(transacted) => return transacted,
        };
        if let Err(fault) = self.faults.hit(FaultPoint::AfterInsert, key.as_str()).await {
            return Settlement::Restore(retry(fault.to_string())).into();
        }
        let charge = match self
            .charge_keeping_lease(command, context, payment_id, lease, history)
            .await
        {
            Ok(charge) => charge,
            Err(settlement) => return settlement.into(),
        };
        if let Err(settlement) = record_charge(&mut tx, stall, payment_id, &charge).await {
            return settlement.into();
        }
        let fence_check = self
            .check_fence(&mut tx, key, lease, payment_id, fingerprint)
            .await;
        match fence_check {
            Ok(Transition::Applied) => {}
            Ok(Transition::Refused) => {
                return Settlement::LeaveToLease(retry_unknown("lease lost before commit")).into()
            }
            Err(error) => {
                return Settlement::LeaveToLease(retry_unknown(format!(
                    "lease check before commit failed: {error}"
                )))
                .into()
            }
        }
        if let Err(error) = stall
            .bounded("COMMIT", tx.commit())
            .instrument(persistence::statement_span("COMMIT"))
            .await
        {
            // A failed COMMIT may still have committed: only the next owner can tell.
            return Settlement::LeaveToLease(retry_unknown(format!("commit failed: {error}")))
                .into();
        }
        self.committed(payment_id, fingerprint, &charge).into()
    }

    /// The pre-existing check and the insert, one statement (I6): the new row's id
    /// and what is known of an earlier charge, or how the transaction ends (the
    /// payment found under the key, a race lost, a database failure).
    async fn insert_row(
        &self,
        conn: &mut PgConnection,
        stall: &Stall,
        command: &PaymentCommand,
        fingerprint: &Fingerprint,
        context: &CommandContext<'_>,
        claim: &Claim,
    ) -> Result<(Uuid, ChargeHistory), Transacted> {
        let row = row_context(context, claim.fence);
        match stall
            .bounded(
                "insert",
                persistence::insert_or_find(conn, command, fingerprint, &row),
            )
            .await
        {
            Ok(Insertion::Inserted(id, remembered)) => Ok((
                id,
                decisions::charge_history(
                    remembered == Remembered::ChargeUnknown,
                    context.earlier,
                    claim.fence,
                ),
            )),
            Ok(Insertion::Existing(existing)) => {
                Err(self.settle_existing(existing, fingerprint).into())
            }
            Ok(Insertion::Raced) => Err(Transacted::Raced),
            // Nothing charged: the token goes back, the answer is final.
            Ok(Insertion::KeyOfARefund) => Err(Settlement::Restore(key_reused().into()).into()),
            Err(error) => Err(before_charge("insert", error)),
        }
    }

    /// The charge (or the earlier one found), obtained while the lease is renewed;
    /// `Err` when it settles otherwise, the lease lost meanwhile included.
    async fn charge_keeping_lease(
        &self,
        command: &PaymentCommand,
        context: &CommandContext<'_>,
        payment_id: Uuid,
        lease: &Lease<'_>,
        history: ChargeHistory,
    ) -> Result<Charge, Settlement> {
        let key = &command.idempotency_key;
        let (charge, lease_kept) = self
            .with_lease(
                key,
                lease.claim,
                self.obtain_charge(command, context.source, payment_id, lease, history),
            )
            .await;
        let charge = charge?;
        if let Err(fault) = self.faults.hit(FaultPoint::AfterCharge, key.as_str()).await {
            return Err(Settlement::LeaveToLease(retry_unknown(fault.to_string())));
        }
        if !lease_kept {
            // Another owner may be waiting on our uncommitted row; rolling back lets it
            // proceed, and its fence > 1 makes it look this charge up instead of charging.
            return Err(Settlement::LeaveToLease(retry_unknown(
                "lease lost during the gateway call",
            )));
        }
        Ok(charge)
    }

    /// Fencing (I5): only the current owner may commit. A store in the payments
    /// database checks the fence and completes the token inside this transaction
    /// (one atomic step with the payment); any other store renews the lease right
    /// before COMMIT, unless the lease is certainly still ours, and is confirmed
    /// after it.
    pub(super) async fn check_fence(
        &self,
        conn: &mut PgConnection,
        key: &IdempotencyKey,
        lease: &Lease<'_>,
        payment_id: Uuid,
        fingerprint: &Fingerprint,
    ) -> Result<Transition, TokenError> {
        match self.tokens.in_transaction() {
            Some(settle) => {
                settle
                    .confirm_in(conn, key, lease.claim, payment_id, fingerprint.as_str())
                    .instrument(token_span("confirm"))
                    .await
            }
            None if lease.surely_held() => Ok(Transition::Applied),
            None => {
                self.tokens
                    .extend(key, lease.claim)
                    .instrument(token_span("extend"))
                    .await
            }
        }
    }

    /// What is left for the token once the payment is committed: nothing when the
    /// token was completed inside the transaction, else its confirm.
    fn committed(
        &self,
        payment_id: Uuid,
        fingerprint: &Fingerprint,
        charge: &Charge,
    ) -> Settlement {
        let outcome = final_outcome(payment_id, charge);
        if self.tokens.in_transaction().is_some() {
            return Settlement::Settled(outcome);
        }
        Settlement::Confirm {
            payment_id,
            fingerprint: fingerprint.clone(),
            outcome,
        }
    }

    /// The payment transaction's connection, its wait measured: with no more attempts
    /// than connections it is handed out at once, and a wait here (metric
    /// `payment_worker.db.pool.acquire`, log field `pool_acquire_ms`) means something
    /// else holds payment-pool connections.
    pub(super) async fn payment_connection(&self) -> Result<PoolConnection<Postgres>, sqlx::Error> {
        let asked = std::time::Instant::now();
        let acquired = self.pool.acquire().await;
        let waited = asked.elapsed();
        crate::telemetry::emit(PoolAcquireEnded {
            waited,
            error: acquired.as_ref().err(),
        });
        acquired
    }

    pub(super) fn settle_existing(
        &self,
        existing: PaymentRecord,
        fingerprint: &Fingerprint,
    ) -> Settlement {
        if existing.status == PaymentStatus::Processing {
            // Never committed by this code; leave it for `audit` rather than guess.
            return Settlement::Restore(retry("payment row stuck in processing"));
        }
        let outcome = outcome_for_existing(&existing, fingerprint);
        Settlement::Confirm {
            payment_id: existing.id,
            fingerprint: existing.fingerprint,
            outcome,
        }
    }
}

/// Nothing was charged yet: a final database refusal restores the token too, so a
/// corrected command (or a redrive after a fix) can still go through.
fn before_charge(what: &str, error: sqlx::Error) -> Transacted {
    Settlement::Restore(database_failure(what, &error)).into()
}

/// The charge recorded on the payment row.
async fn record_charge(
    conn: &mut PgConnection,
    stall: &Stall,
    payment_id: Uuid,
    charge: &Charge,
) -> Result<(), Settlement> {
    stall
        .bounded(
            "recording the charge",
            persistence::record_charge(conn, payment_id, charge),
        )
        .await
        .map_err(|error| {
            // Charged but not recorded: the lease hands the look-up to the next owner.
            Settlement::LeaveToLease(database_failure_after_charge(
                "recording the charge",
                &error,
            ))
        })
}
