//! The gateway simulator, and the processor against gateway answers real gateways give.

mod answers;
mod metrics;
mod sim_binary;
mod simulator;
mod unknown_charges;
