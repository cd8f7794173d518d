//! Amounts in Stripe's unit for each currency. A command's `amount_minor` is in the
//! currency's ISO 4217 minor unit (cents; yen for JPY, which has none; fils, a
//! thousandth, for KWD). Stripe counts most currencies in hundredths, the
//! zero-decimal ones in whole units, ISK and UGX in hundredths that must end in 00,
//! and the three-decimal ones in thousandths that must end in 0. An amount Stripe
//! cannot express exactly is refused before anything is sent, never rounded.

/// ISO 4217 currencies without a minor unit.
const ISO_EXPONENT_0: &[&str] = &[
    "BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX", "VND", "VUV",
    "XAF", "XOF", "XPF",
];
/// ISO 4217 currencies with thousandths.
const ISO_EXPONENT_3: &[&str] = &["BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"];
/// Stripe's zero-decimal currencies: the amount is in whole units.
const STRIPE_ZERO_DECIMAL: &[&str] = &[
    "BIF", "CLP", "DJF", "GNF", "JPY", "KMF", "KRW", "MGA", "PYG", "RWF", "UGX", "VND", "VUV",
    "XAF", "XOF", "XPF",
];
/// Zero-decimal currencies Stripe takes with two decimals of 00 all the same.
const STRIPE_TWO_DECIMALS_OF_00: &[&str] = &["ISK", "UGX"];
/// Stripe's three-decimal currencies: thousandths whose last digit is 0.
const STRIPE_THREE_DECIMAL: &[&str] = &["BHD", "JOD", "KWD", "OMR", "TND"];

/// How Stripe writes one currency's amounts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct StripeUnit {
    /// Decimal places of Stripe's integer amount.
    exponent: u32,
    /// The amount must be a multiple of this in Stripe's unit.
    step: i64,
}

fn iso_exponent(currency: &str) -> u32 {
    if ISO_EXPONENT_0.contains(&currency) {
        0
    } else if ISO_EXPONENT_3.contains(&currency) {
        3
    } else {
        2
    }
}

/// Stripe's unit for `currency` (ISO upper case); `None` for a currency whose
/// Stripe unit is unknown (thousandths Stripe does not list).
fn stripe_unit(currency: &str) -> Option<StripeUnit> {
    if STRIPE_TWO_DECIMALS_OF_00.contains(&currency) {
        Some(StripeUnit {
            exponent: 2,
            step: 100,
        })
    } else if STRIPE_ZERO_DECIMAL.contains(&currency) {
        Some(StripeUnit {
            exponent: 0,
            step: 1,
        })
    } else if STRIPE_THREE_DECIMAL.contains(&currency) {
        Some(StripeUnit {
            exponent: 3,
            step: 10,
        })
    } else if iso_exponent(currency) == 3 {
        None
    } else {
        Some(StripeUnit {
            exponent: 2,
            step: 1,
        })
    }
}

/// `amount_minor` of `currency` in Stripe's unit; `Err` is the refusal,
/// `<reason code>: <explanation>`, for the command's `invalid` answer.
pub fn stripe_amount(amount_minor: i64, currency: &str) -> Result<i64, String> {
    let Some(unit) = stripe_unit(currency) else {
        return Err(format!(
            "currency_not_supported: Stripe has no amount rule for {currency}"
        ));
    };
    let iso = iso_exponent(currency);
    let amount = if unit.exponent >= iso {
        10i64
            .checked_pow(unit.exponent - iso)
            .and_then(|factor| amount_minor.checked_mul(factor))
    } else {
        let divisor = 10i64.pow(iso - unit.exponent);
        (amount_minor % divisor == 0).then_some(amount_minor / divisor)
    };
    match amount {
        Some(amount) if amount % unit.step == 0 => Ok(amount),
        _ => Err(format!(
            "amount_not_representable: Stripe charges {currency} in steps of {} of its \
             smallest unit; {amount_minor} minor units is not a whole number of them",
            unit_step_in_minor_units(unit, iso)
        )),
    }
}

/// The step of `unit`, said in the command's minor units (10 fils for KWD, 100
/// iraimbilanja for MGA).
fn unit_step_in_minor_units(unit: StripeUnit, iso: u32) -> i64 {
    if unit.exponent >= iso {
        (unit.step / 10i64.pow(unit.exponent - iso)).max(1)
    } else {
        unit.step * 10i64.pow(iso - unit.exponent)
    }
}

/// A Stripe `amount` of `currency` (any case) back in ISO minor units; `None`
/// when it is no whole number of them.
pub(super) fn minor_units(amount: i64, currency: &str) -> Option<i64> {
    let currency = currency.to_ascii_uppercase();
    let unit = stripe_unit(&currency)?;
    let iso = iso_exponent(&currency);
    if unit.exponent >= iso {
        let divisor = 10i64.pow(unit.exponent - iso);
        (amount % divisor == 0).then_some(amount / divisor)
    } else {
        amount.checked_mul(10i64.pow(iso - unit.exponent))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_currency_goes_to_stripe_in_its_unit() {
        // Two decimals: the same number.
        assert_eq!(stripe_amount(1999, "USD"), Ok(1999));
        // Zero-decimal: ISO has no minor unit either.
        assert_eq!(stripe_amount(500, "JPY"), Ok(500));
        // ISK and UGX: whole units sent with two decimals of 00.
        assert_eq!(stripe_amount(5, "ISK"), Ok(500));
        assert_eq!(stripe_amount(7, "UGX"), Ok(700));
        // MGA: ISO counts hundredths, Stripe whole ariary.
        assert_eq!(stripe_amount(1200, "MGA"), Ok(12));
        assert!(stripe_amount(1250, "MGA")
            .unwrap_err()
            .starts_with("amount_not_representable:"));
        // Three decimals: thousandths, the last digit 0.
        assert_eq!(stripe_amount(1230, "KWD"), Ok(1230));
        let refused = stripe_amount(1235, "KWD").unwrap_err();
        assert!(
            refused.starts_with("amount_not_representable:") && refused.contains("steps of 10"),
            "{refused}"
        );
        // Thousandths Stripe does not list.
        assert!(stripe_amount(1000, "IQD")
            .unwrap_err()
            .starts_with("currency_not_supported:"));
        assert!(stripe_amount(i64::MAX, "ISK").is_err());
    }

    #[test]
    fn stripe_amounts_come_back_in_minor_units() {
        for (minor, currency) in [
            (1999, "USD"),
            (500, "JPY"),
            (5, "ISK"),
            (1200, "MGA"),
            (1230, "KWD"),
        ] {
            let sent = stripe_amount(minor, currency).unwrap();
            assert_eq!(
                minor_units(sent, &currency.to_lowercase()),
                Some(minor),
                "{currency}"
            );
        }
        assert_eq!(minor_units(550, "isk"), None);
    }
}
