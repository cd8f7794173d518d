//! Card numbers (PANs) in one text: found and masked. What a text may also be read
//! as (another encoding, escapes) is `readings.rs`'s; the one detector over every
//! reading is `echo.rs`'s [`super::holds_card_number`].

// A card number: 13–19 digits passing the Luhn check, written either as one run of
// digits or in groups of any sizes joined by single separators (space, dash, dot,
// slash, underscore: "4111 1111 1111 1111", "41111111-11111111", "4-111111111111111",
// "4111.1111.1111.1111"), alone or inside a longer value ("card:4111111111111111").
// Each separator in any form a reader shows as one: any space (no-break, ideographic,
// a tab or a line break), any hyphen (the Unicode hyphens, the figure dash, the minus
// sign, the fullwidth hyphen-minus; not the en and em dashes of a range), the
// fullwidth and small dot, slash and underscore. Characters that show nothing (a soft
// hyphen, a zero-width space, a byte order mark) are passed over: "4111\u{200B}1111…"
// reads as one unbroken number. Digits of any script count (`digits.rs`). A number
// is made of whole groups: any run of consecutive groups is tried, so a card
// followed or preceded by more groups ("4111 1111 1111 1111 123") is still caught,
// but a single unbroken run longer than 19 digits is not a card (it is some other
// identifier, and one in ten of its 13-digit windows would pass Luhn by chance).

use std::borrow::Cow;
use std::ops::Range;

use super::digits::digit_value;

/// The digits a card number has, at least and at most.
const CARD_DIGITS: std::ops::RangeInclusive<usize> = 13..=19;

/// Whether `c` joins the digit groups of one written number: one of the five, in any
/// form a reader shows as one of them.
fn is_separator(c: char) -> bool {
    match c {
        ' ' | '-' | '.' | '/' | '_' => true,
        // A tab or a line break: as good a space as any to a reader.
        c if c.is_ascii() => c.is_ascii_whitespace(),
        c => c.is_whitespace() || is_dash(c) || is_wide_dot_slash_or_underscore(c),
    }
}

/// The hyphens (Unicode's Dash_Punctuation that join, not the en and em dashes,
/// bars and wave dashes that stand between two numbers in a range: "2026-01-18–
/// 2026-01-21" is two dates, and joined its digits pass Luhn one time in ten) and
/// the minus sign.
fn is_dash(c: char) -> bool {
    matches!(
        c,
        '\u{058A}' | '\u{05BE}' | '\u{1400}' | '\u{1806}' | '\u{2010}'
            ..='\u{2012}'
                | '\u{2212}'
                | '\u{2E17}'
                | '\u{2E1A}'
                | '\u{2E40}'
                | '\u{2E5D}'
                | '\u{FE63}'
                | '\u{FF0D}'
                | '\u{10EAD}'
    )
}

/// The other forms of dot, slash and underscore: fullwidth and small ones (NFKC folds
/// them to the ASCII three), the one-dot leader, the division and fraction slashes,
/// the low lines of vertical text. (Not the ideographic full stop: it ends a
/// sentence, it does not group digits.)
fn is_wide_dot_slash_or_underscore(c: char) -> bool {
    matches!(
        c,
        '\u{FF0E}'
            | '\u{FE52}'
            | '\u{2024}'
            | '\u{FF0F}'
            | '\u{2215}'
            | '\u{2044}'
            | '\u{FF3F}'
            | '\u{FE33}'
            | '\u{FE34}'
            | '\u{FE4D}'..='\u{FE4F}'
    )
}

/// Characters a reader does not see: Unicode's default-ignorable code points (the
/// soft hyphen, the combining grapheme joiner, the Hangul fillers, the Khmer
/// inherent vowels, the Mongolian selectors, zero-width spaces and joiners, the
/// direction marks and controls, the invisible operators, variation selectors, the
/// byte order mark, the halfwidth filler, the shorthand format controls, the musical
/// symbol format controls, the tags), the other format characters (the Arabic number
/// signs and end of ayah, the Syriac abbreviation mark, the Kaithi number signs, the
/// Egyptian hieroglyph format controls, the interlinear annotation marks), the
/// braille blank, and a carriage return ("\r\n" is one line break). Between two
/// digits they join, not separate. (Also what an identifier in a command may not
/// hold.)
pub(crate) fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\r' | '\u{00AD}'
            | '\u{034F}'
            | '\u{0600}'..='\u{0605}'
            | '\u{061C}'
            | '\u{06DD}'
            | '\u{070F}'
            | '\u{0890}'..='\u{0891}'
            | '\u{08E2}'
            | '\u{115F}'..='\u{1160}'
            | '\u{17B4}'..='\u{17B5}'
            | '\u{180B}'..='\u{180F}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}'
            | '\u{2800}'
            | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FEFF}'
            | '\u{FFA0}'
            | '\u{FFF0}'..='\u{FFFB}'
            | '\u{110BD}'
            | '\u{110CD}'
            | '\u{13430}'..='\u{1343F}'
            | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0000}'..='\u{E0FFF}'
    )
}

