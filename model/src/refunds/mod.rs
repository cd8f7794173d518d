//! The refund protocol's model: several holders of the same refund key (the token
//! lost, so it excludes nobody) and refunds of other keys against one payment,
//! each running the three steps of `payment/processor/refunding.rs` with crashes
//! and lost gateway answers between any two of them, checked against the refund
//! invariants in every reachable state.

mod check;
mod state;
mod steps;

pub use check::{
    check_refunds, RefundModel, BOOKS_AGREE, NEVER_PAST_THE_CHARGE, ONE_REFUND_PER_KEY,
};
pub use state::{RefundConfig, RefundGateway, RefundMutant};
