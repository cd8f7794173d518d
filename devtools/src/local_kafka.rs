//! `payment-worker-devtools dev-kafka`, and the local Kafka behind it, the demo, the bench
//! and the tests: librdkafka's mock cluster in this process.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use rdkafka::config::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, DefaultProducerContext, Producer};

use payment_worker::configuration::KafkaSettings;

/// An in-process Kafka: librdkafka's mock cluster, speaking the real protocol on
/// localhost ports, with consumer groups and fault injection.
pub struct LocalKafka {
    // The mock cluster lives inside this client handle.
    producer: BaseProducer<DefaultProducerContext>,
}

impl LocalKafka {
    /// Starts a mock cluster of `brokers` brokers, first-rebalance delay off.
    pub fn start(brokers: i32) -> anyhow::Result<Self> {
        let producer: BaseProducer<DefaultProducerContext> = ClientConfig::new()
            .set("test.mock.num.brokers", brokers.to_string())
            .create()
            .context("starting the librdkafka mock cluster")?;
        // SAFETY: the handle is valid for the producer's lifetime, which owns the
        // cluster; a null return means the client has no mock cluster.
        unsafe {
            let raw = rdkafka_sys::rd_kafka_handle_mock_cluster(producer.client().native_ptr());
            anyhow::ensure!(!raw.is_null(), "client has no mock cluster");
            // The mock waits 3 s before the first rebalance by default; tests and the
            // demo would spend most of their time there.
            rdkafka_sys::rd_kafka_mock_group_initial_rebalance_delay_ms(raw, 0);
            // Groups of the KIP-848 protocol (`--kafka-group-protocol consumer`) take
            // their timeouts from the broker: as short as the tests' classic groups.
            rdkafka_sys::rd_kafka_mock_set_group_consumer_session_timeout_ms(raw, 6000);
            rdkafka_sys::rd_kafka_mock_set_group_consumer_heartbeat_interval_ms(raw, 1000);
        }
        Ok(Self { producer })
    }

    /// The mock cluster, for fault injection (broker down, request errors, RTT).
    pub fn cluster(&self) -> MockCluster<'_, DefaultProducerContext> {
        // `start` checked that the handle has a mock cluster.
        self.producer
            .client()
            .mock_cluster()
            .expect("LocalKafka always owns a mock cluster")
    }

    /// The cluster's `host:port,…` bootstrap list.
    pub fn bootstrap_servers(&self) -> String {
        self.cluster().bootstrap_servers()
    }

    /// Creates `name` with `partitions` partitions (replication factor 1).
    pub fn create_topic(&self, name: &str, partitions: i32) -> anyhow::Result<()> {
        self.cluster()
            .create_topic(name, partitions, 1)
            .with_context(|| format!("creating topic {name}"))
    }

    /// Creates the three topics of a payment-worker deployment.
    pub fn create_payment_topics(
        &self,
        settings: &KafkaSettings,
        partitions: i32,
    ) -> anyhow::Result<()> {
        self.create_topic(&settings.commands_topic, partitions)?;
        self.create_topic(&settings.results_topic, partitions)?;
        self.create_topic(&settings.dlq_topic, partitions)
    }
}

/// A standalone local Kafka (librdkafka mock cluster) for development.
#[derive(Debug, clap::Args)]
pub struct DevKafkaArgs {
    /// Host to advertise; the mock cluster picks its own ports and prints them.
    #[arg(long, default_value = "127.0.0.1")]
    pub listen: String,
    /// Partitions of each payment topic.
    #[arg(long, default_value_t = 6)]
    pub partitions: i32,
    /// Mock brokers in the cluster. Its own id: the flattened KafkaSettings
    /// already owns the argument id `brokers` (`--kafka-brokers`).
    #[arg(id = "mock_brokers", long = "brokers", default_value_t = 3)]
    pub brokers: i32,
    /// Also write the bootstrap address to this file.
    #[arg(long)]
    pub bootstrap_file: Option<PathBuf>,
    /// Topic names (and the settings any client of this cluster would use).
    #[command(flatten)]
    pub kafka: KafkaSettings,
}

/// `payment-worker-devtools dev-kafka`: starts the mock cluster with the three payment
/// topics, prints (and writes) its bootstrap address, and runs until SIGTERM/Ctrl-C.
pub async fn run_dev_kafka(args: DevKafkaArgs) -> anyhow::Result<()> {
    let shutdown = payment_worker::startup::shutdown_signal()?;
    let local = LocalKafka::start(args.brokers)?;
    local.create_payment_topics(&args.kafka, args.partitions)?;
    let bootstrap = local.bootstrap_servers();
    let advertised = if args.listen == "127.0.0.1" {
        bootstrap.clone()
    } else {
        bootstrap.replace("127.0.0.1", &args.listen)
    };
    if let Some(path) = args.bootstrap_file {
        std::fs::write(&path, &advertised)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    println!("dev-kafka bootstrap {advertised}");
    std::io::stdout().flush()?;
    shutdown.await;
    tokio::task::spawn_blocking(move || drop(local)).await?;
    Ok(())
}
