//! One command record, from bytes to an acknowledged result: read it once
//! (`inbound.rs`), process it with retries, hand the final outcome to the publisher.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use backon::Retryable;
use opentelemetry::KeyValue;
use rdkafka::message::{Message, OwnedMessage};
use tokio_util::sync::CancellationToken;

use super::answer_order::{AnswerTurn, Turn};
use super::inbound::{record_key, source_of, Inbound};
use super::publisher::{Publisher, Verdict};
use crate::fault::FaultPoint;
use crate::payment::{
    record_unresolved_stake, Attempt, ChargeAtStake, ChargeEvidence, CommandContext, Outcome,
    PaymentCommand, Processor, RejectionKind, SourcePosition,
};
use crate::retry::RetryPolicy;
use crate::token::SettleWatch;

/// One record end to end: decode, attempts under the retry policy, result and dead
/// letter published.
pub struct Handler {
    processor: Arc<Processor>,
    publisher: Publisher,
    retry: RetryPolicy,
}

/// A command answered: its outcome, and in exactly-once mode its place in the open
/// transaction, held until the partition recorded the command as settled.
pub struct Answer {
    pub outcome: Outcome,
    pub transaction: Option<super::transactions::AnswerGuard>,
}

/// The watch slot; a panic elsewhere leaves it usable (it holds plain data).
fn lock(slot: &Mutex<Option<SettleWatch>>) -> MutexGuard<'_, Option<SettleWatch>> {
    slot.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A not-yet-final attempt, as an error so backon drives the retries.
#[derive(Debug)]
struct NotYet {
    after: Duration,
    reason: String,
}

/// What one attempt's result means to the retry loop: the answer and whether it is
/// unbooked, or another try; and whether a charge may now exist that no row records,
/// given what earlier attempts left (`earlier`).
fn judge(attempt: Attempt, earlier: bool) -> (Result<(Outcome, bool), NotYet>, bool) {
    match attempt {
        Attempt::Retry {
            after,
            reason,
            charge,
        } => (
            Err(NotYet { after, reason }),
            charge.may_have_charged(earlier),
        ),
        // The token vanished while an earlier attempt's charge is unresolved: its
        // deadline passed during a restore, or the key expired with a lease that
        // outlived it. Then "the gateway holds no charge" only says the gateway has
        // not shown it yet (a 409 means it is still working on it), so look again
        // until it does (the missing-token path books it) or the budget runs out
        // (dead-lettered with the charge unknown). Answering token_missing here
        // would forget a charge that may be made a moment later.
        Attempt::Final(Outcome::Rejected {
            kind: RejectionKind::TokenMissing,
            reason,
        }) if earlier => (
            Err(NotYet {
                after: Duration::ZERO,
                reason: format!("{reason}, while an earlier attempt's charge is unresolved"),
            }),
            true,
        ),
        Attempt::Final(outcome) => (Ok((outcome, false)), earlier),
        Attempt::Unbooked(outcome) => (Ok((outcome, true)), earlier),
    }
}

impl Handler {
    /// A handler over `processor` that publishes through `publisher` and retries
    /// within `retry`.
    pub fn new(processor: Arc<Processor>, publisher: Publisher, retry: RetryPolicy) -> Self {
        Self {
            processor,
            publisher,
            retry,
        }
    }

    /// The processor.
    pub fn processor(&self) -> &Arc<Processor> {
        &self.processor
    }

    /// A fatal error of the results producer (librdkafka gives up on it for good,
    /// e.g. no idempotent-write permission): no answer can leave this process again.
    pub fn producer_fatal_error(&self) -> Option<String> {
        self.publisher.fatal_error()
    }

    /// The open-transaction bookkeeping, in exactly-once mode.
    pub(super) fn transactions(&self) -> Option<&Arc<super::transactions::Transactions>> {
        self.publisher.transactions()
    }

