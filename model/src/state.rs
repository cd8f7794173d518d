//! The system's state: the workers, the token, the payment row and
//! `unresolved_charges`, the gateway, the partition and the budgets left.
//!
//! Owners are numbered per attempt (never by worker), so the workers can be sorted
//! into a canonical order without renaming anything: that is the symmetry the
//! checker reduces by ([`State::representative`]).

use payment_worker::payment::decisions::{ChargeHistory, UnknownCause};

/// An attempt's owner (`<worker_id>:<uuid>` in the code); 0 is nobody.
pub type Owner = u8;

/// What the gateway answered for a charge, as booked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verdict {
    Approved,
    Declined,
}

/// Where one worker is in one attempt (the processor's steps, in the code's order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    Idle,
    /// `reserve`.
    Reserve,
    /// `insert_or_find`: the pre-existing check and the insert, one statement.
    Insert,
    /// The look-up before charging, when `first_step` says so.
    LookUp,
    /// The lease check right before a POST (`LeaseCheck::check`).
    CheckLease,
    /// The POST of the charge (or Stripe's create).
    Post,
    /// Stripe: the lease check before the confirm, then the confirm.
    CheckConfirm,
    Confirm,
    /// The look-up after an unknown outcome (`resolve_unknown`).
    Resolve(UnknownCause),
    /// `record_charge`, then the fence check before COMMIT.
    Fence,
    Commit,
    /// Settling the token after the attempt: confirm, restore.
    ConfirmToken,
    Restore,
    /// Stripe: the create of a PaymentIntent, after its lease check.
    Create,
    /// The attempt's result goes to the retry loop (`judge`).
    Judge,
    /// The answer is published, then the offset committed.
    CommitOffset,
}

/// What an attempt came to, before the retry loop judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Ended {
    None,
    /// A retry; `true` when a charge may exist that no row records.
    Retry(bool),
    /// A booked answer.
    Booked(Verdict),
    /// A duplicate answered from the row (or a token tombstone).
    Duplicate,
    /// Refused for good without charging (a declined look-up that is no charge is
    /// `Booked(Declined)`).
    Rejected,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Worker {
    pub phase: Phase,
    /// This attempt's owner and fence.
    pub owner: Owner,
    pub fence: u8,
    /// The owner this delivery's previous attempt reserved as (`previous_claim`).
    pub previous_claim: Owner,
    /// The retry loop's `charge_unknown` (this delivery's earlier attempts, or the
    /// inbound `x-charge-unknown` flag).
    pub charge_unknown: bool,
    /// What the attempt inherited (`evidence_after`): `context.earlier`.
    pub inherited: bool,
    pub history: Option<ChargeHistory>,
    /// Attempts made by this delivery.
    pub attempts: u8,
    /// The lease is certainly still ours (half a lease after asking or renewing).
    pub surely_held: bool,
    /// The next lease check may skip its round trip (`FirstCheck`).
    pub may_skip_check: bool,
    /// The charge the attempt holds, to record.
    pub charge: Option<Verdict>,
    /// Stripe: the PaymentIntent (index + 1) this attempt confirms; 0 none.
    pub intent: u8,
    /// The attempt's transaction was lost (a zombie's dropped session).
    pub tx_lost: bool,
    /// The attempt's inserted row (the transaction is open).
    pub in_tx: bool,
    pub result: Ended,
    /// The delivery is the partition's current one: a delivery superseded by a
    /// rebalance (a later one of the same record) has its offset commit refused
    /// (its generation is fenced).
    pub current: bool,
    /// Whether the answer published says the charge is unknown (dead letter flag).
    pub answer_unknown: bool,
}

impl Worker {
    pub fn idle() -> Self {
        Self {
            phase: Phase::Idle,
            owner: 0,
            fence: 0,
            previous_claim: 0,
            charge_unknown: false,
            inherited: false,
            history: None,
            attempts: 0,
            surely_held: false,
            may_skip_check: false,
            charge: None,
            intent: 0,
            tx_lost: false,
            in_tx: false,
            result: Ended::None,
            current: false,
            answer_unknown: false,
        }
    }
}

