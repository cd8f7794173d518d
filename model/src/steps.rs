//! One worker's steps of one attempt, in the processor's order: reserve, insert,
//! look up, lease check, POST (or Stripe's create and confirm), resolve an unknown
//! answer, record and fence check, COMMIT, then confirm, restore or leave the token.
//! Each calls the code's own decision where the code has one.

use payment_worker::payment::decisions::{self, FirstStep, LookupAnswer, OnChargeError, SettleBy};
use payment_worker::payment::{ChargeEvidence, CommandContext};
use payment_worker::token::{Reservation, Transition};

use crate::config::{Config, GatewayKind, Mutant, StoreKind};
use crate::gateway::{self, Answer, Standing};
use crate::retry_loop;
use crate::state::{Ended, Phase, Row, State, Token, Verdict, Worker};
use crate::token_store;

/// A fresh owner per attempt: one more than any in the state.
fn new_owner(state: &State) -> u8 {
    let mut max = state
        .workers
        .iter()
        .map(|w| w.owner.max(w.previous_claim))
        .max()
        .unwrap_or(0);
    match state.token {
        Some(Token::Pending { holder, .. }) => max = max.max(holder),
        Some(Token::Processing { owner, .. }) => max = max.max(owner),
        _ => {}
    }
    if let Row::Uncommitted(owner) = state.row {
        max = max.max(owner);
    }
    max + 1
}

pub fn step(config: &Config, state: &mut State, i: usize) {
    let phase = state.workers[i].phase;
    match phase {
        Phase::Reserve => reserve(config, state, i),
        Phase::Insert => insert(config, state, i),
        Phase::CheckLease | Phase::CheckConfirm => check_lease(config, state, i, phase),
        Phase::Post => stripe_standing(state, i),
        Phase::Create => {
            state.gateway.intents.push(false);
            state.workers[i].intent = state.gateway.intents.len() as u8;
            state.workers[i].phase = Phase::CheckConfirm;
        }
        Phase::Fence => fence(config, state, i),
        Phase::Commit => commit(config, state, i),
        Phase::ConfirmToken => {
            token_store::confirm(state, state.workers[i].owner);
            state.workers[i].phase = Phase::Judge;
        }
        Phase::Restore => {
            let any = config.mutated(Mutant::RestoreAnyOwner);
            token_store::restore(state, state.workers[i].owner, any);
            state.workers[i].phase = Phase::Judge;
        }
        Phase::Judge => retry_loop::judge(config, state, i),
        Phase::CommitOffset => {
            if !state.answered {
                state.offset_unanswered = true;
            }
            if state.workers[i].current {
                state.committed = true;
            }
            state.workers[i] = Worker::idle();
        }
        Phase::Idle | Phase::LookUp | Phase::Confirm | Phase::Resolve(_) => {}
    }
}

fn reserve(config: &Config, state: &mut State, i: usize) {
    let worker = &state.workers[i];
    let first = worker.attempts == 0;
    if !worker.current && (!first || config.assumptions.superseded_start_nothing) {
        // Handed over: no answer, no offset commit; a charge this delivery could
        // not settle is kept in `unresolved_charges`.
        if worker.charge_unknown {
            retry_loop::remember_unresolved(config, state);
        }
        state.workers[i] = Worker::idle();
        return;
    }
    let owner = new_owner(state);
    let worker = &mut state.workers[i];
    worker.attempts += 1;
    worker.inherited = false;
    let previous = token_store::owner_name(worker.previous_claim);
    let context = CommandContext {
        earlier: ChargeEvidence::from_unknown(worker.charge_unknown),
        previous_claim: (worker.previous_claim != 0).then_some(previous.as_str()),
        ..CommandContext::default()
    };
    match token_store::reserve(state, owner) {
        Reservation::Reserved { fence, predecessor } => {
            let inherited = if config.mutated(Mutant::NoTakeoverLookup) {
                context.earlier
            } else {
                context.evidence_after(&predecessor)
            };
            let worker = &mut state.workers[i];
            worker.owner = owner;
            worker.fence = u8::try_from(fence).unwrap_or(u8::MAX);
            worker.inherited = inherited == ChargeEvidence::MayHaveCharged;
            worker.surely_held = true;
            worker.phase = Phase::Insert;
        }
        // The retry waits (no longer than the lease left): within a budget that
        // outlasts the lease, the attempt is not one of those that run out.
        Reservation::InFlight { .. } => {
            if config.assumptions.retry_outlasts_lease {
                state.workers[i].attempts -= 1;
            }
            end(state, i, Ended::Retry(false), None)
        }
        // The tombstone names the payment; the row tells the original answer.
        Reservation::Completed { .. } => end(state, i, Ended::Duplicate, None),
        Reservation::Missing | Reservation::Unsettled => end(state, i, Ended::Rejected, None),
    }
}

