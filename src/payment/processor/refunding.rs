//! A refund's attempt once its token is reserved, in three steps:
//!
//! 1. **Reserve the amount** (one transaction, committed before anything is sent):
//!    the payment's row locked, refunds booked or in flight plus this one checked
//!    against the amount charged, the refund's row inserted `processing`. Its
//!    amount stays reserved, whatever happens next, until the gateway's answer is
//!    recorded: a refund whose outcome is unknown can never be refunded again by
//!    another key.
//! 2. **Ask the gateway** in a second transaction that holds the refund's row lock
//!    (taken without waiting), under the lease (checked right before the POST),
//!    looking the refund up first when an earlier attempt may have sent it.
//! 3. **Record the answer** in that same transaction, check the fence, commit; the
//!    token is confirmed as for a charge.
//!
//! A charge does all of it in one transaction, its row existing only once
//! committed; a refund cannot: its reservation must outlive a crash after its POST,
//! and the payment's row lock is held only while the amount is reserved, not for
//! the gateway call.

use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, Postgres};

use super::refund_answers::{final_answer_of, refund_outcome, WAITING_FOR_PAYMENT};
use super::refund_gateway::{RefundAsk, RefundEnd};
use super::*;
use crate::payment::refunds::{self, Locked, RefundRecord, RefundStatus, Reserving};

/// What the gateway answered a refund, to be recorded on its row.
enum Answered {
    /// A refund (approved or declined), or the one an earlier attempt made.
    Refund(Charge),
    /// Refused for good, nothing refunded: the refusal's reason, cut to what a row
    /// holds.
    Refused(String),
}

/// A gateway's refusal as a row keeps it: its control characters (a NUL, which
/// Postgres cannot store, a gateway's line breaks) as spaces, cut to what the column
/// holds, masked before and after the cut (`masked_within`): a space where a NUL
/// stood, or a cut, can make a card number of digits the gateway's text held apart. The answer given now is the same
/// text, so every delivery reads alike.
fn keepable_reason(reason: &str) -> String {
    let spaced: String = reason
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    crate::redaction::masked_within(&spaced, refunds::MAX_FAILURE_REASON)
}

impl Answered {
    /// Recorded on the row still `processing`; `false` when it no longer was.
    async fn record(&self, conn: &mut PgConnection, row: Uuid) -> Result<bool, sqlx::Error> {
        match self {
            Self::Refund(charge) => refunds::record_refund(conn, row, charge).await,
            Self::Refused(reason) => refunds::record_gateway_refusal(conn, row, reason).await,
        }
    }
}

/// What steps 2 and 3 work on.
#[derive(Clone, Copy)]
struct RefundStep<'a> {
    command: &'a RefundCommand,
    fingerprint: &'a Fingerprint,
    context: &'a CommandContext<'a>,
    lease: &'a Lease<'a>,
    row: &'a RefundRecord,
    /// The row was reserved by an earlier attempt, which may have sent the refund.
    resumed: bool,
}

impl Processor {
    /// The refund's three steps, settling the token as they end.
    pub(super) async fn transact_refund(
        &self,
        command: &RefundCommand,
        fingerprint: &Fingerprint,
        context: &CommandContext<'_>,
        lease: &Lease<'_>,
    ) -> Settlement {
        let (row, resumed) = match self
            .reserve_amount(command, fingerprint, context, lease.claim)
            .await
        {
            Ok(reserved) => reserved,
            Err(settlement) => return settlement,
        };
        let mut conn = match self.payment_connection().await {
            Ok(conn) => conn,
            Err(error) => return Settlement::Restore(database_failure("begin", &error)),
        };
        let stall = Stall::default();
        let step = RefundStep {
            command,
            fingerprint,
            context,
            lease,
            row: &row,
            resumed,
        };
        let settlement = self.refund_on(&mut conn, &stall, step).await;
        // Back to the pool first: an attempt holds one connection at a time.
        stall.release(conn);
        settlement
    }

