//! A model checker of payment-worker's payment protocol (stateright): N workers
//! running the processor's steps in the code's order against both token stores,
//! the gateway (charges API or Stripe) and every fault the contract names, checked
//! against the invariants in every reachable state of a bounded system.
//!
//! The decisions are the product's own (`payment_worker::payment::decisions`,
//! `CommandContext::evidence_after`, `Attempt::knowing`, the token store's
//! `Reservation`/`Predecessor`/`Transition`), so a change to them changes, or
//! breaks the build of, this model. docs/ARCHITECTURE.md maps each action to the
//! code it mirrors.
//!
//! The refund path has a model of its own (`refunds`): several refund keys of one
//! payment, their holders kept apart by Postgres alone.

pub mod actions;
pub mod config;
pub mod gateway;
pub mod properties;
pub mod refunds;
pub mod retry_loop;
pub mod run;
pub mod state;
pub mod steps;
pub mod token_store;

use stateright::{Model, Property};

pub use config::{Assumptions, Config, GatewayKind, Mutant, StoreKind};
use state::{Budget, Gateway, Row, State, Worker};

/// The model of one bounded system.
#[derive(Debug, Clone)]
pub struct PaymentModel {
    pub config: Config,
}

impl Model for PaymentModel {
    type State = State;
    type Action = actions::Action;

    fn init_states(&self) -> Vec<State> {
        let c = &self.config;
        let breaks =
            u8::from(!c.assumptions.key_retention) + u8::from(!c.assumptions.postgres_durability);
        vec![State {
            workers: vec![Worker::idle(); c.workers],
            token: None,
            row: Row::None,
            unresolved: false,
            gateway: Gateway {
                entry: None,
                queued: false,
                charges: 0,
                intents: Vec::new(),
            },
            committed: false,
            dead_letter: None,
            flagged: false,
            answered: false,
            original: None,
            wrong_duplicate: false,
            duplicate_answered: false,
            offset_unanswered: false,
            stale_commit: false,
            budget: Budget {
                crashes: c.crashes,
                expiries: c.expiries,
                zombies: c.zombies,
                wipes: c.wipes,
                faults: c.faults,
                redeliveries: c.redeliveries,
                replays: c.replays,
                redrives: c.redrives,
                breaks,
            },
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<actions::Action>) {
        actions::enabled(&self.config, state, actions);
    }

    fn next_state(&self, last: &State, action: actions::Action) -> Option<State> {
        actions::apply(&self.config, last, action)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all()
    }
}
