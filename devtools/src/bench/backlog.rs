//! The backlog phase's figures: how long draining took, how long each command waited
//! between being read and being answered, and how soon a duplicate waiting on
//! another attempt's lease was answered after that attempt settled.
//!
//! The worker does not say when it read a command, so the read time is derived from
//! the answers: a partition admits at most `max_in_flight` commands at once, in
//! offset order, so the command at offset `o` cannot have been read before the
//! partition's `o - max_in_flight + 1`-th answer (nor before the worker owned the
//! partition, nor before it was sent). Measuring from that earliest possible read
//! can only overstate a command's wait, never hide one.

use std::collections::HashMap;

use super::load::Position;
use super::report::{percentile, BacklogReport, LatencySummary};
use super::results::Observation;

/// Points of the read-to-answer distribution the picture draws (percentiles).
const CURVE: [f64; 14] = [
    0.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 98.0, 99.0, 99.5, 99.8, 99.9, 99.95, 100.0,
];

/// The figures of a backlog of `sent` commands answered as `observations`; `repeated`
/// lists the positions of every key sent more than once; the worker started at
/// `started_ms` and owned every partition at `owned_ms`.
pub(super) fn analyse(
    sent: &HashMap<Position, i64>,
    repeated: &[Vec<Position>],
    observations: &[Observation],
    started_ms: i64,
    owned_ms: i64,
    max_in_flight: usize,
) -> BacklogReport {
    let window = max_in_flight.max(1);
    let answered: HashMap<Position, (i64, &str)> = observations
        .iter()
        .map(|o| (o.source, (o.produced_ms, o.outcome.as_str())))
        .collect();
    let mut per_partition: HashMap<i32, Vec<i64>> = HashMap::new();
    for o in observations {
        per_partition
            .entry(o.source.0)
            .or_default()
            .push(o.produced_ms);
    }
    for times in per_partition.values_mut() {
        times.sort_unstable();
    }
    let read_at = |(partition, offset): Position| -> i64 {
        let sent_at = sent.get(&(partition, offset)).copied().unwrap_or(owned_ms);
        let freed = usize::try_from(offset)
            .ok()
            .and_then(|o| o.checked_sub(window))
            .and_then(|nth| per_partition.get(&partition)?.get(nth).copied())
            .unwrap_or(owned_ms);
        owned_ms.max(sent_at).max(freed)
    };
    let mut waits: Vec<i64> = Vec::with_capacity(observations.len());
    for o in observations {
        waits.push((o.produced_ms - read_at(o.source)).max(0));
    }
    waits.sort_unstable();
    let curve = CURVE
        .iter()
        .map(|&p| (p, percentile(&waits, p.max(0.001))))
        .collect();

    let mut duplicates = 0;
    let mut cross_partition = 0;
    let mut wakes = Vec::new();
    for positions in repeated {
        duplicates += positions.len().saturating_sub(1);
        // The holder: the position whose answer is not a duplicate (it charged).
        let Some(&holder) = positions
            .iter()
            .find(|p| answered.get(p).is_some_and(|(_, o)| *o != "duplicate"))
        else {
            continue;
        };
        let Some(&(settled_ms, _)) = answered.get(&holder) else {
            continue;
        };
        for &position in positions {
            if position == holder || position.0 == holder.0 {
                continue;
            }
            cross_partition += 1;
            let Some(&(answer_ms, _)) = answered.get(&position) else {
                continue;
            };
            if read_at(position) < settled_ms {
                wakes.push((answer_ms - settled_ms).max(0));
            }
        }
    }
    let last = observations
        .iter()
        .map(|o| o.produced_ms)
        .max()
        .unwrap_or(owned_ms);
    BacklogReport {
        commands: sent.len(),
        duplicates,
        cross_partition_duplicates: cross_partition,
        makespan_s: (last - owned_ms).max(0) as f64 / 1000.0,
        join_s: (owned_ms - started_ms).max(0) as f64 / 1000.0,
        read_to_answer: LatencySummary::of(waits),
        read_to_answer_curve: curve,
        duplicate_wake: LatencySummary::of(wakes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(partition: i32, offset: i64, at: i64, outcome: &str) -> Observation {
        Observation {
            source: (partition, offset),
            produced_ms: at,
            seen_ms: at,
            outcome: outcome.into(),
        }
    }

    #[test]
    fn a_command_is_read_no_earlier_than_a_slot_of_its_partition_frees() {
        // Window 2: offset 2 is read once the first answer of partition 0 is out.
        let sent: HashMap<Position, i64> = [((0, 0), 0), ((0, 1), 0), ((0, 2), 0), ((1, 0), 0)]
            .into_iter()
            .collect();
        let answers = [
            answer(0, 0, 1_020, "succeeded"),
            answer(0, 1, 1_030, "succeeded"),
            answer(0, 2, 1_100, "succeeded"),
            // A duplicate of (0, 1)'s key on partition 1, read at once, answered 15 ms
            // after the holder's answer.
            answer(1, 0, 1_045, "duplicate"),
        ];
        let report = analyse(&sent, &[vec![(0, 1), (1, 0)]], &answers, 500, 1_000, 2);
        assert_eq!(report.read_to_answer.max_ms, 80, "1100 - 1020");
        assert_eq!(report.read_to_answer.p50_ms, 30);
        assert!((report.makespan_s - 0.1).abs() < 1e-9);
        assert!((report.join_s - 0.5).abs() < 1e-9);
        assert_eq!(
            (report.duplicates, report.cross_partition_duplicates),
            (1, 1)
        );
        assert_eq!(report.duplicate_wake.samples, 1);
        assert_eq!(report.duplicate_wake.max_ms, 15);
        assert_eq!(report.read_to_answer_curve.last(), Some(&(100.0, 80)));
    }

    #[test]
    fn a_duplicate_read_after_the_settle_did_not_wait_for_it() {
        let sent: HashMap<Position, i64> = [((0, 0), 0), ((1, 0), 2_000)].into_iter().collect();
        let answers = [
            answer(0, 0, 1_020, "succeeded"),
            answer(1, 0, 2_010, "duplicate"),
        ];
        let report = analyse(&sent, &[vec![(0, 0), (1, 0)]], &answers, 1_000, 1_000, 32);
        assert_eq!(report.cross_partition_duplicates, 1);
        assert_eq!(report.duplicate_wake.samples, 0);
    }
}