    /// Returns once the outcome is final and every record about it is acknowledged,
    /// or `None` when `draining` stopped the retries first, or (exactly-once) an
    /// earlier command of the partition will not answer: then nothing was published
    /// and the command's offset must stay uncommitted.
    pub async fn handle(
        &self,
        message: &OwnedMessage,
        draining: &CancellationToken,
        turn: Option<AnswerTurn>,
    ) -> Option<Answer> {
        let started = Instant::now();
        let Inbound {
            source,
            key,
            command,
        } = Inbound::read(message);
        let verdict = match command {
            Ok(command) => {
                let (outcome, attempts, charge_unknown) = self
                    .process_with_retries(&command, &source, draining)
                    .await?;
                Verdict {
                    outcome,
                    key,
                    attempts,
                    charge_unknown,
                }
            }
            Err(undecodable) => Verdict {
                outcome: Outcome::Rejected {
                    kind: RejectionKind::Invalid,
                    reason: undecodable.to_string(),
                },
                key,
                attempts: 1,
                charge_unknown: false,
            },
        };
        let answer = self.answer(message, source, verdict, started, turn).await;
        let faults = self.processor.faults();
        if answer.is_some() && faults.is_armed() {
            // Freeze or panic only: after the answer there is no step left to fail.
            // Not in `give_up_after_panics`, whose answer ends the panics.
            let key = String::from_utf8_lossy(message.key().unwrap_or_default());
            let _ = faults.hit(FaultPoint::AfterAnswer, &key).await;
        }
        answer
    }

    /// The record made its handler panic `panics` times: dead-letter it as
    /// `internal` without touching it again, so the records behind it can flow.
    pub async fn give_up_after_panics(
        &self,
        message: &OwnedMessage,
        panics: u32,
        turn: Option<AnswerTurn>,
    ) -> Option<Answer> {
        let key = record_key(message);
        // A panic after the POST (or after a look-up found the charge) left the
        // charge at stake with nobody to book it: say so, and remember the key.
        let stake = key
            .as_deref()
            .and_then(|key| self.processor.charge_at_stake(key));
        let mut reason = format!("panicked: handling this record panicked {panics} times");
        let source = source_of(message);
        if let Some(stake) = &stake {
            reason.push_str("; a charge may exist that no payment row records");
            self.remember_unresolved(stake, &source, &reason, panics)
                .await;
        }
        let outcome = Outcome::Rejected {
            kind: RejectionKind::Internal,
            reason,
        };
        let verdict = Verdict {
            outcome,
            key,
            attempts: panics,
            charge_unknown: stake.is_some(),
        };
        // Not decoded again: whatever made it panic may be in the value.
        self.answer(message, source, verdict, Instant::now(), turn)
            .await
    }

    /// Has the publisher send the dead letter (if any) and the result, and counts the
    /// outcome. In exactly-once mode both go into the same open transaction, once
    /// every earlier command of the partition entered its answer (`turn`).
    async fn answer(
        &self,
        message: &OwnedMessage,
        source: SourcePosition,
        verdict: Verdict,
        started: Instant,
        turn: Option<AnswerTurn>,
    ) -> Option<Answer> {
        let transaction = match turn {
            Some(turn) => {
                if turn.wait().await == Turn::Stopped {
                    return None;
                }
                let transaction = self.publisher.enter(&source).await;
                turn.entered();
                transaction
            }
            None => self.publisher.enter(&source).await,
        };
        let span = tracing::Span::current();
        span.record("payment.outcome", verdict.outcome.label());
        let rejection = match &verdict.outcome {
            Outcome::Rejected { kind, reason } => {
                span.record("payment.rejection", kind.as_str());
                tracing::info!(kind = kind.as_str(), %reason, partition = source.partition, offset = source.offset, "dead-lettering");
                Some(*kind)
            }
            _ => None,
        };
        let outcome = verdict.outcome.clone();
        self.publisher
            .publish_answer(message, source, verdict)
            .await;
        if let Some(kind) = rejection {
            crate::telemetry::metrics()
                .dead_letters
                .add(1, &[KeyValue::new("kind", kind.as_str())]);
        }
        let labels = [KeyValue::new("outcome", outcome.label())];
        let metrics = crate::telemetry::metrics();
        metrics.commands.add(1, &labels);
        metrics
            .processing_duration
            .record(started.elapsed().as_secs_f64(), &labels);
        Some(Answer {
            outcome,
            transaction,
        })
    }

