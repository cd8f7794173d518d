//! Properties of the text fields' rules, for every character of each class rather
//! than the examples of the table tests: a control character or a bidirectional
//! override is refused in every text field, at the position it was sent; a
//! character that shows as nothing is refused in the identifiers (`account_id`,
//! `payment_method`) and kept in free text (`description`, `reason`); anything else
//! is kept as sent; and no refusal quotes the value back.
//!
//! The classes are written here from the contract (docs/CONTRACT.md, "Messages"),
//! not taken from the parser's own predicates, so that a rule the parser drops or
//! widens fails here.

use proptest::prelude::*;
use serde_json::Value;

use super::{Command, InvalidCommand, TextProblem};

const CHARGE: &str = r#"{"idempotency_key":"ord-1","account_id":"acct","amount_minor":100,"currency":"USD","payment_method":"pm_card_visa","description":"d"}"#;
const REFUND: &str = r#"{"type":"refund","idempotency_key":"rf-1","payment_idempotency_key":"ord-1","amount_minor":50,"currency":"USD","reason":"r"}"#;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    AccountId,
    PaymentMethod,
    Description,
    Reason,
}

impl Field {
    const ALL: [Field; 4] = [
        Field::AccountId,
        Field::PaymentMethod,
        Field::Description,
        Field::Reason,
    ];

    fn name(self) -> &'static str {
        match self {
            Field::AccountId => "account_id",
            Field::PaymentMethod => "payment_method",
            Field::Description => "description",
            Field::Reason => "reason",
        }
    }

    /// An identifier has no look-alike twin; free text may hold joiners and marks.
    fn is_identifier(self) -> bool {
        matches!(self, Field::AccountId | Field::PaymentMethod)
    }

    /// The command with this field set to `value`, as a producer would encode it.
    fn command_with(self, value: &str) -> Vec<u8> {
        let base = match self {
            Field::Reason => REFUND,
            _ => CHARGE,
        };
        let Ok(Value::Object(mut map)) = serde_json::from_str::<Value>(base) else {
            unreachable!("the base commands are JSON objects");
        };
        map.insert(self.name().to_owned(), Value::String(value.to_owned()));
        serde_json::to_vec(&Value::Object(map)).unwrap_or_default()
    }

    /// The field's value in a parsed command.
    fn read(self, command: &Command) -> Option<&str> {
        match (self, command) {
            (Field::AccountId, Command::Charge(charge)) => Some(&charge.account_id),
            (Field::PaymentMethod, Command::Charge(charge)) => Some(charge.payment_method()),
            (Field::Description, Command::Charge(charge)) => charge.description.as_deref(),
            (Field::Reason, Command::Refund(refund)) => refund.reason.as_deref(),
            _ => None,
        }
    }

    /// What `error` refuses in this field, and where: `None` when it is not one
    /// of this field's character refusals.
    fn refusal(self, error: &InvalidCommand) -> Option<(Class, usize)> {
        let text = |problem: &TextProblem| match *problem {
            TextProblem::ControlCharacter { position } => Some((Class::Control, position)),
            TextProblem::InvisibleCharacter { position } => Some((Class::Invisible, position)),
            _ => None,
        };
        match (self, error) {
            (Field::AccountId, InvalidCommand::InvalidAccountId(problem))
            | (Field::PaymentMethod, InvalidCommand::InvalidPaymentMethod(problem)) => {
                text(problem)
            }
            (Field::Description, InvalidCommand::DescriptionControlCharacter { position })
            | (Field::Reason, InvalidCommand::ReasonControlCharacter { position }) => {
                Some((Class::Control, *position))
            }
            _ => None,
        }
    }
}

/// Which rule refused a character.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Control,
    Invisible,
}

fn field() -> impl Strategy<Value = Field> {
    proptest::sample::select(Field::ALL.to_vec())
}

/// C0, DEL, C1, and Unicode's bidirectional embeddings, overrides and isolates.
fn control_char() -> impl Strategy<Value = char> {
    prop_oneof![
        proptest::char::range('\u{0}', '\u{1F}'),
        Just('\u{7F}'),
        proptest::char::range('\u{80}', '\u{9F}'),
        proptest::char::range('\u{202A}', '\u{202E}'),
        proptest::char::range('\u{2066}', '\u{2069}'),
    ]
}

