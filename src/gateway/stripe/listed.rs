//! What listings already covered of each lost create's window. A create whose
//! answer was lost is looked for by listing the PaymentIntents made around its
//! recorded time; a listing that found nothing there need not be repeated for the
//! part of the window that lay before Stripe's clock when it answered, since no
//! PaymentIntent can appear in the past. Only what is left (up to the window's
//! end, while that is still ahead) is listed again, and a window wholly covered
//! is answered "not found" without a request.
//!
//! A wrong "covered" could only leave an orphan (an unconfirmed PaymentIntent that
//! charges nothing, which `audit` lists), never a second charge: a PaymentIntent is
//! confirmed only once its id is recorded. Kept in memory, per process; forgetting
//! costs one listing.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// Lost creates remembered at most; past that the memory starts afresh.
const CAPACITY: usize = 10_000;

/// A window (Unix seconds, both ends included) and the last second of it that
/// listings have covered from its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Covered {
    window: (i64, i64),
    up_to: i64,
}

/// Per key and create attempt, what listings covered of its window.
#[derive(Debug, Default)]
pub(super) struct Listed {
    covered: Mutex<HashMap<(String, i32), Covered>>,
}

impl Listed {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<(String, i32), Covered>> {
        // Only inserts, removals and reads of whole entries: a poisoned map is whole.
        self.covered.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The part of `window` still to list for `key`'s create `attempt`; `None`
    /// when listings found nothing in all of it.
    pub fn left(&self, key: &str, attempt: i32, window: (i64, i64)) -> Option<(i64, i64)> {
        match self.map().get(&(key.to_owned(), attempt)) {
            Some(covered) if covered.window == window => {
                (covered.up_to < window.1).then(|| (window.0.max(covered.up_to + 1), window.1))
            }
            _ => Some(window),
        }
    }

    /// A listing of what [`Listed::left`] gave found nothing; Stripe answered it at
    /// `served_at`, so everything created before that second was in it.
    pub fn found_nothing(&self, key: &str, attempt: i32, window: (i64, i64), served_at: i64) {
        let up_to = (served_at - 1).min(window.1);
        let mut map = self.map();
        let entry = (key.to_owned(), attempt);
        let up_to = match map.get(&entry) {
            Some(covered) if covered.window == window => covered.up_to.max(up_to),
            _ => up_to,
        };
        if map.len() >= CAPACITY && !map.contains_key(&entry) {
            map.clear();
        }
        map.insert(entry, Covered { window, up_to });
    }

    /// The create was found (its id is recorded now): nothing to remember.
    pub fn found(&self, key: &str, attempt: i32) {
        self.map().remove(&(key.to_owned(), attempt));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_no_listing_covered_is_left() {
        let listed = Listed::default();
        let window = (1_000, 2_000);
        assert_eq!(
            listed.left("k", 1, window),
            Some(window),
            "nothing listed yet"
        );

        // Answered at 1500: everything up to 1499 is covered.
        listed.found_nothing("k", 1, window, 1_500);
        assert_eq!(listed.left("k", 1, window), Some((1_500, 2_000)));
        assert_eq!(listed.left("k", 2, window), Some(window), "per attempt");
        assert_eq!(listed.left("other", 1, window), Some(window), "per key");
        assert_eq!(
            listed.left("k", 1, (1_000, 2_100)),
            Some((1_000, 2_100)),
            "per window"
        );

        // A listing answered by a clock behind the last one covers no less.
        listed.found_nothing("k", 1, window, 1_200);
        assert_eq!(listed.left("k", 1, window), Some((1_500, 2_000)));

        // Answered after the window's end: all of it is covered, and stays so.
        listed.found_nothing("k", 1, window, 2_001);
        assert_eq!(listed.left("k", 1, window), None);
        listed.found_nothing("k", 1, window, 2_500);
        assert_eq!(listed.left("k", 1, window), None);

        // Found meanwhile (by another worker's listing, say): forgotten.
        listed.found("k", 1);
        assert_eq!(listed.left("k", 1, window), Some(window));
    }

    #[test]
    fn keys_are_remembered_side_by_side_until_the_capacity_is_reached() {
        let listed = Listed::default();
        let window = (1_000, 2_000);
        listed.found_nothing("k", 1, window, 2_001);
        listed.found_nothing("other", 1, window, 1_500);
        assert_eq!(
            listed.left("k", 1, window),
            None,
            "another key kept nothing out"
        );
        assert_eq!(listed.left("other", 1, window), Some((1_500, 2_000)));

        // Another window for the same attempt replaces the first, whatever it covered.
        listed.found_nothing("other", 1, (1_000, 2_100), 1_200);
        assert_eq!(
            listed.left("other", 1, (1_000, 2_100)),
            Some((1_200, 2_100))
        );

        // Full: the next new entry starts the memory afresh (forgetting costs only a
        // listing); an entry already there is updated without that.
        for n in 2..CAPACITY {
            listed.found_nothing(&format!("filler-{n}"), 1, window, 2_001);
        }
        listed.found_nothing("k", 1, window, 2_500);
        assert_eq!(listed.left("k", 1, window), None, "updated in place");
        listed.found_nothing("new", 1, window, 2_001);
        assert_eq!(listed.left("new", 1, window), None);
        assert_eq!(listed.left("k", 1, window), Some(window), "forgotten");
    }

    #[test]
    fn a_clock_before_the_window_covers_nothing_of_it() {
        let listed = Listed::default();
        let window = (1_000, 2_000);
        listed.found_nothing("k", 1, window, 900);
        assert_eq!(listed.left("k", 1, window), Some(window));
        // Covering up to the second before the answer, ending exactly at the end.
        listed.found_nothing("k", 1, window, 2_000);
        assert_eq!(listed.left("k", 1, window), Some((2_000, 2_000)));
    }
}
