//! The end state every crash run must reach, read from what the systems hold:
//! gateway ledger, payments rows, Redis tokens, result / dead-letter / offset state in
//! Kafka.

use std::collections::{BTreeMap, HashMap, HashSet};

use payment_worker::gateway::{ChargeStatus, LedgerEntry};
use payment_worker::operator::{RecordKind, WorkloadRecord};
use payment_worker::worker::{self, ResultRecord};
use rdkafka::message::{Headers, Message, OwnedMessage};
use sqlx::PgPool;

// ---------------------------------------------------------------------------
// What a command position should lead to, from the topic itself.

#[derive(Debug, Clone)]
pub(crate) enum Expected {
    /// Decodes into a valid command for this key and fingerprint.
    Valid { key: String, fingerprint: String },
    /// Fails validation: its key (if any) and the original bytes.
    Invalid {
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
    },
}

pub(crate) type Position = (i32, i64);

pub(crate) fn expectations(commands: &[OwnedMessage]) -> BTreeMap<Position, Expected> {
    commands
        .iter()
        .map(|m| {
            let expected = match worker::Inbound::read(m).command {
                Ok(command) => Expected::Valid {
                    key: command.idempotency_key().as_str().to_owned(),
                    fingerprint: command.fingerprint().to_string(),
                },
                Err(_) => Expected::Invalid {
                    key: m.key().map(<[u8]>::to_vec),
                    value: m.payload().map(<[u8]>::to_vec),
                },
            };
            ((m.partition(), m.offset()), expected)
        })
        .collect()
}

pub(crate) fn header(message: &OwnedMessage, name: &str) -> Option<String> {
    message.headers().and_then(|h| {
        h.iter()
            .find(|x| x.key == name)
            .and_then(|x| x.value.map(|v| String::from_utf8_lossy(v).into_owned()))
    })
}

pub(crate) fn by_position(results: &[ResultRecord]) -> HashMap<Position, Vec<&ResultRecord>> {
    let mut out: HashMap<Position, Vec<&ResultRecord>> = HashMap::new();
    for r in results {
        out.entry((r.source.partition, r.source.offset))
            .or_default()
            .push(r);
    }
    out
}

/// The command position a dead letter names in its `x-source-*` headers.
pub(crate) fn source_position(letter: &OwnedMessage) -> Position {
    (
        header(letter, "x-source-partition")
            .unwrap()
            .parse()
            .unwrap(),
        header(letter, "x-source-offset").unwrap().parse().unwrap(),
    )
}

pub(crate) struct PaymentRow {
    pub(crate) id: uuid::Uuid,
    pub(crate) status: String,
    pub(crate) transaction_id: Option<String>,
    pub(crate) fingerprint: String,
}

pub(crate) async fn payment_rows(pool: &PgPool) -> HashMap<String, PaymentRow> {
    let rows: Vec<(uuid::Uuid, String, String, Option<String>, String)> = sqlx::query_as(
        "SELECT id, idempotency_key, status, gateway_transaction_id, fingerprint FROM payments",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter()
        .map(|(id, key, status, transaction_id, fingerprint)| {
            (
                key,
                PaymentRow {
                    id,
                    status,
                    transaction_id,
                    fingerprint,
                },
            )
        })
        .collect()
}

/// Every token hash under `prefix` with its `status` field (see token/redis/store.rs).
pub(crate) async fn token_statuses(
    redis: &mut redis::aio::ConnectionManager,
    prefix: &str,
) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for key in scan(redis, &format!("{prefix}:token:*")).await {
        let status: Option<String> = redis::cmd("HGET")
            .arg(&key)
            .arg("status")
            .query_async(redis)
            .await
            .unwrap();
        if let Some(status) = status {
            out.insert(key, status);
        }
    }
    out
}

pub(crate) async fn scan(redis: &mut redis::aio::ConnectionManager, pattern: &str) -> Vec<String> {
    let mut cursor: u64 = 0;
    let mut keys = Vec::new();
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(redis)
            .await
            .unwrap();
        keys.extend(batch);
        if next == 0 {
            return keys;
        }
        cursor = next;
    }
}

/// Redis "loses its data": every key of this test's prefix is deleted (other tests
/// share the server, so no FLUSHALL). Returns how many keys went.
pub(crate) async fn flush_prefix(redis: &mut redis::aio::ConnectionManager, prefix: &str) -> usize {
    let keys = scan(redis, &format!("{prefix}:*")).await;
    for chunk in keys.chunks(500) {
        let _: i64 = redis::cmd("DEL")
            .arg(chunk)
            .query_async(redis)
            .await
            .unwrap();
    }
    keys.len()
}

