//! W3C trace context (Trace Context Level 1: `traceparent`, `tracestate`) and
//! W3C Baggage, read strictly. Whatever a producer put in these headers is
//! forwarded by the worker (on results, dead letters, requests to the gateway) and
//! exported in every span of the trace, so an entry that breaks the grammar or
//! holds a card number is dropped here, never passed on.

use crate::redaction::holds_card_number;

/// The most `tracestate` list-members kept (the recommendation's limit).
const MAX_TRACESTATE_MEMBERS: usize = 32;
/// The most `baggage` list-members kept, and bytes in all (the recommendation's
/// limits).
const MAX_BAGGAGE_MEMBERS: usize = 64;
const MAX_BAGGAGE_BYTES: usize = 8192;

/// A `traceparent` that passed the strict check: version `00`, ids of lower-case
/// hex, neither all zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace id.
    pub trace_id: [u8; 16],
    /// The caller's span id.
    pub parent_id: [u8; 8],
    /// The trace flags.
    pub flags: u8,
}

fn lower_hex(bytes: &[u8], out: &mut [u8]) -> Option<()> {
    if bytes.len() != out.len() * 2
        || !bytes
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
    {
        return None;
    }
    let text = std::str::from_utf8(bytes).ok()?;
    for (at, slot) in out.iter_mut().enumerate() {
        *slot = u8::from_str_radix(text.get(at * 2..at * 2 + 2)?, 16).ok()?;
    }
    Some(())
}

/// `value` as a `traceparent`: exactly `00-<32 hex>-<16 hex>-<2 hex>` (lower case;
/// another version, or anything after the flags, is not read: it is a version this
/// worker does not know), ids not all zeros, and no card number in it.
pub fn parse_traceparent(value: &[u8]) -> Option<TraceParent> {
    let [b'0', b'0', b'-', rest @ ..] = value else {
        return None;
    };
    if rest.len() != 52 || rest[32] != b'-' || rest[49] != b'-' {
        return None;
    }
    let mut parent = TraceParent {
        trace_id: [0; 16],
        parent_id: [0; 8],
        flags: 0,
    };
    lower_hex(&rest[..32], &mut parent.trace_id)?;
    lower_hex(&rest[33..49], &mut parent.parent_id)?;
    let mut flags = [0u8; 1];
    lower_hex(&rest[50..], &mut flags)?;
    parent.flags = flags[0];
    if parent.trace_id == [0; 16] || parent.parent_id == [0; 8] || holds_card_number(value) {
        return None;
    }
    Some(parent)
}

/// `lcalpha / DIGIT / "_" / "-" / "*" / "/"`: what follows a key's first character.
fn key_char(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-' | b'*' | b'/')
}

/// A `tracestate` key: `lcalpha 0*255(key_char)`, or `tenant@system` with a tenant
/// of `(lcalpha / DIGIT) 0*240(key_char)` and a system of `lcalpha 0*13(key_char)`.
fn tracestate_key(key: &[u8]) -> bool {
    let well_formed = |part: &[u8], first: fn(&u8) -> bool, longest: usize| {
        !part.is_empty()
            && part.len() <= longest
            && first(&part[0])
            && part[1..].iter().all(|&b| key_char(b))
    };
    match key.iter().position(|&b| b == b'@') {
        None => well_formed(key, u8::is_ascii_lowercase, 256),
        Some(at) => {
            well_formed(
                &key[..at],
                |b| b.is_ascii_lowercase() || b.is_ascii_digit(),
                241,
            ) && well_formed(&key[at + 1..], u8::is_ascii_lowercase, 14)
        }
    }
}

/// A `tracestate` value: 1–256 printable ASCII characters but `,` and `=`, the last
/// not a space.
fn tracestate_value(value: &[u8]) -> bool {
    (1..=256).contains(&value.len())
        && value
            .iter()
            .all(|&b| (0x20..=0x7e).contains(&b) && b != b',' && b != b'=')
        && value.last() != Some(&b' ')
}

/// Optional white space, as the grammars allow it around members.
fn trim_ows(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .position(|&b| b != b' ' && b != b'\t')
        .unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|&b| b != b' ' && b != b'\t')
        .map_or(start, |at| at + 1);
    &bytes[start..end]
}

