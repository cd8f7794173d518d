//! `--results exactly-once`: results, dead letters and the consumed offsets leave the
//! worker in one Kafka transaction (KIP-447: one transactional producer per process,
//! fenced through the consumer group's metadata).
//!
//! A command's answer (its dead letter, then its result) is produced while holding
//! the *gate* for reading; the partition task lets go of it only after the gap-free
//! tracker recorded the command as settled. A commit takes the gate for writing, so
//! at that moment every answer produced in the open transaction is acknowledged and
//! settled. Answers of one partition enter in offset order (`answer_order.rs`), so
//! the settled offset sent with `send_offsets_to_transaction` lies past every one of
//! them; the commit checks that and aborts instead when it does not hold (an answer
//! whose command was abandoned before it settled, or one that panicked after it
//! answered). The offsets and the answers they cover therefore become visible
//! together, or, when the transaction is aborted, neither does: the member then
//! rewinds its partitions to the last committed offsets and answers those commands
//! again (as `duplicate`, with the original answer, since the charge itself is
//! idempotent).
//!
//! Commits, aborts and rewinds run on the poll thread, which owns the consumer and
//! the partition map; see `consumer.rs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, Producer};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::{OwnedRwLockReadGuard, RwLock};

use super::oversized::Oversized;
use crate::configuration::{KafkaSettings, WorkerSettings};
use crate::payment::SourcePosition;

type PartitionId = (String, i32);

/// Held by a command from the start of its answer until its partition recorded it
/// as settled; a commit waits for every one of them.
pub struct AnswerGuard {
    settled: bool,
    /// The transaction's `broken` flag: a guard dropped unsettled raises it.
    broken: Arc<AtomicBool>,
    _gate: OwnedRwLockReadGuard<()>,
}

impl AnswerGuard {
    /// The partition recorded the command as settled: a commit may carry its answer.
    pub fn settled(mut self) {
        self.settled = true;
    }
}

impl Drop for AnswerGuard {
    fn drop(&mut self) {
        // Abandoned at the drain deadline, or its handler panicked after answering:
        // the answer is in the transaction but its offset will not be sent, and the
        // command will be answered again. Raised before the gate opens, so the
        // commit waiting for this guard sees it and aborts.
        if !self.settled {
            self.broken.store(true, Ordering::SeqCst);
        }
    }
}

/// Why a transaction did not commit.
#[derive(Debug, thiserror::Error)]
pub enum TransactionFailure {
    /// Aborted; what it held is discarded and must be redone.
    #[error("transaction aborted: {0}")]
    Aborted(String),
    /// The producer cannot go on (fenced by a newer instance, or fatal).
    #[error("transactional producer failed for good: {0}")]
    Fatal(String),
}

/// The process's transactional producer and the gate between answers and commits.
pub struct Transactions {
    producer: FutureProducer,
    gate: Arc<RwLock<()>>,
    /// Settled offsets (next offset to read) not yet sent in a committed transaction.
    settled: Mutex<HashMap<PartitionId, i64>>,
    /// Where each partition would restart if the open transaction were aborted: the
    /// offset this member last committed for it, or the first record it was given.
    restart_at: Mutex<HashMap<PartitionId, i64>>,
    /// Answers produced in the open transaction.
    answers: AtomicU64,
    /// The highest offset answered in the open transaction, per partition.
    answered: Mutex<HashMap<PartitionId, i64>>,
    /// A record of the open transaction was not delivered, or an answer in it was
    /// abandoned unsettled: it cannot commit.
    broken: Arc<AtomicBool>,
    opened: Mutex<Instant>,
    /// Dead letters the broker refused as too large, until a commit passes them.
    oversized: Oversized,
    interval: Duration,
    max_records: u64,
    /// Bound of each transactional call the poll thread makes (sending offsets,
    /// committing, aborting); see [`poll_thread_call_timeout`].
    call_timeout: Duration,
}

/// How long the poll thread waits for one transactional call: half the session
/// timeout. A commit makes at most three calls in a row (offsets, commit, and the
/// abort when the commit fails), and the poll thread polls nothing meanwhile; the
/// worker ends itself when it has not polled for twice the session timeout
/// (`consumer.rs`). Three halves fit inside that, so a coordinator that answers too
/// late ends the worker through the transaction's own verdict (fatal, exit 4, with
/// the reason) rather than as a poll loop that merely stood still.
fn poll_thread_call_timeout(session_timeout: Duration) -> Duration {
    session_timeout / 2
}

