//! The refund model's checks (`payment_worker_model::refunds`): every invariant
//! holds in the systems below, a gateway that ignores keys breaks one when Redis
//! loses tokens unless every POST is looked up first, and each guard of the refund
//! path, taken out, yields a counterexample to the invariant it keeps.

use payment_worker_model::refunds::{
    check_refunds, RefundConfig, RefundMutant, NEVER_PAST_THE_CHARGE, ONE_REFUND_PER_KEY,
};

mod support;
use support::{assert_no_counterexample, counterexample_to};

fn holds(config: RefundConfig) {
    let report = check_refunds(&config, false);
    assert_no_counterexample(&config, &report);
    assert!(
        report.unreached.is_empty(),
        "never reached: {:?}",
        report.unreached
    );
}

/// `config` yields a counterexample to `property`.
fn fails(config: RefundConfig, property: &str) {
    counterexample_to(&config, &check_refunds(&config, true), property);
}

#[test]
fn every_refund_invariant_holds_with_two_holders_per_key_crashes_and_lost_answers() {
    holds(RefundConfig::ci());
}

#[test]
fn against_a_gateway_that_ignores_keys_looking_up_every_post_first_holds() {
    holds(RefundConfig::ignoring_keys_looking_up_always());
}

#[test]
fn against_a_gateway_that_ignores_keys_one_holder_per_key_holds() {
    holds(RefundConfig::ignoring_keys_one_holder());
}

/// The assumption: with Redis losing a token, a second holder that reserved the row
/// itself POSTs without a look-up after the first holder's refund went unanswered
/// and it died before recording it; only the gateway's key (or `--gateway-lookup
/// always`) stops a second refund.
#[test]
fn a_gateway_that_ignores_keys_refunds_twice_when_redis_loses_the_token() {
    let config = RefundConfig {
        gateway: payment_worker_model::refunds::RefundGateway::IgnoresKeys,
        ..RefundConfig::ci()
    };
    fails(config, ONE_REFUND_PER_KEY);
}

#[test]
fn without_the_amount_check_two_refunds_pass_the_charge() {
    fails(
        RefundConfig::ci().with(RefundMutant::NoAmountCheck),
        NEVER_PAST_THE_CHARGE,
    );
}

#[test]
fn without_the_row_lock_two_holders_of_a_key_both_refund() {
    fails(
        RefundConfig::ignoring_keys_looking_up_always().with(RefundMutant::NoRowLock),
        ONE_REFUND_PER_KEY,
    );
}

#[test]
fn without_the_look_up_a_resumed_reservation_refunds_again() {
    fails(
        RefundConfig::ignoring_keys_one_holder().with(RefundMutant::NoLookupWhenResumed),
        ONE_REFUND_PER_KEY,
    );
}

#[test]
fn a_reservation_that_rolls_back_with_the_call_lets_another_key_pass_the_charge() {
    fails(
        RefundConfig::ci().with(RefundMutant::ReservationInCallTransaction),
        NEVER_PAST_THE_CHARGE,
    );
}
