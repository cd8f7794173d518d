//! The Kafka cluster, the consumer group, the topics and the settings passed through to
//! librdkafka.

use std::time::Duration;

use super::kafka_passthrough::{
    check_passthrough_key, environment_passthrough, is_secret_setting, KafkaConfigFileParser,
    KafkaSettingParser,
};
use super::{parse_duration, KafkaConfigFile, RefusedKafkaSetting};

/// `KAFKA_BROKERS` when none is given: a local broker.
pub const DEFAULT_BROKERS: &str = "127.0.0.1:9092";

/// The Kafka cluster, the group and the three topics the worker uses.
#[derive(Clone, clap::Args)]
pub struct KafkaSettings {
    /// Bootstrap brokers, `host:port[,host:port…]`.
    #[arg(long = "kafka-brokers", env = "KAFKA_BROKERS", default_value = DEFAULT_BROKERS)]
    pub brokers: String,
    /// Consumer group of the workers.
    #[arg(
        long = "kafka-group-id",
        env = "KAFKA_GROUP_ID",
        default_value = "payment-worker"
    )]
    pub group_id: String,
    /// Topic the payment commands arrive on.
    #[arg(
        long = "commands-topic",
        env = "COMMANDS_TOPIC",
        default_value = "payments.commands"
    )]
    pub commands_topic: String,
    /// Topic each processed command's result is published to.
    #[arg(
        long = "results-topic",
        env = "RESULTS_TOPIC",
        default_value = "payments.results"
    )]
    pub results_topic: String,
    /// Dead-letter topic for records that cannot be processed.
    #[arg(long = "dlq-topic", env = "DLQ_TOPIC", default_value = "payments.dlq")]
    pub dlq_topic: String,
    /// A member that stops heart-beating this long is removed from the group.
    #[arg(long = "kafka-session-timeout", env = "KAFKA_SESSION_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub session_timeout: Duration,
    /// Static group membership (KIP-345): a stable name for this member, e.g. the
    /// pod name of a StatefulSet. A member restarted under the same name within the
    /// session timeout gets its partitions back without a rebalance. Unset: a
    /// dynamic member (every join and leave rebalances the group).
    #[arg(long = "kafka-group-instance-id", env = "KAFKA_GROUP_INSTANCE_ID")]
    pub group_instance_id: Option<String>,
    /// `classic`: the JoinGroup/SyncGroup protocol with the cooperative-sticky
    /// assignor (incremental rebalancing). `consumer`: the broker-driven protocol of
    /// KIP-848 (Kafka 4.0+ brokers); session timeout and assignor are then the
    /// broker's settings.
    #[arg(
        long = "kafka-group-protocol",
        env = "KAFKA_GROUP_PROTOCOL",
        value_enum,
        default_value = "classic"
    )]
    pub group_protocol: GroupProtocol,
    /// Extra librdkafka settings, `key=value` (repeatable), e.g. `security.protocol=SASL_SSL`;
    /// `KAFKA_CONFIG_SASL_MECHANISM=…` style environment variables are read too (`_` becomes
    /// `.`, lower-cased). They win over the worker's tuning defaults; settings the worker
    /// owns (offset storing, auto-commit, acks, idempotence, isolation, transactional id,
    /// group and bootstrap settings) are refused.
    #[arg(id = "kafka_config", long = "kafka-config", value_parser = KafkaSettingParser)]
    pub extra: Vec<(String, String)>,
    /// A librdkafka properties file (`key=value` lines, `#` comments), read once at
    /// start: pass-through settings that hold secrets, such as `sasl.password` or
    /// `sasl.oauthbearer.client.secret`. A setting may not also be given as
    /// KAFKA_CONFIG_* or --kafka-config.
    #[arg(
        id = "kafka_config_file",
        long = "kafka-config-file",
        env = "KAFKA_CONFIG_FILE",
        value_name = "PATH",
        value_parser = KafkaConfigFileParser
    )]
    pub config_file: Option<KafkaConfigFile>,
    /// The `KAFKA_CONFIG_*` environment variables as librdkafka settings, read once
    /// when these settings are made (parsed, or [`KafkaSettings::local`]): the
    /// environment is read at the edge, never by a client builder or `Debug`.
    #[arg(skip = environment_passthrough())]
    pub from_environment: Vec<(String, String)>,
}

/// Which consumer-group protocol the member speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GroupProtocol {
    /// JoinGroup/SyncGroup with the cooperative-sticky assignor.
    // The flag's help describes the values; a help per value would switch `--help`
    // to its long layout. The doc comments are for the library.
    #[value(help = None::<&str>)]
    Classic,
    /// KIP-848: the broker assigns partitions (Kafka 4.0+).
    #[value(help = None::<&str>)]
    Consumer,
}

