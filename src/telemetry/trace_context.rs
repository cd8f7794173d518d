//! W3C trace context across Kafka headers and HTTP: the parent a command's span
//! takes from its record's headers, the headers the worker sends on (results, the
//! gateway's requests) and the ids of its own spans. What a producer sent is read
//! strictly (`w3c.rs`): an invalid `traceparent` parents nothing, and a `tracestate`
//! entry that is invalid or holds a card number is dropped before it becomes part
//! of the trace, which every span exports and every outgoing request carries.

use std::str::FromStr;

use opentelemetry::propagation::Injector;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};
use rdkafka::message::{Header, OwnedHeaders};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::w3c::{parse_traceparent, sanitize_tracestate, TraceParent};
use crate::kafka_headers::RawHeader;

/// The header names of W3C trace context and Baggage.
pub const TRACEPARENT: &str = "traceparent";
/// See [`TRACEPARENT`].
pub const TRACESTATE: &str = "tracestate";
/// See [`TRACEPARENT`].
pub const BAGGAGE: &str = "baggage";

/// The values of every header of `headers` called `name` (ASCII case-insensitive:
/// header names are matched so everywhere), in order.
fn values<'a>(headers: &[RawHeader<'a>], name: &str) -> Vec<&'a [u8]> {
    headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case(name.as_bytes()))
        .filter_map(|h| h.value)
        .collect()
}

/// The trace context a record's headers carry, as the worker accepts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteContext {
    /// The one valid `traceparent`.
    pub parent: TraceParent,
    /// What is kept of its `tracestate` headers.
    pub state: Option<String>,
}

/// The trace context of `headers`: exactly one `traceparent` (two are ambiguous),
/// valid and card-free, and what its `tracestate` headers hold that may be kept.
/// Without a valid `traceparent` the `tracestate` is not read at all, as the W3C
/// recommendation has it.
pub fn remote_context(headers: &[RawHeader<'_>]) -> Option<RemoteContext> {
    let [traceparent] = values(headers, TRACEPARENT)[..] else {
        return None;
    };
    let parent = parse_traceparent(traceparent)?;
    Some(RemoteContext {
        parent,
        state: sanitize_tracestate(&values(headers, TRACESTATE)),
    })
}

/// Makes `span` a child of the trace context `headers` carry ([`remote_context`]).
/// None, or an invalid one, leaves the span a root: bad tracing data never fails a
/// payment.
pub fn adopt_remote_parent(span: &tracing::Span, headers: Option<&OwnedHeaders>) {
    let Some(headers) = headers else { return };
    let Some(remote) = remote_context(&crate::kafka_headers::raw(headers)) else {
        return;
    };
    let flags = carried_flags(remote.parent.flags);
    let state = remote
        .state
        .as_deref()
        .and_then(|state| TraceState::from_str(state).ok())
        .unwrap_or_default();
    let parent = SpanContext::new(
        TraceId::from_bytes(remote.parent.trace_id),
        SpanId::from_bytes(remote.parent.parent_id),
        flags,
        true,
        state,
    );
    let context = opentelemetry::Context::new().with_remote_span_context(parent);
    let _ = span.set_parent(context);
}

#[derive(Default)]
struct PairInjector(Vec<(String, String)>);

impl Injector for PairInjector {
    fn set(&mut self, key: &str, value: String) {
        self.0.push((key.to_owned(), value));
    }
}

/// `traceparent` (and `tracestate`) of the current span, for outgoing requests and
/// records. Read back as strictly as an incoming one before it goes: what would be
/// dropped on the way in is not sent.
pub fn current_trace_headers() -> Vec<(String, String)> {
    let context = tracing::Span::current().context();
    if !context.span().span_context().is_valid() {
        // Not traced (no exporter): a propagator writes nothing for it.
        return Vec::new();
    }
    let mut injector = PairInjector::default();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&context, &mut injector));
    let raw: Vec<RawHeader<'_>> = injector
        .0
        .iter()
        .map(|(name, value)| RawHeader {
            name: name.as_bytes(),
            value: Some(value.as_bytes()),
        })
        .collect();
    let Some(remote) = remote_context(&raw) else {
        return Vec::new();
    };
    let traceparent = injector
        .0
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(TRACEPARENT))
        .map(|(_, value)| value.clone())
        .unwrap_or_default();
    let mut headers = vec![(TRACEPARENT.to_owned(), traceparent)];
    if let Some(state) = remote.state {
        headers.push((TRACESTATE.to_owned(), state));
    }
    headers
}

/// `headers` plus the current trace context.
pub fn with_trace_headers(mut headers: OwnedHeaders) -> OwnedHeaders {
    for (key, value) in current_trace_headers() {
        headers = headers.insert(Header {
            key: &key,
            value: Some(value.as_bytes()),
        });
    }
    headers
}

/// Trace id and span id (hex) of `span`, when it is being traced.
pub fn trace_ids(span: &tracing::Span) -> Option<(String, String)> {
    let context = span.context();
    let span_context = context.span().span_context().clone();
    span_context.is_valid().then(|| {
        (
            span_context.trace_id().to_string(),
            span_context.span_id().to_string(),
        )
    })
}

/// Links `span` to a span of another trace (a replayed duplicate to the run that
/// charged). Ignores ids that do not parse.
pub fn link_to(span: &tracing::Span, trace_id: &str, span_id: &str) {
    let (Ok(trace_id), Ok(span_id)) = (TraceId::from_hex(trace_id), SpanId::from_hex(span_id))
    else {
        return;
    };
    let remote = SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    span.add_link(remote);
}

