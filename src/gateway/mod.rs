//! The payment gateway as the worker sees it: the interface, and one adapter per
//! protocol (`charges`, `stripe`) over a shared transport (credentials, TLS).
//! (The simulator that answers `charges` in development lives in `devtools`.)
mod bodies;
mod client;
mod client_reads;
mod client_refunds;
mod ids;
mod interface;
mod refunds;
mod stripe;
mod transport;

pub use client::HttpGateway;
pub use interface::{
    Charge, ChargeRequest, ChargeStatus, GatewayError, LeaseGuard, LeaseLoss, LedgerEntry,
    PaymentGateway, Unconfirmed,
};
pub use refunds::{RefundEntry, RefundRequest};
pub use stripe::{stripe_amount, StripeCompat, StripeGateway, StripeOptions};
pub use transport::GatewayTransport;
