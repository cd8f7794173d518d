//! One attempt at one command: reserve the token, run the one Postgres transaction
//! around the gateway charge, then confirm or restore the token.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::Retryable;
use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};
use tracing::field::Empty;
use tracing::Instrument;
use uuid::Uuid;

use super::decisions::{self, ChargeHistory, FirstStep, GatewayLookup, OnChargeError, SettleBy};
use super::outcome::{Attempt, ChargeEvidence, OriginalAnswer, Outcome, RejectionKind};
use super::persistence::{
    self, Insertion, PaymentRecord, PaymentStatus, Remembered, RowContext, SourcePosition,
};
use super::{Fingerprint, PaymentCommand};
use crate::fault::{FaultPoint, Faults};
use crate::gateway::{Charge, ChargeStatus, GatewayError, LeaseLoss, LedgerEntry, PaymentGateway};
use crate::retry::{classify_sqlx, DatabaseFailure};
use crate::token::{
    Claim, IdempotencyKey, Predecessor, Reservation, SettleWatch, TokenError, TokenStore,
    Transition,
};

pub use at_stake::ChargeAtStake;

use answers::*;
use lease_check::{FirstCheck, LeaseCheck};
use stalls::Stall;
use token_calls::*;

mod answers;
mod at_stake;
mod charging;
mod lease_check;
mod stalls;
mod token_calls;

/// How a token that is not there is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Absence {
    /// `Missing`: never issued, expired or consumed; no charge unless the gateway shows one.
    Missing,
    /// `Unsettled`: expired while an attempt held it; its charge is unknown.
    ExpiredWhileHeld,
}

/// Where a command came from, carried onto its payment row.
#[derive(Debug, Clone, Copy, Default)]
pub struct CommandContext<'a> {
    /// Where the command came from (stored on the row).
    pub source: Option<&'a SourcePosition>,
    /// The trace the attempt runs in (stored on the row).
    pub trace_id: Option<&'a str>,
    /// What earlier attempts at this delivery learnt about a charge. After one that
    /// may have charged, the attempt looks the charge up before any POST whatever its
    /// fence: the token may have vanished meanwhile (its deadline passed during a
    /// restore) and a new one starts at fence 1.
    pub earlier: ChargeEvidence,
    /// The owner this delivery's previous attempt reserved the token as, if it did
    /// ([`Watched::claimed_as`]). A reservation whose predecessor is anyone else
    /// inherits an outcome this delivery cannot know (see [`Predecessor`]).
    pub previous_claim: Option<&'a str>,
    /// The owner this delivery's previous attempt asked to reserve the token as and
    /// got no answer ([`Watched::lost_reservation`]): the reservation may have been
    /// made, and nobody will settle it. The attempt takes the token back from it at
    /// once instead of waiting out its lease ([`TokenStore::reserve_reclaiming`]).
    pub lost_reservation: Option<&'a str>,
}

impl CommandContext<'_> {
    /// What this attempt knows of an earlier charge, given who held the token before
    /// its reservation: a stranger's (a holder killed after its POST, or whose
    /// look-ups failed) is a charge that may exist, exactly as if this delivery had
    /// sent it and lost the answer.
    pub fn evidence_after(&self, predecessor: &Predecessor) -> ChargeEvidence {
        // The lost reservation was this delivery's own, and did nothing.
        if predecessor.is_stranger(self.previous_claim)
            && predecessor.is_stranger(self.lost_reservation)
        {
            ChargeEvidence::MayHaveCharged
        } else {
            self.earlier
        }
    }
}

/// What an attempt leaves beside its answer, for the retry loop.
#[derive(Default)]
struct Aside {
    watch: Option<SettleWatch>,
    claimed_as: Option<String>,
    lost_reservation: Option<String>,
}

/// One attempt as the retry loop sees it.
#[derive(Debug)]
pub struct Watched {
    /// What the attempt came to.
    pub attempt: Attempt,
    /// Set when the attempt met another owner's live lease: ends when that owner
    /// settles the token.
    pub watch: Option<SettleWatch>,
    /// The owner the attempt reserved the token as, when it did: the next attempt of
    /// the same delivery passes it as [`CommandContext::previous_claim`].
    pub claimed_as: Option<String>,
    /// The owner the attempt asked to reserve the token as when no answer came (a
    /// timeout, a connection lost): the next attempt of the same delivery passes it
    /// as [`CommandContext::lost_reservation`].
    pub lost_reservation: Option<String>,
}

