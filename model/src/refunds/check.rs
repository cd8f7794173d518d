//! The refund model as a stateright model, its invariants, and a check of it.

use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model, Property};

use super::state::{RefundConfig, RowStatus, State};
use super::steps::{self, Action};
use crate::run::{report, Report};

/// No payment is refunded past its charge: by the gateway's count.
pub const NEVER_PAST_THE_CHARGE: &str = "R2: never refunded past the charge";
/// A refund key is refunded at most once at the gateway.
pub const ONE_REFUND_PER_KEY: &str = "at most one refund per refund key";
/// At quiescence the rows and the gateway agree: a key is `refunded` exactly when
/// the gateway refunded it, and no reservation is left `processing`.
pub const BOOKS_AGREE: &str = "R1: rows and gateway agree at quiescence";

#[derive(Debug, Clone)]
pub struct RefundModel {
    pub config: RefundConfig,
}

impl Model for RefundModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State::initial(&self.config)]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        steps::enabled(state, actions);
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        steps::apply(&self.config, last, action)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(NEVER_PAST_THE_CHARGE, |m: &RefundModel, s: &State| {
                s.refunded(&m.config) <= u32::from(m.config.charged)
            }),
            Property::always(ONE_REFUND_PER_KEY, |_, s: &State| {
                s.refunds.iter().all(|&n| n <= 1)
            }),
            Property::always(BOOKS_AGREE, |_, s: &State| {
                !s.quiescent()
                    || s.rows.iter().zip(&s.refunds).all(|(row, &refunds)| {
                        let status = row.map(|row| row.status);
                        status != Some(RowStatus::Processing)
                            && (refunds > 0) == (status == Some(RowStatus::Refunded))
                    })
            }),
            // Reachability: the model reaches what the invariants talk about.
            Property::sometimes("a refund is refused for the amount", |_, s: &State| {
                s.rows
                    .iter()
                    .any(|row| row.is_some_and(|row| row.status == RowStatus::Rejected))
            }),
            Property::sometimes("a refund is booked", |_, s: &State| {
                s.rows
                    .iter()
                    .any(|row| row.is_some_and(|row| row.status == RowStatus::Refunded))
            }),
            Property::sometimes(
                "a refund made by an earlier attempt is found by its look-up",
                |_, s: &State| s.found_by_look_up,
            ),
        ]
    }
}

/// Checks `config` breadth-first (the shortest counterexample first); with
/// `stop_at_failure`, stops at the first failure.
pub fn check_refunds(config: &RefundConfig, stop_at_failure: bool) -> Report {
    let model = RefundModel {
        config: config.clone(),
    };
    let properties = model.properties();
    let started = Instant::now();
    let mut builder = model.checker();
    if stop_at_failure {
        builder = builder.finish_when(HasDiscoveries::AnyFailures);
    }
    report(builder.spawn_bfs().join(), &properties, started, summary)
}

/// A state in one line: each key's row, lock holder and refunds, each worker's step.
fn summary(s: &State) -> String {
    format!(
        "rows {:?}, locks {:?}, refunds {:?}, [{}]",
        s.rows
            .iter()
            .map(|r| r.map(|r| r.status))
            .collect::<Vec<_>>(),
        s.locks,
        s.refunds,
        s.workers
            .iter()
            .map(|w| format!("k{} {:?}", w.key, w.phase))
            .collect::<Vec<_>>()
            .join(", ")
    )
}
