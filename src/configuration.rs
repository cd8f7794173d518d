//! Every setting is a flag with an environment variable (docs/CONTRACT.md, "Command line"). Secrets inside
//! URLs are redacted by every `Debug` here, so a config can be logged whole.

use std::time::Duration;

use anyhow::Context;
use sqlx::postgres::PgConnectOptions;
use sqlx::ConnectOptions;

use crate::redaction::redact_url;
use crate::token::{TokenMode, TokenPolicy};

mod gateway;
mod kafka_passthrough;
mod key_hash;
mod secrets;

pub use gateway::{
    GatewayAccess, GatewayKind, StripeCompat, StripeSettings, DEFAULT_CHARGES_URL,
    DEFAULT_STRIPE_API_VERSION, DEFAULT_STRIPE_URL,
};
pub use key_hash::KeyHashSettings;
pub use secrets::{read_secret, Secret, SecretError, SecretFile, SecretFileParser};

use kafka_passthrough::{
    check_passthrough_key, is_secret_setting, KafkaConfigFileParser, KafkaSettingParser,
};
pub use kafka_passthrough::{
    environment_passthrough, KafkaConfigFile, RefusedKafkaSetting, WorkerOwnedKafkaSetting,
};

/// `DATABASE_URL` when none is given: the local `payments` database.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/payments";
/// `REDIS_URL` when none is given: a local Redis.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";
/// `KAFKA_BROKERS` when none is given: a local broker.
pub const DEFAULT_BROKERS: &str = "127.0.0.1:9092";

/// Parse `30s`, `1500ms`, `5m`, `24h` (clap value parser).
pub fn parse_duration(value: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(value)
        .map_err(|e| format!("{value:?} is not a duration: {e}"))?;
    // Every duration here is a timeout, a lease, an interval or a lifetime; none
    // means anything past a year, and a bound keeps the arithmetic on them (twice a
    // timeout, a deadline from now) from overflowing.
    if duration > MAX_DURATION {
        return Err(format!("{value:?} is longer than a year"));
    }
    Ok(duration)
}

/// The longest duration a setting takes.
pub const MAX_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);

/// The payments database: where it is and how many connections the pool holds.
#[derive(Clone, clap::Args)]
pub struct DatabaseSettings {
    /// Postgres URL (`sslmode`, `sslrootcert` honoured); with `--migrate auto` the
    /// database is created when missing.
    // Read it through `DatabaseSettings::url`, which takes DATABASE_URL_FILE into account.
    #[arg(id = "database_url", long = "database-url", env = "DATABASE_URL", default_value = DEFAULT_DATABASE_URL, hide_env_values = true)]
    pub url: String,
    /// File holding the Postgres URL (e.g. a mounted Secret), read once at start (a
    /// trailing line break is ignored); instead of DATABASE_URL.
    #[arg(
        id = "database_url_file",
        long = "database-url-file",
        env = "DATABASE_URL_FILE",
        value_name = "PATH",
        value_parser = SecretFileParser::new("DATABASE_URL"),
        conflicts_with = "database_url",
        hide_env_values = true
    )]
    pub url_file: Option<SecretFile>,
    /// Pool size. Each in-flight payment holds one connection for its transaction.
    #[arg(
        long = "database-max-connections",
        env = "DATABASE_MAX_CONNECTIONS",
        default_value_t = 48,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub max_connections: u32,
}

impl std::fmt::Debug for DatabaseSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseSettings")
            .field("url", &redact_url(self.url()))
            .field("url_file", &self.url_file.as_ref().map(SecretFile::path))
            .field("max_connections", &self.max_connections)
            .finish()
    }
}

