//! The payments database at start: created when missing, connected, migrated, or
//! checked for its schema, as `DatabaseSettings` and `MigrateMode` say.

use std::time::Duration;

use anyhow::Context;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};

use crate::configuration::{DatabaseSettings, MigrateMode};
use crate::redaction::redact_url;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// A pooled connection unused for this long is checked before it is handed out.
/// Under load connections are reused within milliseconds and never pinged.
const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// Migrations whose comments were reworded after databases applied them, with the
/// checksum (SHA-384, hex) of the text they applied. sqlx refuses to start when an
/// applied migration's checksum changed, so without this every database migrated
/// before the rewording would stop its workers. Only comments may change this way:
/// `only_comments_changed` compares the released texts, kept in
/// `tests/fixtures/migrations-as-released/`, with today's.
const REWORDED: &[(i64, &str)] = &[
    (
        1,
        "8625f5e8133251f1065726f9be02f2dc935624cbb6bfc623505e9fcbdbea2ff0069814f2985bbeaabe3a2fb8fc336c1f",
    ),
    (
        2,
        "1a63467db14b0989b70a37b910bb6dc903b254041578e42c77d72b3d0512578e4f30997ba724e90647bb50528677aa53",
    ),
];

/// Applies `migrations/`. Safe to run concurrently from several processes.
pub async fn migrate(pool: &PgPool) -> anyhow::Result<()> {
    accept_reworded_migrations(pool)
        .await
        .context("recording reworded migrations failed")?;
    MIGRATOR
        .run(pool)
        .await
        .context("applying migrations failed")
}

/// Gives a migration applied with a text in `REWORDED` today's checksum. Any other
/// checksum is left as it is, for sqlx to refuse. Idempotent, so processes migrating
/// at the same time may all run it.
async fn accept_reworded_migrations(pool: &PgPool) -> Result<(), sqlx::Error> {
    // `IS NOT NULL` is never NULL; Postgres does not say so of an expression.
    let applied: bool =
        sqlx::query_scalar!(r#"SELECT to_regclass('_sqlx_migrations') IS NOT NULL AS "applied!""#)
            .fetch_one(pool)
            .await?;
    if !applied {
        return Ok(());
    }
    for (version, released) in REWORDED {
        let Some(migration) = MIGRATOR.iter().find(|m| m.version == *version) else {
            continue;
        };
        // Not a checked statement: `_sqlx_migrations` is sqlx's own table, which
        // `migrations/` does not make, so the database the offline cache is prepared
        // on (scripts/sqlx-prepare) has no such table to check it against.
        sqlx::query(
            "UPDATE _sqlx_migrations SET checksum = $1 \
             WHERE version = $2 AND checksum = decode($3, 'hex')",
        )
        .bind(migration.checksum.as_ref())
        .bind(version)
        .bind(released)
        .execute(pool)
        .await?;
    }
    Ok(())
}

/// How long a connection to Postgres may take at start-up, and from the pool.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Set on every connection a pool opens, so the server finds out when its client is
/// gone. A statement the worker gives up on (its deadline passed: a silent
/// partition, a half-open connection) is abandoned with its connection, and the
/// server never hears of it: its open transaction keeps the payment's key locked in
/// the unique index until the server's kernel gives up on the peer, two hours by
/// default. With keepalives every 30 s (3 probes 10 s apart) the server finds such a
/// client gone within about a minute and rolls its transaction back; a charge it
/// made is found by the next owner's look-up, as after a crash. (Nothing else: a
/// limit on idle transactions would also end a payment's own, open across a
/// gateway call of any length. Over a Unix socket the settings do nothing; behind
/// a pooler they reach its server connections, where they are harmless.)
const SESSION_SETTINGS: &str = "SET tcp_keepalives_idle = 30; \
     SET tcp_keepalives_interval = 10; \
     SET tcp_keepalives_count = 3";

/// Creates the database named in the URL if it does not exist yet.
pub async fn ensure_database(settings: &DatabaseSettings) -> anyhow::Result<()> {
    let options = settings.connect_options()?;
    let name = options.get_database().unwrap_or("postgres").to_owned();
    let unreachable = || format!("cannot reach Postgres at {}", redact_url(settings.url()));
    // A server that accepts and never answers (a black-holing firewall, a hung
    // host) would hold the start-up forever: bounded like the pool's acquire.
    let mut admin = tokio::time::timeout(
        CONNECT_TIMEOUT,
        PgConnection::connect_with(&options.clone().database("postgres")),
    )
    .await
    // An I/O timeout, as the driver reports one: the same outage as a refused
    // connection to whoever asks (`process` exits 75 for either).
    .map_err(|_| {
        sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {CONNECT_TIMEOUT:?}"),
        ))
    })
    .with_context(unreachable)?
    .map_err(name_tls_failure)
    .with_context(unreachable)?;
    let exists: bool = sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1) AS "exists!""#,
        &name
    )
    .fetch_one(&mut admin)
    .await?;
    if !exists {
        let quoted = format!("\"{}\"", name.replace('"', "\"\""));
        // The name is the URL's: built at run time, so not a checked statement.
        match sqlx::query(&format!("CREATE DATABASE {quoted}"))
            .execute(&mut admin)
            .await
        {
            Ok(_) => {}
            // Another process created it between our check and our CREATE: Postgres
            // says duplicate_database, or unique_violation when both raced the catalog.
            Err(sqlx::Error::Database(e))
                if matches!(e.code().as_deref(), Some("42P04" | "23505")) => {}
            Err(e) => return Err(e).context("CREATE DATABASE failed"),
        }
    }
    admin.close().await.ok();
    Ok(())
}

