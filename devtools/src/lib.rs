//! payment-worker's development tools, a crate apart from the product: `demo`,
//! `bench`, the gateway simulator (`gateway-sim`), the local Kafka (`dev-kafka`, with
//! the changes `native/` links into librdkafka's mock broker) and localstripe for
//! the tests. They use the product's public library; the product never uses them,
//! and its build (`cargo build --release` at the repository's root) holds none of it.
mod bench;
pub mod cli;
mod demo;
mod demo_refunds;
mod gateway_simulator;
mod local_kafka;
mod localstripe;
mod refund_books;

pub use bench::{percentile, read_memory, run as run_bench, BenchArgs, BenchReport, Memory};
pub use demo::{run as run_demo, DemoArgs};
pub use gateway_simulator::{
    run_cli as run_simulator, GatewaySimulator, RefundRefusal, RunningSimulator, SimulatorConfig,
    SlowKey,
};
pub use local_kafka::{run_dev_kafka, DevKafkaArgs, LocalKafka};
pub use localstripe::{
    has_localstripe, LocalStripe, PythonSearch, LOCALSTRIPE_ENV, LOCALSTRIPE_KEY,
    LOCALSTRIPE_VERSION,
};
