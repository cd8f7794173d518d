//! The corpus of bad input: each case's record (key, value, headers) and the verdict
//! it must get.

use serde_json::{json, Value};

/// Limit given to the test producer and to the worker: the librdkafka default
/// (1,000,000 bytes) is below the 1 MiB record of the corpus.
pub(crate) const MAX_MESSAGE_BYTES: &str = "4194304";

#[derive(Debug, Clone)]
pub(crate) enum Expect {
    /// Dead-lettered with this `x-error-kind` and an `x-error-reason` starting with `code:`.
    Dead {
        kind: &'static str,
        code: &'static str,
    },
    /// Processed normally with this result outcome.
    Outcome(&'static str),
}

pub(crate) struct Case {
    pub(crate) name: String,
    pub(crate) key: Option<Vec<u8>>,
    pub(crate) value: Option<Vec<u8>>,
    pub(crate) headers: Vec<(&'static str, Vec<u8>)>,
    pub(crate) expect: Expect,
}

pub(crate) fn command(key: &str) -> serde_json::Map<String, Value> {
    let Value::Object(map) = json!({
        "idempotency_key": key, "account_id": "acct_corpus", "amount_minor": 1999,
        "currency": "EUR", "payment_method": "pm_card_visa", "description": "corpus",
    }) else {
        unreachable!()
    };
    map
}

/// A command for `key` with `field` replaced by the raw JSON text `raw` (or removed).
pub(crate) fn with_raw(key: &str, field: &str, raw: Option<&str>) -> Vec<u8> {
    let mut map = command(key);
    map.remove(field);
    let mut text = serde_json::to_string(&Value::Object(map)).unwrap();
    if let Some(raw) = raw {
        text.pop();
        text.push_str(&format!(",\"{field}\":{raw}}}"));
    }
    text.into_bytes()
}

/// `text` (UTF-8) written as UTF-16.
fn utf16(text: &[u8], big_endian: bool) -> Vec<u8> {
    String::from_utf8_lossy(text)
        .encode_utf16()
        .flat_map(|unit| {
            if big_endian {
                unit.to_be_bytes()
            } else {
                unit.to_le_bytes()
            }
        })
        .collect()
}

pub(crate) fn dead(kind: &'static str, code: &'static str) -> Expect {
    Expect::Dead { kind, code }
}

pub(crate) fn invalid(code: &'static str) -> Expect {
    dead("invalid", code)
}

pub(crate) struct Corpus {
    pub(crate) cases: Vec<Case>,
}

impl Corpus {
    pub(crate) fn raw(
        &mut self,
        name: &str,
        key: Option<&[u8]>,
        value: Option<Vec<u8>>,
        expect: Expect,
    ) {
        self.cases.push(Case {
            name: name.to_owned(),
            key: key.map(<[u8]>::to_vec),
            value,
            headers: vec![],
            expect,
        });
    }

    /// A record keyed `c-<n>` whose value is `value`.
    pub(crate) fn keyed(&mut self, name: &str, value: Vec<u8>, expect: Expect) {
        let key = format!("c-{}", self.cases.len());
        self.raw(name, Some(key.as_bytes()), Some(value), expect);
    }

    /// A command keyed `c-<n>` with one field replaced by raw JSON (None: removed).
    pub(crate) fn field(&mut self, name: &str, field: &str, raw: Option<&str>, expect: Expect) {
        let key = format!("c-{}", self.cases.len());
        let value = with_raw(&key, field, raw);
        self.raw(name, Some(key.as_bytes()), Some(value), expect);
    }

