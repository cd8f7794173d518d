//! Card numbers (PANs) in text: found and masked, wherever text may leave the
//! worker (dead letters, gateway error texts).

// Card numbers (PANs): 13–19 digits passing the Luhn check, written either as one
// run of digits or in groups separated by single spaces or dashes
// ("4111 1111 1111 1111", "4111-1111-1111-1111"), alone or inside a longer value
// ("card:4111111111111111"). Any run of consecutive groups is tried, so a PAN
// followed by more digits ("4111 1111 1111 1111 123") is still caught. A single
// unbroken run longer than 19 digits is not a PAN (it is some other identifier).

/// Luhn mod-10 check over ASCII digit values (0–9).
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

/// One stretch of digit groups; `groups` holds the end offset of each group in
/// `digits`.
#[derive(Default)]
struct DigitRun {
    digits: Vec<u8>,
    groups: Vec<usize>,
}

impl DigitRun {
    fn looks_like_card(&self) -> bool {
        let starts = std::iter::once(0).chain(self.groups.iter().copied());
        for (first, start) in starts.enumerate().take(self.groups.len()) {
            for &end in &self.groups[first..] {
                let length = end - start;
                if length > 19 {
                    break;
                }
                if length >= 13 && luhn_valid(&self.digits[start..end]) {
                    return true;
                }
            }
        }
        false
    }

    fn clear(&mut self) {
        self.digits.clear();
        self.groups.clear();
    }
}

/// Whether `value` holds a card-number-like run.
pub fn contains_card_number(value: &str) -> bool {
    !card_runs(value, 1).is_empty()
}

/// Whether `value` holds the 13 digits a card number needs at least. The cheap exit
/// of both scans: most references and keys hold far fewer.
fn too_few_digits(value: &str) -> bool {
    value.bytes().filter(u8::is_ascii_digit).count() < 13
}

/// The byte ranges (first digit to last digit) of up to `limit` card-number-like
/// runs of `value`, in order.
fn card_runs(value: &str, limit: usize) -> Vec<std::ops::Range<usize>> {
    let mut found = Vec::new();
    if too_few_digits(value) {
        return found;
    }
    let mut run = DigitRun::default();
    let mut span = 0..0;
    let mut after_separator = false;
    for (at, c) in value.char_indices() {
        if c.is_ascii_digit() {
            if run.digits.is_empty() {
                span.start = at;
            }
            span.end = at + 1;
            run.digits.push(c as u8 - b'0');
            after_separator = false;
            continue;
        }
        let is_separator = c == ' ' || c == '-';
        if !run.digits.is_empty() && !after_separator {
            // The group that just ended.
            run.groups.push(run.digits.len());
        }
        if is_separator && !run.digits.is_empty() && !after_separator {
            after_separator = true;
            continue;
        }
        if run.looks_like_card() {
            found.push(span.clone());
            if found.len() == limit {
                return found;
            }
        }
        run.clear();
        after_separator = false;
    }
    if !run.digits.is_empty() && !after_separator {
        run.groups.push(run.digits.len());
    }
    if run.looks_like_card() {
        found.push(span);
    }
    found
}

/// `value` with the digits of every card-number-like run replaced by `*`, all but
/// the last four (separators kept): "4111 1111 1111 1111" → "**** **** **** 1111".
/// Runs are found exactly as [`contains_card_number`] finds them.
pub fn mask_card_numbers(value: &str) -> std::borrow::Cow<'_, str> {
    mask_runs(value, card_runs(value, usize::MAX))
}

/// The digits a group of a written card number holds: cards print theirs in
/// groups of three to six (4-4-4-4, 4-4-4-4-3, 4-6-5, 4-6-4, 3-4-4-4-…).
const PRINTED_GROUP: std::ops::RangeInclusive<usize> = 3..=6;

/// `value` with the digits of every card number written as cards print them
/// masked like [`mask_card_numbers`] does: one unbroken run of 13–19 digits, or
/// groups of three to six digits separated by single dashes or spaces, 13–19
/// digits in all, passing Luhn.
///
/// The identifier rule: for idempotency keys, which a key holding such a number is
/// refused as (`card_number_as_key`), and which log lines and spans show masked by
/// it. The broad rule of [`mask_card_numbers`], any run of digit groups, would
/// refuse one "ord-20260115-00000008" in ten: an order, not a card, that operators
/// grep for.
pub fn mask_printed_card_numbers(value: &str) -> std::borrow::Cow<'_, str> {
    mask_runs(value, printed_card_runs(value))
}

/// Whether `value` holds a card number by the identifier rule of
/// [`mask_printed_card_numbers`].
pub fn contains_printed_card_number(value: &str) -> bool {
    !printed_card_runs(value).is_empty()
}