/// A reservation and how long it is certainly still ours.
struct Lease<'a> {
    claim: &'a Claim,
    /// Half the lease after the reserve request was sent: whatever the network and
    /// scheduling did since, the lease Redis granted runs at least until then.
    surely_held_until: tokio::time::Instant,
}

impl Lease<'_> {
    /// Nobody can have taken over a lease that is certainly still live, so checking
    /// it would only cost a round trip.
    fn surely_held(&self) -> bool {
        tokio::time::Instant::now() < self.surely_held_until
    }
}

/// What the transaction leaves for the token once it has ended.
enum Settlement {
    /// A final outcome is durable in Postgres: `processing → completed`.
    Confirm {
        payment_id: Uuid,
        fingerprint: Fingerprint,
        outcome: Outcome,
    },
    /// Nothing was charged (or the refusal is final and charge-free): `processing → pending`.
    Restore(Attempt),
    /// A charge may have happened and we could not find out, or the token is no
    /// longer ours: leave it to its lease, so the next owner (fence + 1) looks the
    /// charge up before charging.
    LeaveToLease(Attempt),
    /// The token store shares the payments database and the token was completed by
    /// the payment's own transaction: nothing is left to do for the token.
    Settled(Outcome),
}

/// How the transaction on its connection ended: settled, or raced by another holder
/// that committed this key while we waited on the unique index (read again once the
/// connection is back in the pool).
enum Transacted {
    Settled(Settlement),
    Raced,
}

impl From<Settlement> for Transacted {
    fn from(settlement: Settlement) -> Self {
        Self::Settled(settlement)
    }
}

/// Processes one attempt of one command: token, row, charge, settlement (one connection at a time).
pub struct Processor {
    tokens: Arc<dyn TokenStore>,
    gateway: Arc<dyn PaymentGateway>,
    pool: PgPool,
    lookup: GatewayLookup,
    worker_id: String,
    faults: Faults,
    /// Attempts running at once in this process, one per payment-pool connection.
    /// An attempt holds at most one connection at any moment (the Postgres token
    /// store settles inside the payment transaction and renews leases on its own
    /// pool), so with no more attempts than connections the pool can never make one
    /// wait. Commands beyond it queue here, before reserving their token, holding
    /// nothing and with no acquire timeout to run into.
    attempts: Arc<tokio::sync::Semaphore>,
    /// Keys whose charge may exist while no attempt settled it (see [`ChargeAtStake`]).
    at_stake: Mutex<HashMap<String, at_stake::Stake>>,
}

impl Processor {
    /// A processor over these stores and gateway; its attempts are owned by `<worker_id>:<uuid>`, faults armed from the environment (none in production).
    pub fn new(
        tokens: Arc<dyn TokenStore>,
        gateway: Arc<dyn PaymentGateway>,
        pool: PgPool,
        lookup: GatewayLookup,
        worker_id: impl Into<String>,
    ) -> Self {
        Self {
            tokens,
            gateway,
            lookup,
            worker_id: worker_id.into(),
            faults: Faults::from_env(),
            attempts: Arc::new(tokio::sync::Semaphore::new(attempt_slots(&pool))),
            at_stake: Mutex::new(HashMap::new()),
            pool,
        }
    }

    /// How many attempts may run at once (the payment pool's size).
    pub fn attempt_slots(&self) -> usize {
        attempt_slots(&self.pool)
    }

    /// One of the attempts' slots, for work outside an attempt that needs a
    /// payment-pool connection (recording an unresolved charge): taken like an
    /// attempt's, so it never takes a connection an admitted attempt is owed.
    /// `None` only if the slots were closed, which nothing does.
    pub async fn slot(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        self.attempts.acquire().await.ok()
    }

    /// The same processor with `faults` armed (tests only).
    pub fn with_faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    /// The faults armed for this processor's commands (none in production).
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// The token store.
    pub fn tokens(&self) -> &Arc<dyn TokenStore> {
        &self.tokens
    }

