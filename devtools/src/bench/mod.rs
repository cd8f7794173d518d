//! `payment-worker-devtools bench` (docs/CONTRACT.md, "Performance targets"): throughput, latency and memory of the whole
//! path, against a Postgres ceiling measured in the same run so the ratios hold on
//! a noisy machine.
mod audit;
mod backlog;
mod ceiling;
mod cleanup;
mod compare;
mod cpu;
mod e2e;
mod load;
mod pg_tokens;
mod phase;
mod plot;
mod report;
mod results;
mod round_trips;
mod rss;
mod runner;
mod running;
mod stripe;
mod summaries;
mod table;

pub use report::{percentile, BenchReport};
pub use rss::{read_memory, Memory};
pub use runner::{run, BenchArgs};
