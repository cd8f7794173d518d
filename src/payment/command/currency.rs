//! ISO 4217: which codes a payment can be made in.

use super::InvalidCommand;

pub(super) fn validate_currency(currency: &str) -> Result<(), InvalidCommand> {
    let bytes = currency.as_bytes();
    if bytes.len() != 3 || !bytes.iter().all(u8::is_ascii_alphabetic) {
        return Err(InvalidCommand::InvalidCurrencyFormat);
    }
    if !bytes.iter().all(u8::is_ascii_uppercase) {
        return Err(InvalidCommand::CurrencyNotUpperCase {
            currency: currency.to_owned(),
        });
    }
    if ISO_4217_CURRENCIES.binary_search(&currency).is_ok() {
        return Ok(());
    }
    if ISO_4217_NOT_PAYABLE.binary_search(&currency).is_ok() {
        return Err(InvalidCommand::CurrencyNotPayable {
            currency: currency.to_owned(),
        });
    }
    Err(InvalidCommand::UnknownCurrency {
        currency: currency.to_owned(),
    })
}

// ---------------------------------------------------------------------------
// ISO 4217 list one (current codes), kept sorted for binary search. Withdrawn codes
// (HRK, SLL, ZWL, VEF, MRO, STD, BYR, LTL, LVL, …) are not in it; codes in a
// published transition period (ANG → XCG, BGN) are. Update with each ISO 4217
// amendment.

/// Currencies a payment can be made in.
const ISO_4217_CURRENCIES: &[&str] = &[
    "AED", "AFN", "ALL", "AMD", "ANG", "AOA", "ARS", "AUD", "AWG", "AZN", "BAM", "BBD", "BDT",
    "BGN", "BHD", "BIF", "BMD", "BND", "BOB", "BRL", "BSD", "BTN", "BWP", "BYN", "BZD", "CAD",
    "CDF", "CHF", "CLP", "CNY", "COP", "CRC", "CUC", "CUP", "CVE", "CZK", "DJF", "DKK", "DOP",
    "DZD", "EGP", "ERN", "ETB", "EUR", "FJD", "FKP", "GBP", "GEL", "GHS", "GIP", "GMD", "GNF",
    "GTQ", "GYD", "HKD", "HNL", "HTG", "HUF", "IDR", "ILS", "INR", "IQD", "IRR", "ISK", "JMD",
    "JOD", "JPY", "KES", "KGS", "KHR", "KMF", "KPW", "KRW", "KWD", "KYD", "KZT", "LAK", "LBP",
    "LKR", "LRD", "LSL", "LYD", "MAD", "MDL", "MGA", "MKD", "MMK", "MNT", "MOP", "MRU", "MUR",
    "MVR", "MWK", "MXN", "MYR", "MZN", "NAD", "NGN", "NIO", "NOK", "NPR", "NZD", "OMR", "PAB",
    "PEN", "PGK", "PHP", "PKR", "PLN", "PYG", "QAR", "RON", "RSD", "RUB", "RWF", "SAR", "SBD",
    "SCR", "SDG", "SEK", "SGD", "SHP", "SLE", "SOS", "SRD", "SSP", "STN", "SVC", "SYP", "SZL",
    "THB", "TJS", "TMT", "TND", "TOP", "TRY", "TTD", "TWD", "TZS", "UAH", "UGX", "USD", "UYU",
    "UZS", "VED", "VES", "VND", "VUV", "WST", "XAF", "XCD", "XCG", "XOF", "XPF", "YER", "ZAR",
    "ZMW", "ZWG",
];

/// Active list-one codes that are not money a customer pays in: funds (BOV, CHE,
/// CHW, CLF, COU, MXV, USN, UYI, UYW), precious metals, bond-market units, SDR,
/// SUCRE, ADB unit, the testing code XTS and "no currency" XXX.
const ISO_4217_NOT_PAYABLE: &[&str] = &[
    "BOV", "CHE", "CHW", "CLF", "COU", "MXV", "USN", "UYI", "UYW", "XAG", "XAU", "XBA", "XBB",
    "XBC", "XBD", "XDR", "XPD", "XPT", "XSU", "XTS", "XUA", "XXX",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn currency_tables_are_sorted_and_disjoint() {
        for table in [ISO_4217_CURRENCIES, ISO_4217_NOT_PAYABLE] {
            assert!(table.windows(2).all(|w| w[0] < w[1]), "table not sorted");
            assert!(table
                .iter()
                .all(|c| c.len() == 3 && c.bytes().all(|b| b.is_ascii_uppercase())));
        }
        for code in ISO_4217_NOT_PAYABLE {
            assert!(ISO_4217_CURRENCIES.binary_search(code).is_err(), "{code}");
        }
    }
}