/// The payment pool: `settings.max_connections` connections. `run` opens them all
/// before it polls ([`open_all_connections`]) and none is closed for being idle, so
/// a burst after a quiet spell never waits for connections opened all at once. (Not
/// `min_connections`: every one-shot tool opening this pool would open all of it.)
pub async fn connect(settings: &DatabaseSettings) -> anyhow::Result<PgPool> {
    pool_of(settings, settings.max_connections, IdleConnections::Kept).await
}

/// A pool of `size` connections to the same database (the token store's own),
/// opened as they are needed.
pub async fn connect_with_size(settings: &DatabaseSettings, size: u32) -> anyhow::Result<PgPool> {
    pool_of(settings, size, IdleConnections::Closed).await
}

/// Whether a pool closes connections that sat idle (sqlx's default: after 10 minutes).
enum IdleConnections {
    Kept,
    Closed,
}

/// Opens every connection of `pool` before the worker polls its first record, one
/// after the other (paced: the server sees one connection start at a time, not a
/// burst of them), so the first burst of payments finds them all open.
pub async fn open_all_connections(pool: &PgPool) -> anyhow::Result<()> {
    let size = pool.options().get_max_connections() as usize;
    let mut held = Vec::with_capacity(size);
    for _ in 0..size {
        held.push(
            pool.acquire()
                .await
                .context("opening the payment pool's connections")?,
        );
    }
    Ok(())
}

async fn pool_of(
    settings: &DatabaseSettings,
    size: u32,
    idle: IdleConnections,
) -> anyhow::Result<PgPool> {
    let options = PgPoolOptions::new();
    let options = match idle {
        IdleConnections::Kept => options.idle_timeout(None),
        IdleConnections::Closed => options,
    };
    options
        .max_connections(size)
        .acquire_timeout(CONNECT_TIMEOUT)
        // sqlx pings every connection as it goes back to the pool; pinging it again
        // on the way out, as sqlx does by default, would be one more round trip per
        // payment. Only a connection that sat unused for a while (long enough for a
        // restart or a failover to have closed it) is pinged before it is handed out.
        .test_before_acquire(false)
        .after_connect(|connection, _meta| {
            Box::pin(async move {
                // A server that refuses them (a Postgres-compatible one without the
                // settings) still serves payments: said, not fatal.
                if let Err(error) =
                    sqlx::Executor::execute(&mut *connection, SESSION_SETTINGS).await
                {
                    tracing::warn!(%error, "the server refused the TCP keepalive settings");
                }
                Ok(())
            })
        })
        .before_acquire(|connection, meta| {
            Box::pin(async move {
                // Opened before a server answered read-only: closed (the pool opens
                // another), not handed out to fail the same way.
                if crate::database_errors::opened_before_a_read_only_answer(meta.age) {
                    return Ok(false);
                }
                if meta.idle_for >= PING_AFTER_IDLE {
                    connection.ping().await?;
                }
                Ok(true)
            })
        })
        .connect_with(settings.connect_options()?)
        .await
        .map_err(name_tls_failure)
        .with_context(|| {
            format!(
                "cannot connect to Postgres at {}",
                redact_url(settings.url())
            )
        })
}

