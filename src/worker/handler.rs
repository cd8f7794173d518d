//! One command record, from bytes to an acknowledged result: read it once
//! (`inbound.rs`), process it with retries, hand the final outcome to the publisher.

use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, Retryable};
use rdkafka::message::{Message, OwnedMessage};
use tokio_util::sync::CancellationToken;

use super::answer_sink::{AnswerHold, AnswerPlace, AnswerSink};
use super::inbound::{charge_flag, record_key, source_of, Inbound};
use super::publisher::{Publisher, Verdict};
use super::record_echo::KeyScan;
use crate::fault::FaultPoint;
use crate::payment::{
    record_unresolved_stake, Attempt, ChargeAtStake, ChargeEvidence, Command, CommandContext,
    Outcome, Processor, RejectionKind, SourcePosition, Watched, WAITING_FOR_PAYMENT,
};
use crate::retry::RetryPolicy;
use crate::telemetry::events::{
    CommandFinished, CommandRetried, RecordDeadLettered, SettleWaitEnded,
};
use crate::token::SettleWatch;

/// One record end to end: decode, attempts under the retry policy, result and dead
/// letter published.
pub struct Handler {
    processor: Arc<Processor>,
    publisher: Publisher,
    retry: RetryPolicy,
}

/// A command answered: its outcome, and what it holds until the partition recorded
/// the command as settled (exactly-once: its place in the open transaction).
pub struct Answer {
    pub outcome: Outcome,
    pub hold: AnswerHold,
}

/// A not-yet-final attempt: why, and how long another owner's lease still runs.
#[derive(Debug)]
struct NotYet {
    after: Duration,
    reason: String,
}

/// What a delivery's attempts so far leave to the next one.
#[derive(Debug)]
struct Attempts {
    /// Attempts made.
    made: u32,
    /// Whether an earlier attempt may have charged with no look-up resolving it.
    charge_unknown: bool,
    /// The owner this delivery last reserved the token as: a reservation after our
    /// own restore inherits nothing, one after anyone else's inherits their charge.
    previous_claim: Option<String>,
    /// The owner the last attempt asked to reserve as without an answer.
    lost_reservation: Option<String>,
}

impl Attempts {
    /// None made yet; a record `flagged` so starts with the charge unknown.
    fn new(flagged: ChargeEvidence) -> Self {
        Self {
            made: 0,
            charge_unknown: flagged == ChargeEvidence::MayHaveCharged,
            previous_claim: None,
            lost_reservation: None,
        }
    }
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
        // A refusal books nothing: after an attempt that may have charged (or a record
        // flagged so), the charge is still unknown, and the answer says so.
        Attempt::Final(outcome @ Outcome::Rejected { .. }) if earlier => {
            (Ok((outcome, true)), earlier)
        }
        Attempt::Final(outcome) => (Ok((outcome, false)), earlier),
        Attempt::Unbooked(outcome) => (Ok((outcome, true)), earlier),
    }
}