impl KafkaSettings {
    /// The commands, results and dead-letter topics are three topics: a worker
    /// whose answers go to its own commands topic would read each answer back as a
    /// command (invalid), answer it again, and so on without end; dead letters among
    /// the results would reach every reader of results. Checked before `run` or `dlq
    /// redrive` connects. None of them, nor the group id, may hold a card number:
    /// they are written into log lines, spans and headers. (The instance id is not
    /// checked: a pod name with a millisecond timestamp would be refused one time in
    /// ten.)
    pub fn check_topics(&self) -> Result<(), RefusedKafkaSetting> {
        let topics = [
            ("COMMANDS_TOPIC", &self.commands_topic),
            ("RESULTS_TOPIC", &self.results_topic),
            ("DLQ_TOPIC", &self.dlq_topic),
        ];
        let group = ("KAFKA_GROUP_ID", &self.group_id);
        for (setting, name) in std::iter::once(group).chain(topics) {
            if crate::redaction::contains_card_number(name) {
                return Err(RefusedKafkaSetting::CardNumberInName(setting));
            }
        }
        for (at, (first, one)) in topics.iter().enumerate() {
            if let Some((second, _)) = topics[at + 1..].iter().find(|(_, other)| other == one) {
                return Err(RefusedKafkaSetting::SharedTopic(
                    first,
                    second,
                    (*one).clone(),
                ));
            }
        }
        Ok(())
    }

    /// Settings for a local cluster (the mock cluster of the tests and tools): default topics, a 6 s session timeout.
    pub fn local(brokers: impl Into<String>, group_id: impl Into<String>) -> Self {
        Self {
            brokers: brokers.into(),
            group_id: group_id.into(),
            commands_topic: "payments.commands".into(),
            results_topic: "payments.results".into(),
            dlq_topic: "payments.dlq".into(),
            session_timeout: Duration::from_secs(6),
            group_instance_id: None,
            group_protocol: GroupProtocol::Classic,
            extra: Vec::new(),
            config_file: None,
            from_environment: environment_passthrough(),
        }
    }

    /// The `KAFKA_CONFIG_*` settings read from the environment, then those of
    /// KAFKA_CONFIG_FILE, then the `--kafka-config` pairs (a later pair wins in
    /// librdkafka; `check_passthrough` refuses a setting given in the file and
    /// elsewhere).
    pub fn passthrough(&self) -> Vec<(String, String)> {
        let from_file = self
            .config_file
            .iter()
            .flat_map(|file| file.settings().iter());
        self.from_environment
            .iter()
            .chain(from_file)
            .chain(&self.extra)
            .cloned()
            .collect()
    }

    /// Refuses passed-through settings the worker owns (`--kafka-config` and the
    /// file are checked when parsed; this catches `KAFKA_CONFIG_*` too), and a
    /// setting given both in KAFKA_CONFIG_FILE and as `KAFKA_CONFIG_*` or
    /// `--kafka-config` (which one should win would be a guess). Every Kafka client
    /// the worker builds for `run` checks it first.
    pub fn check_passthrough(&self) -> Result<(), RefusedKafkaSetting> {
        self.passthrough()
            .iter()
            .try_for_each(|(key, _)| check_passthrough_key(key))?;
        let Some(file) = &self.config_file else {
            return Ok(());
        };
        let normalised = |key: &str| key.trim().to_ascii_lowercase();
        match self
            .from_environment
            .iter()
            .chain(&self.extra)
            .find(|(key, _)| {
                file.settings()
                    .iter()
                    .any(|(in_file, _)| normalised(in_file) == normalised(key))
            }) {
            Some((key, _)) => Err(RefusedKafkaSetting::GivenTwice(key.clone())),
            None => Ok(()),
        }
    }
}

impl std::fmt::Debug for KafkaSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let extra: Vec<(String, &str)> = self
            .passthrough()
            .into_iter()
            .map(|(k, v)| {
                let shown = if is_secret_setting(&k) {
                    "***"
                } else {
                    "<set>"
                };
                let _ = v;
                (k, shown)
            })
            .collect();
        f.debug_struct("KafkaSettings")
            .field("brokers", &self.brokers)
            .field("group_id", &self.group_id)
            .field("commands_topic", &self.commands_topic)
            .field("results_topic", &self.results_topic)
            .field("dlq_topic", &self.dlq_topic)
            .field("session_timeout", &self.session_timeout)
            .field("group_instance_id", &self.group_instance_id)
            .field("group_protocol", &self.group_protocol)
            .field(
                "config_file",
                &self.config_file.as_ref().map(KafkaConfigFile::path),
            )
            .field("extra", &extra)
            .finish()
    }
}