impl DatabaseSettings {
    /// Settings for the database at `url`, with the default pool size.
    pub fn with_url(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            url_file: None,
            max_connections: 48,
        }
    }

    /// The Postgres URL: DATABASE_URL_FILE's contents when given, else DATABASE_URL.
    pub fn url(&self) -> &str {
        match &self.url_file {
            Some(file) => file.contents().expose(),
            None => &self.url,
        }
    }

    /// The connection options `DATABASE_URL` names (no connection is made);
    /// statements are logged by the tracing spans, not by sqlx.
    pub fn connect_options(&self) -> anyhow::Result<PgConnectOptions> {
        let url = self.url();
        let mut options: PgConnectOptions = url
            .parse()
            .with_context(|| format!("invalid DATABASE_URL {}", redact_url(url)))?;
        if requires_tls_with_a_root_certificate(url) {
            // libpq verifies the server against `sslrootcert` under `sslmode=require`
            // (as `verify-ca`); sqlx alone would encrypt without verifying anything,
            // so a URL written for psql would silently trust any server.
            options = options.ssl_mode(sqlx::postgres::PgSslMode::VerifyCa);
        }
        // Statements are logged at debug by the tracing spans, not by sqlx at info.
        Ok(options.log_statements(tracing::log::LevelFilter::Trace))
    }
}

/// `sslmode=require` together with an `sslrootcert` in a Postgres URL.
fn requires_tls_with_a_root_certificate(raw: &str) -> bool {
    let Ok(parsed) = url::Url::parse(raw) else {
        return false;
    };
    let mut require = false;
    let mut root_certificate = false;
    for (name, value) in parsed.query_pairs() {
        match name.as_ref() {
            "sslmode" | "ssl-mode" => require = value.eq_ignore_ascii_case("require"),
            "sslrootcert" | "ssl-root-cert" => root_certificate = !value.is_empty(),
            _ => {}
        }
    }
    require && root_certificate
}

/// Whether `run` prepares the schema itself or leaves it to the `migrate` command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum MigrateMode {
    /// Create the database when missing and apply migrations (owner rights needed).
    #[default]
    Auto,
    /// Touch neither the maintenance database nor the schema (DML rights suffice).
    Skip,
}

/// Where the Redis token store is and how its keys are named.
#[derive(Clone, clap::Args)]
pub struct RedisSettings {
    /// Redis URL: `redis://` or `rediss://` (TLS) for one node; `redis+cluster://h1:p1,h2:p2`
    /// (or `rediss+cluster://`) for a Redis Cluster; `redis+sentinel://h1:p1,h2:p2,h3:p3/<master>`
    /// (or `rediss+sentinel://`) for the master a group of Sentinels names.
    // Read it through `RedisSettings::url`, which takes REDIS_URL_FILE into account.
    #[arg(id = "redis_url", long = "redis-url", env = "REDIS_URL", default_value = DEFAULT_REDIS_URL, hide_env_values = true)]
    pub url: String,
    /// File holding the Redis URL, read once at start (a trailing line break is
    /// ignored); instead of REDIS_URL.
    #[arg(
        id = "redis_url_file",
        long = "redis-url-file",
        env = "REDIS_URL_FILE",
        value_name = "PATH",
        value_parser = SecretFileParser::new("REDIS_URL"),
        conflicts_with = "redis_url",
        hide_env_values = true
    )]
    pub url_file: Option<SecretFile>,
    /// Treat a comma-separated REDIS_URL (`redis://h1:p1,redis://h2:p2`) as the seed
    /// nodes of a Redis Cluster.
    #[arg(id = "redis_cluster", long = "redis-cluster", env = "REDIS_CLUSTER")]
    pub cluster: bool,
    /// PEM file of the CA that signs the Redis servers' TLS certificates (default: the
    /// system roots).
    #[arg(id = "redis_ca_cert", long = "redis-ca-cert", env = "REDIS_CA_CERT")]
    pub ca_cert: Option<std::path::PathBuf>,
    /// PEM certificate (chain) this worker presents to Redis (`rediss://`, mutual TLS).
    #[arg(
        id = "redis_client_cert",
        long = "redis-client-cert",
        env = "REDIS_CLIENT_CERT",
        value_name = "PATH",
        requires = "redis_client_key"
    )]
    pub client_cert: Option<std::path::PathBuf>,
    /// PEM private key of REDIS_CLIENT_CERT.
    #[arg(
        id = "redis_client_key",
        long = "redis-client-key",
        env = "REDIS_CLIENT_KEY",
        value_name = "PATH",
        requires = "redis_client_cert"
    )]
    pub client_key: Option<std::path::PathBuf>,
    /// Key prefix; each key is `<prefix>:token:{<idempotency key>}` (hash-tagged for Redis Cluster).
    #[arg(
        id = "redis_key_prefix",
        long = "redis-key-prefix",
        env = "REDIS_KEY_PREFIX",
        default_value = "pw"
    )]
    pub key_prefix: String,
}

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettings")
            .field("url", &redact_url(self.url()))
            .field("url_file", &self.url_file.as_ref().map(SecretFile::path))
            .field("cluster", &self.cluster)
            .field("ca_cert", &self.ca_cert)
            .field("client_cert", &self.client_cert)
            .field("client_key", &self.client_key)
            .field("key_prefix", &self.key_prefix)
            .finish()
    }
}

