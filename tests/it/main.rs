//! One integration-test binary (one link step); each module is a capability.
mod helpers;
mod bench;
mod token_contract;
mod token_postgres;
mod token_redis;
mod cli;
mod demo;
mod gateway;
mod processor;
mod telemetry;
mod worker;
mod compose;
mod audit;
mod corpus;
mod security;
mod procs;
mod multiprocess;
