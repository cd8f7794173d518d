//! Exactly-once mode: dead letters and results the brokers refused as too large,
//! remembered by the position of their command until a transaction commits past it,
//! so that the command's next answer starts from a form that fits (a smaller dead
//! letter; a result without the record key it echoes).
//!
//! In at-least-once mode the smaller form follows the refused one at once. In
//! exactly-once mode it cannot: a record the broker refuses leaves the open
//! transaction abortable, so the smaller form is refused too, the transaction
//! aborts, the member rewinds, and the same command is answered again. Without
//! this memory that answer would send the same refused record, and its partition
//! would never move on while the worker looked healthy. Each abort teaches one
//! refusal (the records after it fail with the transaction, not for their size), so
//! n oversized dead letters in one transaction cost n aborts; nothing is forgotten
//! before the commit that carries them, however many there are.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::payment::SourcePosition;

/// A partition of the commands topic.
type PartitionId = (String, i32);

/// How much of the original record a dead letter carries, largest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum LetterForm {
    /// The original key, value and headers, plus the dead-letter headers.
    Whole,
    /// The original key and headers: the value is dropped
    /// (`x-payload-dropped: message_too_large`).
    WithoutValue,
    /// The dead-letter headers alone (`x-original-dropped: key,headers`).
    Bare,
}

impl LetterForm {
    /// The next smaller form, if there is one.
    pub(super) fn smaller(self) -> Option<Self> {
        match self {
            Self::Whole => Some(Self::WithoutValue),
            Self::WithoutValue => Some(Self::Bare),
            Self::Bare => None,
        }
    }
}

/// The form each refused command's dead letter must start from, and the commands
/// whose result the broker refused with its key, until committed.
#[derive(Default)]
pub(super) struct Oversized {
    refused: Mutex<Vec<(SourcePosition, LetterForm)>>,
    /// A result is small but echoes the record key, which may be as large as the
    /// commands topic takes: refused keyed, it goes out unkeyed (with the key's hash).
    unkeyed_results: Mutex<Vec<SourcePosition>>,
}

impl Oversized {
    /// The form to try first for the dead letter of the command at `source`.
    pub(super) fn first_form(&self, source: &SourcePosition) -> LetterForm {
        self.lock()
            .iter()
            .find(|(at, _)| at == source)
            .map_or(LetterForm::Whole, |&(_, form)| form)
    }

    /// The dead letter of the command at `source` was refused; from now on it
    /// starts at `form` (never at a larger form than one remembered before).
    pub(super) fn remember(&self, source: &SourcePosition, form: LetterForm) {
        let mut refused = self.lock();
        match refused.iter_mut().find(|(at, _)| at == source) {
            Some((_, known)) => *known = (*known).max(form),
            None => refused.push((source.clone(), form)),
        }
    }

    /// Whether the result of the command at `source` goes out without its key.
    pub(super) fn result_unkeyed(&self, source: &SourcePosition) -> bool {
        lock(&self.unkeyed_results).contains(source)
    }

    /// The result of the command at `source` was refused with its key; from now on
    /// it goes out without.
    pub(super) fn remember_result_unkeyed(&self, source: &SourcePosition) {
        let mut unkeyed = lock(&self.unkeyed_results);
        if !unkeyed.contains(source) {
            unkeyed.push(source.clone());
        }
    }

    /// A transaction committed these partitions' offsets (the next offset to read):
    /// the commands before them are answered for good.
    pub(super) fn committed(&self, offsets: &HashMap<PartitionId, i64>) {
        let pending = |at: &SourcePosition| {
            offsets
                .iter()
                .find(|((topic, partition), _)| *topic == at.topic && *partition == at.partition)
                .is_none_or(|(_, next)| at.offset >= *next)
        };
        self.lock().retain(|(at, _)| pending(at));
        lock(&self.unkeyed_results).retain(pending);
    }

