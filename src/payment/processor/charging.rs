//! The gateway side of an attempt: charge or find the earlier charge, resolve an
//! unknown outcome by look-up, and keep the lease alive while the gateway works.

use super::*;
use crate::payment::decisions::{LookupAnswer, UnknownCause};

impl Processor {
    /// Charge, or find the charge an earlier attempt made. `Err` says how to settle.
    pub(super) async fn obtain_charge(
        &self,
        command: &PaymentCommand,
        record: Option<&SourcePosition>,
        payment_id: Uuid,
        lease: &Lease<'_>,
        history: ChargeHistory,
    ) -> Result<Charge, Settlement> {
        let key = &command.idempotency_key;
        let look_first = decisions::first_step(self.lookup, history) == FirstStep::LookUp;
        if look_first {
            if let Some(found) = self.look_up_first(command, record, history).await? {
                return Ok(found);
            }
        }
        // The lease is checked right before every POST (the adapter asks `lease_check`
        // before each), not only renewed while the call runs: a worker paused, or
        // blocked on another holder's row, since it reserved may have been replaced,
        // and then the new owner decides. No check, no POST.
        let first = if look_first {
            FirstCheck::Asks
        } else {
            FirstCheck::MaySkipWhileSurelyHeld
        };
        let lease_check = LeaseCheck::new(self.tokens.as_ref(), key, lease, first);
        let request = command.charge_request().for_payment(payment_id);
        // From here until an attempt answers for good, a charge may exist: a panic
        // before then leaves it marked for the record's dead letter.
        self.mark_at_stake(ChargeAtStake::of_charge(command), record);
        match self.gateway.charge(key, &request, &lease_check).await {
            Ok(charge) => Ok(charge),
            Err(error) => self.settle_charge_error(command, error).await,
        }
    }

    /// The look-up before any POST: the charge an earlier attempt made, `None` when
    /// none shows yet, `Err` when the look-up failed.
    async fn look_up_first(
        &self,
        command: &PaymentCommand,
        record: Option<&SourcePosition>,
        history: ChargeHistory,
    ) -> Result<Option<Charge>, Settlement> {
        // Nothing found says only that no charge shows yet: an earlier attempt's
        // request may still be queued inside the gateway. What earlier attempts
        // learnt about a charge stands (`retry`, `ChargeEvidence::Unchanged`),
        // except for a key given up on with its charge unknown: a look-up that
        // cannot answer leaves that charge as unknown as it was.
        match self.gateway.lookup(&command.idempotency_key).await {
            Ok(Some(found)) => {
                self.mark_at_stake(ChargeAtStake::of_charge(command), record);
                charge_for(found, command).map(Some)
            }
            Ok(None) => Ok(None),
            Err(error) => {
                let reason = format!("gateway look-up before charging failed: {error}");
                Err(Settlement::Restore(retry_knowing(
                    decisions::failed_lookup_evidence(history),
                    reason,
                )))
            }
        }
    }

    /// A charge that failed, settled as [`decisions::on_charge_error`] says: an
    /// unknown outcome looked up, anything else restored or left to the lease.
    async fn settle_charge_error(
        &self,
        command: &PaymentCommand,
        error: GatewayError,
    ) -> Result<Charge, Settlement> {
        match decisions::on_charge_error(&error) {
            OnChargeError::LeaveNothingSent => Err(Settlement::LeaveToLease(retry(
                "lease lost before the charge; nothing was sent",
            ))),
            OnChargeError::RestoreRetry => match error {
                GatewayError::LeaseNotHeld(LeaseLoss::Unchecked(error)) => {
                    Err(Settlement::Restore(retry(format!(
                        "lease check before the charge failed: {error}"
                    ))))
                }
                error => Err(Settlement::Restore(retry(format!("gateway: {error}")))),
            },
            OnChargeError::Resolve(cause) => self.resolve_unknown(command, &error, cause).await,
            // A 5xx after the request was sent may have charged (Stripe's rule). The
            // token is restored and the retry backs off; its reservation (fence + 1)
            // looks the charge up before any POST, and should the budget run out
            // first, the dead letter and `unresolved_charges` say the charge is unknown.
            OnChargeError::RestoreUnknown => Err(Settlement::Restore(retry_unknown(format!(
                "gateway: {error}"
            )))),
            OnChargeError::KeyReused => Err(Settlement::Restore(key_reused().into())),
            OnChargeError::Rejected => Err(Settlement::Restore(Attempt::Final(gateway_rejected(
                &error,
            )))),
        }
    }

