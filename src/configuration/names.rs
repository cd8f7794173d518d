//! The names a worker writes into every Redis key and token owner (`--redis-key-prefix`,
//! `--worker-id`), checked once, at the edge: they reach Redis, Postgres, log lines
//! and spans on every command, so a bad one would fail or leak on every command
//! instead of once at start.

use crate::redaction::contains_card_number;

/// The longest name, in characters.
const LONGEST_NAME: usize = 64;

/// Why `name` cannot be one, or `None`. Never quotes it. The alphabet is the
/// idempotency keys' (`[A-Za-z0-9._:-]`): no space, control, bidirectional or
/// invisible character, no `{` or `}` (Redis Cluster hashes a key by its first
/// `{…}`, which must be the idempotency key's) and no `*?[]\` (Redis's SCAN reads
/// the prefix as a pattern).
fn refusal(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("it is empty".to_owned());
    }
    if name.chars().count() > LONGEST_NAME {
        return Some(format!("it is longer than {LONGEST_NAME} characters"));
    }
    if let Some(position) = crate::token::outside_key_alphabet(name) {
        return Some(format!(
            "character {} is not one of A-Z a-z 0-9 . _ : -",
            position + 1
        ));
    }
    if contains_card_number(name) {
        return Some("it holds a card number".to_owned());
    }
    None
}

/// The value parser of `--redis-key-prefix` and `--worker-id` (clap quotes the value
/// it refuses; the command line's errors are printed with card numbers masked).
pub(super) fn parse_name(value: &str) -> Result<String, String> {
    match refusal(value) {
        None => Ok(value.to_owned()),
        Some(why) => Err(why),
    }
}

/// `<host>:<pid>`, the worker id when none is given: the host name cut to the
/// alphabet and to what fits. A colon, not a dash: digit groups joined by dashes
/// read as one number (`ip-172-31-20-15-1002` is 13 digits that pass the Luhn
/// check), and the id is in every token owner and log line.
pub(super) fn default_worker_id(host: &str, pid: u32) -> String {
    let pid = pid.to_string();
    let host: String = host
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        .take(LONGEST_NAME - 1 - pid.len())
        .collect();
    let id = format!("{host}:{pid}");
    if host.is_empty() || refusal(&id).is_some() {
        format!("worker:{pid}")
    } else {
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_short_plain_and_hold_no_card_number() {
        let longest = "n".repeat(LONGEST_NAME);
        for good in [
            "pw",
            "pwt_abcdefghabcdefghabcdefghabcdefgh",
            "payments:prod",
            "bench-1a2b3c4d-e2e-0ms",
            "worker-3-1",
            longest.as_str(),
        ] {
            assert_eq!(parse_name(good).as_deref(), Ok(good), "{good}");
        }
        let longer = "n".repeat(LONGEST_NAME + 1);
        for bad in [
            "",
            longer.as_str(),
            "{pw}",
            "pw{",
            "p w",
            "pw\t",
            "pw\0",
            "pw*",
            "pw[1]",
            "pw\\",
            "pwé",
            "pw\u{202E}",
            "pw\u{200B}",
            "4111111111111111",
            "pw:4111-1111-1111-1111",
        ] {
            let why = parse_name(bad).expect_err(bad);
            assert!(!why.contains("4111"), "{why}");
        }
    }

    #[test]
    fn the_default_worker_id_keeps_the_rules_whatever_the_host_is_called() {
        assert!(
            contains_card_number("ip-172-31-20-15-1002"),
            "the dashed form"
        );
        assert_eq!(
            default_worker_id("ip-172-31-20-15", 1002),
            "ip-172-31-20-15:1002"
        );
        let long_host = "h".repeat(300);
        for host in [
            "",
            "\u{202E}",
            long_host.as_str(),
            "4111111111111111",
            "a b\0",
        ] {
            let id = default_worker_id(host, u32::MAX);
            assert_eq!(refusal(&id), None, "{host:?} gave {id:?}");
        }
        assert_eq!(default_worker_id("4111111111111111", 7), "worker:7");
    }
}
