//! Dead letters the brokers refused as too large, remembered by the position of
//! their command, so that the command's next answer starts from a form that fits.
//!
//! In at-least-once mode the smaller form follows the refused one at once. In
//! exactly-once mode it cannot: a record the broker refuses leaves the open
//! transaction abortable, so the smaller form is refused too, the transaction
//! aborts, the member rewinds, and the same command is answered again. Without
//! this memory that answer would send the same refused record, and its partition
//! would never move on while the worker looked healthy.

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::payment::SourcePosition;

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

/// Refusals remembered. An aborted transaction is redone right after its abort,
/// and one transaction holds at most a few hundred answers by default; older
/// refusals are forgotten first (their commands were answered long ago).
const REMEMBERED: usize = 1_024;

/// The form each refused command's dead letter must start from.
#[derive(Default)]
pub(super) struct Oversized {
    refused: Mutex<VecDeque<(SourcePosition, LetterForm)>>,
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
        if let Some((_, known)) = refused.iter_mut().find(|(at, _)| at == source) {
            *known = (*known).max(form);
            return;
        }
        if refused.len() == REMEMBERED {
            refused.pop_front();
        }
        refused.push_back((source.clone(), form));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(SourcePosition, LetterForm)>> {
        // A panic elsewhere while holding it leaves a list that is still whole.
        self.refused.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(partition: i32, offset: i64) -> SourcePosition {
        SourcePosition {
            topic: "payments.commands".into(),
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
    fn the_oldest_refusal_is_forgotten_first() {
        let oversized = Oversized::default();
        for offset in 0..=REMEMBERED as i64 {
            oversized.remember(&at(0, offset), LetterForm::WithoutValue);
        }
        assert_eq!(oversized.first_form(&at(0, 0)), LetterForm::Whole);
        assert_eq!(oversized.first_form(&at(0, 1)), LetterForm::WithoutValue);
        assert_eq!(
            oversized.first_form(&at(0, REMEMBERED as i64)),
            LetterForm::WithoutValue
        );
    }
}
