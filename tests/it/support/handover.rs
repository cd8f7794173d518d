//! Who answered a command position twice, and why: every partition's ownership
//! periods read from the workers' JSON logs (its first record, with the member id and
//! generation; its revoke; the offset the drain reached), and each hand-over from one
//! owner to the next compared. A new owner starts at the offset the group had
//! committed when it fetched (librdkafka's OffsetFetch at the assignment), so:
//! - it started before the old owner's revoke: two owners at once;
//! - it started after the revoke, below the offset the old owner's drain committed:
//!   the broker served an older committed offset than the one acknowledged.
//!
//! Printed lines start with `hand-over ` (scripts/interop-tansu collects them).

use std::collections::{BTreeMap, HashSet};

use chrono::{DateTime, FixedOffset};
use payment_worker::worker::ResultRecord;

use crate::support::books::by_position;

type Time = DateTime<FixedOffset>;

/// One member's stretch of ownership of one partition.
#[derive(Debug, Clone)]
struct Period {
    worker: String,
    member: String,
    generation: i64,
    first_offset: i64,
    first_at: Time,
    /// The revoke (or shutdown drain) that ended it, if one was logged (none: killed,
    /// or still held when the run ended).
    revoked_at: Option<Time>,
    revoke_generation: Option<i64>,
    lost: bool,
    /// The offset its drain reached (next to process), when logged.
    reached: Option<i64>,
}

fn fields(line: &str) -> Option<(Time, serde_json::Value)> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    let at = DateTime::parse_from_rfc3339(value.get("timestamp")?.as_str()?).ok()?;
    Some((at, value.get("fields")?.clone()))
}

fn numbers(list: &str) -> impl Iterator<Item = &str> {
    list.split(',').filter(|s| !s.is_empty())
}

/// Every ownership period in one worker's log.
fn periods_of(worker: &str, lines: &[String]) -> Vec<(i32, Period)> {
    let mut open: BTreeMap<i32, Period> = BTreeMap::new();
    let mut closed = Vec::new();
    // Periods revoked but whose drain outcome is not logged yet.
    let mut draining: Vec<(i32, Period)> = Vec::new();
    for (at, f) in lines.iter().filter_map(|l| fields(l)) {
        let text = |k: &str| f.get(k).and_then(|v| v.as_str()).unwrap_or_default();
        let number = |k: &str| f.get(k).and_then(|v| v.as_i64());
        match text("message") {
            "first record of the partition" => {
                let (Some(partition), Some(offset)) = (number("partition"), number("offset"))
                else {
                    continue;
                };
                open.insert(
                    partition as i32,
                    Period {
                        worker: worker.to_owned(),
                        member: text("member_id").to_owned(),
                        generation: number("generation").unwrap_or(-1),
                        first_offset: offset,
                        first_at: at,
                        revoked_at: None,
                        revoke_generation: None,
                        lost: false,
                        reached: None,
                    },
                );
            }
            "revoked; draining" => {
                closed.append(&mut draining);
                for p in numbers(text("partition_ids")).filter_map(|p| p.parse::<i32>().ok()) {
                    if let Some(mut period) = open.remove(&p) {
                        period.revoked_at = Some(at);
                        period.revoke_generation = number("generation");
                        period.lost = f.get("lost").and_then(|v| v.as_bool()) == Some(true);
                        draining.push((p, period));
                    }
                }
            }
            message if message.starts_with("drained") || message.contains("after the drain") => {
                let reached = text("reached");
                for pair in numbers(reached) {
                    let Some((p, o)) = pair.split_once(':') else {
                        continue;
                    };
                    let (Ok(p), Ok(o)) = (p.parse::<i32>(), o.parse::<i64>()) else {
                        continue;
                    };
                    if let Some((_, period)) = draining.iter_mut().find(|(q, _)| *q == p) {
                        period.reached = Some(o);
                    } else if let Some(mut period) = open.remove(&p) {
                        // The shutdown drain: no revoke line before it.
                        period.revoked_at = Some(at);
                        period.reached = Some(o);
                        closed.push((p, period));
                    }
                }
                closed.append(&mut draining);
            }
            _ => {}
        }
    }
    closed.append(&mut draining);
    closed.extend(open);
    closed
}