/// `ensure_database`, `connect`, then apply `migrations/`.
pub async fn connect_and_migrate(settings: &DatabaseSettings) -> anyhow::Result<PgPool> {
    ensure_database(settings).await?;
    let pool = connect(settings).await?;
    migrate(&pool).await?;
    Ok(pool)
}

/// The payments database as `mode` wants it: `Auto` creates and migrates it
/// (owner rights needed), `Skip` only connects, so a role with nothing but
/// `SELECT, INSERT, UPDATE, DELETE` on the tables is enough.
pub async fn open_database(
    settings: &DatabaseSettings,
    mode: MigrateMode,
) -> anyhow::Result<PgPool> {
    match mode {
        MigrateMode::Auto => connect_and_migrate(settings)
            .await
            .map_err(|error| explain_missing_rights(error, settings.url())),
        MigrateMode::Skip => {
            let pool = connect(settings).await?;
            ensure_schema_present(&pool).await?;
            Ok(pool)
        }
    }
}

/// sqlx reports a refused server certificate as an I/O error carrying the rustls
/// error; say that it is the TLS handshake, so the operator looks at `sslrootcert`.
fn name_tls_failure(error: sqlx::Error) -> anyhow::Error {
    let tls = match &error {
        sqlx::Error::Tls(_) => true,
        sqlx::Error::Io(io) => io
            .get_ref()
            .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some()),
        _ => false,
    };
    if tls {
        anyhow::Error::new(error)
            .context("TLS handshake with Postgres failed (check sslmode and the CA in sslrootcert)")
    } else {
        error.into()
    }
}

/// SQLSTATE 42501 (insufficient_privilege) anywhere in the chain: the role may use
/// the tables but may not change the schema.
fn explain_missing_rights(error: anyhow::Error, url: &str) -> anyhow::Error {
    let denied = error.chain().any(|cause| {
        cause
            .downcast_ref::<sqlx::Error>()
            .and_then(|e| e.as_database_error())
            .and_then(|e| e.code())
            .is_some_and(|code| code == "42501")
            || cause
                .downcast_ref::<sqlx::migrate::MigrateError>()
                .is_some_and(|e| e.to_string().contains("permission denied"))
    });
    if denied {
        error.context(format!(
            "the role in {} may not create or migrate the schema: run `payment-worker migrate` \
             once with an owner role, then start workers with `--migrate skip` (MIGRATE=skip)",
            redact_url(url)
        ))
    } else {
        error
    }
}

/// With `--migrate skip` nobody applied migrations on this start: fail early and
/// say so when the tables are missing. `to_regclass` needs no privilege.
async fn ensure_schema_present(pool: &PgPool) -> anyhow::Result<()> {
    let present = crate::payment::payments_table_exists(pool)
        .await
        .context("checking the schema")?;
    anyhow::ensure!(
        present,
        "the payments table does not exist: run `payment-worker migrate` with an owner role \
         before starting workers with `--migrate skip`"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha384};

    use super::{MIGRATOR, REWORDED};

    /// The text as databases applied it, from `tests/fixtures/migrations-as-released/`.
    fn released(version: i64) -> &'static str {
        match version {
            1 => include_str!(
                "../../tests/fixtures/migrations-as-released/0001_idempotency_tokens.sql"
            ),
            2 => include_str!("../../tests/fixtures/migrations-as-released/0002_payments.sql"),
            other => panic!("no released text kept for migration {other}"),
        }
    }

    /// The statements, without `--` comments and blank lines.
    fn statements(sql: &str) -> Vec<&str> {
        sql.lines()
            .map(|line| {
                line.split_once("--")
                    .map_or(line, |(code, _)| code)
                    .trim_end()
            })
            .filter(|line| !line.is_empty())
            .collect()
    }

    #[test]
    fn only_comments_changed() {
        for (version, checksum) in REWORDED {
            let before = released(*version);
            assert_eq!(
                hex::encode(Sha384::digest(before.as_bytes())),
                *checksum,
                "migration {version}: the kept text is not the one released"
            );
            let now = MIGRATOR
                .iter()
                .find(|m| m.version == *version)
                .unwrap_or_else(|| panic!("migration {version} is gone"));
            assert_ne!(
                hex::encode(&now.checksum),
                *checksum,
                "migration {version}: unchanged"
            );
            assert_eq!(
                statements(before),
                statements(&now.sql),
                "migration {version}: more than its comments changed"
            );
        }
    }
}