/// The list-members of `values` (one header each, in order), trimmed, empty ones
/// left out.
fn members<'a>(values: &'a [&'a [u8]]) -> impl Iterator<Item = &'a [u8]> {
    values
        .iter()
        .flat_map(|value| value.split(|&b| b == b','))
        .map(trim_ows)
        .filter(|member| !member.is_empty())
}

/// The `tracestate` the worker keeps of `values` (the record's `tracestate`
/// headers, in order): each list-member that is a valid `key=value` and holds no
/// card number, the first of each key, at most 32; `None` when none is left.
pub fn sanitize_tracestate(values: &[&[u8]]) -> Option<String> {
    let mut kept: Vec<&[u8]> = Vec::new();
    let mut keys: Vec<&[u8]> = Vec::new();
    for member in members(values) {
        let Some(at) = member.iter().position(|&b| b == b'=') else {
            continue;
        };
        let (key, value) = (&member[..at], &member[at + 1..]);
        if !tracestate_key(key)
            || !tracestate_value(value)
            || keys.contains(&key)
            || holds_card_number(member)
        {
            continue;
        }
        keys.push(key);
        kept.push(member);
        if kept.len() == MAX_TRACESTATE_MEMBERS {
            break;
        }
    }
    join(&kept)
}

/// An HTTP `token` (RFC 7230 `tchar`s), as Baggage keys are.
fn token(bytes: &[u8]) -> bool {
    !bytes.is_empty()
        && bytes.iter().all(|&b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'!' | b'#'
                        | b'$'
                        | b'%'
                        | b'&'
                        | b'\''
                        | b'*'
                        | b'+'
                        | b'-'
                        | b'.'
                        | b'^'
                        | b'_'
                        | b'`'
                        | b'|'
                        | b'~'
                )
        })
}

/// A Baggage value: `baggage-octet`s (printable ASCII but space, `"`, `,`, `;`, `\`).
fn baggage_value(bytes: &[u8]) -> bool {
    bytes
        .iter()
        .all(|&b| (0x21..=0x7e).contains(&b) && !matches!(b, b'"' | b',' | b';' | b'\\'))
}

/// `key OWS "=" OWS value` (a property may also be a bare key).
fn baggage_pair(bytes: &[u8], bare_key_allowed: bool) -> bool {
    match bytes.iter().position(|&b| b == b'=') {
        Some(at) => token(trim_ows(&bytes[..at])) && baggage_value(trim_ows(&bytes[at + 1..])),
        None => bare_key_allowed && token(trim_ows(bytes)),
    }
}

/// The `baggage` the worker keeps of `values`: each list-member of the W3C Baggage
/// grammar (`key=value`, `;`-separated properties) that holds no card number in any
/// reading (values are percent-encoded), at most 64 and 8192 bytes in all; `None`
/// when none is left.
pub fn sanitize_baggage(values: &[&[u8]]) -> Option<String> {
    let mut kept: Vec<&[u8]> = Vec::new();
    let mut size = 0;
    for member in members(values) {
        let mut parts = member.split(|&b| b == b';');
        let pair = parts.next().unwrap_or_default();
        let valid = baggage_pair(pair, false) && parts.all(|property| baggage_pair(property, true));
        if !valid || holds_card_number(member) {
            continue;
        }
        let added = member.len() + usize::from(!kept.is_empty());
        if kept.len() == MAX_BAGGAGE_MEMBERS || size + added > MAX_BAGGAGE_BYTES {
            break;
        }
        size += added;
        kept.push(member);
    }
    join(&kept)
}

