//! One integration-test binary (one link step), one folder per capability and one
//! `support/` for the harness they share.
mod audit;
mod chaos;
mod cli;
mod deploy;
mod gateway;
#[cfg(target_os = "linux")]
mod local_kafka;
mod payment;
mod support;
mod telemetry;
mod token;
mod worker;
