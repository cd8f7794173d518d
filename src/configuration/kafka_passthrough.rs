//! Kafka settings passed through to librdkafka (`--kafka-config`, `KAFKA_CONFIG_*`):
//! read, refused when the worker owns them, and told apart when they are secrets.

/// Every `KAFKA_CONFIG_*` environment variable as a librdkafka setting (`_`
/// becomes `.`, lower-cased).
///
/// Read as OS strings: `std::env::vars` panics on any variable that is not UTF-8,
/// however unrelated to Kafka. One of ours that is not UTF-8 keeps its bytes as
/// U+FFFD, so librdkafka refuses it by name when the client is created.
pub fn environment_passthrough() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| {
            let name = k.to_string_lossy();
            name.strip_prefix("KAFKA_CONFIG_").map(|rest| {
                (
                    rest.to_ascii_lowercase().replace('_', "."),
                    v.to_string_lossy().into_owned(),
                )
            })
        })
        .collect()
}

/// librdkafka settings the exactly-once discipline depends on, with their aliases:
/// passing one through would silently break it, so it is refused. The value says
/// what the worker does instead.
const WORKER_OWNED_KAFKA_SETTINGS: &[(&str, &str)] = &[
    (
        "enable.auto.offset.store",
        "the worker stores an offset only once every command below it is settled",
    ),
    (
        "enable.auto.commit",
        "the worker commits only the offsets it stored",
    ),
    (
        "auto.commit.enable",
        "the worker commits only the offsets it stored",
    ),
    (
        "acks",
        "results and dead letters need every in-sync replica (acks=all)",
    ),
    (
        "request.required.acks",
        "results and dead letters need every in-sync replica (acks=all)",
    ),
    (
        "enable.idempotence",
        "producer retries must never duplicate a result",
    ),
    ("isolation.level", "the worker reads committed records only"),
    (
        "transactional.id",
        "each worker process names its own transactions (--results exactly-once)",
    ),
    ("group.id", "set it with --kafka-group-id (KAFKA_GROUP_ID)"),
    (
        "session.timeout.ms",
        "set it with --kafka-session-timeout (KAFKA_SESSION_TIMEOUT): the drain deadline, the heartbeat and the poll-loop watchdog are checked against it",
    ),
    (
        "group.instance.id",
        "set it with --kafka-group-instance-id (KAFKA_GROUP_INSTANCE_ID)",
    ),
    (
        "group.protocol",
        "set it with --kafka-group-protocol (KAFKA_GROUP_PROTOCOL)",
    ),
    (
        "bootstrap.servers",
        "set it with --kafka-brokers (KAFKA_BROKERS)",
    ),
    (
        "metadata.broker.list",
        "set it with --kafka-brokers (KAFKA_BROKERS)",
    ),
];

/// A passed-through librdkafka setting that the worker owns.
#[derive(Debug, thiserror::Error)]
#[error("the Kafka setting {key:?} cannot be passed through (--kafka-config / KAFKA_CONFIG_*): {reason}")]
pub struct WorkerOwnedKafkaSetting {
    /// The setting as it was passed.
    pub key: String,
    /// What the worker does instead of taking it.
    pub reason: &'static str,
}

pub(super) fn check_passthrough_key(key: &str) -> Result<(), WorkerOwnedKafkaSetting> {
    let normalised = key.trim().to_ascii_lowercase();
    // Topic-level settings may be written with a `topic.` prefix.
    let bare = normalised.strip_prefix("topic.").unwrap_or(&normalised);
    match WORKER_OWNED_KAFKA_SETTINGS
        .iter()
        .find(|(owned, _)| *owned == bare)
    {
        Some((_, reason)) => Err(WorkerOwnedKafkaSetting {
            key: key.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// `--kafka-config key=value`. A refused argument is never repeated in the error:
/// it may hold a secret written with the wrong separator (`sasl.password:…`), and
/// clap's own message for a value parser's error quotes the whole argument.
#[derive(Clone)]
pub(super) struct KafkaSettingParser;

impl clap::builder::TypedValueParser for KafkaSettingParser {
    type Value = (String, String);

    fn parse_ref(
        &self,
        _: &clap::Command,
        _: Option<&clap::Arg>,
        argument: &std::ffi::OsStr,
    ) -> Result<Self::Value, clap::Error> {
        let refuse = |why: String| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("--kafka-config: {why}\n"),
            )
        };
        let (key, value) = argument
            .to_str()
            .and_then(|text| text.split_once('='))
            .ok_or_else(|| {
                refuse("a setting is written key=value (the argument is not shown: it may hold a secret)".to_owned())
            })?;
        let key = key.trim().to_owned();
        check_passthrough_key(&key).map_err(|e| refuse(e.to_string()))?;
        Ok((key, value.to_owned()))
    }
}

pub(super) fn is_secret_setting(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "password",
        "secret",
        "jaas",
        "token",
        "key.pem",
        "credentials",
    ]
    .iter()
    .any(|s| key.contains(s))
}