    /// Step 1: the amount reserved and committed, or the row an earlier attempt
    /// reserved (`true`: it may have been sent), or how the attempt ends.
    async fn reserve_amount(
        &self,
        command: &RefundCommand,
        fingerprint: &Fingerprint,
        context: &CommandContext<'_>,
        claim: &Claim,
    ) -> Result<(RefundRecord, bool), Settlement> {
        let row = row_context(context, claim.fence);
        let mut conn = self
            .payment_connection()
            .await
            .map_err(|error| Settlement::Restore(database_failure("begin", &error)))?;
        let stall = Stall::default();
        let reserved = stall
            .bounded("reserving the refund", async {
                let mut tx = sqlx::Acquire::begin(&mut *conn).await?;
                let reserving =
                    refunds::reserve_refund(&mut tx, command, fingerprint, &row).await?;
                // A refusal for good is kept, so that a replay answers it again.
                let rejection = match refusal_of(&reserving) {
                    Some((payment_id, reason)) => refunds::record_rejection(
                        &mut tx,
                        command,
                        fingerprint,
                        payment_id,
                        &reason,
                    )
                    .await?
                    .map(|id| (id, reason)),
                    None => None,
                };
                if matches!(reserving, Reserving::Reserved(_)) || rejection.is_some() {
                    tx.commit().await?;
                }
                Ok::<_, sqlx::Error>((reserving, rejection))
            })
            .instrument(persistence::statement_span("reserve refund"))
            .await;
        stall.release(conn);
        // Nothing was sent; a reservation whose COMMIT went unanswered is found by
        // the next attempt and looked up before any POST.
        let (reserving, rejection) = reserved.map_err(|error| {
            Settlement::Restore(database_failure("reserving the refund", &error))
        })?;
        settle_reserving(reserving, rejection, fingerprint)
    }

    /// Steps 2 and 3 in one transaction holding the refund's row lock, so that no
    /// other holder of the key (after Redis lost its token) asks the gateway while
    /// this one does: it finds the row locked and tries again later.
    async fn refund_on(
        &self,
        conn: &mut PoolConnection<Postgres>,
        stall: &Stall,
        step: RefundStep<'_>,
    ) -> Settlement {
        let mut tx = match stall
            .bounded("BEGIN", sqlx::Acquire::begin(&mut **conn))
            .instrument(persistence::statement_span("BEGIN"))
            .await
        {
            Ok(tx) => tx,
            Err(error) => return Settlement::Restore(database_failure("begin", &error)),
        };
        if let Err(settlement) = lock_for_the_call(&mut tx, stall, step.row).await {
            return settlement;
        }
        let key = step.command.idempotency_key.as_str();
        if let Err(fault) = self.faults.hit(FaultPoint::AfterInsert, key).await {
            return Settlement::Restore(retry(fault.to_string()));
        }
        let answer = match self.ask_gateway(step).await {
            Ok(answer) => Answered::Refund(answer),
            Err(RefundEnd::Refused(reason)) => Answered::Refused(keepable_reason(&reason)),
            Err(RefundEnd::Settle(settlement)) => return settlement,
            Err(RefundEnd::Release(settlement)) => {
                // Nothing refunded, and the key is not this refund's: the
                // reservation is freed.
                let released = stall
                    .bounded("releasing the refund", async {
                        refunds::release_refund(&mut tx, step.row.id).await?;
                        tx.commit().await
                    })
                    .await;
                return match released {
                    Ok(()) => settlement,
                    Err(error) => {
                        Settlement::Restore(database_failure("releasing the refund", &error))
                    }
                };
            }
        };
        self.record_and_commit(tx, stall, step, answer).await
    }

