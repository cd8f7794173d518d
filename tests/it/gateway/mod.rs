//! The gateway simulator, the processor against gateway answers real gateways
//! give, the Stripe adapter, and the credentials and TLS every adapter uses.

mod answers;
mod credentials;
mod metrics;
mod refunds;
mod sim_binary;
mod simulator;
mod stripe;
mod takeovers;
mod unknown_charges;
mod unknown_outcomes;
