//! A phase's answers: the results topic read on a thread of its own as the worker
//! writes it, and what the answers say (outcomes, throughput, latency).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use super::load::{now_ms, Position};
use super::report::{LatencySummary, PhaseReport};
use payment_worker::configuration::KafkaSettings;
use payment_worker::worker::{self, ResultRecord};

/// librdkafka's mock broker answers a fetch that finds no data only after the full
/// `fetch.wait.max.ms` (default 500), even when records arrive meanwhile; a real
/// broker answers as soon as they do. The bench's consumers wait at most this
/// long, so idle latency measures the worker rather than the mock.
pub const MOCK_FETCH_WAIT_MS: u32 = 5;
/// Results the local Kafka certainly keeps per partition: it drops the oldest
/// records beyond 5 MiB, about 14,000 results of ~360 bytes.
pub(super) const RESULTS_KEPT_PER_PARTITION: usize = 10_000;

/// One result as the bench's reader saw it.
#[derive(Debug, Clone)]
pub(super) struct Observation {
    pub(super) source: Position,
    /// The result record's CreateTime: when the worker produced it.
    pub(super) produced_ms: i64,
    /// When the reader received it.
    pub(super) seen_ms: i64,
    pub(super) outcome: String,
}

/// Reads a phase's results topic on its own thread, first result per command only.
pub(super) struct ResultsReader {
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicUsize>,
    thread: std::thread::JoinHandle<anyhow::Result<Vec<Observation>>>,
}

impl ResultsReader {
    pub(super) fn start(kafka: &KafkaSettings, partitions: i32) -> anyhow::Result<Self> {
        let mut config = worker::base_config(kafka);
        config
            .set("group.id", format!("{}-reader", kafka.group_id))
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false")
            .set("fetch.wait.max.ms", MOCK_FETCH_WAIT_MS.to_string());
        let consumer: BaseConsumer = config.create().context("creating the results reader")?;
        let mut list = TopicPartitionList::new();
        for p in 0..partitions {
            list.add_partition_offset(&kafka.results_topic, p, Offset::Beginning)?;
        }
        consumer.assign(&list)?;
        drop(list);
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (stop, answered) = (Arc::clone(&stop), Arc::clone(&answered));
            std::thread::Builder::new()
                .name("bench-results".into())
                .spawn(move || {
                    let mut seen: HashSet<Position> = HashSet::new();
                    let mut out = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let Some(polled) = consumer.poll(Duration::from_millis(50)) else {
                            continue;
                        };
                        let message = match polled {
                            Ok(message) => message,
                            Err(error) => {
                                tracing::warn!(%error, "reading results");
                                continue;
                            }
                        };
                        let seen_ms = now_ms();
                        let Some(result) = message
                            .payload()
                            .and_then(|p| serde_json::from_slice::<ResultRecord>(p).ok())
                        else {
                            tracing::warn!(offset = message.offset(), "unreadable result record");
                            continue;
                        };
                        let source = (result.source.partition, result.source.offset);
                        if seen.insert(source) {
                            out.push(Observation {
                                source,
                                produced_ms: message.timestamp().to_millis().unwrap_or(seen_ms),
                                seen_ms,
                                outcome: result.outcome,
                            });
                            answered.store(out.len(), Ordering::Relaxed);
                        }
                    }
                    drop(consumer);
                    Ok(out)
                })?
        };
        Ok(Self {
            stop,
            answered,
            thread,
        })
    }

    pub(super) fn answered(&self) -> usize {
        self.answered.load(Ordering::Relaxed)
    }

    pub(super) async fn finish(self) -> anyhow::Result<Vec<Observation>> {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread;
        tokio::task::spawn_blocking(move || thread.join())
            .await?
            .map_err(|_| anyhow::anyhow!("the results reader panicked"))?
    }
}

/// One line per answered command: where it was, when it was produced, when its
/// result was produced and when the reader saw it (Unix milliseconds).
pub(super) fn write_samples(
    path: &std::path::Path,
    sent: &HashMap<Position, i64>,
    observations: &[Observation],
) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    writeln!(out, "partition,offset,sent_ms,result_ms,seen_ms,outcome")?;
    for o in observations {
        let at = sent.get(&o.source).copied().unwrap_or(-1);
        writeln!(
            out,
            "{},{},{at},{},{},{}",
            o.source.0, o.source.1, o.produced_ms, o.seen_ms, o.outcome
        )?;
    }
    out.flush()?;
    Ok(())
}

pub(super) fn summarize(
    sent: &HashMap<Position, i64>,
    observations: &[Observation],
    measured_from: i64,
) -> PhaseReport {
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    let mut latency = Vec::with_capacity(observations.len());
    let mut observed = Vec::with_capacity(observations.len());
    for o in observations {
        *outcomes.entry(o.outcome.clone()).or_default() += 1;
        match sent.get(&o.source) {
            Some(&at) if at >= measured_from => {
                latency.push(o.produced_ms - at);
                observed.push(o.seen_ms - at);
            }
            Some(_) => {}
            None => *outcomes.entry("unknown_source".into()).or_default() += 1,
        }
    }
    let first = observations
        .iter()
        .map(|o| o.produced_ms)
        .min()
        .unwrap_or(0);
    let last = observations
        .iter()
        .map(|o| o.produced_ms)
        .max()
        .unwrap_or(0);
    let span_s = (last - first) as f64 / 1000.0;
    let answered = observations.len();
    PhaseReport {
        commands: sent.len(),
        answered,
        outcomes,
        payments_per_s: if span_s > 0.0 {
            (answered.saturating_sub(1)) as f64 / span_s
        } else {
            0.0
        },
        first_to_last_result_s: span_s,
        latency: LatencySummary::of(latency),
        observed_latency: LatencySummary::of(observed),
        ..PhaseReport::default()
    }
}