/// librdkafka's `transaction.timeout.ms` when none is set.
const DEFAULT_TRANSACTION_TIMEOUT_MS: u64 = 60_000;

/// librdkafka refuses a transactional producer whose records may outlive their
/// transaction: a message timeout (`message.timeout.ms`, or its alias
/// `delivery.timeout.ms`) above the transaction timeout is lowered to it.
fn fit_message_timeout(config: &mut ClientConfig) {
    let transaction = transaction_timeout_ms(config);
    let setting = |key| config.get(key).and_then(|v: &str| v.parse::<u64>().ok());
    let message = setting("delivery.timeout.ms").or_else(|| setting("message.timeout.ms"));
    if message.is_some_and(|message| message > transaction) {
        config.remove("delivery.timeout.ms");
        config.set("message.timeout.ms", transaction.to_string());
    }
}

/// How long the broker lets a transaction stay open before aborting it.
fn transaction_timeout_ms(config: &ClientConfig) -> u64 {
    config
        .get("transaction.timeout.ms")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(DEFAULT_TRANSACTION_TIMEOUT_MS)
}

/// A transaction is committed once its interval ends; one left open that long
/// would be aborted by the broker first, every time, and nothing would ever be
/// answered.
fn check_interval(interval: Duration, config: &ClientConfig) -> anyhow::Result<()> {
    let timeout = Duration::from_millis(transaction_timeout_ms(config));
    anyhow::ensure!(
        interval < timeout,
        "TRANSACTION_INTERVAL ({}) must be shorter than the brokers' transaction timeout \
         (transaction.timeout.ms, {}), or the broker aborts every transaction before it commits",
        humantime::format_duration(interval),
        humantime::format_duration(timeout)
    );
    Ok(())
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every mutation is a single insert/remove/replace: a poisoned map is still valid.
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Transactions {
    /// Creates this process's transactional producer, fences any earlier producer
    /// of the same transactional id, and opens the first transaction. Blocks for
    /// broker round trips: call it before the worker starts consuming.
    pub fn start(kafka: &KafkaSettings, worker: &WorkerSettings) -> anyhow::Result<Arc<Self>> {
        // Unique per process (KIP-447): fencing comes from the group's generation,
        // not from reusing an id, so two members can never fence each other. Colons
        // between the parts: a dash would join the worker id's last digits (its
        // pid) and the suffix's first into one number, which may read as a card
        // number in the log line below.
        let transactional_id = format!(
            "{}:{}:{}",
            kafka.group_id,
            worker.worker_id(),
            uuid::Uuid::new_v4().simple()
        );
        let mut config = super::kafka::producer_config(kafka);
        config.set("transactional.id", &transactional_id);
        fit_message_timeout(&mut config);
        check_interval(worker.transaction_interval, &config)?;
        let producer: FutureProducer = super::kafka::create_client(&config)
            .context("creating the transactional Kafka producer")?;
        // Off the poll thread, before the member joins: finding the transaction
        // coordinator may take a while on a cluster that is just starting.
        producer
            .init_transactions(kafka.session_timeout.max(Duration::from_secs(10)))
            .map_err(|error| {
                // Refused credentials or permissions: restarting cannot help (exit 4),
                // as for the consumer; anything else may be a broker without
                // transactions.
                let fatal = super::supervision::is_fatal_broker_error(&error)
                    || matches!(&error, KafkaError::Transaction(e) if e.is_fatal());
                if fatal {
                    anyhow::Error::new(super::WorkerFailure::FatalBroker(format!(
                        "initialising Kafka transactions: {error}"
                    )))
                } else {
                    anyhow::Error::new(error)
                        .context("initialising Kafka transactions (do the brokers support them?)")
                }
            })?;
        producer
            .begin_transaction()
            .context("opening the first Kafka transaction")?;
        tracing::info!(%transactional_id, "exactly-once results: transactional producer ready");
        Ok(Arc::new(Self::over(
            producer,
            worker.transaction_interval,
            worker.transaction_max_records,
            poll_thread_call_timeout(kafka.session_timeout),
        )))
    }

    /// The bookkeeping around `producer`; `start` has opened its first transaction.
    fn over(
        producer: FutureProducer,
        interval: Duration,
        max_records: u64,
        call_timeout: Duration,
    ) -> Self {
        Self {
            producer,
            gate: Arc::new(RwLock::new(())),
            settled: Mutex::default(),
            restart_at: Mutex::default(),
            answers: AtomicU64::new(0),
            answered: Mutex::default(),
            broken: Arc::new(AtomicBool::new(false)),
            opened: Mutex::new(Instant::now()),
            oversized: Oversized::default(),
            interval,
            max_records,
            call_timeout,
        }
    }

    /// What the broker refused as too large in transactions not yet committed.
    pub(super) fn oversized(&self) -> &Oversized {
        &self.oversized
    }

    /// The transactional producer the publisher sends results and dead letters with.
    pub fn producer(&self) -> &FutureProducer {
        &self.producer
    }

    /// Waits while a commit is under way, then admits the answer to the command at
    /// `source` to the open transaction.
    pub async fn enter(&self, source: &SourcePosition) -> AnswerGuard {
        let gate = Arc::clone(&self.gate).read_owned().await;
        self.answers.fetch_add(1, Ordering::SeqCst);
        let mut answered = lock(&self.answered);
        let highest = answered
            .entry((source.topic.clone(), source.partition))
            .or_insert(source.offset);
        *highest = (*highest).max(source.offset);
        AnswerGuard {
            settled: false,
            broken: Arc::clone(&self.broken),
            _gate: gate,
        }
    }

    /// A record of the open transaction failed for good: the transaction must abort.
    pub fn mark_broken(&self) {
        self.broken.store(true, Ordering::SeqCst);
    }

    /// The partition's tracker moved: every command below `next` is settled.
    pub fn settle(&self, topic: &str, partition: i32, next: i64) {
        let mut settled = lock(&self.settled);
        let entry = settled.entry((topic.to_owned(), partition)).or_insert(next);
        *entry = (*entry).max(next);
    }

    /// The first record this member got for a partition since it was assigned (or
    /// rewound): the restart point while nothing was committed for it.
    pub fn first_record(&self, topic: &str, partition: i32, offset: i64) {
        lock(&self.restart_at)
            .entry((topic.to_owned(), partition))
            .or_insert(offset);
    }

    /// The partitions left this member: nothing of theirs is restarted here.
    pub fn forget(&self, ids: &[PartitionId]) {
        let mut restart_at = lock(&self.restart_at);
        let mut settled = lock(&self.settled);
        for id in ids {
            restart_at.remove(id);
            settled.remove(id);
        }
        self.oversized.forget(ids);
    }

    /// Where to rewind each partition that had records, after an abort.
    pub fn restart_points(&self) -> Vec<(PartitionId, i64)> {
        lock(&self.restart_at)
            .iter()
            .map(|(id, offset)| (id.clone(), *offset))
            .collect()
    }

    /// Whether the open transaction should be committed now.
    pub fn due(&self) -> bool {
        let answers = self.answers.load(Ordering::SeqCst);
        answers >= self.max_records
            || ((answers > 0 || !lock(&self.settled).is_empty())
                && lock(&self.opened).elapsed() >= self.interval)
    }

    /// How long until the interval of the open transaction ends.
    pub fn until_due(&self) -> Duration {
        self.interval
            .saturating_sub(lock(&self.opened).elapsed())
            .max(Duration::from_millis(1))
    }

    /// Commits the open transaction with the settled offsets, fenced by `group`
    /// (the consumer's current generation), and opens the next one. Blocks: call it
    /// from the poll thread, never from the async runtime. On `Aborted` the
    /// transaction was rolled back and a new one is open, but the gate stays closed
    /// until the caller rewound its partitions and dropped the returned guard.
    pub fn commit(
        &self,
        group: Option<ConsumerGroupMetadata>,
    ) -> Result<Committed, (TransactionFailure, GateClosed<'_>)> {
        let closed = GateClosed {
            _gate: self.gate.blocking_write(),
        };
        let offsets: HashMap<PartitionId, i64> = lock(&self.settled).drain().collect();
        let answers = self.answers.load(Ordering::SeqCst);
        if answers == 0 && offsets.is_empty() {
            *lock(&self.opened) = Instant::now();
            return Ok(Committed::default());
        }
        match self.try_commit(&offsets, group) {
            Ok(()) => {
                let mut restart_at = lock(&self.restart_at);
                for (id, offset) in &offsets {
                    restart_at.insert(id.clone(), *offset);
                }
                drop(restart_at);
                self.oversized.committed(&offsets);
                self.reopen().map_err(|failure| (failure, closed))?;
                Ok(Committed {
                    answers,
                    partitions: offsets.len(),
                })
            }
            Err(failure) => {
                let failure = match failure {
                    TransactionFailure::Aborted(reason) => self.abort_and_reopen(reason),
                    fatal => fatal,
                };
                Err((failure, closed))
            }
        }
    }

    /// Rolls the open transaction back (a lost assignment, a zombie that woke up),
    /// and opens the next one; the caller rewinds, then drops the guard.
    pub fn abort(&self, reason: &str) -> (TransactionFailure, GateClosed<'_>) {
        let closed = GateClosed {
            _gate: self.gate.blocking_write(),
        };
        lock(&self.settled).clear();
        (self.abort_and_reopen(reason.to_owned()), closed)
    }

    fn try_commit(
        &self,
        offsets: &HashMap<PartitionId, i64>,
        group: Option<ConsumerGroupMetadata>,
    ) -> Result<(), TransactionFailure> {
        if self.broken.load(Ordering::SeqCst) {
            return Err(TransactionFailure::Aborted(
                "a record of the transaction was not delivered, or an answer in it was abandoned before it settled".to_owned(),
            ));
        }
        if let Some(((topic, partition), offset)) = uncovered(&lock(&self.answered), offsets) {
            return Err(TransactionFailure::Aborted(format!(
                "the answer to {topic}/{partition} at offset {offset} lies past the offset the transaction would commit"
            )));
        }
        if !offsets.is_empty() {
            let group = group.ok_or_else(|| {
                TransactionFailure::Aborted("the consumer has no group metadata".to_owned())
            })?;
            let mut list = TopicPartitionList::new();
            for ((topic, partition), offset) in offsets {
                list.add_partition_offset(topic, *partition, Offset::Offset(*offset))
                    .map_err(|e| TransactionFailure::Aborted(e.to_string()))?;
            }
            self.retrying(|p| p.send_offsets_to_transaction(&list, &group, self.call_timeout))?;
        }
        self.retrying(|p| p.commit_transaction(self.call_timeout))
    }

    /// Runs a transactional call again while librdkafka calls its error retriable.
    fn retrying(
        &self,
        call: impl Fn(&FutureProducer) -> Result<(), KafkaError>,
    ) -> Result<(), TransactionFailure> {
        let deadline = Instant::now() + self.call_timeout;
        loop {
            let error = match call(&self.producer) {
                Ok(()) => return Ok(()),
                Err(error) => error,
            };
            match &error {
                KafkaError::Transaction(e) if e.is_fatal() => {
                    return Err(TransactionFailure::Fatal(error.to_string()))
                }
                KafkaError::Transaction(e) if e.is_retriable() && Instant::now() < deadline => {
                    tracing::info!(%error, "transactional call failed; retrying");
                    std::thread::sleep(Duration::from_millis(100));
                }
                _ => return Err(TransactionFailure::Aborted(error.to_string())),
            }
        }
    }

    /// Only a transaction rolled back and a new one open lets the worker answer
    /// again, so failing either is fatal: a commit that timed out (the coordinator
    /// slower than `call_timeout`) waits in librdkafka to be resumed, and until then it
    /// refuses every abort as a conflict. Going on would rewind and redo the same
    /// commands forever, answering none, while the member kept its partitions and
    /// looked healthy. Ended, the worker leaves the group and its partitions move to
    /// members that can answer; nothing was committed, so they redo it all.
    fn abort_and_reopen(&self, reason: String) -> TransactionFailure {
        tracing::warn!(%reason, "aborting the Kafka transaction; its commands are redone");
        match self
            .retrying(|p| p.abort_transaction(self.call_timeout))
            .and_then(|()| self.reopen())
        {
            Ok(()) => TransactionFailure::Aborted(reason),
            Err(TransactionFailure::Aborted(error) | TransactionFailure::Fatal(error)) => {
                TransactionFailure::Fatal(format!(
                    "{reason}; the transaction could not then be rolled back and a new one opened: {error}"
                ))
            }
        }
    }

    /// Opens the next transaction. A producer that cannot open one cannot answer at
    /// all (every answer would be produced outside a transaction and refused), so
    /// any failure here is fatal.
    fn reopen(&self) -> Result<(), TransactionFailure> {
        self.answers.store(0, Ordering::SeqCst);
        lock(&self.answered).clear();
        self.broken.store(false, Ordering::SeqCst);
        *lock(&self.opened) = Instant::now();
        self.producer
            .begin_transaction()
            .map_err(|error| TransactionFailure::Fatal(format!("opening a transaction: {error}")))
    }
}

/// An answer of the transaction whose offset the transaction would not commit past:
/// committed, it would be visible while the next owner of its partition reads the
/// command again and answers it a second time.
fn uncovered<'a>(
    answered: &'a HashMap<PartitionId, i64>,
    offsets: &HashMap<PartitionId, i64>,
) -> Option<(&'a PartitionId, i64)> {
    answered
        .iter()
        .find(|(id, offset)| offsets.get(*id).is_none_or(|next| next <= offset))
        .map(|(id, offset)| (id, *offset))
}

