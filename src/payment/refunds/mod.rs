//! Refunds: (part of) a booked charge given back under a key of its own, never more
//! than was charged, whatever the keys, workers and crashes.
mod rows;

pub use rows::{
    find_refund, lock_refund, record_gateway_refusal, record_refund, record_rejection, refunded_of,
    release_refund, reserve_refund, settled_refund_keys, Locked, RefundRecord, RefundStatus,
    Reserving, MAX_FAILURE_REASON,
};