/// What the systems hold once a run is over, read by `Deployment::holdings`.
pub(crate) struct Holdings {
    /// What each command position should lead to, from the commands topic.
    pub(crate) expected: BTreeMap<Position, Expected>,
    pub(crate) dead_letters: Vec<OwnedMessage>,
    pub(crate) ledger: Vec<LedgerEntry>,
    pub(crate) rows: HashMap<String, PaymentRow>,
}

impl Holdings {
    /// The books of a run that published `records` and answered `results`, its
    /// token store holding `tokens` (key → status).
    pub(crate) fn check(
        &self,
        records: &[WorkloadRecord],
        results: &[ResultRecord],
        tokens: &HashMap<String, String>,
    ) {
        Books {
            records,
            expected: &self.expected,
            results,
            dead_letters: &self.dead_letters,
            ledger: &self.ledger,
            rows: &self.rows,
            tokens,
        }
        .check();
    }
}

/// The end state every run must reach (the invariants), from what the systems hold.
struct Books<'a> {
    records: &'a [WorkloadRecord],
    expected: &'a BTreeMap<Position, Expected>,
    results: &'a [ResultRecord],
    dead_letters: &'a [OwnedMessage],
    ledger: &'a [LedgerEntry],
    rows: &'a HashMap<String, PaymentRow>,
    tokens: &'a HashMap<String, String>,
}

