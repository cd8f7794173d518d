//! librdkafka client settings.

use std::ffi::CStr;

use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, FromClientConfig, FromClientConfigAndContext};
use rdkafka::consumer::{BaseConsumer, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka_sys as rdsys;

use crate::configuration::{GroupProtocol, KafkaSettings};

/// Brokers plus passed-through settings: the base of every client.
pub fn base_config(settings: &KafkaSettings) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &settings.brokers);
    apply_passthrough(&mut config, settings);
    config
}

/// Creates a Kafka client from `config`. Every client of the product is made here, so
/// that no refused setting prints its value: rdkafka's error quotes it, and the
/// setting may be a `sasl.password` (or a misspelt one librdkafka does not know).
pub fn create_client<T: FromClientConfig>(config: &ClientConfig) -> KafkaResult<T> {
    config.create().map_err(without_setting_value)
}

/// [`create_client`] with a client context.
pub fn create_client_with_context<C, T>(config: &ClientConfig, context: C) -> KafkaResult<T>
where
    C: ClientContext,
    T: FromClientConfigAndContext<C>,
{
    config
        .create_with_context(context)
        .map_err(without_setting_value)
}

const REDACTED: &str = "<redacted>";

/// A refused setting keeps its name and librdkafka's reason, never its value.
fn without_setting_value(error: KafkaError) -> KafkaError {
    match error {
        KafkaError::ClientConfig(code, reason, key, value) => {
            let reason = if value.is_empty() {
                reason
            } else {
                let quoted = reason.replace(&format!("\"{value}\""), &format!("\"{REDACTED}\""));
                if quoted.contains(value.as_str()) {
                    "librdkafka refused the value".to_owned()
                } else {
                    quoted
                }
            };
            KafkaError::ClientConfig(code, reason, key, REDACTED.to_owned())
        }
        other => other,
    }
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
/// Offsets are committed by the worker itself (see `commits.rs`): as soon as they
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

/// Who this member is in its group right now, as librdkafka knows it: the member id
/// the coordinator gave it and the generation of its last join (KIP-848: the member
/// epoch). Logged with every assignment change, so a partition's owners can be
/// told apart across the members' logs and the broker's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupGeneration {
    /// The generation (or member epoch); -1 before the first join.
    pub generation: i32,
    /// The member id; empty before the first join.
    pub member_id: String,
}

/// The member's current [`GroupGeneration`]; `None` for a client that is not a
/// group member. rdkafka keeps the handle's accessors to itself, so this asks
/// librdkafka directly. Served by librdkafka's own thread: callable from a
/// rebalance callback.
pub fn group_generation<C: ConsumerContext>(consumer: &BaseConsumer<C>) -> Option<GroupGeneration> {
    use rdkafka::consumer::Consumer;
    let client = consumer.client().native_ptr();
    // SAFETY: `client` is the live handle `consumer` owns; the metadata returned is
    // a copy this function owns and destroys after reading it (NULL: not a group
    // member), and the member id it points to is read before that.
    unsafe {
        let metadata = rdsys::rd_kafka_consumer_group_metadata(client);
        if metadata.is_null() {
            return None;
        }
        let generation = rdsys::rd_kafka_consumer_group_metadata_generation_id(metadata);
        let member = rdsys::rd_kafka_consumer_group_metadata_member_id(metadata);
        let member_id = if member.is_null() {
            String::new()
        } else {
            CStr::from_ptr(member).to_string_lossy().into_owned()
        };
        rdsys::rd_kafka_consumer_group_metadata_destroy(metadata);
        Some(GroupGeneration {
            generation,
            member_id,
        })
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::consumer::BaseConsumer;
    use rdkafka::producer::FutureProducer;

    fn refused(key: &str, value: &str) -> String {
        let mut config = ClientConfig::new();
        config.set(key, value);
        match create_client::<BaseConsumer>(&config) {
            Ok(_) => panic!("{key} was accepted"),
            Err(error) => format!("{error} {error:?}"),
        }
    }

    #[test]
    fn a_refused_setting_is_named_without_its_value() {
        // Unknown to librdkafka (a Java client's setting), and a known one with a
        // value it refuses: neither error shows the value.
        let jaas = r#"PlainLoginModule required username="u" password="hunter2-secret";"#;
        let unknown = refused("sasl.jaas.config", jaas);
        assert!(unknown.contains("sasl.jaas.config"), "{unknown}");
        assert!(!unknown.contains("hunter2-secret"), "{unknown}");
        let invalid = refused("security.protocol", "hunter2-secret");
        assert!(invalid.contains("security.protocol"), "{invalid}");
        assert!(!invalid.contains("hunter2-secret"), "{invalid}");
        assert!(invalid.contains(REDACTED), "{invalid}");
    }

    #[test]
    fn a_client_with_accepted_settings_is_created() {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", "127.0.0.1:1");
        assert!(create_client::<FutureProducer>(&config).is_ok());
    }
}