/// The trace flags a remote parent passes on: sampled or not is the one flag W3C
/// Level 1 defines; the others are not carried on.
fn carried_flags(remote: u8) -> TraceFlags {
    TraceFlags::new(remote) & TraceFlags::SAMPLED
}

/// Random trace and span ids that never read as a card number, alone or where
/// they are written (`00-<trace id>-<span id>-01`, log lines, the `payments` row):
/// each begins and ends with a letter (`a`–`f`), so its digits never join those
/// of a neighbour, and has no run of 13 digits or more. A strict receiver — this
/// worker among them — would otherwise drop one trace context in a few hundred.
#[derive(Debug, Default)]
pub struct CardFreeIds(RandomIdGenerator);

/// The id `bytes` with its first and last hex digits made letters; `None` when it
/// has a run of 13 decimal digits or more (drawn again).
fn card_free<const N: usize>(mut bytes: [u8; N]) -> Option<[u8; N]> {
    // A nibble 0–9 becomes a–f (10–15): the id stays random, a little less so.
    let letter = |nibble: u8| if nibble < 10 { 10 + nibble % 6 } else { nibble };
    if let Some(first) = bytes.first_mut() {
        *first = (letter(*first >> 4) << 4) | (*first & 0x0f);
    }
    if let Some(last) = bytes.last_mut() {
        *last = (*last & 0xf0) | letter(*last & 0x0f);
    }
    let mut run = 0;
    for nibble in bytes.iter().flat_map(|b| [b >> 4, b & 0x0f]) {
        run = if nibble < 10 { run + 1 } else { 0 };
        if run >= 13 {
            return None;
        }
    }
    Some(bytes)
}

impl IdGenerator for CardFreeIds {
    fn new_trace_id(&self) -> TraceId {
        loop {
            if let Some(id) = card_free(self.0.new_trace_id().to_bytes()) {
                return TraceId::from_bytes(id);
            }
        }
    }

    fn new_span_id(&self) -> SpanId {
        loop {
            if let Some(id) = card_free(self.0.new_span_id().to_bytes()) {
                return SpanId::from_bytes(id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw<'a>(pairs: &'a [(&'a str, &'a str)]) -> Vec<RawHeader<'a>> {
        pairs
            .iter()
            .map(|(name, value)| RawHeader {
                name: name.as_bytes(),
                value: Some(value.as_bytes()),
            })
            .collect()
    }

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn a_record_parents_its_span_only_with_one_valid_traceparent() {
        let remote = remote_context(&raw(&[
            ("TraceParent", PARENT),
            ("tracestate", "pan=4111111111111111,vendor=ok"),
            ("tracestate", "other=1"),
        ]))
        .expect("valid");
        assert_eq!(remote.state.as_deref(), Some("vendor=ok,other=1"));
        assert_eq!(
            remote_context(&raw(&[("traceparent", PARENT), ("traceparent", PARENT)])),
            None
        );
        assert_eq!(remote_context(&raw(&[("tracestate", "vendor=ok")])), None);
        assert_eq!(
            remote_context(&raw(&[(
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c"
            )])),
            None
        );
    }

    #[test]
    fn generated_ids_never_read_as_card_numbers() {
        let ids = CardFreeIds::default();
        for _ in 0..2_000 {
            let trace = ids.new_trace_id().to_string();
            let span = ids.new_span_id().to_string();
            let traceparent = format!("00-{trace}-{span}-01");
            assert!(
                parse_traceparent(traceparent.as_bytes()).is_some(),
                "{traceparent}"
            );
            for id in [&trace, &span] {
                assert!(id.starts_with(|c: char| c.is_ascii_alphabetic()), "{id}");
                assert!(id.ends_with(|c: char| c.is_ascii_alphabetic()), "{id}");
            }
        }
        // A run of 13 digits is drawn again; one of 12 is kept, its ends made letters.
        assert_eq!(
            card_free([0xa1, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0xa1]),
            None
        );
        assert_eq!(
            card_free([0x01, 0x11, 0x11, 0x11, 0x11, 0x11, 0x1a, 0xa0]),
            Some([0xa1, 0x11, 0x11, 0x11, 0x11, 0x11, 0x1a, 0xaa])
        );
    }

    #[test]
    fn the_ends_made_letters_stay_as_random_as_six_letters_allow() {
        // Digits 0–5 become the six letters a–f one to one (and 6–9 again a–d): an
        // id loses as little randomness at its ends as a letter there allows.
        let firsts: std::collections::BTreeSet<u8> = (0u8..6)
            .filter_map(|nibble| card_free([nibble << 4, 0xab]))
            .map(|id| id[0] >> 4)
            .collect();
        assert_eq!(
            firsts.into_iter().collect::<Vec<_>>(),
            [10, 11, 12, 13, 14, 15]
        );
        let lasts: std::collections::BTreeSet<u8> = (0u8..6)
            .filter_map(|nibble| card_free([0xab, nibble]))
            .map(|id| id[1] & 0x0f)
            .collect();
        assert_eq!(lasts.len(), 6);
    }

    #[test]
    fn only_the_sampled_flag_of_a_remote_parent_is_carried_on() {
        assert!(!carried_flags(0x00).is_sampled());
        assert_eq!(carried_flags(0x01), TraceFlags::SAMPLED);
        // Flags Level 1 does not define (e.g. random-trace-id, 0x02) are dropped.
        assert_eq!(carried_flags(0x03), TraceFlags::SAMPLED);
        assert_eq!(carried_flags(0x02), TraceFlags::default());
    }
}
