//! Gap-free offsets: a partition's committable offset is the lowest offset whose
//! command is not finished yet, or one past the highest seen when all are.

use std::collections::BTreeSet;

/// The offsets of one partition that are admitted and not yet finished; what may be committed follows from them.
#[derive(Debug, Default)]
pub struct OffsetTracker {
    pending: BTreeSet<i64>,
    next_after_seen: Option<i64>,
    stored: Option<i64>,
}

impl OffsetTracker {
    /// A record at `offset` was admitted.
    pub fn admit(&mut self, offset: i64) {
        self.pending.insert(offset);
        self.next_after_seen = Some(
            self.next_after_seen
                .map_or(offset + 1, |n| n.max(offset + 1)),
        );
    }

    /// The record at `offset` is finished.
    pub fn complete(&mut self, offset: i64) {
        self.pending.remove(&offset);
    }

    /// The offset to commit: every command below it is finished.
    pub fn committable(&self) -> Option<i64> {
        self.pending.first().copied().or(self.next_after_seen)
    }

    /// The committable offset if it moved since the last call that returned one.
    pub fn advance(&mut self) -> Option<i64> {
        let committable = self.committable()?;
        if self.stored.is_some_and(|s| s >= committable) {
            return None;
        }
        self.stored = Some(committable);
        Some(committable)
    }

    /// The last offset `advance` returned.
    pub fn stored(&self) -> Option<i64> {
        self.stored
    }

    /// Records admitted and not finished.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_passes_an_unfinished_offset() {
        let mut t = OffsetTracker::default();
        for o in 10..15 {
            t.admit(o);
        }
        assert_eq!(t.in_flight(), 5);
        assert_eq!(t.advance(), Some(10));
        t.complete(11);
        t.complete(12);
        assert_eq!(t.advance(), None, "10 is still running");
        t.complete(10);
        assert_eq!(t.advance(), Some(13));
        t.complete(14);
        assert_eq!(t.advance(), None);
        t.complete(13);
        assert_eq!(t.advance(), Some(15));
        assert_eq!(t.in_flight(), 0);
    }

    #[test]
    fn one_finished_offset_commits_the_next_one() {
        // Kafka commits the offset of the next record to read, never the last one read.
        let mut t = OffsetTracker::default();
        assert_eq!(t.advance(), None, "nothing seen, nothing to commit");
        t.admit(41);
        assert_eq!(t.in_flight(), 1);
        t.complete(41);
        assert_eq!(t.committable(), Some(42));
        assert_eq!(t.advance(), Some(42));
        assert_eq!(t.advance(), None, "already stored");
    }

    #[test]
    fn gaps_in_offsets_do_not_block() {
        // Compacted topics and transaction markers leave holes in the sequence.
        let mut t = OffsetTracker::default();
        t.admit(3);
        t.admit(7);
        t.complete(7);
        assert_eq!(t.advance(), Some(3));
        t.complete(3);
        assert_eq!(t.advance(), Some(8));
    }
}
