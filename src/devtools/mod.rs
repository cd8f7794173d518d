//! Development tools, apart from the product: `demo`, `bench`, the gateway
//! simulator (`gateway-sim`) and the local Kafka (`dev-kafka`). They may use any
//! product module; no product module uses them (only `cli` names both, to
//! dispatch commands).
mod bench;
mod demo;
mod gateway_simulator;
mod local_kafka;
mod localstripe;

pub use bench::{percentile, read_memory, run as run_bench, BenchArgs, BenchReport, Memory};
pub use demo::{run as run_demo, DemoArgs};
pub use gateway_simulator::{
    run_cli as run_simulator, GatewaySimulator, RunningSimulator, SimulatorConfig, SlowKey,
};
pub use local_kafka::{run_dev_kafka, DevKafkaArgs, LocalKafka};
pub use localstripe::{LocalStripe, LOCALSTRIPE_KEY, LOCALSTRIPE_VERSION};
