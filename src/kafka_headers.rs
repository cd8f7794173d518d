//! Kafka record headers as raw bytes.
//!
//! A header name is arbitrary bytes on the wire, but rdkafka's `Headers::get` and
//! `Headers::iter` unwrap it as UTF-8 (`CStr::to_str().unwrap()`): one record with
//! a non-UTF-8 header name panicked whoever iterated its headers — the trace-context
//! extractor and the dead-letter copy among them — and stopped its partition. The
//! worker therefore reads, copies and filters headers only through this module,
//! which goes to librdkafka's C API and never interprets a name.

use std::ffi::CStr;
use std::os::raw::{c_char, c_void};

use rdkafka::message::OwnedHeaders;
use rdkafka_sys as rdsys;

/// One header as it came off the wire. `name` stops at its first NUL byte, as
/// librdkafka stores names as C strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawHeader<'a> {
    /// The name's bytes, up to its first NUL.
    pub name: &'a [u8],
    /// The value's bytes; `None` for a header without a value.
    pub value: Option<&'a [u8]>,
}

impl RawHeader<'_> {
    /// The name as text, when it is UTF-8.
    pub fn name_str(&self) -> Option<&str> {
        std::str::from_utf8(self.name).ok()
    }
}

fn native(headers: &OwnedHeaders) -> *mut rdsys::rd_kafka_headers_t {
    // `BorrowedHeaders` is rdkafka's zero-sized view placed at the native pointer
    // (rdkafka casts it back the same way), so its address is the C handle.
    headers.as_borrowed() as *const _ as *mut rdsys::rd_kafka_headers_t
}

/// Every header, in order, names and values as bytes. Never panics.
pub fn raw(headers: &OwnedHeaders) -> Vec<RawHeader<'_>> {
    let handle = native(headers);
    // SAFETY: `handle` is valid while `headers` is borrowed, and so are the name and
    // value pointers librdkafka hands out for it.
    let count = unsafe { rdsys::rd_kafka_header_cnt(handle) };
    let mut out = Vec::with_capacity(count);
    for index in 0..count {
        let mut name: *const c_char = std::ptr::null();
        let mut value: *const c_void = std::ptr::null();
        let mut size = 0usize;
        // SAFETY: as above; the out-pointers are valid locals.
        let error = unsafe {
            rdsys::rd_kafka_header_get_all(handle, index, &mut name, &mut value, &mut size)
        };
        if error != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            continue;
        }
        // SAFETY: librdkafka NUL-terminates every name it stores.
        let name = unsafe { CStr::from_ptr(name) }.to_bytes();
        let value = if value.is_null() {
            None
        } else if size == 0 {
            Some(&[][..])
        } else {
            // SAFETY: `value` points at `size` bytes owned by `headers`.
            Some(unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) })
        };
        out.push(RawHeader { name, value });
    }
    out
}

/// The value of the last header called `name` (ASCII case-insensitive).
pub fn last_value<'a>(headers: &'a OwnedHeaders, name: &str) -> Option<&'a [u8]> {
    raw(headers)
        .into_iter()
        .rev()
        .find(|h| h.name.eq_ignore_ascii_case(name.as_bytes()))
        .and_then(|h| h.value)
}

/// Whether any header called `name` (ASCII case-insensitive) has exactly `value`.
/// For a flag that is evidence (`x-charge-unknown: true`): a later header saying
/// otherwise, or carrying no value, does not take it back.
pub fn any_value_is(headers: &OwnedHeaders, name: &str, value: &[u8]) -> bool {
    raw(headers)
        .iter()
        .any(|h| h.name.eq_ignore_ascii_case(name.as_bytes()) && h.value == Some(value))
}

/// `headers` plus one header whose name may be any bytes (the safe
/// `OwnedHeaders::insert` only takes `&str` names).
pub fn append_raw(headers: OwnedHeaders, name: &[u8], value: Option<&[u8]>) -> OwnedHeaders {
    let (value_ptr, value_len) = match value {
        Some(value) => (value.as_ptr().cast::<c_void>(), value.len()),
        None => (std::ptr::null(), 0),
    };
    // SAFETY: we own `headers` (it is moved in), the name and value pointers are
    // valid for the given lengths, and librdkafka copies both.
    unsafe {
        rdsys::rd_kafka_header_add(
            native(&headers),
            name.as_ptr().cast::<c_char>(),
            name.len() as isize,
            value_ptr,
            value_len as isize,
        );
    }
    headers
}

/// A copy of `headers` (raw names kept) without any header called one of `names`.
pub fn copy_without(headers: &OwnedHeaders, names: &[&str]) -> OwnedHeaders {
    raw(headers)
        .into_iter()
        // Header names are matched without regard to letter case, as `last_value`
        // reads them.
        .filter(|h| {
            !names
                .iter()
                .any(|n| h.name.eq_ignore_ascii_case(n.as_bytes()))
        })
        .fold(OwnedHeaders::new_with_capacity(8), |copy, h| {
            append_raw(copy, h.name, h.value)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::Header;

    #[test]
    fn a_flag_set_by_any_copy_of_its_header_stays_set() {
        let flag = |values: &[Option<&[u8]>]| {
            let headers = values.iter().fold(OwnedHeaders::new(), |headers, value| {
                append_raw(headers, b"X-Charge-Unknown", *value)
            });
            any_value_is(&headers, "x-charge-unknown", b"true")
        };
        assert!(flag(&[Some(b"true")]));
        assert!(flag(&[Some(b"true"), Some(b"false")]), "a later false");
        assert!(flag(&[Some(b"true"), None]), "a later valueless copy");
        assert!(flag(&[None, Some(b"true")]));
        assert!(!flag(&[Some(b"false"), None, Some(b"TRUE ")]));
        assert!(!flag(&[]));
    }

    #[test]
    fn non_utf8_names_are_read_copied_and_filtered_without_panicking() {
        let headers = append_raw(OwnedHeaders::new(), b"\xff\xfename", Some(b"v1"));
        let headers = headers.insert(Header {
            key: "x-error-kind",
            value: Some("invalid"),
        });
        let headers = append_raw(headers, b"empty", Some(b""));
        let headers = append_raw(headers, b"null", None);
        let all = raw(&headers);
        assert_eq!(all.len(), 4);
        assert_eq!(all[0].name, b"\xff\xfename");
        assert_eq!(all[0].name_str(), None);
        assert_eq!(all[2].value, Some(&b""[..]));
        assert_eq!(all[3].value, None);
        assert_eq!(last_value(&headers, "X-Error-Kind"), Some(&b"invalid"[..]));

        let copy = copy_without(&headers, &["x-error-kind"]);
        let names: Vec<&[u8]> = raw(&copy).iter().map(|h| h.name).collect();
        assert_eq!(names, [&b"\xff\xfename"[..], b"empty", b"null"]);
    }

    #[test]
    fn names_are_filtered_whatever_their_letter_case() {
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "X-Payload-Dropped",
                value: Some("sent by a client"),
            })
            .insert(Header {
                key: "x-kept",
                value: Some("v"),
            });
        let copy = copy_without(&headers, &["x-payload-dropped"]);
        assert_eq!(last_value(&copy, "x-payload-dropped"), None);
        assert_eq!(last_value(&copy, "x-kept"), Some(&b"v"[..]));
    }

    #[test]
    fn a_nul_inside_a_name_cuts_it_there() {
        let headers = append_raw(OwnedHeaders::new(), b"ab\0cd", Some(b"v"));
        assert_eq!(raw(&headers)[0].name, b"ab");
    }
}
