//! The payments database: where it is, how its pool is sized, whether `run` migrates.

use anyhow::Context;
use sqlx::postgres::PgConnectOptions;
use sqlx::ConnectOptions;

use super::{SecretFile, SecretFileParser};
use crate::redaction::redact_url;

/// `DATABASE_URL` when none is given: the local `payments` database.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/payments";

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
