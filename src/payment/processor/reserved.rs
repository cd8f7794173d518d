//! The attempt once its token is reserved: the payment (or refund) transaction, then the token
//! confirmed, restored or left to its lease as the transaction's `Settlement` says.

use super::*;
use crate::telemetry::events::{SettleRefused, SettleTransition};

impl Processor {
    /// The payment transaction, then the token settled as it says.
    pub(super) async fn run_reserved(
        &self,
        key: &IdempotencyKey,
        context: &CommandContext<'_>,
        lease: &Lease<'_>,
        transaction: impl Future<Output = Settlement>,
    ) -> Attempt {
        let claim = lease.claim;
        let settlement = match self
            .faults
            .hit(FaultPoint::AfterReserve, key.as_str())
            .await
        {
            Err(fault) => Settlement::Restore(retry(fault.to_string())),
            Ok(()) => {
                transaction
                    .instrument(tracing::info_span!(
                        "payment transaction",
                        otel.kind = "internal",
                        db.system.name = "postgresql",
                        token.fence = claim.fence,
                    ))
                    .await
            }
        };
        match settlement {
            Settlement::Confirm {
                payment_id,
                fingerprint,
                outcome,
            } => {
                if let Err(fault) = self.faults.hit(FaultPoint::AfterCommit, key.as_str()).await {
                    // The payment is durable; the token stays `processing` until its lease
                    // expires, and the next attempt finds the row (a duplicate).
                    tracing::warn!(idempotency_key = %key, %fault, "token left processing");
                    return outcome.into();
                }
                self.confirm_token(key, claim, payment_id, &fingerprint)
                    .await;
                outcome.into()
            }
            Settlement::Restore(attempt) => {
                let attempt = attempt.knowing(context.earlier);
                self.restore_token(key, claim).await;
                attempt
            }
            Settlement::LeaveToLease(attempt) => attempt.knowing(context.earlier),
            Settlement::Settled(outcome) => {
                if let Err(fault) = self.faults.hit(FaultPoint::AfterCommit, key.as_str()).await {
                    // Token and payment were committed together: nothing is left behind.
                    tracing::warn!(idempotency_key = %key, %fault, "stopped after commit; token already completed");
                }
                outcome.into()
            }
        }
    }

    /// `processing → completed` once the payment is committed, retried while the
    /// store fails transiently; a refusal or a failure is logged, never answered:
    /// the row decides for the next owner.
    async fn confirm_token(
        &self,
        key: &IdempotencyKey,
        claim: &Claim,
        payment_id: Uuid,
        fingerprint: &Fingerprint,
    ) {
        let confirmed = (|| {
            self.tokens
                .confirm(key, claim, payment_id, fingerprint.as_str())
                .instrument(token_span("confirm"))
        })
        .retry(settle_backoff())
        .when(TokenError::is_retryable)
        .notify(|error, after| note_settle_retry("confirm", key, error, after))
        .await;
        match confirmed {
            Ok(Transition::Applied) => {
                tracing::debug!(idempotency_key = %key, "token processing -> completed")
            }
            Ok(Transition::Refused) => crate::telemetry::emit(SettleRefused {
                key,
                transition: SettleTransition::Confirm,
            }),
            Err(error) => {
                token_failure("confirm", &error);
                tracing::warn!(
                    idempotency_key = %key, %error,
                    "confirm failed; the lease will expire and the row decides"
                )
            }
        }
    }

    /// `processing → pending`, retried while the store fails transiently; a refusal
    /// or a failure is logged, and the lease expires instead.
    async fn restore_token(&self, key: &IdempotencyKey, claim: &Claim) {
        let retried = std::sync::atomic::AtomicBool::new(false);
        let restored = (|| {
            self.tokens
                .restore(key, claim)
                .instrument(token_span("restore"))
        })
        .retry(settle_backoff())
        .when(TokenError::is_retryable)
        .notify(|error, after| {
            retried.store(true, std::sync::atomic::Ordering::Relaxed);
            note_settle_retry("restore", key, error, after)
        })
        .await;
        match restored {
            Ok(Transition::Applied) => {
                tracing::debug!(idempotency_key = %key, "token processing -> pending")
            }
            // The attempt that timed out may have reached the store and restored
            // the token already; nobody else is implied.
            Ok(Transition::Refused) if retried.load(std::sync::atomic::Ordering::Relaxed) => {
                tracing::debug!(idempotency_key = %key, "restore refused after a retry")
            }
            Ok(Transition::Refused) => crate::telemetry::emit(SettleRefused {
                key,
                transition: SettleTransition::Restore,
            }),
            Err(error) => {
                token_failure("restore", &error);
                tracing::warn!(
                    idempotency_key = %key, %error,
                    "restore failed; the lease will expire instead"
                )
            }
        }
    }
}