fn insert(config: &Config, state: &mut State, i: usize) {
    let worker = &state.workers[i];
    match state.row {
        Row::Committed(_) => {
            // `settle_existing`: the row decides; the token is confirmed.
            end(state, i, Ended::Duplicate, Some(Phase::ConfirmToken));
            return;
        }
        Row::Uncommitted(_) => return,
        Row::None => {}
    }
    let earlier = ChargeEvidence::from_unknown(worker.inherited);
    let fence = if config.mutated(Mutant::NoTakeoverLookup) {
        1
    } else {
        u64::from(worker.fence)
    };
    let history = decisions::charge_history(state.unresolved, earlier, fence);
    let first = decisions::first_step(config.lookup, history);
    state.row = Row::Uncommitted(worker.owner);
    let worker = &mut state.workers[i];
    worker.in_tx = true;
    worker.history = Some(history);
    worker.may_skip_check = first == FirstStep::Charge;
    worker.phase = match first {
        FirstStep::LookUp => Phase::LookUp,
        FirstStep::Charge => to_gateway(config),
    };
}

/// The charge after the look-up (or without one): the Charges adapter checks the
/// lease and POSTs; the Stripe adapter reads its records first.
fn to_gateway(config: &Config) -> Phase {
    match config.gateway {
        GatewayKind::Charges => Phase::CheckLease,
        GatewayKind::Stripe => Phase::Post,
    }
}

fn stripe_standing(state: &mut State, i: usize) {
    match gateway::standing(state) {
        Standing::Settled => charged(state, i, Verdict::Approved),
        Standing::Confirmable(intent) => {
            state.workers[i].intent = intent as u8 + 1;
            state.workers[i].phase = Phase::CheckConfirm;
        }
        Standing::Nothing => state.workers[i].phase = Phase::CheckLease,
    }
}

fn check_lease(config: &Config, state: &mut State, i: usize, phase: Phase) {
    let worker = &mut state.workers[i];
    let skip = std::mem::take(&mut worker.may_skip_check) && worker.surely_held;
    let next = match (config.gateway, phase) {
        (GatewayKind::Charges, _) => Phase::Post,
        (GatewayKind::Stripe, Phase::CheckLease) => Phase::Create,
        (GatewayKind::Stripe, _) => Phase::Confirm,
    };
    let owner = worker.owner;
    if skip || config.mutated(Mutant::NoStripeLeaseCheck) {
        state.workers[i].phase = next;
        return;
    }
    match token_store::extend(state, owner) {
        Transition::Applied => {
            state.workers[i].surely_held = true;
            state.workers[i].phase = next;
        }
        // `LeaseNotHeld(Lost)`: nothing was sent; the new owner decides.
        Transition::Refused => {
            let error = payment_worker::gateway::GatewayError::LeaseNotHeld(
                payment_worker::gateway::LeaseLoss::Lost,
            );
            debug_assert_eq!(
                decisions::on_charge_error(&error),
                OnChargeError::LeaveNothingSent
            );
            leave(state, i, false);
        }
    }
}

pub fn post(config: &Config, state: &mut State, i: usize, answer: Answer) {
    match config.gateway {
        GatewayKind::Charges => gateway::apply(config, state, answer),
        GatewayKind::Stripe => {
            let intent = usize::from(state.workers[i].intent).saturating_sub(1);
            gateway::confirm_intent(state, intent, answer)
        }
    }
    let error = match answer.received() {
        Ok(verdict) => return charged(state, i, verdict),
        Err(error) => error,
    };
    match decisions::on_charge_error(&error) {
        OnChargeError::LeaveNothingSent => leave(state, i, false),
        OnChargeError::RestoreRetry => restore(state, i, false),
        OnChargeError::Resolve(cause) => state.workers[i].phase = Phase::Resolve(cause),
        OnChargeError::RestoreUnknown => restore(state, i, true),
        OnChargeError::KeyReused | OnChargeError::Rejected => {
            end_tx(state, i);
            end(state, i, Ended::Rejected, Some(Phase::Restore));
        }
    }
}

