//! Where a replay restarts each partition of the group: shared by the rewind
//! (`replay.rs`) and its dry run (`dry_run.rs`), so the dry run counts what the
//! workers will read after the rewind.

/// One partition of a replay: where the group restarts it, and how that compares
/// with where the group was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Restart {
    pub(super) start: i64,
    pub(super) movement: Movement,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Movement {
    /// Moved back to the target.
    Rewound,
    /// Already at the target.
    Stays,
    /// The group had not read as far as the target: left where it was.
    NotReadThatFar,
}

/// Where one partition of the group restarts: the target clamped to what the topic
/// holds, but never past where the group is (`committed`, or the low watermark when
/// it committed nothing): moving a partition forward would skip commands that were
/// never processed, with no charge, result or dead letter to show for them.
pub(super) fn restart_of(
    to_offset: Option<i64>,
    low: i64,
    high: i64,
    committed: Option<i64>,
) -> Restart {
    let target = to_offset.map_or(low, |o| o.clamp(low, high));
    let current = committed.unwrap_or(low).max(low);
    let movement = match target.cmp(&current) {
        std::cmp::Ordering::Less => Movement::Rewound,
        std::cmp::Ordering::Equal => Movement::Stays,
        std::cmp::Ordering::Greater => Movement::NotReadThatFar,
    };
    Restart {
        start: target.min(current),
        movement,
    }
}

#[cfg(test)]
mod tests {
    use super::{restart_of, Movement, Restart};

    fn restart(start: i64, movement: Movement) -> Restart {
        Restart { start, movement }
    }

    #[test]
    fn a_replay_moves_a_partition_back_never_forward() {
        // The group committed 300 of a partition holding 100..1200.
        let at_300 = |to| restart_of(to, 100, 1200, Some(300));
        assert_eq!(
            at_300(Some(1000)),
            restart(300, Movement::NotReadThatFar),
            "not read that far"
        );
        assert_eq!(at_300(Some(200)), restart(200, Movement::Rewound));
        assert_eq!(at_300(Some(300)), restart(300, Movement::Stays));
        assert_eq!(at_300(None), restart(100, Movement::Rewound));
        assert_eq!(at_300(Some(50)), restart(100, Movement::Rewound), "clamped");
        // Nothing committed: the group starts at the low watermark anyway.
        assert_eq!(
            restart_of(Some(1000), 100, 1200, None),
            restart(100, Movement::NotReadThatFar)
        );
        assert_eq!(
            restart_of(None, 100, 1200, None),
            restart(100, Movement::Stays)
        );
        // A committed offset the topic no longer holds reads from the low watermark.
        assert_eq!(
            restart_of(Some(1000), 100, 1200, Some(20)),
            restart(100, Movement::NotReadThatFar)
        );
    }
}
