//! Kafka settings passed through to librdkafka (`--kafka-config`, `KAFKA_CONFIG_*`,
//! `KAFKA_CONFIG_FILE`): read, refused when the worker owns them, and told apart
//! when they are secrets.

use std::path::{Path, PathBuf};

use super::secrets::read_secret;

/// The environment variable naming the properties file; not a librdkafka setting.
const CONFIG_FILE_VARIABLE: &str = "KAFKA_CONFIG_FILE";

/// Every `KAFKA_CONFIG_*` environment variable but `KAFKA_CONFIG_FILE` as a
/// librdkafka setting (`_` becomes `.`, lower-cased).
///
/// Read as OS strings: `std::env::vars` panics on any variable that is not UTF-8,
/// however unrelated to Kafka. One of ours that is not UTF-8 keeps its bytes as
/// U+FFFD, so librdkafka refuses it by name when the client is created.
pub fn environment_passthrough() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| {
            let name = k.to_string_lossy();
            if name == CONFIG_FILE_VARIABLE {
                return None;
            }
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

/// Why a passed-through Kafka setting is refused at start: a usage error (exit 2),
/// as clap's own refusals of `--kafka-config` and of the file's lines are.
#[derive(Debug, thiserror::Error)]
pub enum RefusedKafkaSetting {
    /// The worker sets it itself.
    #[error(transparent)]
    WorkerOwned(#[from] WorkerOwnedKafkaSetting),
    /// Which one should win would be a guess.
    #[error(
        "the Kafka setting {0:?} is in KAFKA_CONFIG_FILE and given again as KAFKA_CONFIG_* or \
         --kafka-config: give each setting once"
    )]
    GivenTwice(String),
    /// Two of the worker's topics are one: answers would be read back as commands.
    #[error(
        "{0} and {1} name the same topic {2:?}: the commands, results and dead-letter \
         topics must be three topics (an answer written to the commands topic is read \
         back as a command, and answered again, without end)"
    )]
    SharedTopic(&'static str, &'static str, String),
    /// A name the worker shows in log lines, spans and headers holds a card number.
    #[error(
        "{0} holds what looks like a card number (not shown); it is written into log lines, \
         spans and headers: choose another name"
    )]
    CardNumberInName(&'static str),
}

/// Why a setting whose key is no property name is refused.
const NOT_A_PROPERTY_NAME: &str = "the part before '=' is no Kafka property name (letters, \
     digits, '.', '_', '-'); write key=value (the setting is not shown: it may hold a secret)";

/// Whether `key` is a librdkafka property name. A Java-style `name: value` (or
/// `name value`) setting would otherwise make its value part of the key, and keys
/// are shown (settings' `Debug`, librdkafka's refusals): a key is a property name or
/// the setting is refused unshown.
fn is_property_name(key: &str) -> bool {
    !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
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
        if !is_property_name(&key) {
            return Err(refuse(NOT_A_PROPERTY_NAME.to_owned()));
        }
        check_passthrough_key(&key).map_err(|e| refuse(e.to_string()))?;
        Ok((key, value.to_owned()))
    }
}

/// `KAFKA_CONFIG_FILE`: a librdkafka properties file, read (through `read_secret`)
/// and checked when the command line is parsed. `Debug` shows the path and the
/// setting names, never a value.
#[derive(Clone)]
pub struct KafkaConfigFile {
    path: PathBuf,
    settings: Vec<(String, String)>,
}

impl KafkaConfigFile {
    /// The file named.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its settings, in file order.
    pub fn settings(&self) -> &[(String, String)] {
        &self.settings
    }
}

impl std::fmt::Debug for KafkaConfigFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys: Vec<&str> = self.settings.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("KafkaConfigFile")
            .field("path", &self.path)
            .field("keys", &keys)
            .finish()
    }
}