/// The wait before the next attempt: `delay`, cut short by a drain (the attempt after
/// it is the last), and, when the last attempt met another owner's live lease, by
/// that owner's settle, so a duplicate is answered right after it.
async fn back_off(delay: Duration, watch: Option<SettleWatch>, draining: &CancellationToken) {
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
    crate::telemetry::emit(SettleWaitEnded { woken_by });
    tracing::Span::current().record("token.woken_by", woken_by);
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

    /// Where answers go, chosen when the publisher was made.
    pub(super) fn sink(&self) -> &AnswerSink {
        self.publisher.sink()
    }

    /// Returns once the outcome is final and every record about it is acknowledged,
    /// or `None` when `draining` stopped the retries first, or (exactly-once) an
    /// earlier command of the partition will not answer: then nothing was published
    /// and the command's offset must stay uncommitted.
    pub async fn handle(
        &self,
        message: &OwnedMessage,
        draining: &CancellationToken,
        place: AnswerPlace,
    ) -> Option<Answer> {
        let started = Instant::now();
        let Inbound {
            source,
            key,
            command,
            flagged,
            key_scan,
        } = Inbound::read(message);
        let verdict = match command {
            Ok(command) => {
                let (outcome, attempts, charge_unknown) = self
                    .process_with_retries(&command, &source, flagged, draining)
                    .await?;
                Verdict {
                    outcome,
                    key,
                    attempts,
                    charge_unknown,
                    key_scan,
                }
            }
            // A flagged record keeps its flag: nothing here settles its charge.
            Err(undecodable) => Verdict {
                outcome: Outcome::Rejected {
                    kind: RejectionKind::Invalid,
                    reason: undecodable.to_string(),
                },
                key,
                attempts: 1,
                charge_unknown: flagged == ChargeEvidence::MayHaveCharged,
                key_scan,
            },
        };
        let answer = self.answer(message, source, verdict, started, place).await;
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
        place: AnswerPlace,
    ) -> Option<Answer> {
        let key = record_key(message);
        let source = source_of(message);
        // A panic after the POST (or after a look-up found the charge) left the
        // charge at stake with nobody to book it: say so, and remember the key (a
        // record without a Kafka key is found by its position).
        let stake = self.processor.charge_at_stake_of(key.as_deref(), &source);
        let mut reason = format!("panicked: handling this record panicked {panics} times");
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
            // A record flagged so keeps its flag whatever happened to it here.
            charge_unknown: stake.is_some()
                || charge_flag(message) == ChargeEvidence::MayHaveCharged,
            key_scan: KeyScan::of_record(message.key()),
        };
        // Not decoded again: whatever made it panic may be in the value.
        self.answer(message, source, verdict, Instant::now(), place)
            .await
    }

    /// Has the publisher send the dead letter (if any) and the result, and counts the
    /// outcome. In exactly-once mode both go into the same open transaction, once
    /// every earlier command of the partition entered its answer (`place`).
    async fn answer(
        &self,
        message: &OwnedMessage,
        source: SourcePosition,
        verdict: Verdict,
        started: Instant,
        place: AnswerPlace,
    ) -> Option<Answer> {
        let hold = self.sink().enter(place, &source).await?;
        let span = tracing::Span::current();
        span.record("payment.outcome", verdict.outcome.label());
        if let Outcome::Rejected { kind, reason } = &verdict.outcome {
            span.record("payment.rejection", kind.as_str());
            crate::telemetry::emit(RecordDeadLettered {
                kind: kind.as_str(),
                reason,
                partition: source.partition,
                offset: source.offset,
            });
        }
        let outcome = verdict.outcome.clone();
        self.publisher
            .publish_answer(message, source, verdict)
            .await;
        crate::telemetry::emit(CommandFinished {
            outcome: outcome.label(),
            duration: started.elapsed(),
        });
        Some(Answer { outcome, hold })
    }

    /// Attempts until one is final, the retry budget is spent or a drain stops the
    /// retries. Returns the outcome, the attempts made and whether the answer must
    /// say a charge may exist unbooked; `None` when a drain interrupted the retries
    /// (the partition's next owner takes the command over).
    ///
    /// `flagged`: the record itself says a charge may exist (`x-charge-unknown: true`
    /// on a redriven dead letter): the first attempt looks the charge up before any
    /// POST, and the flag is kept unless an answer is booked.
    async fn process_with_retries(
        &self,
        command: &Command,
        source: &SourcePosition,
        flagged: ChargeEvidence,
        draining: &CancellationToken,
    ) -> Option<(Outcome, u32, bool)> {
        let started = Instant::now();
        let mut delays = self.retry.backoff().build();
        let mut attempts = Attempts::new(flagged);
        let last = loop {
            let (answer, watch) = self.attempt(command, source, &mut attempts).await;
            let not_yet = match answer {
                Ok((outcome, unbooked)) => {
                    return Some(
                        self.final_answer(command, source, outcome, unbooked, attempts.made)
                            .await,
                    );
                }
                Err(not_yet) => not_yet,
            };
            let Some(delay) = self.next_delay(&mut delays, &not_yet, started, draining) else {
                break not_yet;
            };
            crate::telemetry::emit(CommandRetried {
                reason: &not_yet.reason,
                after: delay,
            });
            back_off(delay, watch, draining).await;
        };
        if draining.is_cancelled() {
            self.hand_over(command, source, &attempts).await;
            return None;
        }
        Some(
            self.retries_exhausted(command, source, last, &attempts)
                .await,
        )
    }

    /// One attempt, given what the earlier ones left (`attempts`, updated with what
    /// this one learned): its judged answer, and the settle of another owner's live
    /// lease to wait for before the next.
    async fn attempt(
        &self,
        command: &Command,
        source: &SourcePosition,
        attempts: &mut Attempts,
    ) -> (Result<(Outcome, bool), NotYet>, Option<SettleWatch>) {
        attempts.made += 1;
        let context = CommandContext {
            source: Some(source),
            trace_id: None,
            earlier: ChargeEvidence::from_unknown(attempts.charge_unknown),
            previous_claim: attempts.previous_claim.as_deref(),
            lost_reservation: attempts.lost_reservation.as_deref(),
        };
        let Watched {
            attempt,
            watch,
            claimed_as,
            lost_reservation: lost,
        } = self.processor.process_watching(command, &context).await;
        attempts.lost_reservation = lost;
        if claimed_as.is_some() {
            attempts.previous_claim = claimed_as;
        }
        let (answer, may_have_charged) = judge(attempt, attempts.charge_unknown);
        attempts.charge_unknown = may_have_charged;
        (answer, watch)
    }

    /// A final answer after `attempts` attempts; an unbooked one first keeps the key
    /// where `audit` lists it.
    async fn final_answer(
        &self,
        command: &Command,
        source: &SourcePosition,
        outcome: Outcome,
        unbooked: bool,
        attempts: u32,
    ) -> (Outcome, u32, bool) {
        if unbooked {
            let reason = match &outcome {
                Outcome::Rejected { reason, .. } => reason.as_str(),
                _ => "the gateway charged and no payment row records it",
            };
            self.remember_unresolved(&ChargeAtStake::of(command), source, reason, attempts)
                .await;
        }
        (outcome, attempts, unbooked)
    }

    /// The wait before another attempt, or `None` when there is none: a drain began,
    /// or the budget is spent.
    fn next_delay(
        &self,
        delays: &mut impl Iterator<Item = Duration>,
        not_yet: &NotYet,
        started: Instant,
        draining: &CancellationToken,
    ) -> Option<Duration> {
        // A drain lets the attempt running when it began finish, then no other.
        if draining.is_cancelled() || started.elapsed() >= self.retry.budget {
            return None;
        }
        let delay = delays.next()?;
        // Another worker's lease tells us when to look again; do not sleep past it.
        let delay = if not_yet.after.is_zero() {
            delay
        } else {
            delay.min(not_yet.after + Duration::from_millis(5))
        };
        Some(delay)
    }

    /// A drain interrupted the retries.
    async fn hand_over(&self, command: &Command, source: &SourcePosition, attempts: &Attempts) {
        // Not exhausted, interrupted: the partition's next owner takes it over.
        // It starts knowing nothing of a charge this member could not settle (in
        // issued mode it may find no token and no charge yet, and answer
        // token_missing), so the key is kept where `audit` lists it until a row
        // books it.
        if attempts.charge_unknown {
            let reason = "handed over by a drain with the charge unknown";
            self.remember_unresolved(&ChargeAtStake::of(command), source, reason, attempts.made)
                .await;
        }
    }

    /// The retry budget ran out with no final attempt (`last` said why): the answer
    /// is a `retries_exhausted` dead letter.
    async fn retries_exhausted(
        &self,
        command: &Command,
        source: &SourcePosition,
        last: NotYet,
        attempts: &Attempts,
    ) -> (Outcome, u32, bool) {
        let Attempts {
            made,
            charge_unknown,
            ..
        } = *attempts;
        // A refund whose payment never showed within the budget: nothing was
        // reserved or sent, and the answer says what the producer must fix.
        if let (Command::Refund(refund), true, false) =
            (command, last.reason == WAITING_FOR_PAYMENT, charge_unknown)
        {
            let reason = format!("{WAITING_FOR_PAYMENT}, within {made} attempts");
            // Kept, so that a replay after the charge arrived refunds nothing the
            // first delivery refused; unless the key has a row already (another
            // delivery got there after the payment was booked): that row answers.
            let outcome = match self.processor.keep_refund_refusal(refund, &reason).await {
                Some(answered) => answered,
                None => Outcome::Rejected {
                    kind: RejectionKind::Invalid,
                    reason,
                },
            };
            return (outcome, made, false);
        }
        let reason = format!("retries_exhausted after {made} attempts: {}", last.reason);
        if charge_unknown {
            self.remember_unresolved(&ChargeAtStake::of(command), source, &reason, made)
                .await;
        }
        (
            Outcome::Rejected {
                kind: RejectionKind::RetriesExhausted,
                reason,
            },
            made,
            charge_unknown,
        )
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
            .when(crate::database_errors::is_transient_sqlx)
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
        // A refusal books nothing: after an attempt that may have charged it is
        // answered flagged; without one it is a plain refusal. A booked answer
        // (succeeded, declined, duplicate) is never flagged.
        let refused = || {
            Attempt::Final(Outcome::Rejected {
                kind: RejectionKind::Invalid,
                reason: "gateway_rejected: HTTP 400".to_owned(),
            })
        };
        assert!(matches!(judge(refused(), true), (Ok((_, true)), true)));
        assert!(matches!(judge(refused(), false), (Ok((_, false)), false)));
        let booked = Attempt::Final(Outcome::Succeeded {
            payment_id: uuid::Uuid::nil(),
            transaction_id: "txn_1".to_owned(),
        });
        assert!(matches!(judge(booked, true), (Ok((_, false)), true)));
        let unbooked = Attempt::Unbooked(Outcome::Rejected {
            kind: RejectionKind::Internal,
            reason: "recording the charge failed".to_owned(),
        });
        assert!(matches!(judge(unbooked, false), (Ok((_, true)), false)));
    }
}