    /// An unknown outcome (timeout, 409, an unreadable answer): ask the gateway by key
    /// before deciding anything, and never restore on a guess.
    async fn resolve_unknown(
        &self,
        command: &PaymentCommand,
        error: &GatewayError,
        cause: UnknownCause,
    ) -> Result<Charge, Settlement> {
        let key = &command.idempotency_key;
        let (found, answer) = looked_up(|| async { self.gateway.lookup(key).await }).await;
        match (decisions::settle_unknown(cause, answer), found) {
            (SettleBy::Book, Ok(Some(found))) => charge_for(found, command),
            // The gateway is still working on a request with this key (a 409), or it
            // timed out and no charge shows yet: nothing to book. Restoring is safe
            // because every later reservation (fence > 1) looks up before it POSTs,
            // and the gateway answers a repeated key with its first answer; but the
            // request may still land, so the charge stays unknown: should the token
            // vanish meanwhile (issued mode, its deadline passed), the next attempt
            // must not take "no token, no charge" for an answer.
            (SettleBy::RestoreUnknown, _) => Err(Settlement::Restore(retry_unknown(match cause {
                UnknownCause::InFlight => {
                    "a request with this key is still in flight at the gateway (HTTP 409)"
                        .to_owned()
                }
                _ => "gateway timed out and holds no charge for the key yet".to_owned(),
            }))),
            // The gateway said it decided (or answered in a way that says nothing) and
            // its ledger does not show it yet, or the look-up failed: do not trust a
            // "none"; the next owner looks again after the lease.
            (_, Err(lookup_error)) => Err(Settlement::LeaveToLease(retry_unknown(format!(
                "{error}, and the look-up failed ({lookup_error}): outcome unknown"
            )))),
            (_, _) => Err(Settlement::LeaveToLease(retry_unknown(format!(
                "{error}, and the look-up holds no charge yet"
            )))),
        }
    }

    /// Runs `work` while renewing the lease every third of it. Returns whether the
    /// lease was kept throughout.
    pub(super) async fn with_lease<T>(
        &self,
        key: &IdempotencyKey,
        claim: &Claim,
        work: impl Future<Output = T>,
    ) -> (T, bool) {
        let period = (self.tokens.policy().lease / 3).max(Duration::from_millis(10));
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        let mut kept = true;
        tokio::pin!(work);
        loop {
            tokio::select! {
                output = &mut work => return (output, kept),
                _ = ticker.tick(), if kept => match self.tokens.extend(key, claim).instrument(token_span("extend")).await {
                    Ok(Transition::Applied) => {}
                    Ok(Transition::Refused) => kept = false,
                    // A missed renewal is not a lost lease; the next tick tries again.
                    Err(error) => tracing::warn!(idempotency_key = %key, %error, "lease renewal failed"),
                },
            }
        }
    }
}

/// A charge found by key, checked: settled as [`checked_charge`] says.
pub(super) fn charge_for(
    found: LedgerEntry,
    command: &PaymentCommand,
) -> Result<Charge, Settlement> {
    checked_charge(found, command).map_err(Settlement::Restore)
}

/// A look-up's answer counts for `command` only when it names the key asked for
/// and was made for the command's amount and currency. Anything else is never
/// booked, and never taken for a reused key either (the gateway holds a charge
/// under the key that no row will record): `internal` (`gateway_charge_mismatch`),
/// answered as unbooked, so the dead letter says the charge is unknown and
/// `unresolved_charges` keeps the key for `audit`.
pub(super) fn checked_charge(
    found: LedgerEntry,
    command: &PaymentCommand,
) -> Result<Charge, Attempt> {
    let request = command.charge_request();
    let mismatch = if found.idempotency_key != command.idempotency_key.as_str() {
        // The other key is not repeated: a gateway's key could be anything.
        "the look-up answered with a charge made under another idempotency key".to_owned()
    } else if !found.matches(&request) {
        format!(
            "the gateway's charge under this key is for {} {}, the command asks {} {}",
            found.amount_minor,
            // The gateway's text, shown to operators: short, and never a card number.
            crate::redaction::mask_card_numbers(
                &found.currency.chars().take(8).collect::<String>()
            ),
            request.amount_minor,
            request.currency
        )
    } else {
        return Ok(found.charge());
    };
    tracing::error!(
        idempotency_key = %command.idempotency_key,
        "the gateway's answer to a look-up does not match the command; nothing booked"
    );
    Err(Attempt::Unbooked(Outcome::Rejected {
        kind: RejectionKind::Internal,
        reason: format!("gateway_charge_mismatch: {mismatch}"),
    }))
}

/// A look-up after an unknown outcome, retried briefly while the gateway cannot
/// answer, and what it came to.
pub(super) async fn looked_up<T, F, Fut>(
    lookup: F,
) -> (Result<Option<T>, GatewayError>, LookupAnswer)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, GatewayError>>,
{
    let found = lookup
        .retry(
            backon::ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(50))
                .with_max_times(4)
                .with_jitter(),
        )
        .when(GatewayError::is_retryable)
        .await;
    let answer = match &found {
        Ok(Some(_)) => LookupAnswer::Found,
        Ok(None) => LookupAnswer::NoneYet,
        Err(_) => LookupAnswer::Failed,
    };
    (found, answer)
}

/// The answer to a request the gateway refused for good (a charge or a refund).
pub(super) fn gateway_rejected(error: &GatewayError) -> Outcome {
    Outcome::Rejected {
        kind: RejectionKind::Invalid,
        reason: gateway_rejection_reason(error),
    }
}

/// The reason of [`gateway_rejected`]'s outcome.
pub(super) fn gateway_rejection_reason(error: &GatewayError) -> String {
    let reason = match error {
        GatewayError::Rejected { status, reason } => {
            format!("gateway_rejected: HTTP {status}: {reason}")
        }
        other => format!("gateway_rejected: {other}"),
    };
    // The gateway's own text was masked where it was read; this masks what the
    // joined text could make of it, and of any other error's words.
    crate::redaction::masked_text(&reason).into_owned()
}
