//! The gateway: what a POST or a look-up may answer, and what each answer leaves
//! at the gateway. Answers become the code's own `GatewayError`s, classified by
//! the code's `on_charge_error`.

use payment_worker::gateway::GatewayError;

use crate::config::{Config, GatewayKind};
use crate::state::{State, Verdict};

/// What the gateway did with one POST (Charges) or one Stripe confirm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Answer {
    Approved,
    Declined,
    /// No answer; the request is queued inside the gateway and lands later.
    TimeoutBeforeCharging,
    /// Charged, and the answer lost.
    TimeoutAfterCharging,
    /// Charged, and a 5xx (or a proxy's 4xx on a Stripe confirm) answered.
    FailedAfterCharging,
    /// Charged, and an answer nobody can read.
    UnreadableAfterCharging,
    /// Nothing sent (a refused connect, 429).
    Unreachable,
    /// 409: a request with this key is still being worked on.
    InFlight,
}

impl Answer {
    /// The answer the code receives: `Ok` a charge, `Err` the gateway error.
    pub fn received(self) -> Result<Verdict, GatewayError> {
        match self {
            Self::Approved => Ok(Verdict::Approved),
            Self::Declined => Ok(Verdict::Declined),
            Self::TimeoutBeforeCharging | Self::TimeoutAfterCharging => Err(GatewayError::Timeout),
            Self::FailedAfterCharging => Err(GatewayError::FailedAfterSending {
                status: 502,
                reason: String::new(),
            }),
            Self::UnreadableAfterCharging => Err(GatewayError::UnreadableAnswer(String::new())),
            Self::Unreachable => Err(GatewayError::Unavailable(String::new())),
            Self::InFlight => Err(GatewayError::InFlight),
        }
    }

    fn is_fault(self) -> bool {
        !matches!(self, Self::Approved | Self::Declined | Self::InFlight)
    }
}

/// The answers a POST (Charges) or a confirm (Stripe) may get in `state`.
pub fn answers(config: &Config, state: &State) -> Vec<Answer> {
    let gateway = &state.gateway;
    if config.gateway == GatewayKind::Charges {
        if gateway.queued {
            return vec![Answer::InFlight];
        }
        // The key joins the repeat: the first answer again, nothing charged.
        if let (Some(verdict), false) = (gateway.entry, config.gateway_ignores_keys) {
            return vec![match verdict {
                Verdict::Approved => Answer::Approved,
                Verdict::Declined => Answer::Declined,
            }];
        }
    }
    let mut all = vec![Answer::Approved];
    if config.gateway == GatewayKind::Charges {
        all.extend([
            Answer::Declined,
            Answer::TimeoutBeforeCharging,
            Answer::TimeoutAfterCharging,
            Answer::FailedAfterCharging,
            Answer::UnreadableAfterCharging,
            Answer::Unreachable,
        ]);
    } else {
        // A confirm whose answer is lost (it charged), a proxy's 5xx or 4xx after it.
        // (A declined confirm is left out: its PaymentIntent's later standing is not
        // modelled.)
        all.extend([Answer::TimeoutAfterCharging, Answer::FailedAfterCharging]);
    }
    all.retain(|answer| !answer.is_fault() || state.budget.faults > 0);
    all
}

/// What `answer` to a POST under the command's key leaves at the gateway.
pub fn apply(config: &Config, state: &mut State, answer: Answer) {
    if answer.is_fault() {
        state.budget.faults -= 1;
    }
    let gateway = &mut state.gateway;
    let repeat = (gateway.entry.is_some() && !config.gateway_ignores_keys) || gateway.queued;
    match answer {
        Answer::Approved
        | Answer::TimeoutAfterCharging
        | Answer::FailedAfterCharging
        | Answer::UnreadableAfterCharging
            if !repeat =>
        {
            gateway.charges += 1;
            gateway.entry = Some(Verdict::Approved);
        }
        Answer::Declined if !repeat => gateway.entry = Some(Verdict::Declined),
        Answer::TimeoutBeforeCharging => gateway.queued = true,
        _ => {}
    }
}

/// Stripe: what `answer` to the confirm of PaymentIntent `intent` (its index)
/// leaves: a PaymentIntent charges once, whoever confirms it, however often.
pub fn confirm_intent(state: &mut State, intent: usize, answer: Answer) {
    if answer.is_fault() {
        state.budget.faults -= 1;
    }
    if let Some(confirmed) = state.gateway.intents.get_mut(intent) {
        if !*confirmed {
            *confirmed = true;
            state.gateway.charges += 1;
        }
    }
}

/// Stripe: what the adapter's records say before it creates.
pub enum Standing {
    /// A confirmed PaymentIntent: its charge is the answer.
    Settled,
    /// A recorded PaymentIntent not confirmed: confirm it (index).
    Confirmable(usize),
    /// Nothing: create one.
    Nothing,
}

pub fn standing(state: &State) -> Standing {
    let intents = &state.gateway.intents;
    if intents.iter().any(|confirmed| *confirmed) {
        Standing::Settled
    } else if intents.is_empty() {
        Standing::Nothing
    } else {
        Standing::Confirmable(intents.len() - 1)
    }
}

/// What a look-up by key may answer: the charge under the key (`Some`), none
/// (`None`), or a failure (`Err`, a fault).
pub fn lookups(config: &Config, state: &State) -> Vec<Result<Option<Verdict>, ()>> {
    let shown = match config.gateway {
        GatewayKind::Charges => state.gateway.entry,
        // Stripe lists the key's PaymentIntents: a confirmed one is the charge.
        GatewayKind::Stripe => (state.gateway.charges > 0).then_some(Verdict::Approved),
    };
    let mut all = vec![Ok(shown)];
    if state.budget.faults > 0 {
        all.push(Err(()));
    }
    all
}

/// A request queued inside the gateway lands: it charges, under the key.
pub fn land(state: &mut State) {
    state.gateway.queued = false;
    if state.gateway.entry.is_none() {
        state.gateway.charges += 1;
        state.gateway.entry = Some(Verdict::Approved);
    }
}
