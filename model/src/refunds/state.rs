//! What the refund model tracks: the refund rows, the row locks, the gateway's
//! refunds, and each delivery's step.

use payment_worker::payment::{ChargeEvidence, GatewayLookup};

/// A guard of the refund path taken out, to show the model tells it apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefundMutant {
    /// Step 1 reserves without checking the refunds booked or in flight against
    /// the amount charged (`refunds::reserve_refund`).
    NoAmountCheck,
    /// Step 2 asks the gateway without holding the refund's row lock
    /// (`lock_for_the_call`).
    NoRowLock,
    /// A row reserved by an earlier attempt is not looked up before the POST
    /// (`charge_history(resumed, …)` in `ask_gateway`).
    NoLookupWhenResumed,
    /// The amount is reserved in the gateway call's transaction instead of one
    /// committed before it: a crash or a lost answer after the POST rolls it back.
    ReservationInCallTransaction,
}

/// How the gateway treats a refund POST under a key it already refunded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefundGateway {
    /// It answers the refund it made (the charges API's keyed replay; the Stripe
    /// adapter lists the PaymentIntent's refunds before every POST).
    KeepsKeys,
    /// It refunds again: the assumption off, or a gateway without idempotency.
    IgnoresKeys,
}

/// One bounded system: a payment of `charged` and one refund key per entry of
/// `amounts`, delivered to `holders[k]` workers at once.
#[derive(Debug, Clone)]
pub struct RefundConfig {
    /// The amount the payment charged.
    pub charged: u8,
    /// Each refund key's amount.
    pub amounts: Vec<u8>,
    /// How many workers hold each key at the same time (more than one: Redis lost
    /// the token, so only Postgres keeps them apart).
    pub holders: Vec<u8>,
    /// Worker crashes the system may suffer (each a redelivery of its record).
    pub crashes: u8,
    /// Gateway answers that may be lost (the refund made or not).
    pub lost_answers: u8,
    pub gateway: RefundGateway,
    /// `--gateway-lookup`: look up before every POST, or only when a refund may exist.
    pub lookup: GatewayLookup,
    pub mutant: Option<RefundMutant>,
}

impl RefundConfig {
    /// Three refunds of a charge of 4 (3, 2 and 1: not all fit, and which do
    /// depends on the order), the first two each held by two workers at once
    /// (Redis lost their tokens), two crashes and two lost answers,
    /// against a gateway that keeps keys, looking up only when a refund may exist.
    pub fn ci() -> Self {
        Self {
            charged: 4,
            amounts: vec![3, 2, 1],
            holders: vec![2, 2, 1],
            crashes: 2,
            lost_answers: 2,
            gateway: RefundGateway::KeepsKeys,
            lookup: GatewayLookup::Uncertain,
            mutant: None,
        }
    }

    /// The same against a gateway that ignores keys, with `--gateway-lookup always`.
    pub fn ignoring_keys_looking_up_always() -> Self {
        Self {
            gateway: RefundGateway::IgnoresKeys,
            lookup: GatewayLookup::Always,
            ..Self::ci()
        }
    }

    /// One holder per key (the tokens kept), against a gateway that ignores keys,
    /// looking up only when a refund may exist.
    pub fn ignoring_keys_one_holder() -> Self {
        Self {
            holders: vec![1, 1, 1],
            gateway: RefundGateway::IgnoresKeys,
            ..Self::ci()
        }
    }

    /// `self` with `mutant`.
    pub fn with(self, mutant: RefundMutant) -> Self {
        Self {
            mutant: Some(mutant),
            ..self
        }
    }
}

/// A refund row's status (`refunds.status`; `declined` is left out: the model's
/// gateway never declines).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RowStatus {
    /// Reserved: its amount counts against the charge until the answer is recorded.
    Processing,
    Refunded,
    /// Refused for good at step 1 (here: the amount would pass the charge).
    Rejected,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Row {
    pub status: RowStatus,
    /// Under [`RefundMutant::ReservationInCallTransaction`]: the worker whose open
    /// transaction inserted it, not committed yet.
    pub uncommitted_by: Option<u8>,
}

/// What a delivery's earlier attempts left ([`ChargeEvidence`], kept hashable).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Earlier {
    Unchanged,
    MayHaveRefunded,
}

impl Earlier {
    pub fn evidence(self) -> ChargeEvidence {
        match self {
            Self::Unchanged => ChargeEvidence::Unchanged,
            Self::MayHaveRefunded => ChargeEvidence::MayHaveCharged,
        }
    }
}

/// Where a delivery is in the three steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Step 1 next: the attempt starts (or starts again).
    Reserve,
    /// Step 2 next: the row is reserved (`resumed`: by an earlier attempt).
    Lock { resumed: bool },
    /// Holding the row lock, the look-up next.
    LookUp,
    /// Holding the row lock, the POST next.
    Post,
    /// The gateway refunded: step 3 next (record, commit).
    Record,
    /// Answered: refunded, a duplicate, or refused.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Worker {
    /// The refund key its record carries.
    pub key: u8,
    pub phase: Phase,
    pub earlier: Earlier,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    pub workers: Vec<Worker>,
    /// Per key: its refund row.
    pub rows: Vec<Option<Row>>,
    /// Per key: the worker holding its row lock.
    pub locks: Vec<Option<u8>>,
    /// Per key: the refunds the gateway made under it.
    pub refunds: Vec<u8>,
    pub crashes: u8,
    pub lost_answers: u8,
    /// A look-up found a refund an earlier attempt made (reachability).
    pub found_by_look_up: bool,
}

impl State {
    pub fn initial(config: &RefundConfig) -> Self {
        let workers = config
            .holders
            .iter()
            .enumerate()
            .flat_map(|(key, &holders)| {
                (0..holders).map(move |_| Worker {
                    key: key as u8,
                    phase: Phase::Reserve,
                    earlier: Earlier::Unchanged,
                })
            })
            .collect();
        let keys = config.amounts.len();
        Self {
            workers,
            rows: vec![None; keys],
            locks: vec![None; keys],
            refunds: vec![0; keys],
            crashes: config.crashes,
            lost_answers: config.lost_answers,
            found_by_look_up: false,
        }
    }

    /// What the gateway refunded in all.
    pub fn refunded(&self, config: &RefundConfig) -> u32 {
        self.refunds
            .iter()
            .zip(&config.amounts)
            .map(|(&n, &amount)| u32::from(n) * u32::from(amount))
            .sum()
    }

    /// Every delivery answered.
    pub fn quiescent(&self) -> bool {
        self.workers.iter().all(|w| w.phase == Phase::Done)
    }
}