    /// A command whose `idempotency_key` field (and record key) is `raw_key`.
    pub(crate) fn with_key(&mut self, name: &str, raw_key: &str) {
        let value = with_raw(
            "x",
            "idempotency_key",
            Some(&serde_json::to_string(raw_key).unwrap()),
        );
        self.raw(
            name,
            Some(raw_key.as_bytes()),
            Some(value),
            invalid("invalid_idempotency_key"),
        );
    }
}

pub(crate) fn corpus() -> Vec<Case> {
    let mut c = Corpus { cases: vec![] };
    // Not JSON, or not an object.
    c.keyed(
        "invalid utf-8",
        vec![0xff, 0xfe, 0x00, 0x7b],
        invalid("not_utf8"),
    );
    let mut bad_inside = with_raw("c-1", "account_id", Some("\"acct\""));
    let at = bad_inside.len() - 3;
    bad_inside.insert(at, 0xc3);
    c.keyed(
        "invalid utf-8 inside a string",
        bad_inside,
        invalid("not_utf8"),
    );
    c.keyed(
        "truncated json",
        br#"{"idempotency_key": "c-2", "account_id": "acct", "amo"#.to_vec(),
        invalid("malformed_json"),
    );
    c.keyed(
        "trailing garbage",
        [with_raw("c-3", "x", None), b"}".to_vec()].concat(),
        invalid("malformed_json"),
    );
    c.keyed(
        "json array",
        br#"[{"idempotency_key":"c-4"}]"#.to_vec(),
        invalid("not_an_object"),
    );
    c.keyed("json number", b"42".to_vec(), invalid("not_an_object"));
    c.keyed("json null", b"null".to_vec(), invalid("not_an_object"));
    c.keyed(
        "json string",
        br#""c-7""#.to_vec(),
        invalid("not_an_object"),
    );
    c.keyed("json boolean", b"true".to_vec(), invalid("not_an_object"));
    c.keyed("empty value", vec![], invalid("empty_payload"));
    c.keyed(
        "whitespace value",
        b" \n\t ".to_vec(),
        invalid("empty_payload"),
    );
    c.raw(
        "tombstone (null value)",
        Some(b"c-11".as_slice()),
        None,
        invalid("empty_payload"),
    );
    // Missing, null and mistyped fields.
    for field in [
        "idempotency_key",
        "account_id",
        "amount_minor",
        "currency",
        "payment_method",
    ] {
        c.field(
            &format!("missing {field}"),
            field,
            None,
            invalid("missing_field"),
        );
        c.field(
            &format!("null {field}"),
            field,
            Some("null"),
            invalid("null_field"),
        );
    }
    c.field(
        "numeric idempotency_key",
        "idempotency_key",
        Some("12345"),
        invalid("wrong_type"),
    );
    c.field(
        "object account_id",
        "account_id",
        Some("{\"id\":1}"),
        invalid("wrong_type"),
    );
    c.field(
        "amount as string",
        "amount_minor",
        Some("\"1999\""),
        invalid("wrong_type"),
    );
    c.field(
        "amount as bool",
        "amount_minor",
        Some("true"),
        invalid("wrong_type"),
    );
    c.field(
        "currency as number",
        "currency",
        Some("978"),
        invalid("wrong_type"),
    );
    c.field(
        "payment method as number",
        "payment_method",
        Some("4111111111111111"),
        invalid("wrong_type"),
    );
    c.field(
        "description as array",
        "description",
        Some("[\"x\"]"),
        invalid("wrong_type"),
    );
    c.keyed(
        "duplicate amount field",
        [
            with_raw("c-29", "description", None)
                .strip_suffix(b"}")
                .unwrap(),
            b",\"amount_minor\":1}",
        ]
        .concat(),
        invalid("duplicate_field"),
    );
    // Amounts.
    c.field(
        "float amount",
        "amount_minor",
        Some("19.99"),
        invalid("amount_not_integer"),
    );
    c.field(
        "exponent amount",
        "amount_minor",
        Some("1e3"),
        invalid("amount_not_integer"),
    );
    c.field(
        "integral float amount",
        "amount_minor",
        Some("1000.0"),
        invalid("amount_not_integer"),
    );
    c.field(
        "negative amount",
        "amount_minor",
        Some("-5"),
        invalid("amount_out_of_range"),
    );
    c.field(
        "zero amount",
        "amount_minor",
        Some("0"),
        invalid("amount_out_of_range"),
    );
    c.field(
        "amount over the maximum",
        "amount_minor",
        Some("1000000000001"),
        invalid("amount_out_of_range"),
    );
    c.field(
        "amount over i64",
        "amount_minor",
        Some("9223372036854775808"),
        invalid("amount_out_of_range"),
    );
    c.field(
        "amount over u64",
        "amount_minor",
        Some("100000000000000000000000"),
        invalid("amount_out_of_range"),
    );
    // Currencies.
    c.field(
        "lower-case currency",
        "currency",
        Some("\"eur\""),
        invalid("currency_not_upper_case"),
    );
    c.field(
        "unknown currency",
        "currency",
        Some("\"XYZ\""),
        invalid("unknown_currency"),
    );
    c.field(
        "two-letter currency",
        "currency",
        Some("\"EU\""),
        invalid("invalid_currency_format"),
    );
    c.field(
        "metal code",
        "currency",
        Some("\"XAU\""),
        invalid("currency_not_payable"),
    );
    // Card numbers and free text.
    c.field(
        "card number as payment method",
        "payment_method",
        Some("\"4111111111111111\""),
        invalid("card_number_as_payment_method"),
    );
    c.field(
        "card number with spaces",
        "payment_method",
        Some("\"4111 1111 1111 1111\""),
        invalid("card_number_as_payment_method"),
    );
    c.field(
        "card number with dashes",
        "payment_method",
        Some("\"5500-0000-0000-0004\""),
        invalid("card_number_as_payment_method"),
    );
    c.field(
        "amex number",
        "payment_method",
        Some("\"378282246310005\""),
        invalid("card_number_as_payment_method"),
    );
    c.field(
        "card number in account_id",
        "account_id",
        Some("\"acct 4111111111111111\""),
        invalid("card_number_in_account_id"),
    );
    c.field(
        "card number in description",
        "description",
        Some("\"paid with 4242-4242-4242-4242\""),
        invalid("card_number_in_description"),
    );
    // A card number behind a rule that refuses the record first: parsing stops at
    // the first broken rule, and the dead letter must still not carry the number.
    c.raw(
        "card number behind a lower-case currency",
        Some(b"c-card-behind-currency".as_slice()),
        Some(
            br#"{"idempotency_key":"c-card-behind-currency","account_id":"a","amount_minor":100,"currency":"eur","payment_method":"4111111111111111"}"#
                .to_vec(),
        ),
        invalid("currency_not_upper_case"),
    );
    c.raw(
        "card number in truncated JSON",
        Some(b"c-card-truncated".as_slice()),
        Some(
            br#"{"idempotency_key":"c-card-truncated","payment_method":"4242 4242 4242 4242"#
                .to_vec(),
        ),
        invalid("malformed_json"),
    );
    // Card numbers no masking of the text can reach: behind a JSON escape, or in a
    // text encoding wider than UTF-8 (every digit next to zero bytes, which are
    // valid UTF-8). Nothing of the value may be kept.
    c.field(
        "card number behind a json escape",
        "payment_method",
        Some(r#""\u0034111111111111111""#),
        invalid("card_number_as_payment_method"),
    );
    let key = format!("c-{}", c.cases.len());
    c.keyed(
        "card number in utf-16 without a byte-order mark",
        utf16(
            &with_raw(&key, "payment_method", Some("\"4111 1111 1111 1111\"")),
            false,
        ),
        invalid("malformed_json"),
    );
    let key = format!("c-{}", c.cases.len());
    c.keyed(
        "card number behind a json escape in utf-16",
        utf16(
            &with_raw(&key, "payment_method", Some(r#""\u0034111111111111111""#)),
            false,
        ),
        invalid("malformed_json"),
    );
    // Not text: digits of fields padded with zero bytes are not one number, and
    // the value is kept as it came.
    c.keyed(
        "digits in zero-padded binary fields",
        b"4000123\x00456789017\x00".to_vec(),
        invalid("malformed_json"),
    );
    let key = format!("c-{}", c.cases.len());
    c.keyed(
        "card number in utf-16 big-endian with a byte-order mark",
        utf16(
            &[
                "\u{feff}".as_bytes(),
                &with_raw(&key, "description", Some("\"5500000000000004\"")),
            ]
            .concat(),
            true,
        ),
        invalid("not_utf8"),
    );
    let long_pm = serde_json::to_string(&"p".repeat(129)).unwrap();
    c.field(
        "over-long payment method",
        "payment_method",
        Some(&long_pm),
        invalid("invalid_payment_method"),
    );
    c.field(
        "empty payment method",
        "payment_method",
        Some("\"\""),
        invalid("invalid_payment_method"),
    );
    let long_account = serde_json::to_string(&"a".repeat(65)).unwrap();
    c.field(
        "over-long account_id",
        "account_id",
        Some(&long_account),
        invalid("invalid_account_id"),
    );
    c.field(
        "blank account_id",
        "account_id",
        Some("\"   \""),
        invalid("invalid_account_id"),
    );
    c.field(
        "account_id with a newline",
        "account_id",
        Some("\"a\\nb\""),
        invalid("invalid_account_id"),
    );
    let long_description = serde_json::to_string(&"d".repeat(513)).unwrap();
    c.field(
        "over-long description",
        "description",
        Some(&long_description),
        invalid("description_too_long"),
    );
    // Keys.
    c.with_key("over-long key", &"k".repeat(129));
    c.with_key("key with a space", "bad key");
    c.with_key("key with a hash tag", "{tag}");
    c.with_key("key with a glob", "key*");
    c.with_key("key with a slash", "a/b");
    c.with_key("empty key", "");
    let n = c.cases.len();
    c.raw(
        "record key differs from idempotency_key",
        Some(b"other-key".as_slice()),
        Some(with_raw(&format!("c-{n}"), "x", None)),
        invalid("kafka_key_mismatch"),
    );
    c.raw(
        "record key not utf-8",
        Some([0xff, 0x00].as_slice()),
        Some(with_raw(&format!("c-{}", n + 1), "x", None)),
        invalid("kafka_key_mismatch"),
    );
    // 1 MiB: a command whose description alone is a mebibyte.
    let big = serde_json::to_string(&"m".repeat(1 << 20)).unwrap();
    c.field(
        "1 MiB value",
        "description",
        Some(&big),
        invalid("description_too_long"),
    );
    // Valid commands with broken trace context: processed as usual.
    for (name, header) in [
        ("garbage traceparent", "garbage".as_bytes().to_vec()),
        (
            "traceparent with a forbidden version",
            b"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_vec(),
        ),
        (
            "traceparent with a zero trace id",
            b"00-00000000000000000000000000000000-b7ad6b7169203331-01".to_vec(),
        ),
        ("traceparent not utf-8", vec![0xff, 0xfe]),
    ] {
        let key = format!("c-{}", c.cases.len());
        c.cases.push(Case {
            name: name.to_owned(),
            key: Some(key.clone().into_bytes()),
            value: Some(with_raw(&key, "x", None)),
            headers: vec![
                ("traceparent", header),
                ("tracestate", b"=,=,\xff".to_vec()),
            ],
            expect: Expect::Outcome("succeeded"),
        });
    }
    // The same key again with another amount: refused, never charged.
    c.raw(
        "first use of a key",
        Some(b"reused".as_slice()),
        Some(with_raw("reused", "amount_minor", Some("100"))),
        Expect::Outcome("succeeded"),
    );
    c.raw(
        "key reused with another amount",
        Some(b"reused".as_slice()),
        Some(with_raw("reused", "amount_minor", Some("200"))),
        dead("key_reused", "idempotency_key_reused"),
    );
    // Accepted (no rule reads a field it does not know), then refused: the card
    // number in the unknown field is masked on the dead letter all the same.
    let mut reused = command("reused");
    reused.insert("amount_minor".into(), json!(300));
    reused.insert("note".into(), json!("card 4111 1111 1111 1111 on file"));
    c.raw(
        "key reused, a card number in a field no rule reads",
        Some(b"reused".as_slice()),
        Some(serde_json::to_vec(&reused).unwrap()),
        dead("key_reused", "idempotency_key_reused"),
    );
    card_numbers_where_records_are_echoed_from(&mut c);
    c.cases
}

/// Header names and values of the corpus that hold a card number, each in its own
/// case (a command refused for its currency, so its headers go to the dead-letter
/// topic) and all together on one valid command.
pub(crate) const CARD_HEADERS: [(&str, &[u8]); 9] = [
    // Kafka's header name `note`, as an upstream writes a memo.
    ("note", b"card 4111-1111-1111-1111"),
    ("x-memo", b"note: card 4111 1111 1111 1111"),
    // In a header's name.
    ("x-card-4111111111111111", b"v"),
    ("x-plain", b"4111111111111111"),
    // Any grouping, any encoding a receiver decodes.
    ("x-dotted", b"4111.1111.1111.1111"),
    // Grouped by no-break spaces, as a copy from a web page brings it; and joined
    // by zero-width spaces, which show as nothing.
    ("x-copied", b"4111\xc2\xa01111\xc2\xa01111\xc2\xa01111"),
    (
        "x-zero-width",
        b"4111\xe2\x80\x8b1111\xe2\x80\x8b1111\xe2\x80\x8b1111",
    ),
    (
        "x-percent",
        b"%34%31%31%31%31%31%31%31%31%31%31%31%31%31%31%31",
    ),
    // Trace context: a card-holding entry is dropped, the rest copied.
    ("tracestate", b"pan=4111111111111111,vendor=ok"),
];

/// Card numbers in the parts of a record the worker echoes: its key (the record
/// key or the command's `idempotency_key`) and its headers, in every writing the
/// contract names (plain, grouped by separators in any group sizes,
/// inside longer text, in a header's name, UTF-16). None of them may reach an output
/// topic in clear.
fn card_numbers_where_records_are_echoed_from(c: &mut Corpus) {
    for (name, key) in [
        ("card number as key", "4111111111111111"),
        (
            "card number grouped by dashes as key",
            "4111-1111-1111-1111",
        ),
        ("card number inside a longer key", "ord-5500000000000004"),
        // Groupings the identifier rule for keys once let through as keys.
        ("card number as key in groups of eight", "41111111-11111111"),
        ("card number as key after one digit", "4-111111111111111"),
        (
            "card number as key in groups of ten and six",
            "4111111111-111111",
        ),
        ("card number as key grouped by dots", "4111.1111.1111.1111"),
        (
            "card number as key grouped by underscores",
            "4111_1111_1111_1111",
        ),
        (
            "order number whose two groups are a card number",
            "ord-20260115-00000008",
        ),
    ] {
        c.raw(
            name,
            Some(key.as_bytes()),
            Some(with_raw(key, "x", None)),
            invalid("card_number_as_key"),
        );
    }
    c.raw(
        "card number as idempotency_key without a record key",
        None,
        Some(with_raw("5500-0000-0000-0004", "x", None)),
        invalid("card_number_as_key"),
    );
    let n = c.cases.len();
    c.raw(
        "card number in a record key that is no idempotency key",
        Some(b"note: card 4111 1111 1111 1111".as_slice()),
        Some(with_raw(&format!("c-{n}"), "x", None)),
        invalid("card_number_as_key"),
    );
    let n = c.cases.len();
    c.raw(
        "card number as a utf-16 record key",
        Some(utf16(b"4111111111111111", false).as_slice()),
        Some(with_raw(&format!("c-{n}"), "x", None)),
        invalid("card_number_as_key"),
    );
    let wide_value = utf16(b"card 4111 1111 1111 1111", false);
    let headers: Vec<(&'static str, Vec<u8>)> = CARD_HEADERS
        .iter()
        .map(|(name, value)| (*name, value.to_vec()))
        .chain([("x-wide", wide_value)])
        .collect();
    for header in &headers {
        let key = format!("c-{}", c.cases.len());
        c.cases.push(Case {
            name: format!("card number in header {}", header.0),
            key: Some(key.clone().into_bytes()),
            value: Some(with_raw(&key, "currency", Some("\"XYZ\""))),
            headers: vec![header.clone(), ("x-kept", b"plain value".to_vec())],
            expect: invalid("unknown_currency"),
        });
    }
    let key = format!("c-{}", c.cases.len());
    c.cases.push(Case {
        name: "valid command with card numbers in its headers".to_owned(),
        key: Some(key.clone().into_bytes()),
        value: Some(with_raw(&key, "x", None)),
        headers,
        expect: Expect::Outcome("succeeded"),
    });
}
