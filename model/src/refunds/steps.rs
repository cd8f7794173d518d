//! The refund path's steps, in the code's order (`payment/processor/refunding.rs`),
//! and the faults between them. The look-up decision is the product's own
//! (`decisions::first_step` of `charge_history`, as `ask_gateway` calls them).

use payment_worker::payment::decisions::{charge_history, first_step, FirstStep};

use super::state::{
    Earlier, Phase, RefundConfig, RefundGateway, RefundMutant, Row, RowStatus, State,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Step 1 (`reserve_amount`): the payment's row locked, the refund's row read;
    /// none: the amount checked against what is booked or in flight, the row
    /// inserted `processing` (or `rejected`), committed.
    Reserve(u8),
    /// Step 2 begins (`lock_for_the_call`): the refund's row locked without waiting.
    Lock(u8),
    /// The refund looked up at the gateway before any POST.
    LookUp(u8),
    /// The POST, answered.
    Post(u8),
    /// The POST's answer lost (a timeout): the refund made or not.
    PostAnswerLost { worker: u8, made: bool },
    /// Step 3 (`record_and_commit`): the answer recorded, committed, the lock freed.
    Record(u8),
    /// The worker dies; its open transaction rolls back and its record is
    /// delivered again.
    Crash(u8),
}

pub fn enabled(state: &State, actions: &mut Vec<Action>) {
    for (i, worker) in state.workers.iter().enumerate() {
        let i = i as u8;
        match worker.phase {
            Phase::Done => continue,
            Phase::Reserve => actions.push(Action::Reserve(i)),
            Phase::Lock { .. } => actions.push(Action::Lock(i)),
            Phase::LookUp => actions.push(Action::LookUp(i)),
            Phase::Post => {
                actions.push(Action::Post(i));
                if state.lost_answers > 0 {
                    for made in [true, false] {
                        actions.push(Action::PostAnswerLost { worker: i, made });
                    }
                }
            }
            Phase::Record => actions.push(Action::Record(i)),
        }
        if state.crashes > 0 {
            actions.push(Action::Crash(i));
        }
    }
}

pub fn apply(config: &RefundConfig, last: &State, action: Action) -> Option<State> {
    let mut s = last.clone();
    let mutant = config.mutant;
    match action {
        Action::Reserve(i) => reserve(config, &mut s, i),
        Action::Lock(i) => {
            let w = s.workers[i as usize];
            let Phase::Lock { resumed } = w.phase else {
                return None;
            };
            let key = usize::from(w.key);
            if mutant != Some(RefundMutant::NoRowLock) {
                if s.locks[key].is_some_and(|holder| holder != i) {
                    // `FOR UPDATE NOWAIT` fails: the attempt ends, tried again later.
                    s.workers[i as usize].phase = Phase::Reserve;
                    return Some(s);
                }
                s.locks[key] = Some(i);
            }
            let resumed = resumed && mutant != Some(RefundMutant::NoLookupWhenResumed);
            // The token says nothing here (Redis lost it: its fence starts at 1 again).
            let history = charge_history(resumed, w.earlier.evidence(), 1);
            s.workers[i as usize].phase = match first_step(config.lookup, history) {
                FirstStep::LookUp => Phase::LookUp,
                FirstStep::Charge => Phase::Post,
            };
        }
        Action::LookUp(i) => {
            let key = usize::from(s.workers[i as usize].key);
            s.workers[i as usize].phase = if s.refunds[key] > 0 {
                s.found_by_look_up = true;
                Phase::Record
            } else {
                Phase::Post
            };
        }
        Action::Post(i) => {
            let key = usize::from(s.workers[i as usize].key);
            gateway_refunds(config, &mut s, key);
            s.workers[i as usize].phase = Phase::Record;
        }
        Action::PostAnswerLost { worker: i, made } => {
            let key = usize::from(s.workers[i as usize].key);
            s.lost_answers -= 1;
            if made {
                gateway_refunds(config, &mut s, key);
            }
            // An unknown outcome: the token restored, the transaction rolled back,
            // the next attempt of this delivery knows a refund may exist.
            end_attempt(&mut s, i);
            s.workers[i as usize].earlier = Earlier::MayHaveRefunded;
        }
        Action::Record(i) => {
            let key = usize::from(s.workers[i as usize].key);
            s.rows[key] = Some(Row {
                status: RowStatus::Refunded,
                uncommitted_by: None,
            });
            if s.locks[key] == Some(i) {
                s.locks[key] = None;
            }
            s.workers[i as usize].phase = Phase::Done;
        }
        Action::Crash(i) => {
            s.crashes -= 1;
            end_attempt(&mut s, i);
            // A new delivery of the record: nothing carried over.
            s.workers[i as usize].earlier = Earlier::Unchanged;
        }
    }
    Some(s)
}

/// The gateway takes a refund POST under `key`.
fn gateway_refunds(config: &RefundConfig, s: &mut State, key: usize) {
    if s.refunds[key] == 0 || config.gateway == RefundGateway::IgnoresKeys {
        s.refunds[key] += 1;
    }
}

/// Step 1 for worker `i`.
fn reserve(config: &RefundConfig, s: &mut State, i: u8) {
    let key = usize::from(s.workers[i as usize].key);
    let phase = match s.rows[key] {
        // Reserved by an earlier attempt (or another holder): it may have been sent.
        Some(Row {
            status: RowStatus::Processing,
            ..
        }) => Phase::Lock { resumed: true },
        // Answered before: a duplicate, or the same refusal again.
        Some(_) => Phase::Done,
        None => {
            let booked: u32 = s
                .rows
                .iter()
                .zip(&config.amounts)
                .filter_map(|(row, &amount)| {
                    let row = (*row)?;
                    // Another transaction's insert is not seen before it commits.
                    let counts = matches!(row.status, RowStatus::Processing | RowStatus::Refunded)
                        && row.uncommitted_by.is_none_or(|by| by == i);
                    counts.then_some(u32::from(amount))
                })
                .sum();
            let wanted = u32::from(config.amounts[key]);
            let fits = booked + wanted <= u32::from(config.charged)
                || config.mutant == Some(RefundMutant::NoAmountCheck);
            let uncommitted_by =
                (config.mutant == Some(RefundMutant::ReservationInCallTransaction)).then_some(i);
            if fits {
                s.rows[key] = Some(Row {
                    status: RowStatus::Processing,
                    uncommitted_by,
                });
                Phase::Lock { resumed: false }
            } else {
                s.rows[key] = Some(Row {
                    status: RowStatus::Rejected,
                    uncommitted_by: None,
                });
                Phase::Done
            }
        }
    };
    s.workers[i as usize].phase = phase;
}

/// Worker `i`'s attempt ends before step 3: its row lock is freed, what its open
/// transaction wrote rolls back, and it starts again at step 1.
fn end_attempt(s: &mut State, i: u8) {
    let key = usize::from(s.workers[i as usize].key);
    if s.locks[key] == Some(i) {
        s.locks[key] = None;
    }
    if s.rows[key].is_some_and(|row| row.uncommitted_by == Some(i)) {
        s.rows[key] = None;
    }
    s.workers[i as usize].phase = Phase::Reserve;
}