    /// The payment pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// One attempt. Never panics and never returns an error: failures become
    /// [`Attempt::Retry`] (transient) or a final `Outcome::Rejected`.
    pub async fn process(&self, command: &PaymentCommand, context: &CommandContext<'_>) -> Attempt {
        // Never closed, so acquiring only fails if that changes: then run unbounded.
        let _slot = self.attempts.acquire().await.ok();
        self.attempt(command, context, &mut Aside::default()).await
    }

    /// `process`, and when the attempt met another owner's live lease, a watch that
    /// ends when that owner settles the token: the caller waits for whichever comes
    /// first, the watch or its backoff, holding no attempt slot meanwhile.
    ///
    /// The wait for a slot is not cut short by a drain: a command admitted on a
    /// partition gets its attempt even while the partition is revoked. Left to the
    /// next owner instead, its offset would hold the partition's commit below
    /// commands that did answer, and the next owner would answer those again.
    pub async fn process_watching(
        &self,
        command: &PaymentCommand,
        context: &CommandContext<'_>,
    ) -> Watched {
        // Never closed, so acquiring only fails if that changes: then run unbounded.
        let _slot = self.attempts.acquire().await.ok();
        let mut aside = Aside::default();
        let attempt = self.attempt(command, context, &mut aside).await;
        Watched {
            attempt,
            watch: aside.watch,
            claimed_as: aside.claimed_as,
            lost_reservation: aside.lost_reservation,
        }
    }

    async fn attempt(
        &self,
        command: &PaymentCommand,
        context: &CommandContext<'_>,
        aside: &mut Aside,
    ) -> Attempt {
        let mut attempt = self.decide(command, context, aside).await;
        // A final answer settles what was at stake (an unbooked one is recorded by
        // the caller); a retry leaves it, so a panic in a later attempt still knows.
        if !matches!(attempt, Attempt::Retry { .. }) {
            self.settle_stake(command.idempotency_key.as_str());
        }
        if let Attempt::Final(Outcome::Duplicate {
            payment_id,
            original,
        }) = &mut attempt
        {
            let span = tracing::Span::current();
            let traced = crate::telemetry::trace_ids(&span).is_some();
            // Decided from a token tombstone: the row tells the original answer.
            if original.is_none() || traced {
                if let Ok(Some(row)) = self.find_existing(&command.idempotency_key).await {
                    if row.id == *payment_id {
                        *original = original_answer(&row);
                        // A duplicate's trace points at the trace that charged.
                        if let (true, Some(trace_id), Some(span_id)) =
                            (traced, &row.trace_id, &row.span_id)
                        {
                            crate::telemetry::link_to(&span, trace_id, span_id);
                        }
                    }
                }
            }
        }
        attempt
    }