/// What shows as nothing (or only as a mark on its neighbours) and is not a control
/// character: Unicode's default-ignorable code points (the soft hyphen, the
/// combining grapheme joiner, the Hangul fillers, the Khmer inherent vowels, the
/// Mongolian selectors, zero-width spaces and joiners, the direction marks, the
/// invisible operators, variation selectors, the byte-order mark, the shorthand and
/// musical symbol format controls, the tags), the other format characters (the
/// Arabic number signs and end of ayah, the Syriac abbreviation mark, the Kaithi
/// number signs, the Egyptian hieroglyph format controls, the interlinear annotation
/// marks) and the braille blank.
fn invisible_char() -> impl Strategy<Value = char> {
    prop_oneof![
        Just('\u{00AD}'),
        Just('\u{034F}'),
        proptest::char::range('\u{0600}', '\u{0605}'),
        Just('\u{061C}'),
        Just('\u{06DD}'),
        Just('\u{070F}'),
        proptest::char::range('\u{0890}', '\u{0891}'),
        Just('\u{08E2}'),
        proptest::char::range('\u{115F}', '\u{1160}'),
        proptest::char::range('\u{17B4}', '\u{17B5}'),
        proptest::char::range('\u{180B}', '\u{180F}'),
        proptest::char::range('\u{200B}', '\u{200F}'),
        proptest::char::range('\u{2060}', '\u{2065}'),
        proptest::char::range('\u{206A}', '\u{206F}'),
        Just('\u{2800}'),
        Just('\u{3164}'),
        proptest::char::range('\u{FE00}', '\u{FE0F}'),
        Just('\u{FEFF}'),
        Just('\u{FFA0}'),
        proptest::char::range('\u{FFF0}', '\u{FFFB}'),
        Just('\u{110BD}'),
        Just('\u{110CD}'),
        proptest::char::range('\u{13430}', '\u{1343F}'),
        proptest::char::range('\u{1BCA0}', '\u{1BCA3}'),
        proptest::char::range('\u{1D173}', '\u{1D17A}'),
        proptest::char::range('\u{E0000}', '\u{E0FFF}'),
    ]
}

/// Letters of several scripts (no digit: a run of them could be a card number).
fn ordinary_char() -> impl Strategy<Value = char> {
    prop_oneof![
        proptest::char::range('a', 'z'),
        proptest::char::range('A', 'Z'),
        Just('_'),
        Just('-'),
        proptest::char::range('\u{C0}', '\u{D6}'),
        proptest::char::range('\u{3B1}', '\u{3C9}'),
        proptest::char::range('\u{430}', '\u{44F}'),
        proptest::char::range('\u{621}', '\u{63A}'),
        proptest::char::range('\u{4E00}', '\u{4FFF}'),
    ]
}

fn ordinary_text(max: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(ordinary_char(), 1..=max).prop_map(|c| c.into_iter().collect())
}

/// `before`, then `inserted`, then `after`.
fn spliced(before: &str, inserted: char, after: &str) -> String {
    let mut text = String::with_capacity(before.len() + 4 + after.len());
    text.push_str(before);
    text.push(inserted);
    text.push_str(after);
    text
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn a_control_character_is_refused_in_every_text_field_where_it_was_sent(
        field in field(),
        before in ordinary_text(20),
        bad in control_char(),
        after in ordinary_text(20),
    ) {
        let value = spliced(&before, bad, &after);
        match Command::parse(&field.command_with(&value)) {
            Ok(command) => prop_assert!(false, "{:?} accepted {:?}: {:?}", field, value, command),
            Err(error) => prop_assert_eq!(
                field.refusal(&error),
                Some((Class::Control, before.chars().count())),
                "{:?} {:?}: {}", field, value, error
            ),
        }
    }

    #[test]
    fn what_shows_as_nothing_is_refused_in_identifiers_and_kept_in_free_text(
        field in field(),
        before in ordinary_text(20),
        blank in invisible_char(),
        after in ordinary_text(20),
    ) {
        let value = spliced(&before, blank, &after);
        let parsed = Command::parse(&field.command_with(&value));
        if field.is_identifier() {
            match parsed {
                Ok(command) => prop_assert!(false, "{:?} accepted {:?}: {:?}", field, value, command),
                Err(error) => prop_assert_eq!(
                    field.refusal(&error),
                    Some((Class::Invisible, before.chars().count())),
                    "{:?} {:?}: {}", field, value, error
                ),
            }
        } else {
            match parsed {
                Ok(command) => prop_assert_eq!(field.read(&command), Some(value.as_str())),
                Err(error) => prop_assert!(false, "{:?} refused {:?}: {}", field, value, error),
            }
        }
    }

    #[test]
    fn ordinary_text_is_kept_as_sent(field in field(), value in ordinary_text(60)) {
        match Command::parse(&field.command_with(&value)) {
            Ok(command) => prop_assert_eq!(field.read(&command), Some(value.as_str())),
            Err(error) => prop_assert!(false, "{:?} refused {:?}: {}", field, value, error),
        }
    }

    #[test]
    fn any_text_is_kept_clean_or_refused_without_being_quoted(
        field in field(),
        tail in any::<String>(),
    ) {
        // The marker makes a quoted value recognisable in the refusal.
        let value = format!("Qz-marker-{tail}");
        match Command::parse(&field.command_with(&value)) {
            Ok(command) => {
                let kept = field.read(&command);
                prop_assert_eq!(kept, Some(value.as_str()));
                let shown = kept.unwrap_or_default();
                prop_assert!(!shown.chars().any(|c| c.is_control()
                    || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')),
                    "{:?} kept {:?}", field, shown);
            }
            Err(error) => prop_assert!(
                !error.to_string().contains("Qz-marker"),
                "{:?} quoted the value: {}", field, error
            ),
        }
    }
}