/// Luhn mod-10 check over digit values (0–9).
fn luhn_valid(digits: &[u8]) -> bool {
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &d)| {
            let d = u32::from(d);
            if i % 2 == 1 {
                let doubled = d * 2;
                if doubled > 9 {
                    doubled - 9
                } else {
                    doubled
                }
            } else {
                d
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

/// The digits of `text`, of any script. One pass and no allocation: fewer than a
/// card number needs is the exit every clean key, reference and header takes.
fn digit_count(text: &str) -> usize {
    let mut count = 0usize;
    for (at, byte) in text.bytes().enumerate() {
        if byte.is_ascii_digit() {
            count += 1;
        } else if !byte.is_ascii() {
            // From the first character outside ASCII on, digits of other scripts
            // count too (`at` starts a character: all before it were ASCII).
            count += text[at..]
                .chars()
                .filter(|&c| digit_value(c).is_some())
                .count();
            break;
        }
    }
    count
}

/// One stretch of digit groups joined by single separators; `groups` holds the end
/// offset of each group in `digits`.
struct DigitRun {
    digits: Vec<u8>,
    groups: Vec<usize>,
}

impl DigitRun {
    /// A run buffer for a text of `digits` digits: sized once, so that pushing the
    /// digits of its runs never reallocates.
    fn for_digits(digits: usize) -> Self {
        Self {
            digits: Vec::with_capacity(digits),
            groups: Vec::with_capacity(4),
        }
    }

    /// Whether some run of whole consecutive groups is a card number.
    fn looks_like_card(&self) -> bool {
        let starts = std::iter::once(0).chain(self.groups.iter().copied());
        for (first, start) in starts.enumerate().take(self.groups.len()) {
            for &end in &self.groups[first..] {
                let length = end - start;
                if length > *CARD_DIGITS.end() {
                    break;
                }
                if CARD_DIGITS.contains(&length) && luhn_valid(&self.digits[start..end]) {
                    return true;
                }
            }
        }
        false
    }

    fn close_group(&mut self) {
        if self.groups.last() != Some(&self.digits.len()) && !self.digits.is_empty() {
            self.groups.push(self.digits.len());
        }
    }

    fn clear(&mut self) {
        self.digits.clear();
        self.groups.clear();
    }
}

/// The byte ranges (first digit to last digit) of the runs of digit groups of
/// `text` that hold a card number, handed to `found` in order until it returns
/// `false`.
fn each_card_run(text: &str, mut found: impl FnMut(Range<usize>) -> bool) {
    let digits = digit_count(text);
    if digits < *CARD_DIGITS.start() {
        return;
    }
    let mut run = DigitRun::for_digits(digits);
    let mut span = 0..0;
    // Whether the character before was a separator that followed a digit.
    let mut after_separator = false;
    for (at, c) in text.char_indices() {
        if let Some(value) = digit_value(c) {
            if run.digits.is_empty() {
                span.start = at;
            }
            span.end = at + c.len_utf8();
            run.digits.push(value);
            after_separator = false;
            continue;
        }
        if is_invisible(c) {
            // Shown as nothing: neither ends a group nor joins two.
            continue;
        }
        run.close_group();
        if is_separator(c) && !run.digits.is_empty() && !after_separator {
            after_separator = true;
            continue;
        }
        // Anything else, or a second separator in a row, ends the run.
        if run.looks_like_card() && !found(span.clone()) {
            return;
        }
        run.clear();
        after_separator = false;
    }
    run.close_group();
    if run.looks_like_card() {
        found(span);
    }
}

/// The byte ranges of every run of digit groups of `text` that holds a card
/// number, in order ([`each_card_run`]).
fn card_runs(text: &str) -> Vec<Range<usize>> {
    let mut runs = Vec::new();
    each_card_run(text, |run| {
        runs.push(run);
        true
    });
    runs
}

/// Whether `text`, as written, holds a card number. Only this one reading of it:
/// the detector for whatever may leave the worker is
/// [`super::holds_card_number`], which reads it every way a receiver may.
pub(super) fn written_card_number(text: &str) -> bool {
    let mut any = false;
    each_card_run(text, |_| {
        any = true;
        false
    });
    any
}

/// `text` with the digits of every run that holds a card number replaced by `*`,
/// all but the last four of the run (separators kept): "4111 1111 1111 1111" →
/// "**** **** **** 1111". Masks the text as written; a number only another reading
/// shows (an escape, another encoding) is [`super::masked_for_echo`]'s.
pub fn mask_card_numbers(text: &str) -> Cow<'_, str> {
    let runs = card_runs(text);
    if runs.is_empty() {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    for run in runs {
        out.push_str(&text[copied..run.start]);
        let written = &text[run.clone()];
        let keep_from = written
            .chars()
            .filter(|&c| digit_value(c).is_some())
            .count()
            .saturating_sub(4);
        let mut seen = 0;
        for c in written.chars() {
            if digit_value(c).is_some() {
                if seen < keep_from {
                    out.push('*');
                } else {
                    out.push(c);
                }
                seen += 1;
            } else {
                out.push(c);
            }
        }
        copied = run.end;
    }
    out.push_str(&text[copied..]);
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each value masked as given.
    fn assert_masked(cases: &[(&str, &str)]) {
        for (value, masked) in cases {
            assert_eq!(mask_card_numbers(value), *masked, "{value:?}");
        }
    }

    /// Each value holding no card number: left as it is.
    fn assert_untouched(values: &[&str]) {
        for value in values {
            assert_eq!(mask_card_numbers(value), *value, "{value:?}");
        }
    }

    /// The card number need not start the digit run: groups before it (a quantity,
    /// an order line) are skipped, whole groups at a time.
    #[test]
    fn a_card_number_after_other_digit_groups_is_found() {
        for text in [
            "12 4111 1111 1111 1111",
            "7-4111-1111-1111-1111",
            "2026.12.4111111111111111",
        ] {
            assert!(
                crate::redaction::contains_card_number(text),
                "{text}: not found"
            );
        }
    }

    #[test]
    fn masking_keeps_the_last_four_digits_of_each_card_number_and_nothing_else() {
        assert_eq!(
            mask_card_numbers("paid with 4111-1111-1111-1111 ok"),
            "paid with ****-****-****-1111 ok"
        );
        assert_eq!(mask_card_numbers("4111111111111111"), "************1111");
        assert_eq!(
            mask_card_numbers("a 5555 5555 5555 4444 b 4012888888881881"),
            "a **** **** **** 4444 b ************1881"
        );
        // Not a card: fewer digits, or a Luhn failure.
        assert_eq!(
            mask_card_numbers("order 12345 of 2026"),
            "order 12345 of 2026"
        );
        assert_eq!(mask_card_numbers("4111111111111112"), "4111111111111112");
    }

    #[test]
    fn luhn_and_card_detection() {
        assert!(luhn_valid(&[
            4, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1
        ]));
        assert!(!luhn_valid(&[
            4, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2
        ]));
        assert!(written_card_number("4111111111111111"));
        assert!(written_card_number(
            "4111  1111 1111 1111 x 4111 1111 1111 1111"
        ));
        assert!(written_card_number("x-4111-1111-1111-1111-"));
        assert!(
            !written_card_number("4111  1111  1111  1111"),
            "double spaces break groups"
        );
        assert!(!written_card_number("411111111111"), "12 digits");
        assert!(!written_card_number("pm_card_visa"));
        assert!(!written_card_number("ord-2026-000123"));
        assert!(
            !written_card_number("41111111111111111111"),
            "one run of 20 digits is no card"
        );
    }

    #[test]
    fn any_grouping_by_any_of_the_five_separators_is_one_number() {
        assert_masked(&[
            ("41111111-11111111", "********-****1111"),
            ("4-111111111111111", "*-***********1111"),
            ("4111111111-111111", "**********-**1111"),
            ("4111.1111.1111.1111", "****.****.****.1111"),
            ("4111/1111/1111/1111", "****/****/****/1111"),
            ("4111_1111_1111_1111", "****_****_****_1111"),
            ("4111 1111-1111.1111", "**** ****-****.1111"),
            ("x 411-1111-1111-11111 y", "x ***-****-****-*1111 y"),
            ("pay-3782-822463-10005", "pay-****-******-*0005"),
            // A grouped order number is a card number when its digits are one.
            ("ord-20260115-00000008", "ord-********-****0008"),
            // More groups around it: the whole run is masked but its last four.
            ("4111-1111-1111-1111-7", "****-****-****-*111-7"),
            (
                "ref 1/2/3/4 amex 3782 822463 10005",
                "ref 1/2/3/4 amex **** ****** *0005",
            ),
        ]);
        assert_untouched(&[
            "4111--1111--1111--1111",
            "4111,1111,1111,1111",
            "4111:1111:1111:1111",
            "4111+1111+1111+1111",
            "4111-1111-1111-1112",
            "ord-2026-000123",
            "1234567890123",
        ]);
    }

    /// What a reader shows as a space, a dash, a dot, a slash or an underscore
    /// joins groups as they do; what it shows as nothing joins digits.
    #[test]
    fn every_form_of_the_five_separators_joins_groups_and_invisible_characters_join_digits() {
        assert_masked(&[
            (
                "４１１１－１１１１－１１１１－１１１１",
                "****－****－****－１１１１",
            ),
            (
                "４１１１　１１１１　１１１１　１１１１",
                "****　****　****　１１１１",
            ),
            (
                "4111\u{A0}1111\u{A0}1111\u{A0}1111",
                "****\u{A0}****\u{A0}****\u{A0}1111",
            ),
            (
                "4111\u{202F}1111\u{2009}1111\u{2007}1111",
                "****\u{202F}****\u{2009}****\u{2007}1111",
            ),
            (
                "4111\u{2010}1111\u{2012}1111\u{2212}1111",
                "****\u{2010}****\u{2012}****\u{2212}1111",
            ),
            ("4111\t1111\t1111\t1111", "****\t****\t****\t1111"),
            (
                "4111\r\n1111\r\n1111\r\n1111",
                "****\r\n****\r\n****\r\n1111",
            ),
            ("4111\n1111\n1111\n1111", "****\n****\n****\n1111"),
            ("4111．1111／1111＿1111", "****．****／****＿1111"),
            (
                "4111\u{AD}1111\u{AD}1111\u{AD}1111",
                "****\u{AD}****\u{AD}****\u{AD}1111",
            ),
            (
                "4111\u{200B}1111\u{2060}1111\u{FEFF}1111",
                "****\u{200B}****\u{2060}****\u{FEFF}1111",
            ),
            // An invisible character beside a separator is still one separator.
            ("4111-\u{200B}1111 1111 1111", "****-\u{200B}**** **** 1111"),
        ]);
        assert_untouched(&[
            // Two separators in a row, whatever their forms, end the number.
            "4111\u{A0}\u{A0}1111\u{A0}\u{A0}1111\u{A0}\u{A0}1111",
            "4111 \u{2010} 1111 \u{2010} 1111 \u{2010} 1111",
            // The dashes of a range do not join: two dates, not one number.
            "2026-01-18\u{2013}2026-01-21",
            "15.01.2026\u{2014}18.01.2026",
            "2026/01/18\u{301C}2026/01/21",
            // Commas and colons, fullwidth or not, are no separators.
            "4111，1111，1111，1111",
            "4111：1111：1111：1111",
            // An invisible character does not make 20 digits a card number.
            "4111111111\u{200B}1111111111",
        ]);
    }

    #[test]
    fn digits_of_other_scripts_are_digits() {
        assert_eq!(
            mask_card_numbers("card ４１１１ １１１１ １１１１ １１１１"),
            "card **** **** **** １１１１"
        );
        let arabic_indic: String = "4111111111111111"
            .chars()
            .map(|c| char::from_u32(0x0660 + u32::from(c as u8 - b'0')).expect("a digit"))
            .collect();
        assert!(written_card_number(&arabic_indic));
        assert_eq!(digit_count(&arabic_indic), 16);
        assert_eq!(digit_count("é 123456789012"), 12);
        assert_eq!(digit_count("é 1234567890123"), 13);
    }
}
