//! The offline cache of the checked SQL statements (`.sqlx/`, committed) is what the
//! compiler checks every `sqlx::query!`/`query_as!`/`query_scalar!` against: builds
//! never connect (`SQLX_OFFLINE=true` in `.cargo/config.toml`). A cache that no longer
//! matches the schema would let a statement compile against a table that is not
//! there any more, so this test asks Postgres again, on a database migrated from
//! today's `migrations/`, and compares. One describe per statement: a second or so.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use sqlx::{Column, Executor, PgPool, TypeInfo};

/// What to run when this test fails (docs/ARCHITECTURE.md, "Checked SQL").
const REGENERATE: &str = "regenerate the cache with `scripts/sqlx-prepare` \
    (needs the local Postgres and psql) and commit `.sqlx/`";

fn cache_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(".sqlx")
}

/// Every `query-*.json` of the cache, with its file name.
fn cached_files() -> Vec<(String, serde_json::Value)> {
    let mut files: Vec<(String, serde_json::Value)> = std::fs::read_dir(cache_dir())
        .expect("the offline cache .sqlx/ is committed at the workspace root")
        .map(|entry| entry.expect("reading .sqlx/").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .map(|path| {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .expect("a UTF-8 file name")
                .to_owned();
            let text = std::fs::read_to_string(&path).expect("reading a cached query");
            let json = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{name} is not JSON ({e}): {REGENERATE}"));
            (name, json)
        })
        .collect();
    files.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(
        !files.is_empty(),
        ".sqlx/ holds no cached query: {REGENERATE}"
    );
    files
}

/// Every Rust source of the product, concatenated: where a cached statement must be.
fn product_sources() -> String {
    fn walk(dir: &Path, into: &mut String) {
        for entry in std::fs::read_dir(dir).expect("reading src/") {
            let path = entry.expect("reading src/").path();
            if path.is_dir() {
                walk(&path, into);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                into.push_str(&std::fs::read_to_string(&path).expect("reading a source"));
            }
        }
    }
    let mut sources = String::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut sources,
    );
    sources
}

/// A type as the cache spells it (`PgType`'s variant: `"Int4"`, `"TextArray"`) and as
/// Postgres names it (`INT4`, `TEXT[]`), brought to one spelling.
fn type_key(name: &str) -> String {
    name.replace("[]", "ARRAY")
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect::<String>()
        .to_ascii_uppercase()
}

fn cached_type(value: &serde_json::Value) -> String {
    match value.as_str() {
        Some(name) => type_key(name),
        // A custom type (an enum, a domain): not used yet; compared by its JSON,
        // which no live name equals, so the test says so instead of passing.
        None => value.to_string(),
    }
}

/// The cache's `describe` of one statement in one comparable shape: parameter
/// types, then `name type nullable` per column.
fn cached_shape(describe: &serde_json::Value) -> (Vec<String>, Vec<String>) {
    let parameters = describe["parameters"]["Left"]
        .as_array()
        .map(|types| types.iter().map(cached_type).collect())
        .unwrap_or_default();
    let nullable = describe["nullable"].as_array().cloned().unwrap_or_default();
    let columns = describe["columns"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, column)| {
            format!(
                "{} {} nullable={}",
                column["name"].as_str().unwrap_or("?"),
                cached_type(&column["type_info"]),
                nullable.get(i).map_or("?".into(), |n| n.to_string()),
            )
        })
        .collect();
    (parameters, columns)
}

/// Postgres's `describe` of the same statement, in the same shape.
async fn live_shape(pool: &PgPool, query: &str) -> Result<(Vec<String>, Vec<String>), String> {
    let describe = pool.describe(query).await.map_err(|e| e.to_string())?;
    let parameters = match describe.parameters() {
        Some(sqlx::Either::Left(types)) => types.iter().map(|t| type_key(t.name())).collect(),
        _ => Vec::new(),
    };
    let columns = describe
        .columns()
        .iter()
        .enumerate()
        .map(|(i, column)| {
            let nullable = describe
                .nullable(i)
                .map_or("null".to_owned(), |n| n.to_string());
            format!(
                "{} {} nullable={nullable}",
                column.name(),
                type_key(column.type_info().name())
            )
        })
        .collect();
    Ok((parameters, columns))
}

/// Why one cached file is not what the code and the schema make today, if it is not.
async fn problem_with(
    pool: &PgPool,
    sources: &str,
    name: &str,
    cached: &serde_json::Value,
) -> Option<String> {
    let Some(query) = cached["query"].as_str() else {
        return Some(format!("{name}: no `query` text"));
    };
    let hash = hex::encode(Sha256::digest(query.as_bytes()));
    if name != format!("query-{hash}.json") || cached["hash"].as_str() != Some(hash.as_str()) {
        return Some(format!(
            "{name}: the file's name or `hash` is not the SHA-256 of its query text ({hash})"
        ));
    }
    if cached["db_name"].as_str() != Some("PostgreSQL") {
        return Some(format!("{name}: db_name is not PostgreSQL"));
    }
    if !sources.contains(query) {
        return Some(format!(
            "{name}: orphaned, no source under src/ holds its statement any more:\n{query}"
        ));
    }
    let cached_shape = cached_shape(&cached["describe"]);
    match live_shape(pool, query).await {
        Err(error) => Some(format!(
            "{name}: Postgres refuses the statement on today's schema: {error}\n{query}"
        )),
        Ok(live) if live != cached_shape => Some(format!(
            "{name}: stale, the schema describes it otherwise\n  cached: {cached_shape:?}\n  \
             today:  {live:?}\n{query}"
        )),
        Ok(_) => None,
    }
}

#[sqlx::test]
async fn the_offline_cache_matches_the_sources_and_the_migrated_schema(pool: PgPool) {
    let sources = product_sources();
    let mut problems = Vec::new();
    for (name, cached) in cached_files() {
        problems.extend(problem_with(&pool, &sources, &name, &cached).await);
    }
    assert!(
        problems.is_empty(),
        "the offline SQL cache .sqlx/ is out of date: {REGENERATE}\n\n{}",
        problems.join("\n\n")
    );
}

/// The comparison is only as good as its normalisation: the two spellings of the
/// types this code uses meet, and different types stay apart.
#[test]
fn a_type_as_cached_and_as_postgres_names_it_compare_equal() {
    for (cached, live) in [
        ("Int4", "INT4"),
        ("Int8", "INT8"),
        ("Text", "TEXT"),
        ("TextArray", "TEXT[]"),
        ("Timestamptz", "TIMESTAMPTZ"),
        ("Float8", "FLOAT8"),
        ("Bool", "BOOL"),
        ("Uuid", "UUID"),
    ] {
        assert_eq!(type_key(cached), type_key(live), "{cached} vs {live}");
    }
    assert_ne!(type_key("Int4"), type_key("INT8"));
    assert_ne!(type_key("Text"), type_key("TEXT[]"));
}
