//! The table checks on keys, fingerprints and currencies: they refuse exactly what the
//! first release's anchored patterns refused, without evaluating a counted pattern
//! (Postgres evaluates every check on every INSERT and UPDATE of a payment).

use std::collections::{HashMap, HashSet};

use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{PgPool, Postgres};

/// The rules of the first release, as Postgres itself evaluates them.
const KEY_RULE: &str = "^[A-Za-z0-9._:-]{1,128}$";
const FINGERPRINT_RULE: &str = "^[0-9a-f]{64}$";
const CURRENCY_RULE: &str = "^[A-Z]{3}$";

const VALID_FINGERPRINT: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn keys() -> Vec<String> {
    let mut keys: Vec<String> = [
        "",
        "a",
        "cmd-0001",
        "A.b_c:d-e",
        "with space",
        "slash/1",
        "percent%",
        "ä",
        "ключ",
        "emoji-🙂",
        "tab\tkey",
        "line\nbreak",
        "trailing\n",
        "\nleading",
        "Ａ",
        "a$",
        "^a",
        "[x]",
        "a{1}",
        "back\\slash",
        "quote'",
        "star*",
    ]
    .map(String::from)
    .to_vec();
    keys.extend([
        "k".repeat(127),
        "k".repeat(128),
        "k".repeat(129),
        format!("{}ä", "k".repeat(127)),
    ]);
    keys
}

fn fingerprints() -> Vec<String> {
    let mut values: Vec<String> = vec![
        VALID_FINGERPRINT.to_owned(),
        VALID_FINGERPRINT.to_uppercase(),
        VALID_FINGERPRINT[1..].to_owned(),
        format!("{VALID_FINGERPRINT}0"),
        format!("{}g", &VALID_FINGERPRINT[1..]),
        format!("{} ", &VALID_FINGERPRINT[1..]),
        format!("{}\n", &VALID_FINGERPRINT[1..]),
        format!("{}é", &VALID_FINGERPRINT[1..]),
        String::new(),
    ];
    values.push("f".repeat(64));
    values.push("-".repeat(64));
    values
}

fn currencies() -> Vec<String> {
    [
        "EUR",
        "USD",
        "eur",
        "Eur",
        "EU",
        "EURO",
        "E1R",
        "É\u{301}U",
        "ÉUR",
        "E R",
        "EU\n",
        "",
        "ZZZ",
        "AAA",
        "[A]",
    ]
    .map(String::from)
    .to_vec()
}

async fn matches(pool: &PgPool, value: &str, rule: &str) -> bool {
    sqlx::query_scalar("SELECT $1 ~ $2")
        .bind(value)
        .bind(rule)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Inserts a payment row whose other columns are valid: whether the checks let it
/// through.
async fn payment_accepted(pool: &PgPool, key: &str, fingerprint: &str, currency: &str) -> bool {
    let insert = sqlx::query(
        "INSERT INTO payments (id, idempotency_key, fingerprint, account_id, amount_minor,
             currency, status, gateway_transaction_id)
         VALUES (gen_random_uuid(), $1, $2, 'acct-1', 100, $3, 'succeeded', 'txn-1')",
    )
    .bind(key)
    .bind(fingerprint)
    .bind(currency);
    accepted(pool, insert).await
}

async fn unresolved_accepted(pool: &PgPool, key: &str) -> bool {
    let insert = sqlx::query(
        "INSERT INTO unresolved_charges (idempotency_key, amount_minor, currency, reason, attempts)
         VALUES ($1, 100, 'EUR', 'timed out', 3)",
    )
    .bind(key);
    accepted(pool, insert).await
}

/// Runs `insert` in a transaction that is rolled back: `true` when it went through,
/// `false` when a CHECK refused it; any other error fails the test.
async fn accepted(pool: &PgPool, insert: Query<'_, Postgres, PgArguments>) -> bool {
    let mut tx = pool.begin().await.unwrap();
    let outcome = insert.execute(&mut *tx).await;
    tx.rollback().await.unwrap();
    match outcome {
        Ok(_) => true,
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("23514") => false,
        Err(other) => panic!("refused for another reason than a check: {other}"),
    }
}

#[sqlx::test]
async fn the_checks_accept_exactly_what_the_first_release_patterns_accepted(pool: PgPool) {
    let pool = &pool;
    let mut disagreements = Vec::new();
    // Each rule's answers over its corpus: both must occur for the comparison to mean
    // something.
    let mut answers: HashMap<&str, HashSet<bool>> = HashMap::new();
    for key in keys() {
        let expected = matches(pool, &key, KEY_RULE).await;
        answers.entry(KEY_RULE).or_default().insert(expected);
        if payment_accepted(pool, &key, VALID_FINGERPRINT, "EUR").await != expected {
            disagreements.push(format!(
                "payments.idempotency_key {key:?}: expected {expected}"
            ));
        }
        if unresolved_accepted(pool, &key).await != expected {
            disagreements.push(format!(
                "unresolved_charges.idempotency_key {key:?}: expected {expected}"
            ));
        }
    }
    for fingerprint in fingerprints() {
        let expected = matches(pool, &fingerprint, FINGERPRINT_RULE).await;
        answers
            .entry(FINGERPRINT_RULE)
            .or_default()
            .insert(expected);
        if payment_accepted(pool, "cmd-1", &fingerprint, "EUR").await != expected {
            disagreements.push(format!("fingerprint {fingerprint:?}: expected {expected}"));
        }
    }
    for currency in currencies() {
        let expected = matches(pool, &currency, CURRENCY_RULE).await;
        answers.entry(CURRENCY_RULE).or_default().insert(expected);
        if payment_accepted(pool, "cmd-1", VALID_FINGERPRINT, &currency).await != expected {
            disagreements.push(format!("currency {currency:?}: expected {expected}"));
        }
    }
    assert!(disagreements.is_empty(), "{disagreements:#?}");
    for rule in [KEY_RULE, FINGERPRINT_RULE, CURRENCY_RULE] {
        assert_eq!(
            answers.get(rule).map(HashSet::len),
            Some(2),
            "{rule}: the corpus needs accepted and refused values"
        );
    }
}

/// A counted repetition (`{64}`, `{1,128}`) compiles to a large automaton: the checks
/// of a payment cost Postgres a tenth of its CPU time with three of them.
#[sqlx::test]
async fn no_check_on_the_payment_tables_evaluates_a_counted_pattern(pool: PgPool) {
    let checks: Vec<(String, String)> = sqlx::query_as(
        "SELECT conname::text, pg_get_constraintdef(oid)
           FROM pg_constraint
          WHERE conrelid IN ('payments'::regclass, 'unresolved_charges'::regclass)
            AND contype = 'c'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(checks.len() >= 8, "the checks were not found: {checks:?}");
    let counted: Vec<_> = checks
        .iter()
        .filter(|(_, definition)| definition.contains('~') && definition.contains('{'))
        .collect();
    assert!(
        counted.is_empty(),
        "checks with a counted pattern: {counted:?}"
    );
}
