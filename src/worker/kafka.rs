//! librdkafka client settings, and a local Kafka (librdkafka's mock cluster) for
//! `demo`, `dev-kafka` and the tests.

use anyhow::Context;
use rdkafka::config::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, DefaultProducerContext, Producer};

use crate::configuration::{GroupProtocol, KafkaSettings};

pub fn base_config(settings: &KafkaSettings) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &settings.brokers);
    apply_passthrough(&mut config, settings);
    config
}

/// Passed-through settings go on after the worker's defaults, so an operator's
/// tuning wins; the settings the worker owns never get here
/// (`KafkaSettings::check_passthrough`), and the worker sets those after this.
fn apply_passthrough(config: &mut ClientConfig, settings: &KafkaSettings) {
    for (key, value) in settings.passthrough() {
        config.set(key, value);
    }
}

/// At-least-once consumption with our own offset discipline (invariant I3): librdkafka
/// commits only offsets the worker stored, and the worker stores an offset only when
/// every command below it is settled and its result acknowledged.
///
/// Offsets are committed by the worker itself (see `rebalance.rs`): as soon as they
/// move, after every drain and before leaving.
pub fn consumer_config(settings: &KafkaSettings) -> ClientConfig {
    let session_ms = settings.session_timeout.as_millis().max(1000);
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &settings.brokers)
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        .set("max.poll.interval.ms", "300000")
        // Bounded prefetch keeps memory flat with a deep backlog.
        .set("queued.max.messages.kbytes", "16384");
    match settings.group_protocol {
        GroupProtocol::Classic => {
            config
                .set("session.timeout.ms", session_ms.to_string())
                .set(
                    "heartbeat.interval.ms",
                    (session_ms / 4).max(250).to_string(),
                )
                // Incremental rebalancing (KIP-429): a join or leave moves only the
                // partitions that must move. An operator may still choose an eager
                // assignor through KAFKA_CONFIG_PARTITION_ASSIGNMENT_STRATEGY (needed
                // while members of an older eager release are in the group): the
                // pass-through below wins.
                .set("partition.assignment.strategy", "cooperative-sticky");
        }
        // KIP-848: the broker assigns (always incrementally) and owns the timeouts.
        GroupProtocol::Consumer => {
            config.set("group.protocol", "consumer");
        }
    }
    if crate::telemetry::metrics_exported() {
        // Feeds the consumer-lag gauge.
        config.set("statistics.interval.ms", "5000");
    }
    apply_passthrough(&mut config, settings);
    config
        .set("group.id", &settings.group_id)
        .set("enable.auto.offset.store", "false")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed");
    if let Some(instance) = &settings.group_instance_id {
        config.set("group.instance.id", instance);
    }
    config
}

/// Results and dead letters are acknowledged by every in-sync replica before the
/// command's offset may move, and never duplicated by producer retries.
pub fn producer_config(settings: &KafkaSettings) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &settings.brokers)
        .set("linger.ms", "2")
        .set("message.timeout.ms", "30000");
    apply_passthrough(&mut config, settings);
    config.set("acks", "all").set("enable.idempotence", "true");
    config
}

/// An in-process Kafka: librdkafka's mock cluster, speaking the real protocol on
/// localhost ports, with consumer groups and fault injection.
pub struct LocalKafka {
    // The mock cluster lives inside this client handle.
    producer: BaseProducer<DefaultProducerContext>,
}

impl LocalKafka {
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

    pub fn cluster(&self) -> MockCluster<'_, DefaultProducerContext> {
        // `start` checked that the handle has a mock cluster.
        self.producer
            .client()
            .mock_cluster()
            .expect("LocalKafka always owns a mock cluster")
    }

    pub fn bootstrap_servers(&self) -> String {
        self.cluster().bootstrap_servers()
    }

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
