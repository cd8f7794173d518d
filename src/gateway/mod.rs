mod client;
mod interface;
mod simulator;

pub use client::HttpGateway;
pub use interface::{
    Charge, ChargeRequest, ChargeStatus, GatewayError, LedgerEntry, PaymentGateway,
};
pub use simulator::{
    run_cli, run_cli as run_simulator, GatewaySimulator, RunningSimulator, SimulatorConfig, SlowKey,
};