    /// Step 2: the gateway asked for the refund (or for the one an earlier attempt
    /// made) under the lease.
    async fn ask_gateway(&self, step: RefundStep<'_>) -> Result<Charge, RefundEnd> {
        let Some(payment_transaction_id) = step.row.payment_transaction_id.clone() else {
            // A refund row only exists for a succeeded payment, which has one.
            return Err(RefundEnd::Settle(Settlement::Restore(retry(
                "the refunded payment has no transaction id",
            ))));
        };
        let ask = RefundAsk {
            command: step.command,
            request: RefundRequest {
                payment_transaction_id,
                amount_minor: step.row.amount_minor,
                currency: step.row.currency.clone(),
                refund_id: Some(step.row.id),
            },
            record: step.context.source,
        };
        let history =
            decisions::charge_history(step.resumed, step.context.earlier, step.lease.claim.fence);
        self.refund_keeping_lease(&ask, step.lease, history).await
    }

    /// Step 3: the answer recorded, the fence checked, committed.
    async fn record_and_commit(
        &self,
        mut tx: sqlx::Transaction<'_, Postgres>,
        stall: &Stall,
        step: RefundStep<'_>,
        answer: Answered,
    ) -> Settlement {
        let RefundStep {
            row,
            lease,
            fingerprint,
            ..
        } = step;
        let recorded = stall
            .bounded("recording the refund", answer.record(&mut tx, row.id))
            .await;
        match recorded {
            Ok(true) => {}
            // Impossible while we hold the row's lock; should it happen, the row
            // answers the next attempt.
            Ok(false) => {
                return Settlement::LeaveToLease(retry("the refund was recorded by another holder"))
            }
            // A refusal not recorded: nothing was refunded, the transaction is
            // rolled back (the row stays `processing`, looked up first next time,
            // then refused again).
            Err(error) if matches!(answer, Answered::Refused(_)) => {
                return Settlement::Restore(database_failure("recording the refusal", &error))
            }
            // Refunded but not recorded: the row stays `processing`, its amount
            // reserved, and the next holder looks the refund up.
            Err(error) => {
                return Settlement::LeaveToLease(database_failure_after_charge(
                    "recording the refund",
                    &error,
                ))
            }
        }
        let key = &step.command.idempotency_key;
        match self
            .check_fence(&mut tx, key, lease, row.id, fingerprint)
            .await
        {
            Ok(Transition::Applied) => {}
            Ok(Transition::Refused) => {
                return Settlement::LeaveToLease(retry_unknown("lease lost before commit"))
            }
            Err(error) => {
                return Settlement::LeaveToLease(retry_unknown(format!(
                    "lease check before commit failed: {error}"
                )))
            }
        }
        if let Err(error) = stall
            .bounded("COMMIT", tx.commit())
            .instrument(persistence::statement_span("COMMIT"))
            .await
        {
            // A failed COMMIT may still have committed: only the next owner can tell.
            return Settlement::LeaveToLease(retry_unknown(format!("commit failed: {error}")));
        }
        let outcome = match answer {
            Answered::Refund(charge) => refund_outcome(row, &charge),
            // What `final_answer_of` answers from the row from now on.
            Answered::Refused(reason) => Outcome::Rejected {
                kind: RejectionKind::Invalid,
                reason,
            },
        };
        if self.tokens.in_transaction().is_some() {
            return Settlement::Settled(outcome);
        }
        Settlement::Confirm {
            payment_id: row.id,
            fingerprint: fingerprint.clone(),
            outcome,
        }
    }
}

/// The refund's row locked for the gateway call, or how the attempt ends: another
/// holder has it (its call in flight), or settled or released it meanwhile.
async fn lock_for_the_call(
    conn: &mut PgConnection,
    stall: &Stall,
    row: &RefundRecord,
) -> Result<(), Settlement> {
    match stall
        .bounded("locking the refund", refunds::lock_refund(conn, row.id))
        .await
    {
        Ok(Locked::Status(RefundStatus::Processing)) => Ok(()),
        // The next attempt reads what the other holder settled.
        Ok(Locked::Status(_) | Locked::Gone) => Err(Settlement::Restore(retry(
            "the refund was settled by another holder meanwhile",
        ))),
        Ok(Locked::Held) => Err(Settlement::Restore(retry(
            "another holder is asking the gateway for this refund",
        ))),
        Err(error) => Err(Settlement::Restore(database_failure(
            "locking the refund",
            &error,
        ))),
    }
}

