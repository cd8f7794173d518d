//! The gateway side of a refund's attempt: refund or find the earlier refund,
//! resolve an unknown outcome by look-up, keep the lease alive meanwhile. The same
//! rules as a charge's (`charging.rs`), over the refund half of the gateway.

use super::charging::{gateway_rejection_reason, looked_up};
use super::*;
use crate::gateway::{RefundEntry, RefundRequest};
use crate::payment::decisions::UnknownCause;

/// How the gateway step ends when it brings no answer to record.
pub(super) enum RefundEnd {
    /// Settle so; the reservation stays (the refund may exist, or is asked again).
    Settle(Settlement),
    /// The key was used at the gateway for another request: free the reservation,
    /// then settle so (the key is not this refund's to keep).
    Release(Settlement),
    /// The gateway refused this refund for good, nothing refunded: the row keeps the
    /// refusal (`rejected`, its amount freed), so that every later delivery of the
    /// command is answered the same from the row, without asking the gateway again
    /// (where Stripe, asked again with another row's id, would answer with an
    /// idempotency error instead of its refusal). Its reason, as answered.
    Refused(String),
}

/// A refund as the gateway is asked for it.
pub(super) struct RefundAsk<'a> {
    pub command: &'a RefundCommand,
    pub request: RefundRequest,
    pub record: Option<&'a SourcePosition>,
}

impl Processor {
    /// The refund (or the earlier one found), obtained while the lease is renewed.
    pub(super) async fn refund_keeping_lease(
        &self,
        ask: &RefundAsk<'_>,
        lease: &Lease<'_>,
        history: ChargeHistory,
    ) -> Result<Charge, RefundEnd> {
        let key = &ask.command.idempotency_key;
        let (answer, lease_kept) = self
            .with_lease(key, lease.claim, self.obtain_refund(ask, lease, history))
            .await;
        let answer = answer?;
        if let Err(fault) = self.faults.hit(FaultPoint::AfterCharge, key.as_str()).await {
            return Err(RefundEnd::Settle(Settlement::LeaveToLease(retry_unknown(
                fault.to_string(),
            ))));
        }
        if !lease_kept {
            return Err(RefundEnd::Settle(Settlement::LeaveToLease(retry_unknown(
                "lease lost during the gateway call",
            ))));
        }
        Ok(answer)
    }

    async fn obtain_refund(
        &self,
        ask: &RefundAsk<'_>,
        lease: &Lease<'_>,
        history: ChargeHistory,
    ) -> Result<Charge, RefundEnd> {
        let key = &ask.command.idempotency_key;
        let look_first = decisions::first_step(self.lookup, history) == FirstStep::LookUp;
        if look_first {
            match self.gateway.lookup_refund(key, &ask.request).await {
                Ok(Some(found)) => {
                    self.mark_at_stake(ChargeAtStake::of_refund(ask.command), ask.record);
                    return checked_refund(found, ask).map_err(RefundEnd::Settle);
                }
                Ok(None) => {}
                Err(error) => {
                    return Err(RefundEnd::Settle(Settlement::Restore(retry_knowing(
                        decisions::failed_lookup_evidence(history),
                        format!("gateway look-up before refunding failed: {error}"),
                    ))))
                }
            }
        }
        let first = if look_first {
            FirstCheck::Asks
        } else {
            FirstCheck::MaySkipWhileSurelyHeld
        };
        let lease_check = LeaseCheck::new(self.tokens.as_ref(), key, lease, first);
        self.mark_at_stake(ChargeAtStake::of_refund(ask.command), ask.record);
        match self.gateway.refund(key, &ask.request, &lease_check).await {
            Ok(answer) => Ok(answer),
            Err(error) => self.settle_refund_error(ask, error).await,
        }
    }

    /// A refund that failed, settled as [`decisions::on_charge_error`] says.
    async fn settle_refund_error(
        &self,
        ask: &RefundAsk<'_>,
        error: GatewayError,
    ) -> Result<Charge, RefundEnd> {
        let settle = |settlement| Err(RefundEnd::Settle(settlement));
        match decisions::on_charge_error(&error) {
            OnChargeError::LeaveNothingSent => settle(Settlement::LeaveToLease(retry(
                "lease lost before the refund; nothing was sent",
            ))),
            // The reservation stays: the next attempt finds it and looks up first.
            OnChargeError::RestoreRetry => {
                settle(Settlement::Restore(retry(format!("gateway: {error}"))))
            }
            OnChargeError::Resolve(cause) => self.resolve_unknown_refund(ask, &error, cause).await,
            OnChargeError::RestoreUnknown => settle(Settlement::Restore(retry_unknown(format!(
                "gateway: {error}"
            )))),
            OnChargeError::KeyReused => {
                Err(RefundEnd::Release(Settlement::Restore(key_reused().into())))
            }
            OnChargeError::Rejected => Err(RefundEnd::Refused(gateway_rejection_reason(&error))),
        }
    }

    /// An unknown outcome: ask the gateway by key before deciding anything.
    async fn resolve_unknown_refund(
        &self,
        ask: &RefundAsk<'_>,
        error: &GatewayError,
        cause: UnknownCause,
    ) -> Result<Charge, RefundEnd> {
        let key = &ask.command.idempotency_key;
        let (found, answer) =
            looked_up(|| async { self.gateway.lookup_refund(key, &ask.request).await }).await;
        let settlement = match (decisions::settle_unknown(cause, answer), found) {
            (SettleBy::Book, Ok(Some(found))) => {
                return checked_refund(found, ask).map_err(RefundEnd::Settle)
            }
            (SettleBy::RestoreUnknown, _) => Settlement::Restore(retry_unknown(format!(
                "{error}, and no refund shows for the key yet"
            ))),
            (_, Err(lookup_error)) => Settlement::LeaveToLease(retry_unknown(format!(
                "{error}, and the look-up failed ({lookup_error}): outcome unknown"
            ))),
            (_, _) => Settlement::LeaveToLease(retry_unknown(format!(
                "{error}, and the look-up holds no refund yet"
            ))),
        };
        Err(RefundEnd::Settle(settlement))
    }
}

/// A refund found by key counts only when it is for the key, charge, amount and
/// currency asked; anything else is never booked (`gateway_refund_mismatch`).
fn checked_refund(found: RefundEntry, ask: &RefundAsk<'_>) -> Result<Charge, Settlement> {
    if found.idempotency_key == ask.command.idempotency_key.as_str() && found.matches(&ask.request)
    {
        return Ok(found.answer());
    }
    tracing::error!(
        idempotency_key = %ask.command.idempotency_key,
        "the gateway's answer to a refund look-up does not match the command; nothing booked"
    );
    Err(Settlement::Restore(Attempt::Unbooked(Outcome::Rejected {
        kind: RejectionKind::Internal,
        reason: "gateway_refund_mismatch: the gateway's refund under this key is for another charge, amount or currency".to_owned(),
    })))
}
