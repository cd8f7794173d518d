//! Every setting is a flag with an environment variable (docs/CONTRACT.md, "Command line"). Secrets inside
//! URLs are redacted by every `Debug` here, so a config can be logged whole. One file
//! per group of settings; this one only names them.

mod database;
mod durations;
mod gateway;
mod kafka;
mod kafka_passthrough;
mod key_hash;
mod names;
mod redis;
mod secrets;
mod stores;
mod tokens;
mod worker;

pub use database::{DatabaseSettings, MigrateMode, DEFAULT_DATABASE_URL};
pub use durations::{parse_duration, MAX_DURATION};
pub use gateway::{
    GatewayAccess, GatewayKind, GatewaySettings, StripeCompat, StripeSettings, DEFAULT_CHARGES_URL,
    DEFAULT_STRIPE_API_VERSION, DEFAULT_STRIPE_URL,
};
pub use kafka::{GroupProtocol, KafkaSettings, DEFAULT_BROKERS};
pub use kafka_passthrough::{
    environment_passthrough, KafkaConfigFile, RefusedKafkaSetting, WorkerOwnedKafkaSetting,
};
pub use key_hash::KeyHashSettings;
pub use redis::{RedisSettings, DEFAULT_REDIS_URL};
pub use secrets::{
    read_named_setting_file, read_secret, read_setting_file, Secret, SecretError, SecretFile,
    SecretFileParser,
};
pub use stores::{ProcessorSettings, StoreSettings};
pub use tokens::{TokenSettings, TokenStoreKind, TokenTableSettings};
pub use worker::{ResultsMode, WorkerSettings};
