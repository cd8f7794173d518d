//! One attempt at one command: reserve the token, run the one Postgres transaction
//! around the gateway charge, then confirm or restore the token.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::Retryable;
use sqlx::PgPool;
use tracing::field::Empty;
use tracing::Instrument;
use uuid::Uuid;

use super::decisions::{self, ChargeHistory, FirstStep, GatewayLookup, OnChargeError, SettleBy};
use super::outcome::{Attempt, ChargeEvidence, OriginalAnswer, Outcome, RejectionKind};
use super::persistence::{
    self, Insertion, PaymentRecord, PaymentStatus, Remembered, RowContext, SourcePosition,
};
use super::{Command, CommandKind, Fingerprint, PaymentCommand, RefundCommand};
use crate::database_errors::{classify_sqlx, DatabaseFailure};
use crate::fault::{FaultPoint, Faults};
use crate::gateway::{
    Charge, ChargeStatus, GatewayError, LeaseLoss, LedgerEntry, PaymentGateway, RefundRequest,
};
use crate::token::{
    Claim, IdempotencyKey, Predecessor, Reservation, SettleWatch, TokenError, TokenStore,
    Transition,
};

pub use at_stake::ChargeAtStake;
pub use refund_answers::WAITING_FOR_PAYMENT;

use attempts::*;
use lease_check::{FirstCheck, LeaseCheck};
use recovery::Absence;
use stalls::Stall;
use token_calls::*;

mod at_stake;
mod attempts;
mod charging;
mod lease_check;
mod recovery;
mod refund_answers;
mod refund_gateway;
mod refunding;
mod reserved;
mod stalls;
mod token_calls;
mod transaction;

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
        self.attempt(Ask::Charge(command), context, &mut Aside::default())
            .await
    }

    /// One attempt at a refund (see [`Processor::process`]).
    pub async fn process_refund(
        &self,
        command: &RefundCommand,
        context: &CommandContext<'_>,
    ) -> Attempt {
        // Never closed, so acquiring only fails if that changes: then run unbounded.
        let _slot = self.attempts.acquire().await.ok();
        self.attempt(Ask::Refund(command), context, &mut Aside::default())
            .await
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
        command: &Command,
        context: &CommandContext<'_>,
    ) -> Watched {
        // Never closed, so acquiring only fails if that changes: then run unbounded.
        let _slot = self.attempts.acquire().await.ok();
        let mut aside = Aside::default();
        let attempt = self.attempt(Ask::from(command), context, &mut aside).await;
        Watched {
            attempt,
            watch: aside.watch,
            claimed_as: aside.claimed_as,
            lost_reservation: aside.lost_reservation,
        }
    }

    async fn attempt(
        &self,
        ask: Ask<'_>,
        context: &CommandContext<'_>,
        aside: &mut Aside,
    ) -> Attempt {
        let mut attempt = self.decide(ask, context, aside).await;
        // A final answer settles what was at stake (an unbooked one is recorded by
        // the caller); a retry leaves it, so a panic in a later attempt still knows.
        if !matches!(attempt, Attempt::Retry { .. }) {
            self.settle_stake(ask.key().as_str());
        }
        // A refund's duplicate is told from its refund row already.
        let Ask::Charge(command) = ask else {
            return attempt;
        };
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
                        *original = original_answer(&row).map(Box::new);
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

    /// The attempt decided by the token: refused before anything when the gateway
    /// cannot take the command, else the token reserved and the reservation's
    /// answer followed (run the payment, wait for its holder, a duplicate, recover).
    async fn decide(
        &self,
        ask: Ask<'_>,
        context: &CommandContext<'_>,
        aside: &mut Aside,
    ) -> Attempt {
        let key = ask.key();
        // A command this gateway cannot take at all (an amount Stripe cannot
        // express) is refused before its token or the gateway are touched.
        if let Ask::Charge(command) = ask {
            if let Err(reason) = self.gateway.accepts(&command.charge_request()) {
                return Attempt::Final(Outcome::Rejected {
                    kind: RejectionKind::Invalid,
                    reason,
                });
            }
        }
        let fingerprint = ask.fingerprint();
        let (asked, reservation) = match self.reserve_token(key, context, aside).await {
            Ok(reserved) => reserved,
            Err(attempt) => return attempt,
        };
        match reservation {
            Reservation::Reserved { fence, predecessor } => {
                self.run_reservation(
                    ask,
                    &fingerprint,
                    context,
                    asked,
                    fence,
                    &predecessor,
                    aside,
                )
                .await
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
            } => match ask {
                Ask::Charge(_) => {
                    self.decide_completed(key, &fingerprint, payment_id, stored)
                        .await
                }
                Ask::Refund(_) => {
                    self.decide_refund_completed(key, &fingerprint, stored)
                        .await
                }
            },
            Reservation::Missing => {
                self.recover(ask, &fingerprint, context, Absence::Missing)
                    .await
            }
            Reservation::Unsettled => {
                self.recover(ask, &fingerprint, context, Absence::ExpiredWhileHeld)
                    .await
            }
        }
    }

    /// The attempt under a reservation just made (`asked`, at `fence`).
    #[allow(clippy::too_many_arguments)]
    async fn run_reservation(
        &self,
        ask: Ask<'_>,
        fingerprint: &Fingerprint,
        context: &CommandContext<'_>,
        asked: Asked,
        fence: u64,
        predecessor: &Predecessor,
        aside: &mut Aside,
    ) -> Attempt {
        let key = ask.key();
        // A charge's earlier holder leaves no trace when it dies after its POST (its
        // row is rolled back), so a stranger before us is evidence. A refund's leaves
        // its row `processing` from before its POST until the answer is recorded, and
        // that row is what a refund's attempt goes by (looked up first when resumed).
        let context = match ask {
            Ask::Charge(_) => inheriting(context, key, fence, predecessor),
            Ask::Refund(_) => *context,
        };
        let claim = Claim {
            owner: asked.owner,
            fence,
        };
        let lease = Lease {
            claim: &claim,
            surely_held_until: asked.at + self.tokens.policy().lease / 2,
        };
        let attempt = match ask {
            Ask::Charge(command) => {
                let transaction = self.transact(command, fingerprint, &context, &lease);
                self.run_reserved(key, &context, &lease, transaction).await
            }
            Ask::Refund(command) => {
                let transaction = self.transact_refund(command, fingerprint, &context, &lease);
                self.run_reserved(key, &context, &lease, transaction).await
            }
        };
        aside.claimed_as = Some(claim.owner);
        attempt
    }

    /// No token to reserve: the rows (and for a charge the gateway) answer instead.
    async fn recover(
        &self,
        ask: Ask<'_>,
        fingerprint: &Fingerprint,
        context: &CommandContext<'_>,
        absence: Absence,
    ) -> Attempt {
        match ask {
            Ask::Charge(command) => {
                self.recover_missing(command, fingerprint, context, absence)
                    .await
            }
            Ask::Refund(command) => self.recover_refund(command, fingerprint, absence).await,
        }
    }

    /// The token reserved under a fresh owner (taking back the delivery's lost
    /// reservation, if any), the store's verdict recorded on the spans. `Err` is the
    /// retry when the store did not answer; the owner asked as is then kept aside.
    async fn reserve_token(
        &self,
        key: &IdempotencyKey,
        context: &CommandContext<'_>,
        aside: &mut Aside,
    ) -> Result<(Asked, Reservation), Attempt> {
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
                return Err(retry(format!("token reserve failed: {error}")));
            }
        };
        let verdict = verdict_label(&reservation);
        span.record("token.verdict", verdict);
        tracing::Span::current().record("token.verdict", verdict);
        tracing::debug!(idempotency_key = %key, ?reservation, "token reserve");
        let asked = Asked {
            owner,
            at: asked_at,
        };
        Ok((asked, reservation))
    }

    /// A token already completed: a duplicate when the stored fingerprint is this
    /// command's, a reused key when it is another's, and the payments row decides
    /// when the store kept none.
    async fn decide_completed(
        &self,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        payment_id: Uuid,
        stored: Option<String>,
    ) -> Attempt {
        match stored {
            Some(stored) if stored == fingerprint.as_str() => Attempt::Final(Outcome::Duplicate {
                payment_id,
                original: None,
            }),
            Some(_) => key_reused().into(),
            None => {
                self.decide_from_postgres(key, fingerprint, payment_id)
                    .await
            }
        }
    }
}