/// The token (one key), in whichever store holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Token {
    /// Restored: the next reservation takes `fence + 1`; `holder` held it last.
    Pending {
        fence: u8,
        holder: Owner,
    },
    Processing {
        fence: u8,
        owner: Owner,
        live: bool,
    },
    Completed,
}

/// The payment row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Row {
    None,
    /// Inserted by `owner`'s open transaction: others' inserts wait on it.
    Uncommitted(Owner),
    Committed(Verdict),
}

/// The gateway's side.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Gateway {
    /// Charges API: the answer kept under the key (gone if the gateway forgot it).
    pub entry: Option<Verdict>,
    /// A request accepted and still queued inside the gateway: it lands later.
    pub queued: bool,
    /// Money moved: approved charges (Charges), confirmed PaymentIntents (Stripe).
    pub charges: u8,
    /// Stripe: the key's PaymentIntents, created and recorded, and whether each
    /// was confirmed.
    pub intents: Vec<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Budget {
    pub crashes: u8,
    pub expiries: u8,
    pub zombies: u8,
    pub wipes: u8,
    pub faults: u8,
    pub redeliveries: u8,
    pub replays: u8,
    pub redrives: u8,
    /// Assumption breaks: forgotten keys, lost Postgres commits.
    pub breaks: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct State {
    pub workers: Vec<Worker>,
    pub token: Option<Token>,
    pub row: Row,
    /// The key is in `unresolved_charges`.
    pub unresolved: bool,
    pub gateway: Gateway,
    /// The record's offset is committed.
    pub committed: bool,
    /// A dead letter waits, with its `x-charge-unknown` flag.
    pub dead_letter: Option<bool>,
    /// The record on the topic carries `x-charge-unknown: true` (a redriven one).
    pub flagged: bool,
    /// Answers published for the record (results or dead letters).
    pub answered: bool,
    /// The first booked answer, and whether any later duplicate answered otherwise.
    pub original: Option<Verdict>,
    pub wrong_duplicate: bool,
    /// A duplicate was answered (reachability).
    pub duplicate_answered: bool,
    /// A payment was committed by an attempt that no longer held the token (I5).
    pub stale_commit: bool,
    /// An offset was committed before any answer was published.
    pub offset_unanswered: bool,
    pub budget: Budget,
}

impl State {
    pub fn owner_running(&self, owner: Owner) -> Option<&Worker> {
        self.workers
            .iter()
            .find(|w| w.owner == owner && w.phase != Phase::Idle)
    }

    /// The workers sorted and the owners renumbered in order of appearance: sound
    /// because nothing refers to a worker by position, and owners are only ever
    /// compared for equality (a new one is one above all in use).
    pub fn representative(&self) -> Self {
        let mut state = self.clone();
        state.workers.sort();
        let mut names: Vec<Owner> = Vec::new();
        let mut rename = |owner: &mut Owner| {
            if *owner == 0 {
                return;
            }
            let at = match names.iter().position(|n| n == owner) {
                Some(at) => at,
                None => {
                    names.push(*owner);
                    names.len() - 1
                }
            };
            *owner = u8::try_from(at + 1).unwrap_or(Owner::MAX);
        };
        match &mut state.token {
            Some(Token::Pending { holder, .. }) => rename(holder),
            Some(Token::Processing { owner, .. }) => rename(owner),
            _ => {}
        }
        if let Row::Uncommitted(owner) = &mut state.row {
            rename(owner);
        }
        for worker in &mut state.workers {
            rename(&mut worker.owner);
            rename(&mut worker.previous_claim);
        }
        state.workers.sort();
        state
    }

    /// Nothing is left to happen without a new fault or an operator: every worker
    /// idle, nothing queued at the gateway, the offset committed (a dead letter may
    /// wait for a redrive).
    pub fn quiescent(&self) -> bool {
        self.workers.iter().all(|w| w.phase == Phase::Idle)
            && !self.gateway.queued
            && self.committed
    }
}