    async fn process_with_retries(
        &self,
        command: &PaymentCommand,
        source: &SourcePosition,
        draining: &CancellationToken,
    ) -> Option<(Outcome, u32, bool)> {
        let started = Instant::now();
        let budget = self.retry.budget;
        let mut attempts = 0u32;
        // Whether an earlier attempt may have charged with no look-up resolving it.
        let charge_unknown = AtomicBool::new(false);
        // Set by an attempt that met another owner's lease: the backoff after it
        // also ends when that owner settles the token.
        let settle_watch: Arc<Mutex<Option<SettleWatch>>> = Arc::default();
        let attempt = || {
            attempts += 1;
            async {
                let earlier = charge_unknown.load(Ordering::Relaxed);
                // The processor looks the charge up first after such an attempt.
                let context = CommandContext {
                    source: Some(source),
                    trace_id: None,
                    earlier: if earlier {
                        ChargeEvidence::MayHaveCharged
                    } else {
                        ChargeEvidence::Unchanged
                    },
                };
                let (attempt, watch) = self.processor.process_watching(command, &context).await;
                *lock(&settle_watch) = watch;
                let (answer, may_have_charged) = judge(attempt, earlier);
                charge_unknown.store(may_have_charged, Ordering::Relaxed);
                answer
            }
        };
        let result = attempt
            .retry(self.retry.backoff())
            .when(|_| started.elapsed() < budget && !draining.is_cancelled())
            // A drain cuts the backoff short; the attempt after it is the last. So does
            // the settle of the token another owner held: the duplicate is answered
            // right after it instead of after its backoff.
            .sleep({
                let draining = draining.clone();
                let settle_watch = Arc::clone(&settle_watch);
                move |delay| {
                    let draining = draining.clone();
                    let watch = lock(&settle_watch).take();
                    async move {
                        let Some(watch) = watch else {
                            tokio::select! {
                                _ = tokio::time::sleep(delay) => {}
                                _ = draining.cancelled() => {}
                            }
                            return;
                        };
                        let woken_by = tokio::select! {
                            woken = watch.settled() => woken.as_str(),
                            _ = tokio::time::sleep(delay) => "backoff",
                            _ = draining.cancelled() => "drain",
                        };
                        crate::telemetry::record_settle_wait(woken_by);
                        tracing::Span::current().record("token.woken_by", woken_by);
                    }
                }
            })
            // Another worker's lease tells us when to look again; do not sleep past it.
            .adjust(|not_yet: &NotYet, delay| {
                delay.map(|d| {
                    if not_yet.after.is_zero() {
                        d
                    } else {
                        d.min(not_yet.after + Duration::from_millis(5))
                    }
                })
            })
            .notify(|not_yet, after| {
                crate::telemetry::metrics().retries.add(1, &[]);
                tracing::debug!(reason = %not_yet.reason, ?after, "retrying command");
            })
            .await;
        match result {
            Ok((outcome, unbooked)) => {
                if unbooked {
                    let reason = match &outcome {
                        Outcome::Rejected { reason, .. } => reason.as_str(),
                        _ => "the gateway charged and no payment row records it",
                    };
                    self.remember_unresolved(&ChargeAtStake::of(command), source, reason, attempts)
                        .await;
                }
                Some((outcome, attempts, unbooked))
            }
            // Not exhausted, interrupted: the partition's next owner takes it over.
            // It starts knowing nothing of a charge this member could not settle (in
            // issued mode it may find no token and no charge yet, and answer
            // token_missing), so the key is kept where `audit` lists it until a row
            // books it.
            Err(_) if draining.is_cancelled() => {
                if charge_unknown.load(Ordering::Relaxed) {
                    let reason = "handed over by a drain with the charge unknown";
                    self.remember_unresolved(&ChargeAtStake::of(command), source, reason, attempts)
                        .await;
                }
                None
            }
            Err(last) => {
                let reason = format!(
                    "retries_exhausted after {attempts} attempts: {}",
                    last.reason
                );
                let charge_unknown = charge_unknown.load(Ordering::Relaxed);
                if charge_unknown {
                    self.remember_unresolved(
                        &ChargeAtStake::of(command),
                        source,
                        &reason,
                        attempts,
                    )
                    .await;
                }
                Some((
                    Outcome::Rejected {
                        kind: RejectionKind::RetriesExhausted,
                        reason,
                    },
                    attempts,
                    charge_unknown,
                ))
            }
        }
    }