    /// These partitions went to other members.
    pub(super) fn forget(&self, ids: &[PartitionId]) {
        let kept = |at: &SourcePosition| {
            !ids.iter()
                .any(|(topic, partition)| *topic == at.topic && *partition == at.partition)
        };
        self.lock().retain(|(at, _)| kept(at));
        lock(&self.unkeyed_results).retain(kept);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(SourcePosition, LetterForm)>> {
        lock(&self.refused)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere while holding it leaves a list that is still whole.
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOPIC: &str = "payments.commands";

    fn at(partition: i32, offset: i64) -> SourcePosition {
        SourcePosition {
            topic: TOPIC.into(),
            partition,
            offset,
        }
    }

    #[test]
    fn a_command_never_refused_starts_whole() {
        let oversized = Oversized::default();
        oversized.remember(&at(0, 7), LetterForm::WithoutValue);
        assert_eq!(oversized.first_form(&at(0, 8)), LetterForm::Whole);
        assert_eq!(oversized.first_form(&at(1, 7)), LetterForm::Whole);
        assert_eq!(oversized.first_form(&at(0, 7)), LetterForm::WithoutValue);
    }

    #[test]
    fn a_remembered_form_only_shrinks() {
        let oversized = Oversized::default();
        oversized.remember(&at(0, 1), LetterForm::Bare);
        oversized.remember(&at(0, 1), LetterForm::WithoutValue);
        assert_eq!(oversized.first_form(&at(0, 1)), LetterForm::Bare);
        assert_eq!(LetterForm::Whole.smaller(), Some(LetterForm::WithoutValue));
        assert_eq!(LetterForm::WithoutValue.smaller(), Some(LetterForm::Bare));
        assert_eq!(LetterForm::Bare.smaller(), None);
    }

    #[test]
    fn a_result_refused_with_its_key_goes_unkeyed_until_a_commit_passes_it() {
        let oversized = Oversized::default();
        oversized.remember_result_unkeyed(&at(0, 5));
        oversized.remember_result_unkeyed(&at(1, 5));
        assert!(oversized.result_unkeyed(&at(0, 5)));
        assert!(!oversized.result_unkeyed(&at(0, 6)));
        assert_eq!(oversized.first_form(&at(0, 5)), LetterForm::Whole);
        oversized.committed(&HashMap::from([((TOPIC.to_owned(), 0), 5)]));
        assert!(oversized.result_unkeyed(&at(0, 5)), "not passed yet");
        oversized.committed(&HashMap::from([((TOPIC.to_owned(), 0), 6)]));
        assert!(!oversized.result_unkeyed(&at(0, 5)));
        assert!(oversized.result_unkeyed(&at(1, 5)));
        oversized.forget(&[(TOPIC.to_owned(), 1)]);
        assert!(!oversized.result_unkeyed(&at(1, 5)));
    }

    #[test]
    fn every_refusal_is_kept_until_a_commit_passes_it() {
        let oversized = Oversized::default();
        for offset in 0..5_000 {
            oversized.remember(&at(0, offset), LetterForm::WithoutValue);
        }
        oversized.remember(&at(1, 3), LetterForm::WithoutValue);
        assert_eq!(oversized.first_form(&at(0, 0)), LetterForm::WithoutValue);
        oversized.committed(&HashMap::from([((TOPIC.to_owned(), 0), 4_000)]));
        assert_eq!(oversized.first_form(&at(0, 3_999)), LetterForm::Whole);
        assert_eq!(
            oversized.first_form(&at(0, 4_000)),
            LetterForm::WithoutValue
        );
        assert_eq!(
            oversized.first_form(&at(1, 3)),
            LetterForm::WithoutValue,
            "another partition's commit passes nothing here"
        );
        oversized.forget(&[(TOPIC.to_owned(), 0)]);
        assert_eq!(oversized.first_form(&at(0, 4_000)), LetterForm::Whole);
        assert_eq!(oversized.first_form(&at(1, 3)), LetterForm::WithoutValue);
    }
}