/// What one commit carried.
#[derive(Debug, Default, Clone, Copy)]
pub struct Committed {
    pub answers: u64,
    pub partitions: usize,
}

/// No answer enters a transaction while this is held.
pub struct GateClosed<'a> {
    _gate: tokio::sync::RwLockWriteGuard<'a, ()>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pairs: &[(&str, &str)]) -> ClientConfig {
        let mut config = ClientConfig::new();
        for (key, value) in pairs {
            config.set(*key, *value);
        }
        fit_message_timeout(&mut config);
        config
    }

    /// Transactions over a transactional producer librdkafka never initialised:
    /// every transactional call fails at once, none of them as fatal.
    fn uninitialised() -> Transactions {
        let producer: FutureProducer = crate::worker::create_client(&config(&[
            ("bootstrap.servers", "127.0.0.1:9"),
            ("transactional.id", "never-initialised"),
        ]))
        .expect("a producer");
        Transactions::over(
            producer,
            Duration::from_secs(1),
            10,
            Duration::from_millis(300),
        )
    }

    #[test]
    fn a_transaction_that_cannot_be_rolled_back_and_reopened_ends_the_worker() {
        let transactions = uninitialised();
        // An abort librdkafka refuses (as it refuses every abort while a timed-out
        // commit waits to be resumed) must not read as "aborted, redo": nothing
        // could then be answered again.
        let (failure, closed) = transactions.abort("lost the assignment");
        drop(closed);
        match failure {
            TransactionFailure::Fatal(reason) => {
                assert!(reason.starts_with("lost the assignment; "), "{reason}")
            }
            other => panic!("expected Fatal, got {other:?}"),
        }
        // The same for a commit whose transaction is broken.
        transactions.broken.store(true, Ordering::SeqCst);
        transactions.answers.store(1, Ordering::SeqCst);
        let committed = transactions.commit(None);
        match committed {
            Err((TransactionFailure::Fatal(_), _closed)) => {}
            Err((other, _closed)) => panic!("expected Fatal, got {other:?}"),
            Ok(_) => panic!("a broken transaction committed"),
        }
    }

    #[test]
    fn an_interval_the_broker_would_cut_short_is_refused() {
        let default = config(&[]);
        assert!(check_interval(Duration::from_secs(59), &default).is_ok());
        let refused = check_interval(Duration::from_secs(60), &default)
            .expect_err("the default timeout is 60 s")
            .to_string();
        assert!(
            refused.contains("TRANSACTION_INTERVAL (1m)")
                && refused.contains("transaction.timeout.ms, 1m"),
            "{refused}"
        );
        let short = config(&[("transaction.timeout.ms", "5000")]);
        assert!(check_interval(Duration::from_millis(100), &short).is_ok());
        assert!(check_interval(Duration::from_secs(5), &short).is_err());
    }

    #[test]
    fn a_transaction_timeout_below_the_message_timeout_lowers_it() {
        let fitted = config(&[
            ("message.timeout.ms", "30000"),
            ("transaction.timeout.ms", "10000"),
        ]);
        assert_eq!(fitted.get("message.timeout.ms"), Some("10000"));
    }

    #[test]
    fn the_default_transaction_timeout_and_the_alias_count_too() {
        let fitted = config(&[("message.timeout.ms", "120000")]);
        assert_eq!(fitted.get("message.timeout.ms"), Some("60000"));
        let fitted = config(&[
            ("message.timeout.ms", "30000"),
            ("delivery.timeout.ms", "90000"),
            ("transaction.timeout.ms", "45000"),
        ]);
        assert_eq!(fitted.get("message.timeout.ms"), Some("45000"));
        assert_eq!(fitted.get("delivery.timeout.ms"), None);
    }

    #[test]
    fn a_message_timeout_within_the_transaction_timeout_stays() {
        let kept = config(&[
            ("message.timeout.ms", "30000"),
            ("transaction.timeout.ms", "60000"),
        ]);
        assert_eq!(kept.get("message.timeout.ms"), Some("30000"));
        let unset = config(&[("message.timeout.ms", "30000")]);
        assert_eq!(unset.get("message.timeout.ms"), Some("30000"));
    }
}