pub fn look_up(config: &Config, state: &mut State, i: usize, answer: Result<Option<Verdict>, ()>) {
    if answer.is_err() {
        state.budget.faults -= 1;
    }
    let worker = &state.workers[i];
    match (worker.phase, answer) {
        (Phase::Resolve(cause), answer) => {
            let read = match answer {
                Ok(Some(_)) => LookupAnswer::Found,
                Ok(None) => LookupAnswer::NoneYet,
                Err(()) => LookupAnswer::Failed,
            };
            match (decisions::settle_unknown(cause, read), answer) {
                (SettleBy::Book, Ok(Some(verdict))) => charged(state, i, verdict),
                (SettleBy::RestoreUnknown, _) => restore(state, i, true),
                _ => leave(state, i, true),
            }
        }
        (_, Ok(Some(verdict))) => charged(state, i, verdict),
        (_, Ok(None)) => state.workers[i].phase = to_gateway(config),
        (_, Err(())) => {
            let history = worker.history.unwrap_or(decisions::ChargeHistory::Fresh);
            let evidence = decisions::failed_lookup_evidence(history);
            restore(state, i, evidence == ChargeEvidence::MayHaveCharged);
        }
    }
}

/// A charge in hand: recorded unless the lease was lost while the gateway worked
/// (`with_lease`'s renewals were refused).
fn charged(state: &mut State, i: usize, verdict: Verdict) {
    let owner = state.workers[i].owner;
    let kept = matches!(state.token, Some(Token::Processing { owner: o, .. }) if o == owner);
    if !kept {
        return leave(state, i, true);
    }
    state.workers[i].charge = Some(verdict);
    state.workers[i].phase = Phase::Fence;
}

/// `record_charge`, then the fence check before COMMIT (the Postgres store checks
/// its fence inside the COMMIT step instead).
fn fence(config: &Config, state: &mut State, i: usize) {
    let worker = &state.workers[i];
    if worker.tx_lost {
        return leave(state, i, true);
    }
    let owner = worker.owner;
    let checked = if config.store == StoreKind::Postgres
        || config.mutated(Mutant::NoFenceCheck)
        || worker.surely_held
    {
        Transition::Applied
    } else {
        token_store::extend(state, owner)
    };
    match checked {
        // A renewed lease is surely ours for another half lease.
        Transition::Applied => {
            state.workers[i].surely_held = true;
            state.workers[i].phase = Phase::Commit;
        }
        Transition::Refused => leave(state, i, true),
    }
}

fn commit(config: &Config, state: &mut State, i: usize) {
    let worker = state.workers[i].clone();
    let Some(verdict) = worker.charge else { return };
    if worker.tx_lost {
        return leave(state, i, true);
    }
    // I5: a takeover (a higher fence) since this attempt reserved forbids its
    // COMMIT. A token the store lost starts again at fence 1: no fence can tell
    // those holders apart, and the row's unique key serialises them (I6).
    let taken_over = match state.token {
        Some(Token::Processing { owner, fence, .. })
        | Some(Token::Pending {
            holder: owner,
            fence,
        }) => owner != worker.owner && fence > worker.fence,
        _ => false,
    };
    if config.store == StoreKind::Postgres {
        // `confirm_in`: the token completes in the payment's own transaction.
        let fenced = config.mutated(Mutant::NoFenceCheck)
            || token_store::confirm(state, worker.owner) == Transition::Applied;
        if !fenced {
            return leave(state, i, true);
        }
        if config.mutated(Mutant::NoFenceCheck) {
            state.token = Some(Token::Completed);
        }
        state.stale_commit |= taken_over;
        state.row = Row::Committed(verdict);
        state.workers[i].in_tx = false;
        return end(state, i, Ended::Booked(verdict), None);
    }
    state.stale_commit |= taken_over;
    state.row = Row::Committed(verdict);
    state.workers[i].in_tx = false;
    end(state, i, Ended::Booked(verdict), Some(Phase::ConfirmToken));
}

/// The transaction ends without COMMIT: its row goes.
fn end_tx(state: &mut State, i: usize) {
    let owner = state.workers[i].owner;
    token_store::roll_back(state, owner);
    state.workers[i].in_tx = false;
}

/// `Settlement::Restore(retry)` (the retry loop applies `Attempt::knowing`).
fn restore(state: &mut State, i: usize, unknown: bool) {
    end_tx(state, i);
    end(state, i, Ended::Retry(unknown), Some(Phase::Restore));
}

/// `Settlement::LeaveToLease(retry)` (the retry loop applies `Attempt::knowing`).
fn leave(state: &mut State, i: usize, unknown: bool) {
    end_tx(state, i);
    end(state, i, Ended::Retry(unknown), None);
}

/// The attempt came to `ended`; the token is settled by `then` (confirm, restore)
/// or left as it is, then the retry loop judges.
fn end(state: &mut State, i: usize, ended: Ended, then: Option<Phase>) {
    let worker = &mut state.workers[i];
    worker.result = ended;
    worker.phase = then.unwrap_or(Phase::Judge);
}
