//! One integration-test binary (one link step); each module is a capability.
mod audit;
mod bench;
mod cli;
mod compose;
mod corpus;
mod demo;
mod gateway;
mod helpers;
mod multiprocess;
mod processor;
mod procs;
mod security;
mod telemetry;
mod token_contract;
mod token_postgres;
mod token_redis;
mod worker;