impl Books<'_> {
    fn check(&self) {
        // The topic holds exactly the generated workload.
        assert_eq!(
            self.expected.len(),
            self.records.len(),
            "commands on the topic"
        );
        let invalid: BTreeMap<&Position, &Expected> = self
            .expected
            .iter()
            .filter(|(_, e)| matches!(e, Expected::Invalid { .. }))
            .collect();
        assert_eq!(
            invalid.len(),
            self.records
                .iter()
                .filter(|r| r.kind == RecordKind::Invalid)
                .count(),
            "every generated invalid record, and only those, fails validation"
        );
        let valid_keys: HashSet<&str> = self
            .expected
            .values()
            .filter_map(|e| match e {
                Expected::Valid { key, .. } => Some(key.as_str()),
                Expected::Invalid { .. } => None,
            })
            .collect();
        let generated_keys: HashSet<String> = self
            .records
            .iter()
            .filter(|r| r.kind == RecordKind::Valid)
            .map(|r| String::from_utf8(r.key.clone().unwrap()).unwrap())
            .collect();
        assert_eq!(
            valid_keys,
            generated_keys.iter().map(String::as_str).collect(),
            "valid keys"
        );

        // I1: the ledger holds one charge per valid key, and nothing else.
        let mut charges: HashMap<&str, Vec<&LedgerEntry>> = HashMap::new();
        for entry in self.ledger {
            charges
                .entry(entry.idempotency_key.as_str())
                .or_default()
                .push(entry);
        }
        let doubles: Vec<(&&str, usize)> = charges
            .iter()
            .filter(|(_, c)| c.len() > 1)
            .map(|(k, c)| (k, c.len()))
            .collect();
        assert!(
            doubles.is_empty(),
            "keys charged more than once: {doubles:?}"
        );
        let charged: HashSet<&str> = charges.keys().copied().collect();
        let never_charged: Vec<_> = valid_keys.difference(&charged).take(10).collect();
        assert!(
            never_charged.is_empty(),
            "valid keys never charged (lost commands): {never_charged:?}"
        );
        let unexpected: Vec<_> = charged.difference(&valid_keys).take(10).collect();
        assert!(
            unexpected.is_empty(),
            "charges for keys that are no valid command: {unexpected:?}"
        );

        // I7: ledger = books, row by row; no row left `processing`.
        assert_eq!(
            self.rows.len(),
            self.ledger.len(),
            "one payment row per charge"
        );
        for entry in self.ledger {
            let row = self.rows.get(&entry.idempotency_key).unwrap_or_else(|| {
                panic!("charge of {} has no payment row", entry.idempotency_key)
            });
            let status = match entry.status {
                ChargeStatus::Approved => "succeeded",
                ChargeStatus::Declined => "declined",
            };
            assert_eq!(
                row.status, status,
                "row status of {}",
                entry.idempotency_key
            );
            assert_eq!(
                row.transaction_id.as_deref(),
                Some(entry.transaction_id.as_str()),
                "{}",
                entry.idempotency_key
            );
        }

        // I2: every position answered; a repeated answer is only ever `duplicate`
        // (or the same rejection); every answer names the one payment of its key.
        let answers = by_position(self.results);
        let mut finals: HashMap<&str, Vec<&ResultRecord>> = HashMap::new();
        for (position, expected) in self.expected {
            let list = answers
                .get(position)
                .unwrap_or_else(|| panic!("command at {position:?} has no result"));
            match expected {
                Expected::Valid { key, fingerprint } => {
                    let row = self
                        .rows
                        .get(key)
                        .unwrap_or_else(|| panic!("{key} has no payment row"));
                    assert_eq!(
                        &row.fingerprint, fingerprint,
                        "the row of {key} is this command's"
                    );
                    let mut first = 0;
                    for answer in list {
                        assert_eq!(
                            answer.idempotency_key.as_deref(),
                            Some(key.as_str()),
                            "{answer:?}"
                        );
                        assert_eq!(
                            answer.payment_id,
                            Some(row.id),
                            "answer names the payment: {answer:?}"
                        );
                        match answer.outcome.as_str() {
                            "duplicate" => {}
                            "succeeded" | "declined" => {
                                first += 1;
                                finals.entry(key.as_str()).or_default().push(answer);
                            }
                            other => {
                                panic!("valid command at {position:?} answered {other}: {list:?}")
                            }
                        }
                    }
                    assert!(
                        first <= 1,
                        "{position:?} answered as first processing twice: {list:?}"
                    );
                }
                Expected::Invalid { .. } => {
                    assert!(
                        list.iter()
                            .all(|a| a.outcome == "rejected" && a.reason == list[0].reason),
                        "an invalid command is rejected, the same way each time: {list:?}"
                    );
                    let reason = list[0].reason.as_deref().unwrap_or_default();
                    assert!(reason.starts_with("invalid"), "{reason}");
                }
            }
        }
        // A key's final answer (at most one over all its positions) matches its charge.
        for (key, list) in &finals {
            assert_eq!(
                list.len(),
                1,
                "{key} answered as first processing more than once: {list:?}"
            );
            let charge = charges[key][0];
            assert_eq!(
                list[0].gateway_transaction_id.as_deref(),
                Some(charge.transaction_id.as_str())
            );
        }

        // Every invalid record is in the DLQ, unchanged, with its reason.
        let mut lettered: HashSet<Position> = HashSet::new();
        for letter in self.dead_letters {
            let position = source_position(letter);
            let Some(Expected::Invalid { key, value }) = self.expected.get(&position) else {
                panic!("dead letter for {position:?}, which is not an invalid command");
            };
            assert_eq!(header(letter, "x-error-kind").as_deref(), Some("invalid"));
            assert!(!header(letter, "x-error-reason")
                .unwrap_or_default()
                .is_empty());
            assert_eq!(letter.key().map(<[u8]>::to_vec), *key, "original key kept");
            // The original value, but a card number in it masked (all but its last four).
            let kept = match header(letter, "x-payload-redacted").as_deref() {
                Some("card_number") => value.as_deref().map(|v| {
                    payment_worker::payment::mask_card_numbers(&String::from_utf8_lossy(v))
                        .into_owned()
                        .into_bytes()
                }),
                _ => value.clone(),
            };
            assert_eq!(
                letter.payload().map(<[u8]>::to_vec),
                kept,
                "original value kept"
            );
            lettered.insert(position);
        }
        let missing: Vec<_> = invalid.keys().filter(|p| !lettered.contains(p)).collect();
        assert!(
            missing.is_empty(),
            "invalid commands without a dead letter: {missing:?}"
        );

        // I4: no token left `processing`.
        let stuck: Vec<_> = self
            .tokens
            .iter()
            .filter(|(_, s)| *s == "processing")
            .take(10)
            .collect();
        assert!(stuck.is_empty(), "tokens left processing: {stuck:?}");
    }
}

/// Payments decided under a reservation that was not the key's first (a takeover
/// after a kill, a retry after a restore): evidence the faults hit work in flight.
pub(crate) async fn later_reservations(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM payments WHERE fence > 1")
        .fetch_one(pool)
        .await
        .unwrap()
}

pub(crate) fn answered(results: &[ResultRecord]) -> usize {
    results
        .iter()
        .map(|r| (r.source.partition, r.source.offset))
        .collect::<HashSet<_>>()
        .len()
}
