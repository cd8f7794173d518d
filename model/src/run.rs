//! Running a check: the search (depth-first by default, breadth-first for the
//! shortest counterexample), the symmetry reduction, and a report of what it found.

use std::time::{Duration, Instant};

use stateright::{Checker, HasDiscoveries, Model};

use crate::{Config, PaymentModel};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Search {
    /// Depth-first: little memory, any counterexample.
    Dfs,
    /// Breadth-first: the shortest counterexample; memory grows with the states.
    Bfs,
}

/// A property that failed, and the steps to the state that broke it.
#[derive(Debug)]
pub struct Counterexample {
    pub property: &'static str,
    /// The actions from the initial state, one a line.
    pub trace: Vec<String>,
}

#[derive(Debug)]
pub struct Report {
    pub unique_states: usize,
    pub states: usize,
    pub max_depth: usize,
    pub elapsed: Duration,
    pub counterexamples: Vec<Counterexample>,
    /// `sometimes` properties never met (what the model failed to reach).
    pub unreached: Vec<&'static str>,
}

/// Checks `config`; with `stop_at_failure`, stops at the first failure.
pub fn check(config: &Config, search: Search, threads: usize, stop_at_failure: bool) -> Report {
    let model = PaymentModel {
        config: config.clone(),
    };
    let properties = model.properties();
    let started = Instant::now();
    let mut builder = model
        .checker()
        .threads(threads)
        .symmetry_fn(crate::state::State::representative);
    if stop_at_failure {
        builder = builder.finish_when(HasDiscoveries::AnyFailures);
    }
    match search {
        Search::Dfs => report(builder.spawn_dfs().join(), &properties, started, summary),
        Search::Bfs => report(builder.spawn_bfs().join(), &properties, started, summary),
    }
}

/// What `checker` found of `properties`, each step of a counterexample shown with
/// the state after it (`summary`).
pub fn report<M: Model>(
    checker: impl Checker<M>,
    properties: &[stateright::Property<M>],
    started: Instant,
    summary: impl Fn(&M::State) -> String,
) -> Report
where
    M::State: Clone + PartialEq,
    M::Action: Clone + PartialEq + std::fmt::Debug,
{
    let elapsed = started.elapsed();
    let mut counterexamples = Vec::new();
    let mut unreached = Vec::new();
    for property in properties {
        let found = checker.discovery(property.name);
        match (&property.expectation, found) {
            (stateright::Expectation::Sometimes, None) => unreached.push(property.name),
            (stateright::Expectation::Sometimes, Some(_)) => {}
            (_, Some(path)) => counterexamples.push(Counterexample {
                property: property.name,
                trace: path
                    .into_vec()
                    .windows(2)
                    .filter_map(|pair| {
                        let action = pair[0].1.as_ref()?;
                        Some(format!("{action:?} -> {}", summary(&pair[1].0)))
                    })
                    .collect(),
            }),
            (_, None) => {}
        }
    }
    Report {
        unique_states: checker.unique_state_count(),
        states: checker.state_count(),
        max_depth: checker.max_depth(),
        elapsed,
        counterexamples,
        unreached,
    }
}

/// A state in one line: token, row, flags, and each worker's step.
fn summary(state: &crate::state::State) -> String {
    let workers: Vec<String> = state
        .workers
        .iter()
        .map(|w| format!("{:?}(o{} f{} #{})", w.phase, w.owner, w.fence, w.attempts))
        .collect();
    format!(
        "token {:?}, row {:?}, charges {}, unresolved {}, committed {}, [{}]",
        state.token,
        state.row,
        state.gateway.charges,
        state.unresolved,
        state.committed,
        workers.join(", ")
    )
}
