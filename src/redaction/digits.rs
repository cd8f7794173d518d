//! Decimal digits of every script: a card number written in fullwidth digits
//! (`４１１１…`), Arabic-Indic or mathematical bold ones is a card number to any
//! receiver that reads numbers the way Unicode defines them (Python's `int`,
//! Java's `Character.digit`, NFKC normalisation for the fullwidth and mathematical
//! forms), so the detector reads them as digits too.

/// The first code point (digit zero) of every run of ten decimal digits, general
/// category Nd, in Unicode 16.0: the 66 runs of Unicode 14.0 (the table Python 3.11's
/// `unicodedata` holds, from which this one was first generated), Kawi and Nag
/// Mundari of 15.0, and the eight runs 16.0 added (Garay, Myanmar Pao and Eastern Pwo
/// Karen, Sunuwar, Gurung Khema, Kirat Rai, outlined digits, Ol Onal). Every Nd
/// character of that version lies in one of these runs, zero to nine in order.
const ZEROS: [u32; 76] = [
    0x0030, 0x0660, 0x06F0, 0x07C0, 0x0966, 0x09E6, 0x0A66, 0x0AE6, 0x0B66, 0x0BE6, 0x0C66, 0x0CE6,
    0x0D66, 0x0DE6, 0x0E50, 0x0ED0, 0x0F20, 0x1040, 0x1090, 0x17E0, 0x1810, 0x1946, 0x19D0, 0x1A80,
    0x1A90, 0x1B50, 0x1BB0, 0x1C40, 0x1C50, 0xA620, 0xA8D0, 0xA900, 0xA9D0, 0xA9F0, 0xAA50, 0xABF0,
    0xFF10, 0x104A0, 0x10D30, 0x10D40, 0x11066, 0x110F0, 0x11136, 0x111D0, 0x112F0, 0x11450,
    0x114D0, 0x11650, 0x116C0, 0x116D0, 0x116DA, 0x11730, 0x118E0, 0x11950, 0x11BF0, 0x11C50,
    0x11D50, 0x11DA0, 0x11F50, 0x16130, 0x16A60, 0x16AC0, 0x16B50, 0x16D70, 0x1CCF0, 0x1D7CE,
    0x1D7D8, 0x1D7E2, 0x1D7EC, 0x1D7F6, 0x1E140, 0x1E2F0, 0x1E4F0, 0x1E5F1, 0x1E950, 0x1FBF0,
];

/// The value (0–9) of `c` when it is a decimal digit of any script.
pub(super) fn digit_value(c: char) -> Option<u8> {
    if c.is_ascii_digit() {
        return Some(c as u8 - b'0');
    }
    if c.is_ascii() {
        return None;
    }
    let code = u32::from(c);
    // The last run that starts at or before `c`; `c` is a digit when it lies
    // within that run's ten.
    let run = ZEROS.partition_point(|&zero| zero <= code).checked_sub(1)?;
    let offset = code - ZEROS[run];
    // `offset < 10`, so the cast keeps the value.
    (offset < 10).then_some(offset as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_of_every_script_read_as_their_value() {
        assert_eq!(digit_value('7'), Some(7));
        assert_eq!(digit_value('４'), Some(4), "fullwidth");
        assert_eq!(digit_value('٣'), Some(3), "Arabic-Indic");
        assert_eq!(digit_value('९'), Some(9), "Devanagari");
        assert_eq!(digit_value('\u{1D7CF}'), Some(1), "mathematical bold one");
        assert_eq!(digit_value('\u{1FBF9}'), Some(9), "segmented digit nine");
        assert_eq!(digit_value('\u{11F54}'), Some(4), "Kawi four (Unicode 15)");
        assert_eq!(
            digit_value('\u{1CCF1}'),
            Some(1),
            "outlined digit one (Unicode 16)"
        );
        assert_eq!(
            digit_value('\u{1E5FA}'),
            Some(9),
            "Ol Onal nine (Unicode 16)"
        );
        for other in ['a', ' ', '/', '½', 'Ⅻ', '²', '\u{FF1A}', '\u{065F}'] {
            assert_eq!(digit_value(other), None, "{other:?}");
        }
    }

    #[test]
    fn the_table_is_ordered_and_every_entry_starts_ten_numeric_characters() {
        assert!(ZEROS.windows(2).all(|pair| pair[0] + 10 <= pair[1]));
        for zero in ZEROS {
            for value in 0..10u8 {
                let c = char::from_u32(zero + u32::from(value)).expect("a character");
                assert!(c.is_numeric(), "{c:?}");
                assert_eq!(digit_value(c), Some(value), "{c:?}");
            }
            // Just past a run: not a digit, or the next run's zero.
            let after = char::from_u32(zero + 10).expect("a character");
            assert!(matches!(digit_value(after), None | Some(0)), "{after:?}");
        }
    }
}