    /// A charge may exist unbooked (retries ran out, or a drain interrupted them,
    /// after an unresolved attempt; or the database refused to record a charge):
    /// besides a dead letter's `x-charge-unknown`, keep the key where `audit` lists it
    /// against the ledger until a payment row books it.
    async fn remember_unresolved(
        &self,
        command: &ChargeAtStake,
        source: &SourcePosition,
        reason: &str,
        attempts: u32,
    ) {
        let key = &command.idempotency_key;
        tracing::error!(
            idempotency_key = %key,
            attempts,
            %reason,
            "a charge may exist that no payment row records; audit lists the key until one does"
        );
        let pool = self.processor.pool();
        // A slot like an attempt's: the connection it takes is not one a payment is owed.
        let _slot = self.processor.slot().await;
        let record = || record_unresolved_stake(pool, command, source, reason, attempts);
        let recorded = record
            .retry(
                backon::ExponentialBuilder::default()
                    .with_min_delay(Duration::from_millis(100))
                    .with_max_times(5)
                    .with_jitter(),
            )
            .when(crate::retry::is_transient_sqlx)
            .await;
        if let Err(error) = recorded {
            // The dead letter's header still says so; only audit's list misses it.
            tracing::error!(
                idempotency_key = %key, %error,
                "could not record the unresolved charge for audit"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token_missing() -> Attempt {
        Attempt::Final(Outcome::Rejected {
            kind: RejectionKind::TokenMissing,
            reason: "token_missing: never issued, expired, or already consumed".to_owned(),
        })
    }

    fn retry(charge: ChargeEvidence) -> Attempt {
        Attempt::Retry {
            after: Duration::from_millis(7),
            reason: "gateway: 503".to_owned(),
            charge,
        }
    }

    #[test]
    fn a_missing_token_is_final_only_when_no_earlier_attempt_may_have_charged() {
        let (answer, unknown) = judge(token_missing(), false);
        assert!(matches!(
            answer,
            Ok((
                Outcome::Rejected {
                    kind: RejectionKind::TokenMissing,
                    ..
                },
                false
            ))
        ));
        assert!(!unknown);

        let (answer, unknown) = judge(token_missing(), true);
        let not_yet = answer.expect_err("looked at again, not answered");
        assert!(not_yet.reason.contains("unresolved"), "{}", not_yet.reason);
        assert!(unknown, "still unknown when the budget ends");
    }

    #[test]
    fn what_attempts_learn_about_a_charge_is_folded_over_them() {
        assert!(judge(retry(ChargeEvidence::MayHaveCharged), false).1);
        assert!(judge(retry(ChargeEvidence::Unchanged), true).1);
        let (answer, unknown) = judge(retry(ChargeEvidence::Unchanged), false);
        assert_eq!(answer.expect_err("a retry").after, Duration::from_millis(7));
        assert!(!unknown);
        // Final answers keep what was known; only an unbooked one is marked so.
        let declined = Attempt::Final(Outcome::Rejected {
            kind: RejectionKind::Invalid,
            reason: "gateway_rejected: HTTP 400".to_owned(),
        });
        assert!(matches!(judge(declined, true), (Ok((_, false)), true)));
        let unbooked = Attempt::Unbooked(Outcome::Rejected {
            kind: RejectionKind::Internal,
            reason: "recording the charge failed".to_owned(),
        });
        assert!(matches!(judge(unbooked, false), (Ok((_, true)), false)));
    }
}