fn printed_card_runs(value: &str) -> Vec<std::ops::Range<usize>> {
    // Every key of every command comes here (its span, its log lines).
    if too_few_digits(value) {
        return Vec::new();
    }
    let bytes = value.as_bytes();
    let mut groups: Vec<std::ops::Range<usize>> = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at].is_ascii_digit() {
            let start = at;
            while at < bytes.len() && bytes[at].is_ascii_digit() {
                at += 1;
            }
            groups.push(start..at);
        } else {
            at += 1;
        }
    }
    let digits_of = |ranges: &[std::ops::Range<usize>]| -> Vec<u8> {
        ranges
            .iter()
            .flat_map(|r| bytes[r.clone()].iter().map(|b| b - b'0'))
            .collect()
    };
    let mut found = Vec::new();
    let mut next = 0;
    while next < groups.len() {
        let single = &groups[next..=next];
        if (13..=19).contains(&single[0].len()) && luhn_valid(&digits_of(single)) {
            found.push(single[0].clone());
            next += 1;
            continue;
        }
        // The longest run of joined printed groups from here that is a card.
        let mut end = next;
        while end < groups.len()
            && PRINTED_GROUP.contains(&groups[end].len())
            && (end == next || {
                let (before, this) = (&groups[end - 1], &groups[end]);
                this.start == before.end + 1 && matches!(bytes[before.end], b'-' | b' ')
            })
        {
            end += 1;
        }
        let printed = (next + 2..=end).rev().find_map(|last| {
            let window = &groups[next..last];
            let digits = digits_of(window);
            ((13..=19).contains(&digits.len()) && luhn_valid(&digits))
                .then(|| (window[0].start..window[window.len() - 1].end, window.len()))
        });
        match printed {
            Some((range, count)) => {
                found.push(range);
                next += count;
            }
            None => next += 1,
        }
    }
    found
}

/// `value` with the digits of each of `runs` (byte ranges, in order) masked, all
/// but the last four of each.
fn mask_runs(value: &str, runs: Vec<std::ops::Range<usize>>) -> std::borrow::Cow<'_, str> {
    if runs.is_empty() {
        return std::borrow::Cow::Borrowed(value);
    }
    let mut out = String::with_capacity(value.len());
    let mut copied = 0;
    for run in runs {
        out.push_str(&value[copied..run.start]);
        let text = &value[run.clone()];
        let keep_from = text
            .bytes()
            .filter(u8::is_ascii_digit)
            .count()
            .saturating_sub(4);
        let mut seen = 0;
        for c in text.chars() {
            if c.is_ascii_digit() {
                out.push(if seen < keep_from { '*' } else { c });
                seen += 1;
            } else {
                out.push(c);
            }
        }
        copied = run.end;
    }
    out.push_str(&value[copied..]);
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(contains_card_number("4111111111111111"));
        assert!(contains_card_number(
            "4111  1111 1111 1111 x 4111 1111 1111 1111"
        ));
        assert!(contains_card_number("x-4111-1111-1111-1111-"));
        assert!(
            !contains_card_number("4111  1111  1111  1111"),
            "double spaces break groups"
        );
        assert!(!contains_card_number("411111111111"), "12 digits");
        assert!(!contains_card_number("pm_card_visa"));
        assert!(!contains_card_number("ord-2026-000123"));
    }

    #[test]
    fn printed_card_numbers_are_masked_and_grouped_ids_are_not() {
        for (value, masked) in [
            ("4111111111111111", "************1111"),
            ("ord-4111111111111111", "ord-************1111"),
            ("4111-1111-1111-1111", "****-****-****-1111"),
            ("pay-3782-822463-10005", "pay-****-******-*0005"),
            ("4111-1111-1111-1111-7", "****-****-****-1111-7"),
            ("ord-20260115-00000008", "ord-20260115-00000008"),
            // Any printed grouping, not only the common ones.
            ("x 411-1111-1111-11111 y", "x ***-****-****-*1111 y"),
            ("5500 0000 0000 0004", "**** **** **** 0004"),
            ("4111-1111-1111-1112", "4111-1111-1111-1112"),
            ("ord-2026-000123", "ord-2026-000123"),
            ("1234567890123", "1234567890123"),
        ] {
            assert_eq!(mask_printed_card_numbers(value), masked, "{value}");
        }
        // Groups are joined across one dash or one space only: an underscore or a
        // doubled separator makes them separate identifiers.
        for value in ["4111_1111_1111_1111", "4111--1111--1111--1111"] {
            assert!(!contains_printed_card_number(value), "{value}");
        }
        // A printed card is found wherever it starts, after any number of groups.
        assert_eq!(
            mask_printed_card_numbers("ref 1/2/3/4 amex 3782 822463 10005"),
            "ref 1/2/3/4 amex **** ****** *0005"
        );
        // The broad rule, for payloads, masks the grouped id too.
        assert_eq!(
            mask_card_numbers("ord-20260115-00000008"),
            "ord-********-****0008"
        );
    }
}
