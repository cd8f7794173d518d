//! The model checks CI runs: every property holds in the bounded systems below;
//! each assumption turned off, and each mutant of the code's guards that the model
//! can tell apart, yields a counterexample (its trace length printed). They run one
//! at a time (nextest group `model-checks`, .config/nextest.toml).

use payment_worker_model::properties::{
    AT_MOST_ONE_CHARGE, CHARGE_BOOKED_OR_FLAGGED, FENCED_COMMIT, NO_TOKEN_STUCK,
};
use payment_worker_model::run::{check, Report, Search};
use payment_worker_model::{Config, GatewayKind, Mutant, StoreKind};

mod support;
use support::{assert_no_counterexample, counterexample_to};

fn holds(config: Config) -> Report {
    let report = holds_safety(config);
    assert!(
        report.unreached.is_empty(),
        "never reached: {:?}",
        report.unreached
    );
    report
}

/// Every safety property holds (some `sometimes` may be out of the system's reach).
fn holds_safety(config: Config) -> Report {
    let report = check(&config, Search::Dfs, 1, false);
    assert_no_counterexample(&config, &report);
    report
}

/// Checks breadth-first until the first failure (the shortest counterexample);
/// asserts it breaks `property` and returns its trace length.
fn fails(config: Config, property: &str) -> usize {
    let report = check(&config, Search::Bfs, 1, true);
    counterexample_to(&config, &report, property).trace.len()
}

/// The CI system without overlapping deliveries (see `overlapping_deliveries_*`).
fn ci(gateway: GatewayKind, store: StoreKind) -> Config {
    let mut config = Config::ci(gateway, store);
    config.redeliveries = 0;
    config
}

#[test]
fn charges_gateway_with_redis_tokens() {
    let report = holds(ci(GatewayKind::Charges, StoreKind::Redis));
    assert!(
        report.unique_states > 1_000_000,
        "the system explored is not trivial"
    );
}

#[test]
fn charges_gateway_with_postgres_tokens_and_overlapping_deliveries() {
    let mut config = Config::ci(GatewayKind::Charges, StoreKind::Postgres);
    config.wipes = 0;
    holds(config);
}

#[test]
fn stripe_with_redis_tokens() {
    holds(ci(GatewayKind::Stripe, StoreKind::Redis));
}

#[test]
fn stripe_with_postgres_tokens_and_overlapping_deliveries() {
    let mut config = Config::ci(GatewayKind::Stripe, StoreKind::Postgres);
    config.wipes = 0;
    holds(config);
}

#[test]
fn a_gateway_that_forgets_keys_charges_twice() {
    let mut config = ci(GatewayKind::Charges, StoreKind::Redis);
    config.assumptions.key_retention = false;
    config.wipes = 0;
    fails(config, AT_MOST_ONE_CHARGE);
}

#[test]
fn a_lost_postgres_commit_leaves_a_charge_booked_nowhere() {
    let mut config = ci(GatewayKind::Charges, StoreKind::Redis);
    config.assumptions.postgres_durability = false;
    fails(config, CHARGE_BOOKED_OR_FLAGGED);
}

#[test]
fn retries_shorter_than_a_lease_dead_letter_a_charge_unflagged() {
    let mut config = ci(GatewayKind::Charges, StoreKind::Redis);
    config.assumptions.retry_outlasts_lease = false;
    fails(config, CHARGE_BOOKED_OR_FLAGGED);
}

/// Against today's code: a delivery superseded by a rebalance still runs the first
/// attempt of a command it admitted; killed after its POST while its successor has
/// answered and committed the offset, its charge is flagged nowhere by the worker
/// (only `audit`'s ledger check finds it). docs/CONTRACT.md names the assumption.
#[test]
fn a_superseded_delivery_killed_after_its_charge_leaves_it_unflagged() {
    let mut config = Config::ci(GatewayKind::Charges, StoreKind::Postgres);
    config.wipes = 0;
    config.assumptions.superseded_start_nothing = false;
    fails(config, CHARGE_BOOKED_OR_FLAGGED);
}

/// Against today's code: with Redis tokens, a token loss while two deliveries of a
/// record overlap hides the older one's running attempt from the newer; the older,
/// killed after its POST, leaves its charge flagged nowhere by the worker.
#[test]
fn overlapping_deliveries_and_a_redis_loss_leave_a_charge_unflagged() {
    fails(
        Config::ci(GatewayKind::Charges, StoreKind::Redis),
        CHARGE_BOOKED_OR_FLAGGED,
    );
}

fn mutant(mut config: Config, mutant: Mutant) -> Config {
    config.mutant = Some(mutant);
    config
}

#[test]
fn restoring_another_owners_token_is_caught() {
    let config = mutant(
        ci(GatewayKind::Charges, StoreKind::Redis),
        Mutant::RestoreAnyOwner,
    );
    fails(config, NO_TOKEN_STUCK);
}

#[test]
fn an_unknown_charge_not_kept_in_unresolved_charges_is_caught() {
    let config = mutant(
        ci(GatewayKind::Charges, StoreKind::Redis),
        Mutant::NoUnresolvedFlag,
    );
    fails(config, CHARGE_BOOKED_OR_FLAGGED);
}

#[test]
fn a_stripe_confirm_without_its_lease_check_charges_twice() {
    let config = mutant(
        ci(GatewayKind::Stripe, StoreKind::Redis),
        Mutant::NoStripeLeaseCheck,
    );
    fails(config, AT_MOST_ONE_CHARGE);
}

#[test]
fn a_lease_that_runs_out_inside_its_sure_half_lets_a_stale_holder_commit() {
    let mut config = ci(GatewayKind::Charges, StoreKind::Redis);
    config.assumptions.lease_clock = false;
    fails(config, FENCED_COMMIT);
}

#[test]
fn a_commit_without_the_fence_check_is_caught_with_redis_tokens() {
    let config = mutant(
        ci(GatewayKind::Charges, StoreKind::Redis),
        Mutant::NoFenceCheck,
    );
    fails(config, FENCED_COMMIT);
}

#[test]
fn a_commit_without_the_fence_check_is_caught_with_postgres_tokens() {
    let mut config = Config::ci(GatewayKind::Charges, StoreKind::Postgres);
    config.wipes = 0;
    fails(mutant(config, Mutant::NoFenceCheck), FENCED_COMMIT);
}

/// A gateway that charges every POST anew: the look-up on a takeover is what keeps
/// a killed holder's charge from being made twice (the system without faults, where
/// only takeovers can repeat a POST).
fn takeovers_only() -> Config {
    let mut config = ci(GatewayKind::Charges, StoreKind::Redis);
    config.gateway_ignores_keys = true;
    config.faults = 0;
    config.wipes = 0;
    config
}

#[test]
fn a_gateway_ignoring_keys_is_safe_on_takeovers_through_the_look_up() {
    holds_safety(takeovers_only());
}

#[test]
fn a_takeover_that_charges_without_looking_up_is_caught() {
    fails(
        mutant(takeovers_only(), Mutant::NoTakeoverLookup),
        AT_MOST_ONE_CHARGE,
    );
}