/// Prints, for every hand-over of a partition that repeated positions, the two
/// owners, their generations, the offsets and the timing; then how many repeated
/// positions no hand-over explains. `logs` are (worker name, log lines).
pub(crate) fn report(results: &[ResultRecord], logs: &[(String, Vec<String>)]) {
    let repeated: HashSet<(i32, i64)> = by_position(results)
        .into_iter()
        .filter(|(_, answers)| answers.len() > 1)
        .map(|(position, _)| position)
        .collect();
    if repeated.is_empty() {
        return;
    }
    let mut by_partition: BTreeMap<i32, Vec<Period>> = BTreeMap::new();
    for (worker, lines) in logs {
        for (p, period) in periods_of(worker, lines) {
            by_partition.entry(p).or_default().push(period);
        }
    }
    let mut explained: HashSet<(i32, i64)> = HashSet::new();
    let time = |t: &Time| t.format("%H:%M:%S%.3f").to_string();
    for (partition, periods) in &mut by_partition {
        periods.sort_by_key(|p| p.first_at);
        for pair in periods.windows(2) {
            let (old, new) = (&pair[0], &pair[1]);
            // Positions both owners were given: from where the new one started to
            // where the old one got (its drain, or its last first-record if unknown).
            let both: Vec<i64> = repeated
                .iter()
                .filter(|(p, o)| {
                    *p == *partition
                        && *o >= new.first_offset
                        && *o >= old.first_offset
                        && old.reached.is_none_or(|r| *o < r)
                })
                .map(|(_, o)| *o)
                .collect();
            if both.is_empty() {
                continue;
            }
            explained.extend(both.iter().map(|o| (*partition, *o)));
            let timing = match old.revoked_at {
                Some(revoked) if new.first_at < revoked => format!(
                    "two owners at once: the new owner's first record came {:.1}s before the old owner's revoke",
                    (revoked - new.first_at).num_milliseconds() as f64 / 1000.0
                ),
                Some(revoked) => format!(
                    "the new owner started {:.1}s after the old owner's revoke, below the offset that revoke's drain reached",
                    (new.first_at - revoked).num_milliseconds() as f64 / 1000.0
                ),
                None => "two owners at once: the old owner never gave the partition up \
                         (no revoke in its log: it still held it when the run ended, or it \
                         was killed)"
                    .to_owned(),
            };
            eprintln!(
                "hand-over p{partition}: {} (member {}, gen {} at its first record, gen {} at revoke{}, \
                 from offset {} at {}, revoked {}, drain reached {}) -> {} (member {}, gen {}, \
                 first record offset {} at {}): {} positions answered by both ({}..={}); {timing}",
                old.worker,
                old.member,
                old.generation,
                old.revoke_generation.map_or("-".into(), |g| g.to_string()),
                if old.lost { ", lost" } else { "" },
                old.first_offset,
                time(&old.first_at),
                old.revoked_at.as_ref().map_or("-".into(), time),
                old.reached.map_or("-".into(), |r| r.to_string()),
                new.worker,
                new.member,
                new.generation,
                new.first_offset,
                time(&new.first_at),
                both.len(),
                both.iter().min().unwrap_or(&0),
                both.iter().max().unwrap_or(&0),
            );
        }
    }
    // What no hand-over explains: each such position with the ownership periods of
    // its partition, so the log shows who could have answered it.
    let mut unexplained: Vec<&(i32, i64)> = repeated.difference(&explained).collect();
    unexplained.sort();
    for (partition, offset) in unexplained.iter().take(20) {
        let owners: Vec<String> = by_partition
            .get(partition)
            .into_iter()
            .flatten()
            .map(|p| {
                format!(
                    "{} gen {} from {} at {} revoked {}{} reached {}",
                    p.worker,
                    p.generation,
                    p.first_offset,
                    time(&p.first_at),
                    p.revoked_at.as_ref().map_or("-".into(), time),
                    if p.lost { " (lost)" } else { "" },
                    p.reached.map_or("-".into(), |r| r.to_string()),
                )
            })
            .collect();
        eprintln!(
            "hand-over unexplained p{partition}@{offset}: periods [{}]",
            owners.join("; ")
        );
    }
    eprintln!(
        "hand-over summary: {} repeated positions, {} within a hand-over above, {} unexplained",
        repeated.len(),
        explained.len(),
        repeated.len() - explained.len()
    );
}
