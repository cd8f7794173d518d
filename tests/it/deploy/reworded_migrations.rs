//! A database migrated before a migration's comments were reworded keeps starting:
//! its recorded checksum is moved to today's text, and only for the texts released.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha384};
use sqlx::PgPool;

use crate::support::helpers::{ensure_services, unique, PG_ADDR};
use payment_worker::configuration::DatabaseSettings;
use payment_worker::startup::{connect, ensure_database, migrate};

const REPOSITORY: &str = env!("CARGO_MANIFEST_DIR");

/// The migrations as the first release had them: 0001 and 0002 with their old
/// comments, the rest as they are.
fn released_migrations() -> PathBuf {
    let dir = std::env::temp_dir().join(unique("pw-released-migrations"));
    std::fs::create_dir_all(&dir).unwrap();
    let today = Path::new(REPOSITORY).join("migrations");
    let released = Path::new(REPOSITORY).join("tests/fixtures/migrations-as-released");
    for entry in std::fs::read_dir(&today).unwrap() {
        let name = entry.unwrap().file_name();
        let source = if released.join(&name).exists() {
            released.join(&name)
        } else {
            today.join(&name)
        };
        std::fs::copy(source, dir.join(&name)).unwrap();
    }
    dir
}

async fn fresh_database() -> PgPool {
    ensure_services();
    let url = format!("postgres://postgres@{PG_ADDR}/{}", unique("pw_test"));
    let settings = DatabaseSettings {
        max_connections: 2,
        ..DatabaseSettings::with_url(&url)
    };
    ensure_database(&settings).await.unwrap();
    connect(&settings).await.unwrap()
}

async fn checksum(pool: &PgPool, version: i64) -> String {
    sqlx::query_scalar("SELECT encode(checksum, 'hex') FROM _sqlx_migrations WHERE version = $1")
        .bind(version)
        .fetch_one(pool)
        .await
        .unwrap()
}

fn sha384_of(path: &str) -> String {
    let text = std::fs::read(Path::new(REPOSITORY).join(path)).unwrap();
    hex::encode(Sha384::digest(text))
}

#[tokio::test]
async fn a_database_migrated_with_the_released_texts_migrates_again_and_records_todays() {
    let pool = fresh_database().await;
    let dir = released_migrations();
    sqlx::migrate::Migrator::new(dir.as_path())
        .await
        .unwrap()
        .run(&pool)
        .await
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let released = sha384_of("tests/fixtures/migrations-as-released/0001_idempotency_tokens.sql");
    assert_eq!(checksum(&pool, 1).await, released);

    migrate(&pool)
        .await
        .expect("a database of the first release must still migrate");

    for (version, file) in [
        (1, "migrations/0001_idempotency_tokens.sql"),
        (2, "migrations/0002_payments.sql"),
    ] {
        assert_eq!(
            checksum(&pool, version).await,
            sha384_of(file),
            "migration {version}"
        );
    }
    // And again, as every later start does.
    migrate(&pool).await.unwrap();
}

#[tokio::test]
async fn a_migration_changed_otherwise_is_still_refused() {
    let pool = fresh_database().await;
    migrate(&pool).await.unwrap();
    let foreign = hex::encode(Sha384::digest(b"CREATE TABLE something_else ();"));
    sqlx::query("UPDATE _sqlx_migrations SET checksum = decode($1, 'hex') WHERE version = 1")
        .bind(&foreign)
        .execute(&pool)
        .await
        .unwrap();

    let error = migrate(&pool)
        .await
        .expect_err("a modified migration must be refused");
    assert!(
        format!("{error:#}").contains("previously applied but has been modified"),
        "{error:#}"
    );
    assert_eq!(
        checksum(&pool, 1).await,
        foreign,
        "left for the operator to see"
    );
}
