//! The worker's retry loop around the attempts (src/worker/handler.rs,
//! `process_with_retries` and `judge`): it folds what each attempt learnt of a
//! charge, answers, dead-letters when the attempts run out, and keeps the key in
//! `unresolved_charges` when a charge may exist unbooked.

use std::time::Duration;

use payment_worker::payment::{Attempt, ChargeEvidence, Outcome, RejectionKind};

use crate::config::{Config, Mutant};
use crate::state::{Ended, Phase, Row, State, Verdict, Worker};

/// The code's value for what the attempt came to, as the processor returns it:
/// `knowing` what it inherited (this delivery's earlier attempts, or a stranger
/// previous holder).
fn attempt_of(ended: Ended, inherited: bool) -> Attempt {
    let id = uuid::Uuid::nil();
    let attempt = match ended {
        Ended::None | Ended::Retry(false) => Attempt::Retry {
            after: Duration::ZERO,
            reason: String::new(),
            charge: ChargeEvidence::Unchanged,
        },
        Ended::Retry(true) => Attempt::Retry {
            after: Duration::ZERO,
            reason: String::new(),
            charge: ChargeEvidence::MayHaveCharged,
        },
        Ended::Booked(Verdict::Approved) => Attempt::Final(Outcome::Succeeded {
            payment_id: id,
            transaction_id: String::new(),
        }),
        Ended::Booked(Verdict::Declined) => Attempt::Final(Outcome::Declined {
            payment_id: id,
            transaction_id: String::new(),
        }),
        Ended::Duplicate => Attempt::Final(Outcome::Duplicate {
            payment_id: id,
            original: None,
        }),
        Ended::Rejected => Attempt::Final(Outcome::Rejected {
            kind: RejectionKind::Invalid,
            reason: String::new(),
        }),
    };
    attempt.knowing(ChargeEvidence::from_unknown(inherited))
}

pub fn judge(config: &Config, state: &mut State, i: usize) {
    let worker = state.workers[i].clone();
    let earlier = worker.charge_unknown;
    let (answer, unknown) = match attempt_of(worker.result, worker.inherited) {
        Attempt::Retry { charge, .. } => (None, charge.may_have_charged(earlier)),
        Attempt::Final(outcome @ Outcome::Rejected { .. }) => (Some(outcome), earlier),
        Attempt::Final(outcome) => (Some(outcome), false),
        Attempt::Unbooked(outcome) => (Some(outcome), true),
    };
    // The handler keeps `charge_unknown` as folded for the next attempt.
    let keep_unknown = match &answer {
        None => unknown,
        Some(_) => earlier,
    };
    let Some(outcome) = answer else {
        if worker.attempts < config.attempts {
            let mut next = Worker::idle();
            next.charge_unknown = keep_unknown;
            next.attempts = worker.attempts;
            next.previous_claim = if worker.owner != 0 && worker.fence != 0 {
                worker.owner
            } else {
                worker.previous_claim
            };
            next.current = worker.current;
            next.phase = Phase::Reserve;
            state.workers[i] = next;
            return;
        }
        // Retries exhausted: a dead letter, flagged when a charge may exist.
        state.dead_letter = Some(unknown);
        if unknown {
            remember_unresolved(config, state);
        }
        publish(state, i, unknown);
        return;
    };
    if unknown {
        remember_unresolved(config, state);
    }
    match outcome {
        Outcome::Succeeded { .. } => booked(state, Verdict::Approved),
        Outcome::Declined { .. } => booked(state, Verdict::Declined),
        // `attempt` fills the original answer from the row.
        Outcome::Duplicate { .. } => {
            let original = match state.row {
                Row::Committed(verdict) => Some(verdict),
                _ => None,
            };
            if original.is_none() || (state.original.is_some() && state.original != original) {
                state.wrong_duplicate = true;
            }
            state.original = state.original.or(original);
            state.duplicate_answered = true;
        }
        Outcome::Rejected { .. } => {}
        // The model's commands are charges: a refund's answer to one is wrong.
        Outcome::Refunded { .. } | Outcome::RefundDeclined { .. } => state.wrong_duplicate = true,
    }
    publish(state, i, unknown);
}

fn booked(state: &mut State, verdict: Verdict) {
    state.original = state.original.or(Some(verdict));
}

pub fn remember_unresolved(config: &Config, state: &mut State) {
    if !config.mutated(Mutant::NoUnresolvedFlag) {
        state.unresolved = true;
    }
}

fn publish(state: &mut State, i: usize, unknown: bool) {
    state.answered = true;
    let worker = &mut state.workers[i];
    worker.answer_unknown = unknown;
    worker.phase = Phase::CommitOffset;
}