/// `members` joined by commas; every byte of them is ASCII, checked above.
fn join(members: &[&[u8]]) -> Option<String> {
    if members.is_empty() {
        return None;
    }
    let joined = members.join(&b","[..]);
    String::from_utf8(joined).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn traceparent_is_read_strictly() {
        let parent = parse_traceparent(VALID.as_bytes()).expect("valid");
        assert_eq!(parent.trace_id[..2], [0x0a, 0xf7]);
        assert_eq!(parent.parent_id[7], 0x31);
        assert_eq!(parent.flags, 1);
        for invalid in [
            "",
            "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1",
            "00-0af7651916cd43dd8448eb211c80319-cb7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c8031 c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333g-01",
            // Each separator is a dash, the other one right or not.
            "00-0af7651916cd43dd8448eb211c80319c_b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331_01",
            // A card number in the trace id: W3C-valid, and still never forwarded.
            "00-4111111111111111aaaaaaaaaaaaaaaa-b7ad6b7169203331-01",
        ] {
            assert_eq!(parse_traceparent(invalid.as_bytes()), None, "{invalid}");
        }
    }

    #[test]
    fn tracestate_keeps_only_valid_card_free_members() {
        assert_eq!(
            sanitize_tracestate(&[b"pan=4111111111111111,vendor=ok".as_slice()]).as_deref(),
            Some("vendor=ok")
        );
        assert_eq!(
            sanitize_tracestate(&[b"a=1 , ,b@c=x-y,A=no,1a=no,k=,k2=a=b,t@id=x y ".as_slice()])
                .as_deref(),
            Some("a=1,b@c=x-y,t@id=x y")
        );
        assert_eq!(
            sanitize_tracestate(&[b"a=1".as_slice(), b"a=2,b=3"]).as_deref(),
            Some("a=1,b=3"),
            "two headers are one list; the first of a key wins"
        );
        // After its first character a key takes lower-case letters, digits and
        // `_ - * /` only.
        assert_eq!(
            sanitize_tracestate(&[b"aB=1,a.b=2,a b=3,a~b=4,a_b-c*d/e=5".as_slice()]).as_deref(),
            Some("a_b-c*d/e=5")
        );
        // `tenant@system`: both parts must be well formed.
        assert_eq!(
            sanitize_tracestate(&[
                b"@s=1,t@=2,T@s=3,t@S=4,t@abcdefghijklmno=5,7@abcdefghijklmn=6".as_slice()
            ])
            .as_deref(),
            Some("7@abcdefghijklmn=6")
        );
        for hidden in [
            "x=4111-1111-1111-1111",
            "x=4111.1111.1111.1111",
            "x=4111_1111_1111_1111",
            "x=%34%31%31%31%31%31%31%31%31%31%31%31%31%31%31%31",
            "card4111111111111111=v",
        ] {
            assert_eq!(sanitize_tracestate(&[hidden.as_bytes()]), None, "{hidden}");
        }
        let many: Vec<String> = (0..40).map(|n| format!("k{n}=v")).collect();
        let many = many.join(",");
        let kept = sanitize_tracestate(&[many.as_bytes()]).expect("kept");
        assert_eq!(kept.split(',').count(), 32);
        assert!(kept.starts_with("k0=v,") && kept.ends_with(",k31=v"));
        assert_eq!(sanitize_tracestate(&[b"\xff=\xff".as_slice()]), None);
    }

    #[test]
    fn baggage_keeps_only_valid_card_free_members() {
        assert_eq!(
            sanitize_baggage(
                &[b"user=alice;ttl=60;flag, pan=4111%201111%201111%201111".as_slice()]
            )
            .as_deref(),
            Some("user=alice;ttl=60;flag")
        );
        assert_eq!(
            sanitize_baggage(&[
                b"k=%34%31%31%31%31%31%31%31%31%31%31%31%31%31%31%31,ok=1".as_slice()
            ])
            .as_deref(),
            Some("ok=1")
        );
        assert_eq!(
            sanitize_baggage(&[b"bad key=v,k=v v,k=\"q\",=v,good=v".as_slice()]).as_deref(),
            Some("good=v")
        );
        assert_eq!(sanitize_baggage(&[b"".as_slice()]), None);
        // At most 8192 bytes with the commas between members: two of 4096 do not fit.
        let half = format!("k={}", "v".repeat(4094));
        let two = format!("{half},{half}");
        assert_eq!(
            sanitize_baggage(&[two.as_bytes()]).as_deref(),
            Some(half.as_str())
        );
        let member = |len: usize| format!("k={}", "v".repeat(len - 2));
        // Exactly 8192 with the comma: kept whole.
        let exact = format!("{},{}", member(4095), member(4096));
        assert_eq!(
            sanitize_baggage(&[exact.as_bytes()]).as_deref(),
            Some(exact.as_str())
        );
        // Three members of 8191 bytes need two commas: one byte too many for the third.
        let (a, b, c) = (member(2730), member(2730), member(2731));
        let three = format!("{a},{b},{c}");
        assert_eq!(
            sanitize_baggage(&[three.as_bytes()]).as_deref(),
            Some(format!("{a},{b}").as_str())
        );
        // White space around `=` is allowed; a member must be `key=value`, a
        // property may be a bare key, and a bare key must be a token.
        assert_eq!(
            sanitize_baggage(&[b"k = v,flag,p=1;bad key,q=2;prop".as_slice()]).as_deref(),
            Some("k = v,q=2;prop")
        );
    }
}