impl RedisSettings {
    /// Settings for the Redis at `url`: no TLS files, keys under `key_prefix`.
    pub fn with_url(url: impl Into<String>, key_prefix: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            url_file: None,
            cluster: false,
            ca_cert: None,
            client_cert: None,
            client_key: None,
            key_prefix: key_prefix.into(),
        }
    }

    /// The Redis URL: REDIS_URL_FILE's contents when given, else REDIS_URL.
    pub fn url(&self) -> &str {
        match &self.url_file {
            Some(file) => file.contents().expose(),
            None => &self.url,
        }
    }
}

/// Which store keeps the idempotency tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TokenStoreKind {
    /// Redis (the fast path): one hash per key, every transition a Lua script.
    // The flag's help describes the values; a help per value would switch `--help`
    // to its long layout. The doc comments are for the library.
    #[value(help = None::<&str>)]
    Redis,
    /// The `idempotency_tokens` table in the payments database.
    #[value(help = None::<&str>)]
    Postgres,
}

/// The token store and the lifetimes of its tokens.
#[derive(Debug, Clone, clap::Args)]
pub struct TokenSettings {
    /// Where tokens live: Redis (fast path) or the payments database.
    #[arg(
        long = "token-store",
        env = "TOKEN_STORE",
        value_enum,
        default_value = "redis"
    )]
    pub store: TokenStoreKind,
    /// `implicit`: a command's first reservation creates its token; `issued`: only
    /// tokens minted beforehand (`tokens issue`) may be reserved.
    #[arg(
        long = "token-mode",
        env = "TOKEN_MODE",
        value_enum,
        default_value = "implicit"
    )]
    pub mode: TokenMode,
    /// How long a reservation stays exclusive without being extended.
    #[arg(long = "lease", env = "LEASE", default_value = "30s", value_parser = parse_duration)]
    pub lease: Duration,
    /// TTL of a token created implicitly, kept when it is restored.
    #[arg(long = "token-ttl", env = "TOKEN_TTL", default_value = "24h", value_parser = parse_duration)]
    pub pending_ttl: Duration,
    /// TTL of a `completed` tombstone.
    #[arg(long = "completed-ttl", env = "COMPLETED_TTL", default_value = "24h", value_parser = parse_duration)]
    pub completed_ttl: Duration,
}

impl TokenSettings {
    /// The lifetimes and mode these settings give every token.
    pub fn policy(&self) -> TokenPolicy {
        TokenPolicy {
            mode: self.mode,
            lease: self.lease,
            pending_ttl: self.pending_ttl,
            completed_ttl: self.completed_ttl,
        }
    }
}