/// The properties format librdkafka's own tools and kcat read: one `key=value` per
/// line, blank lines and lines starting with `#` or `!` skipped, spaces around the
/// key and before the value ignored. Errors name the line and the key, never a value.
fn parse_properties(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut settings: Vec<(String, String)> = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with('!') {
            continue;
        }
        let at = number + 1;
        let (key, value) = trimmed.split_once('=').ok_or_else(|| {
            format!("line {at} is not key=value (the line is not shown: it may hold a secret)")
        })?;
        let key = key.trim();
        if key.is_empty() {
            return Err(format!("line {at} has no key"));
        }
        if !is_property_name(key) {
            return Err(format!("line {at}: {NOT_A_PROPERTY_NAME}"));
        }
        check_passthrough_key(key).map_err(|e| format!("line {at}: {e}"))?;
        if settings.iter().any(|(k, _)| k.eq_ignore_ascii_case(key)) {
            return Err(format!("line {at}: {key:?} is given twice"));
        }
        settings.push((key.to_owned(), value.trim_start().to_owned()));
    }
    Ok(settings)
}

/// `--kafka-config-file` / `KAFKA_CONFIG_FILE`.
#[derive(Clone)]
pub(super) struct KafkaConfigFileParser;

impl clap::builder::TypedValueParser for KafkaConfigFileParser {
    type Value = KafkaConfigFile;

    fn parse_ref(
        &self,
        _: &clap::Command,
        _: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Self::Value, clap::Error> {
        let refuse = |why: String| {
            clap::Error::raw(clap::error::ErrorKind::ValueValidation, format!("{why}\n"))
        };
        let path = PathBuf::from(value);
        let text = read_secret("KAFKA_CONFIG", None, Some(&path))
            .map_err(|e| refuse(e.to_string()))?
            .ok_or_else(|| refuse(format!("{CONFIG_FILE_VARIABLE}: no file named")))?;
        let settings = parse_properties(text.expose())
            .map_err(|why| refuse(format!("{CONFIG_FILE_VARIABLE} {}: {why}", path.display())))?;
        Ok(KafkaConfigFile { path, settings })
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

#[cfg(test)]
mod tests {
    use super::parse_properties;

    #[test]
    fn a_properties_file_is_read_as_librdkafka_settings_without_showing_values() {
        let text = "# managed Kafka\r\n\nsecurity.protocol = SASL_SSL\r\n  ! a comment\nsasl.password=p=w d \n";
        let settings = parse_properties(text).unwrap();
        assert_eq!(
            settings,
            [
                ("security.protocol".to_owned(), "SASL_SSL".to_owned()),
                ("sasl.password".to_owned(), "p=w d ".to_owned()),
            ]
        );
        for (bad, expected) in [
            ("sasl.password hunter2-secret", "line 1 is not key=value"),
            ("a=1\nenable.auto.commit=true", "line 2"),
            (
                "sasl.username=u\nSASL.USERNAME=hunter2-secret",
                "given twice",
            ),
            ("=hunter2-secret", "no key"),
            // Java's other separators: the secret would be read as part of the key.
            ("sasl.password: hunter2-secret==", "no Kafka property name"),
            ("sasl.password hunter2-secret=", "no Kafka property name"),
        ] {
            let error = parse_properties(bad).unwrap_err();
            assert!(error.contains(expected), "{error}");
            assert!(!error.contains("hunter2-secret"), "{error}");
        }
    }

    #[test]
    fn a_kafka_config_argument_whose_key_is_no_property_name_is_refused_unshown() {
        use clap::builder::TypedValueParser as _;
        let command = clap::Command::new("run");
        let parse = |argument: &str| {
            super::KafkaSettingParser.parse_ref(&command, None, std::ffi::OsStr::new(argument))
        };
        for bad in [
            "sasl.password: hunter2-secret==",
            "sasl.password hunter2-secret=",
        ] {
            let error = parse(bad).unwrap_err().to_string();
            assert!(error.contains("no Kafka property name"), "{error}");
            assert!(!error.contains("hunter2-secret"), "{error}");
        }
        assert_eq!(
            parse("client.id=a=b").unwrap(),
            ("client.id".to_owned(), "a=b".to_owned())
        );
    }
}
