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

/// The byte ranges (first digit to last digit) of up to `limit` card-number-like
/// runs of `value`, in order.
fn card_runs(value: &str, limit: usize) -> Vec<std::ops::Range<usize>> {
    let mut found = Vec::new();
    // Cheap exit: most references hold far fewer than 13 digits.
    if value.bytes().filter(u8::is_ascii_digit).count() < 13 {
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
    let runs = card_runs(value, usize::MAX);
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
}