    async fn decide(
        &self,
        command: &PaymentCommand,
        context: &CommandContext<'_>,
        aside: &mut Aside,
    ) -> Attempt {
        let key = &command.idempotency_key;
        // A command this gateway cannot take at all (an amount Stripe cannot
        // express) is refused before its token or the gateway are touched.
        if let Err(reason) = self.gateway.accepts(&command.charge_request()) {
            return Attempt::Final(Outcome::Rejected {
                kind: RejectionKind::Invalid,
                reason,
            });
        }
        let fingerprint = command.fingerprint();
        // A fresh owner per attempt: a stale attempt of this same worker is fenced too.
        let owner = format!("{}:{}", self.worker_id, Uuid::new_v4().simple());
        // Taken before the request: the lease Redis grants starts later than this.
        let asked_at = tokio::time::Instant::now();
        let span = token_span("reserve");
        let reserving = match context.lost_reservation {
            Some(lost) => self.tokens.reserve_reclaiming(key, &owner, lost),
            None => self.tokens.reserve(key, &owner),
        };
        let reservation = match reserving.instrument(span.clone()).await {
            Ok(reservation) => reservation,
            Err(error) => {
                token_failure("reserve", &error);
                // The request may have reached the store and reserved: nobody would
                // settle that reservation, so the next attempt takes it back.
                aside.lost_reservation = Some(owner);
                return retry(format!("token reserve failed: {error}"));
            }
        };
        let verdict = verdict_label(&reservation);
        span.record("token.verdict", verdict);
        tracing::Span::current().record("token.verdict", verdict);
        tracing::debug!(idempotency_key = %key, ?reservation, "token reserve");
        match reservation {
            Reservation::Reserved { fence, predecessor } => {
                let inherited = context.evidence_after(&predecessor);
                if inherited != context.earlier {
                    tracing::warn!(
                        idempotency_key = %key,
                        fence,
                        "the token's previous holder may have charged: looked up first"
                    );
                }
                let context = CommandContext {
                    earlier: inherited,
                    ..*context
                };
                let claim = Claim { owner, fence };
                let lease = Lease {
                    claim: &claim,
                    surely_held_until: asked_at + self.tokens.policy().lease / 2,
                };
                let attempt = self
                    .run_reserved(command, &fingerprint, &context, &lease)
                    .await;
                aside.claimed_as = Some(claim.owner);
                attempt
            }
            Reservation::InFlight { lease_left } => {
                // Woken by the holder's settle rather than only by the backoff.
                aside.watch = self.tokens.watch_settle(key).await;
                Attempt::Retry {
                    after: lease_left,
                    reason: "token in flight at another worker".to_owned(),
                    charge: ChargeEvidence::Unchanged,
                }
            }
            Reservation::Completed {
                payment_id,
                fingerprint: stored,
            } => match stored {
                Some(stored) if stored == fingerprint.as_str() => {
                    Attempt::Final(Outcome::Duplicate {
                        payment_id,
                        original: None,
                    })
                }
                Some(_) => key_reused().into(),
                None => {
                    self.decide_from_postgres(key, &fingerprint, payment_id)
                        .await
                }
            },
            Reservation::Missing => {
                self.recover_missing(command, &fingerprint, context, Absence::Missing)
                    .await
            }
            Reservation::Unsettled => {
                self.recover_missing(command, &fingerprint, context, Absence::ExpiredWhileHeld)
                    .await
            }
        }
    }

    async fn decide_from_postgres(
        &self,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        tombstone_payment: Uuid,
    ) -> Attempt {
        match self.find_existing(key).await {
            Ok(Some(existing)) => outcome_for_existing(&existing, fingerprint).into(),
            Ok(None) => {
                tracing::warn!(idempotency_key = %key, "completed token without a payment row");
                Attempt::Final(Outcome::Duplicate {
                    payment_id: tombstone_payment,
                    original: None,
                })
            }
            Err(error) => database_failure("payment look-up", &error),
        }
    }

    async fn find_existing(
        &self,
        key: &IdempotencyKey,
    ) -> Result<Option<PaymentRecord>, sqlx::Error> {
        let mut conn = self.pool.acquire().await?;
        let stall = Stall::default();
        let found = stall
            .bounded(
                "payment look-up",
                persistence::find_payment(&mut conn, key.as_str()),
            )
            .await;
        stall.release(conn);
        found
    }

    /// `issued` mode, token missing or expired while held (docs/CONTRACT.md,
    /// "Outcomes"): Postgres, then the gateway, decide. A token that expired while
    /// an attempt held it never means "nothing charged": that attempt's request may
    /// still land, so no charge found yet is a retry with the charge unknown.
    async fn recover_missing(
        &self,
        command: &PaymentCommand,
        fingerprint: &Fingerprint,
        context: &CommandContext<'_>,
        absence: Absence,
    ) -> Attempt {
        let key = &command.idempotency_key;
        match self.find_existing(key).await {
            Ok(Some(existing)) => return outcome_for_existing(&existing, fingerprint).into(),
            Ok(None) => {}
            Err(error) => return database_failure("payment look-up", &error),
        }
        let charge = match (self.gateway.lookup(key).await, absence) {
            // The key's charge was made for another request (or the gateway answered
            // for another key): never book it as this one.
            (Ok(Some(found)), _) => {
                self.mark_at_stake(command, context.source);
                match charging::checked_charge(found, command) {
                    Ok(charge) => charge,
                    Err(mismatch) => return mismatch,
                }
            }
            (Ok(None), Absence::Missing) => {
                return Attempt::Final(Outcome::Rejected {
                    kind: RejectionKind::TokenMissing,
                    reason: "token_missing: never issued, expired, or already consumed".to_owned(),
                })
            }
            (Ok(None), Absence::ExpiredWhileHeld) => return retry_unknown(
                "the token expired while an attempt held it, and the gateway shows no charge yet",
            ),
            (Err(error), Absence::Missing) => {
                return retry(format!("gateway look-up failed: {error}"))
            }
            (Err(error), Absence::ExpiredWhileHeld) => {
                return retry_unknown(format!(
                    "the token expired while an attempt held it, and the look-up failed: {error}"
                ))
            }
        };
        // An earlier attempt charged and crashed before recording: record, never re-charge.
        let row = row_context(context, 0);
        let inserted = async {
            let mut conn = self.pool.acquire().await?;
            let stall = Stall::default();
            let inserted = stall
                .bounded(
                    "recording the recovered charge",
                    persistence::insert(&mut conn, command, fingerprint, &row, Some(&charge)),
                )
                .await;
            stall.release(conn);
            inserted
        }
        .await;
        match inserted {
            Ok(Some(payment_id)) => final_outcome(payment_id, &charge).into(),
            Ok(None) => match self.find_existing(key).await {
                Ok(Some(existing)) => outcome_for_existing(&existing, fingerprint).into(),
                Ok(None) => retry("payment row vanished after a conflict"),
                Err(error) => database_failure("payment look-up", &error),
            },
            Err(error) => database_failure_after_charge("recording the recovered charge", &error),
        }
    }

