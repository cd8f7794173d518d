//! The system's moves: each worker's next step of the processor (in the code's
//! order), and the adversary's: crashes, lease expiry, zombies, token loss,
//! gateway faults and late landings, redelivery, replay, redrive, and the breaks of
//! the assumptions turned off.

use crate::config::{Config, GatewayKind, StoreKind};
use crate::gateway::{self, Answer};
use crate::state::{Phase, Row, State, Token, Verdict, Worker};
use crate::steps::{look_up, post, step};
use crate::token_store;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Worker takes the record from the topic (first delivery or a redelivery).
    Deliver(usize),
    /// Worker takes the dead letter back (`dlq redrive`).
    Redrive(usize),
    /// Worker's next step; a gateway call's answer or a look-up's is part of it.
    Step(usize),
    Post(usize, Answer),
    LookUp(usize, Result<Option<Verdict>, ()>),
    Crash(usize),
    /// The worker's "surely held" half of the lease passes.
    Pass(usize),
    /// The token's lease runs out.
    Expire,
    /// The worker is paused past its lease; its Postgres session is dropped.
    Pause(usize),
    WipeTokens,
    LandQueued,
    Replay,
    /// Assumptions turned off: the gateway forgets the key; a commit is lost.
    ForgetKey,
    LosePostgres,
}

pub fn enabled(config: &Config, state: &State, actions: &mut Vec<Action>) {
    let busy = state.workers.iter().any(|w| w.phase != Phase::Idle);
    for (i, worker) in state.workers.iter().enumerate() {
        if worker.phase == Phase::Idle {
            if !state.committed && (!busy || state.budget.redeliveries > 0) {
                actions.push(Action::Deliver(i));
            }
            if state.dead_letter.is_some() && state.budget.redrives > 0 {
                actions.push(Action::Redrive(i));
            }
            continue;
        }
        match worker.phase {
            Phase::Post if config.gateway == GatewayKind::Charges => {
                for answer in gateway::answers(config, state) {
                    actions.push(Action::Post(i, answer));
                }
            }
            Phase::Confirm => {
                for answer in gateway::answers(config, state) {
                    actions.push(Action::Post(i, answer));
                }
            }
            Phase::LookUp | Phase::Resolve(_) => {
                for answer in gateway::lookups(config, state) {
                    actions.push(Action::LookUp(i, answer));
                }
            }
            // An insert waits on another holder's uncommitted row.
            Phase::Insert if matches!(state.row, Row::Uncommitted(o) if o != worker.owner) => {}
            _ => actions.push(Action::Step(i)),
        }
        if state.budget.crashes > 0 {
            actions.push(Action::Crash(i));
        }
        // Under the lease clock, COMMIT follows the fence check within the half
        // lease that check bought.
        let committing = worker.phase == Phase::Commit && config.assumptions.lease_clock;
        if worker.surely_held && !committing {
            actions.push(Action::Pass(i));
        }
        if state.budget.zombies > 0 && worker.owner != 0 {
            actions.push(Action::Pause(i));
        }
    }
    if let Some(Token::Processing {
        owner, live: true, ..
    }) = state.token
    {
        match state.owner_running(owner) {
            // Nobody renews it: it runs out, in time, without a fault.
            None => actions.push(Action::Expire),
            Some(holder) => {
                let allowed = !holder.surely_held || !config.assumptions.lease_clock;
                if state.budget.expiries > 0 && allowed {
                    actions.push(Action::Expire);
                }
            }
        }
    }
    if config.store == StoreKind::Redis && state.budget.wipes > 0 && state.token.is_some() {
        actions.push(Action::WipeTokens);
    }
    if state.gateway.queued {
        actions.push(Action::LandQueued);
    }
    if state.committed && state.budget.replays > 0 {
        actions.push(Action::Replay);
    }
    if state.budget.breaks > 0 {
        if !config.assumptions.key_retention && state.gateway.entry.is_some() {
            actions.push(Action::ForgetKey);
        }
        if !config.assumptions.postgres_durability && state.row != Row::None {
            actions.push(Action::LosePostgres);
        }
    }
}

pub fn apply(config: &Config, last: &State, action: Action) -> Option<State> {
    let mut state = last.clone();
    match action {
        Action::Deliver(i) => {
            if state.workers.iter().any(|w| w.phase != Phase::Idle) {
                state.budget.redeliveries -= 1;
            }
            let flagged = state.flagged;
            start_delivery(&mut state, i, flagged);
        }
        Action::Redrive(i) => {
            state.budget.redrives -= 1;
            let flag = state.dead_letter.take().unwrap_or(false);
            // The redriven record is a new record on the topic, flagged as its dead
            // letter was.
            state.flagged = flag;
            state.committed = false;
            start_delivery(&mut state, i, flag);
        }
        Action::Step(i) => step(config, &mut state, i),
        Action::Post(i, answer) => post(config, &mut state, i, answer),
        Action::LookUp(i, answer) => look_up(config, &mut state, i, answer),
        Action::Crash(i) => {
            state.budget.crashes -= 1;
            let owner = state.workers[i].owner;
            token_store::roll_back(&mut state, owner);
            state.workers[i] = Worker::idle();
        }
        Action::Pass(i) => state.workers[i].surely_held = false,
        Action::Expire => {
            if let Some(Token::Processing { owner, .. }) = state.token {
                if state.owner_running(owner).is_some() {
                    state.budget.expiries -= 1;
                }
            }
            expire(&mut state);
        }
        Action::Pause(i) => {
            state.budget.zombies -= 1;
            let worker = &mut state.workers[i];
            worker.surely_held = false;
            let owner = worker.owner;
            if worker.in_tx {
                worker.tx_lost = true;
            }
            if matches!(state.token, Some(Token::Processing { owner: o, .. }) if o == owner) {
                expire(&mut state);
            }
            token_store::roll_back(&mut state, owner);
        }
        Action::WipeTokens => {
            state.budget.wipes -= 1;
            state.token = None;
        }
        Action::LandQueued => gateway::land(&mut state),
        Action::Replay => {
            state.budget.replays -= 1;
            state.committed = false;
        }
        Action::ForgetKey => {
            state.budget.breaks -= 1;
            state.gateway.entry = None;
        }
        Action::LosePostgres => {
            state.budget.breaks -= 1;
            state.row = Row::None;
            state.unresolved = false;
            if config.store == StoreKind::Postgres {
                state.token = None;
            }
        }
    }
    Some(state)
}

fn expire(state: &mut State) {
    if let Some(Token::Processing { fence, owner, .. }) = state.token {
        state.token = Some(Token::Processing {
            fence,
            owner,
            live: false,
        });
    }
}

fn start_delivery(state: &mut State, i: usize, flagged: bool) {
    for other in &mut state.workers {
        other.current = false;
    }
    let mut worker = Worker::idle();
    worker.current = true;
    worker.charge_unknown = flagged;
    worker.phase = Phase::Reserve;
    state.workers[i] = worker;
}