/// What step 1 came to, as the attempt goes on or ends; `rejection` is the row
/// that keeps a refusal for good (`None` if another holder wrote the key's row first).
fn settle_reserving(
    reserving: Reserving,
    rejection: Option<(Uuid, String)>,
    fingerprint: &Fingerprint,
) -> Result<(RefundRecord, bool), Settlement> {
    match reserving {
        Reserving::Reserved(row) => Ok((row, false)),
        Reserving::Existing(row) if row.fingerprint != *fingerprint => {
            Err(Settlement::Restore(key_reused().into()))
        }
        Reserving::Existing(row) if row.status == RefundStatus::Processing => Ok((row, true)),
        Reserving::Existing(row) => Err(Settlement::Confirm {
            payment_id: row.id,
            fingerprint: row.fingerprint.clone(),
            outcome: final_answer_of(&row),
        }),
        Reserving::Raced => Err(Settlement::Restore(retry(
            "another holder of the key reserved the refund meanwhile",
        ))),
        Reserving::PaymentUnknown => Err(Settlement::Restore(retry(WAITING_FOR_PAYMENT))),
        Reserving::KeyOfAPayment => Err(Settlement::Restore(key_reused().into())),
        Reserving::PaymentNotCharged { .. }
        | Reserving::CurrencyMismatch { .. }
        | Reserving::ExceedsCharge { .. } => match rejection {
            Some((refund_id, reason)) => Err(Settlement::Confirm {
                payment_id: refund_id,
                fingerprint: fingerprint.clone(),
                outcome: Outcome::Rejected {
                    kind: RejectionKind::Invalid,
                    reason,
                },
            }),
            None => Err(Settlement::Restore(retry(
                "another holder of the key wrote the refund's row meanwhile",
            ))),
        },
    }
}

/// A refusal for good before anything is sent: the payment it was for (if any) and
/// its reason.
fn refusal_of(reserving: &Reserving) -> Option<(Option<Uuid>, String)> {
    match reserving {
        Reserving::PaymentNotCharged { payment_id } => Some((
            Some(*payment_id),
            "payment_not_charged: the payment was declined; nothing to refund".to_owned(),
        )),
        Reserving::CurrencyMismatch {
            payment_id,
            payment_currency,
        } => Some((
            Some(*payment_id),
            format!("currency_mismatch: the payment was made in {payment_currency}"),
        )),
        Reserving::ExceedsCharge { payment_id, left } => Some((
            Some(*payment_id),
            format!("refund_exceeds_charge: {left} minor units of the payment are left to refund"),
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_refusal_holds_no_control_character_and_fits_its_column() {
        assert_eq!(
            keepable_reason("gateway_rejected: HTTP 400: a\0b\r\nc"),
            "gateway_rejected: HTTP 400: a b  c"
        );
        let long = "é".repeat(refunds::MAX_FAILURE_REASON + 7);
        assert_eq!(
            keepable_reason(&long).chars().count(),
            refunds::MAX_FAILURE_REASON
        );
    }

    #[test]
    fn a_kept_refusal_is_masked_after_it_is_spaced_and_cut() {
        use crate::redaction::contains_card_number;
        // NULs keep the groups apart for the detector; as spaces they join them.
        let spaced = keepable_reason("gateway_rejected: HTTP 402: 4111\u{0}1111\u{0}1111\u{0}1111");
        assert!(!contains_card_number(&spaced), "{spaced}");
        assert!(spaced.ends_with("**** **** **** 1111"), "{spaced}");
        // A run of 20 digits is no card; cut to the column, its first 16 are one.
        let prefix = "gateway_rejected: HTTP 402: ";
        let filler = "a".repeat(refunds::MAX_FAILURE_REASON - prefix.len() - 16);
        let cut = keepable_reason(&format!("{prefix}{filler}41111111111111111111"));
        assert_eq!(cut.chars().count(), refunds::MAX_FAILURE_REASON);
        assert!(!contains_card_number(&cut), "{cut}");
    }
}