    async fn run_reserved(
        &self,
        command: &PaymentCommand,
        fingerprint: &Fingerprint,
        context: &CommandContext<'_>,
        lease: &Lease<'_>,
    ) -> Attempt {
        let claim = lease.claim;
        let key = &command.idempotency_key;
        let settlement = match self
            .faults
            .hit(FaultPoint::AfterReserve, key.as_str())
            .await
        {
            Err(fault) => Settlement::Restore(retry(fault.to_string())),
            Ok(()) => {
                self.transact(command, fingerprint, context, lease)
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
                    Ok(Transition::Refused) => {
                        crate::telemetry::record_token_inconsistency("processing", "not_owned");
                        tracing::warn!(
                            idempotency_key = %key,
                            "confirm refused: lease lost after commit; the next owner will find the row"
                        )
                    }
                    Err(error) => {
                        token_failure("confirm", &error);
                        tracing::warn!(
                            idempotency_key = %key, %error,
                            "confirm failed; the lease will expire and the row decides"
                        )
                    }
                }
                outcome.into()
            }
            Settlement::Restore(attempt) => {
                let attempt = attempt.knowing(context.earlier);
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
                    Ok(Transition::Refused)
                        if retried.load(std::sync::atomic::Ordering::Relaxed) =>
                    {
                        tracing::debug!(idempotency_key = %key, "restore refused after a retry")
                    }
                    Ok(Transition::Refused) => {
                        crate::telemetry::record_token_inconsistency("processing", "not_owned");
                        tracing::warn!(idempotency_key = %key, "restore refused: lease lost")
                    }
                    Err(error) => {
                        token_failure("restore", &error);
                        tracing::warn!(
                            idempotency_key = %key, %error,
                            "restore failed; the lease will expire instead"
                        )
                    }
                }
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

    /// The one transaction: pre-existing check, insert, charge, record, commit, on
    /// one connection of the payment pool (closed, not reused, when a statement on it
    /// went unanswered).
    async fn transact(
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

    async fn transact_on(
        &self,
        conn: &mut PoolConnection<Postgres>,
        stall: &Stall,
        command: &PaymentCommand,
        fingerprint: &Fingerprint,
        context: &CommandContext<'_>,
        lease: &Lease<'_>,
    ) -> Transacted {
        let claim = lease.claim;
        let key = &command.idempotency_key;
        // Nothing was charged yet: a final database refusal restores the token too,
        // so a corrected command (or a redrive after a fix) can still go through.
        let before_charge = |what: &str, error: sqlx::Error| {
            Settlement::Restore(database_failure(what, &error)).into()
        };
        let mut tx = match stall
            .bounded("BEGIN", sqlx::Acquire::begin(&mut **conn))
            .instrument(persistence::statement_span("BEGIN"))
            .await
        {
            Ok(tx) => tx,
            Err(error) => return before_charge("begin", error),
        };
        let row = row_context(context, claim.fence);
        // The pre-existing check and the insert, one statement (I6).
        let (payment_id, history) = match stall
            .bounded(
                "insert",
                persistence::insert_or_find(&mut tx, command, fingerprint, &row),
            )
            .await
        {
            Ok(Insertion::Inserted(id, remembered)) => (
                id,
                decisions::charge_history(
                    remembered == Remembered::ChargeUnknown,
                    context.earlier,
                    claim.fence,
                ),
            ),
            Ok(Insertion::Existing(existing)) => {
                return self.settle_existing(existing, fingerprint).into()
            }
            Ok(Insertion::Raced) => return Transacted::Raced,
            Err(error) => return before_charge("insert", error),
        };
        if let Err(fault) = self.faults.hit(FaultPoint::AfterInsert, key.as_str()).await {
            return Settlement::Restore(retry(fault.to_string())).into();
        }

        let (charge, lease_kept) = self
            .with_lease(
                key,
                claim,
                self.obtain_charge(command, context.source, payment_id, lease, history),
            )
            .await;
        let charge = match charge {
            Ok(charge) => charge,
            Err(settlement) => return settlement.into(),
        };
        if let Err(fault) = self.faults.hit(FaultPoint::AfterCharge, key.as_str()).await {
            return Settlement::LeaveToLease(retry_unknown(fault.to_string())).into();
        }
        if !lease_kept {
            // Another owner may be waiting on our uncommitted row; rolling back lets it
            // proceed, and its fence > 1 makes it look this charge up instead of charging.
            return Settlement::LeaveToLease(retry_unknown("lease lost during the gateway call"))
                .into();
        }
        if let Err(error) = stall
            .bounded(
                "recording the charge",
                persistence::record_charge(&mut tx, payment_id, &charge),
            )
            .await
        {
            // Charged but not recorded: the lease hands the look-up to the next owner.
            return Settlement::LeaveToLease(database_failure_after_charge(
                "recording the charge",
                &error,
            ))
            .into();
        }
        // Fencing (I5): only the current owner may commit. A store in the payments
        // database checks the fence and completes the token inside this transaction
        // (one atomic step with the payment); any other store renews the lease right
        // before COMMIT, unless the lease is certainly still ours, and is confirmed
        // after it.
        let fence_check = match self.tokens.in_transaction() {
            Some(settle) => {
                settle
                    .confirm_in(&mut tx, key, claim, payment_id, fingerprint.as_str())
                    .instrument(token_span("confirm"))
                    .await
            }
            None if lease.surely_held() => Ok(Transition::Applied),
            None => {
                self.tokens
                    .extend(key, claim)
                    .instrument(token_span("extend"))
                    .await
            }
        };
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
        let outcome = final_outcome(payment_id, &charge);
        if self.tokens.in_transaction().is_some() {
            return Settlement::Settled(outcome).into();
        }
        Settlement::Confirm {
            payment_id,
            fingerprint: fingerprint.clone(),
            outcome,
        }
        .into()
    }

    /// The payment transaction's connection, its wait measured: with no more attempts
    /// than connections it is handed out at once, and a wait here (metric
    /// `payment_worker.db.pool.acquire`, log field `pool_acquire_ms`) means something
    /// else holds payment-pool connections.
    async fn payment_connection(&self) -> Result<PoolConnection<Postgres>, sqlx::Error> {
        let asked = std::time::Instant::now();
        let acquired = self.pool.acquire().await;
        let waited = asked.elapsed();
        let result = match &acquired {
            Ok(_) => "ok",
            Err(sqlx::Error::PoolTimedOut) => "timeout",
            Err(_) => "error",
        };
        crate::telemetry::record_pool_acquire(waited, result);
        if let Err(error) = &acquired {
            tracing::warn!(
                pool_acquire_ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
                %error,
                "no payment-pool connection for the payment transaction"
            );
        }
        acquired
    }

    fn settle_existing(&self, existing: PaymentRecord, fingerprint: &Fingerprint) -> Settlement {
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

fn attempt_slots(pool: &PgPool) -> usize {
    usize::try_from(pool.options().get_max_connections())
        .unwrap_or(usize::MAX)
        .max(1)
}
