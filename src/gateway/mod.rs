//! The payment gateway as the worker sees it: the interface and the HTTP client.
//! (The simulator that answers it in development lives in `devtools`.)
mod client;
mod interface;

pub use client::HttpGateway;
pub use interface::{
    Charge, ChargeRequest, ChargeStatus, GatewayError, LedgerEntry, PaymentGateway,
};