/// The Postgres token store's own pool and the purge of its expired rows (unused
/// with the Redis store, whose keys expire by themselves).
#[derive(Debug, Clone, clap::Args)]
pub struct TokenTableSettings {
    /// Postgres token store: connections of its own pool for lease renewals and the
    /// purge, apart from the payment pool (whose connections payments hold).
    #[arg(
        long = "token-lease-connections",
        env = "TOKEN_LEASE_CONNECTIONS",
        default_value_t = 4,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub lease_connections: u32,
    /// Postgres token store: how often a worker deletes expired token rows.
    #[arg(long = "token-purge-interval", env = "TOKEN_PURGE_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub purge_interval: Duration,
    /// Postgres token store: rows deleted per statement by the purge.
    #[arg(
        long = "token-purge-batch",
        env = "TOKEN_PURGE_BATCH",
        default_value_t = 1000
    )]
    pub purge_batch: usize,
}

impl Default for TokenTableSettings {
    fn default() -> Self {
        Self {
            lease_connections: 4,
            purge_interval: Duration::from_secs(30),
            purge_batch: 1000,
        }
    }
}

/// Where payments and tokens live: what every command that touches them needs.
#[derive(Debug, Clone, clap::Args)]
pub struct StoreSettings {
    /// `auto` creates and migrates the database at start (owner role); `skip`
    /// leaves that to the `migrate` command, so a DML-only role is enough. `audit`,
    /// `replay --dry-run` and `tokens show` never migrate.
    #[arg(long = "migrate", env = "MIGRATE", value_enum, default_value = "auto")]
    pub migrate: MigrateMode,
    /// The payments database.
    #[command(flatten)]
    pub database: DatabaseSettings,
    /// The Redis token store (unused with `--token-store postgres`).
    #[command(flatten)]
    pub redis: RedisSettings,
    /// Which token store, and the tokens' lifetimes.
    #[command(flatten)]
    pub tokens: TokenSettings,
    /// The Postgres token store's own pool and purge.
    #[command(flatten)]
    pub token_table: TokenTableSettings,
}

impl StoreSettings {
    /// Connections this process opens to Postgres at most.
    pub fn connections_needed(&self) -> u32 {
        let lease_pool = match self.tokens.store {
            TokenStoreKind::Redis => 0,
            // And the one connection that LISTENs for settle announcements.
            TokenStoreKind::Postgres => self.token_table.lease_connections.saturating_add(1),
        };
        self.database.max_connections.saturating_add(lease_pool)
    }
}

/// The payment gateway: which, where, with which credentials, and how long to wait for it.
#[derive(Clone, clap::Args)]
pub struct GatewaySettings {
    /// Kind, URL, credentials and TLS.
    #[command(flatten)]
    pub access: GatewayAccess,
    /// A charge without an answer after this long has an UNKNOWN outcome.
    #[arg(id = "gateway_timeout", long = "gateway-timeout", env = "GATEWAY_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Longest wait for a TCP connection to the gateway.
    #[arg(long = "gateway-connect-timeout", env = "GATEWAY_CONNECT_TIMEOUT", default_value = "1s", value_parser = parse_duration)]
    pub connect_timeout: Duration,
    /// When to look a charge up by key before charging: `uncertain` (after an
    /// earlier attempt may have charged) or `always`.
    #[arg(
        long = "gateway-lookup",
        env = "GATEWAY_LOOKUP",
        value_enum,
        default_value = "uncertain"
    )]
    pub lookup: crate::payment::GatewayLookup,
}

impl std::fmt::Debug for GatewaySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The client refuses a URL with credentials, but only after `run` logged
        // its settings: the log line must not carry them either (nor the API key).
        f.debug_struct("GatewaySettings")
            .field("access", &self.access)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("lookup", &self.lookup)
            .finish()
    }
}

/// Everything one command needs besides Kafka.
#[derive(Debug, Clone, clap::Args)]
pub struct ProcessorSettings {
    /// Where payments and tokens live.
    #[command(flatten)]
    pub stores: StoreSettings,
    /// The payment gateway.
    #[command(flatten)]
    pub gateway: GatewaySettings,
}

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