/// The command an attempt is for, borrowed: a charge's hot path never copies it.
#[derive(Clone, Copy)]
enum Ask<'a> {
    Charge(&'a PaymentCommand),
    Refund(&'a RefundCommand),
}

impl<'a> From<&'a Command> for Ask<'a> {
    fn from(command: &'a Command) -> Self {
        match command {
            Command::Charge(charge) => Self::Charge(charge),
            Command::Refund(refund) => Self::Refund(refund),
        }
    }
}

impl Ask<'_> {
    fn key(&self) -> &IdempotencyKey {
        match self {
            Self::Charge(charge) => &charge.idempotency_key,
            Self::Refund(refund) => &refund.idempotency_key,
        }
    }

    fn fingerprint(&self) -> Fingerprint {
        match self {
            Self::Charge(charge) => charge.fingerprint(),
            Self::Refund(refund) => refund.fingerprint(),
        }
    }
}

/// A reserve request as sent: the owner it asked as, and when (before the request,
/// so the lease the store granted runs at least as long from then).
struct Asked {
    owner: String,
    at: tokio::time::Instant,
}

/// The context of an attempt that reserved the token: what its predecessor may have
/// charged inherited ([`CommandContext::evidence_after`]), and said when it is news.
fn inheriting<'a>(
    context: &CommandContext<'a>,
    key: &IdempotencyKey,
    fence: u64,
    predecessor: &Predecessor,
) -> CommandContext<'a> {
    let inherited = context.evidence_after(predecessor);
    if inherited != context.earlier {
        tracing::warn!(
            idempotency_key = %key,
            fence,
            "the token's previous holder may have charged: looked up first"
        );
    }
    CommandContext {
        earlier: inherited,
        ..*context
    }
}

fn attempt_slots(pool: &PgPool) -> usize {
    usize::try_from(pool.options().get_max_connections())
        .unwrap_or(usize::MAX)
        .max(1)
}