/// `--max-in-flight`: 1 to 65,536 commands per partition.
fn parse_max_in_flight(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if (1..=65_536).contains(&n) => Ok(n),
        _ => Err(format!("{value:?} is not a number from 1 to 65536")),
    }
}

impl KafkaSettings {
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

/// How one worker process admits, retries and drains commands.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerSettings {
    /// Commands admitted at once per partition (different keys run in parallel,
    /// one key strictly in order).
    #[arg(long = "max-in-flight", env = "MAX_IN_FLIGHT", default_value_t = 32, value_parser = parse_max_in_flight)]
    pub max_in_flight: usize,
    /// Transient failures are retried this long before dead-lettering.
    #[arg(long = "retry-budget", env = "RETRY_BUDGET", default_value = "5m", value_parser = parse_duration)]
    pub retry_budget: Duration,
    /// On revoke or shutdown, in-flight commands get this long to finish. Must stay
    /// below the session timeout so the member is not evicted while draining.
    #[arg(long = "drain-deadline", env = "DRAIN_DEADLINE", default_value = "4s", value_parser = parse_duration)]
    pub drain_deadline: Duration,
    /// Serve `/healthz` and `/readyz` on this address.
    #[arg(long = "health-listen", env = "HEALTH_LISTEN")]
    pub health_listen: Option<std::net::SocketAddr>,
    /// Identifies this member in token owners and logs (default: host-pid).
    #[arg(long = "worker-id", env = "WORKER_ID")]
    pub worker_id: Option<String>,
    /// How results, dead letters and offsets leave the worker. `at-least-once`: each
    /// is acknowledged, then the offset is committed (a crash in between answers a
    /// command again, as a `duplicate`). `exactly-once`: they are produced in Kafka
    /// transactions together with the offsets, so a `read_committed` reader sees
    /// one result per command (needs brokers with transactions).
    #[arg(
        long = "results",
        env = "RESULTS_MODE",
        value_enum,
        default_value = "at-least-once"
    )]
    pub results: ResultsMode,
    /// `exactly-once`: an open transaction is committed at least this often
    /// (results become visible to `read_committed` readers at commit).
    #[arg(long = "transaction-interval", env = "TRANSACTION_INTERVAL", default_value = "100ms", value_parser = parse_duration)]
    pub transaction_interval: Duration,
    /// `exactly-once`: an open transaction is committed once it holds this many
    /// answered commands, even before `--transaction-interval` passed.
    #[arg(
        long = "transaction-max-records",
        env = "TRANSACTION_MAX_RECORDS",
        default_value_t = 1000,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub transaction_max_records: u64,
    /// The secret of the keyed hash answers carry for a key they echo masked.
    #[command(flatten)]
    pub key_hash: KeyHashSettings,
}

/// How results and offsets leave the worker (docs/ARCHITECTURE.md, "Result delivery").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ResultsMode {
    /// Acknowledged result, then offset commit: a command may be answered again.
    #[default]
    AtLeastOnce,
    /// Results, dead letters and offsets committed in one Kafka transaction.
    ExactlyOnce,
}

impl ResultsMode {
    /// The spelling of the flag's value, as logs and the demo print it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AtLeastOnce => "at-least-once",
            Self::ExactlyOnce => "exactly-once",
        }
    }
}

impl Default for WorkerSettings {
    fn default() -> Self {
        Self {
            max_in_flight: 32,
            retry_budget: Duration::from_secs(300),
            drain_deadline: Duration::from_secs(4),
            health_listen: None,
            worker_id: None,
            results: ResultsMode::AtLeastOnce,
            transaction_interval: Duration::from_millis(100),
            transaction_max_records: 1000,
            key_hash: KeyHashSettings::default(),
        }
    }
}

impl WorkerSettings {
    /// `--worker-id`, or `<hostname>-<pid>` when none is given.
    pub fn worker_id(&self) -> String {
        self.worker_id.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_owned())
                .unwrap_or_else(|_| "worker".to_owned());
            format!("{host}-{}", std::process::id())
        })
    }
}
