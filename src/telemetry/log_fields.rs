//! What a text log line shows of a span: tracing's own field format, less the
//! fields that only describe the span to trace back ends, and only the latest value
//! of a field recorded more than once.

use tracing::field::{Field, Visit};
use tracing::span;
use tracing_subscriber::field::{RecordFields, VisitOutput};
use tracing_subscriber::fmt::format::{DefaultVisitor, Writer};
use tracing_subscriber::fmt::{FormatFields, FormattedFields};

/// Span fields meant for trace back ends only, the same on every line of a worker.
const TRACE_ONLY_FIELDS: [&str; 5] = [
    "messaging.system",
    "messaging.operation.type",
    "messaging.operation.name",
    "messaging.destination.name",
    "messaging.consumer.group.name",
];

/// Span fields set once per attempt of a command (`in_flight`, `in_flight`,
/// `reserved`): a log line shows the latest, as the span's trace does. Their values
/// are labels, never holding a space.
const LATEST_VALUE_FIELDS: [&str; 4] = [
    "token.verdict",
    "token.woken_by",
    "payment.outcome",
    "payment.rejection",
];

/// The text log format's fields: tracing's own, without `otel.*` and
/// [`TRACE_ONLY_FIELDS`]. The log layer formats the command span's fields when the
/// span opens, whether or not a line is ever printed under it; formatting these
/// for every command cost the worker a few per cent of its CPU, for nothing a
/// reader of the logs needs.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogFields;

impl<'writer> FormatFields<'writer> for LogFields {
    fn format_fields<R: RecordFields>(
        &self,
        writer: Writer<'writer>,
        fields: R,
    ) -> std::fmt::Result {
        let mut visitor = LogFieldVisitor(DefaultVisitor::new(writer, true));
        fields.record(&mut visitor);
        visitor.finish()
    }

    /// tracing appends every value recorded on an open span, so a command retried
    /// five times would carry five verdicts on each of its lines; the earlier value
    /// of a [`LATEST_VALUE_FIELDS`] field is dropped first.
    fn add_fields(
        &self,
        current: &'writer mut FormattedFields<Self>,
        fields: &span::Record<'_>,
    ) -> std::fmt::Result {
        // Dropped as the record names them: no list of names collected per record.
        fields.record(&mut DropEarlierValues(&mut current.fields));
        if !current.fields.is_empty() {
            current.fields.push(' ');
        }
        self.format_fields(current.as_writer(), fields)
    }
}

/// Visits the fields of a record and drops from the formatted span fields the
/// earlier value of each [`LATEST_VALUE_FIELDS`] field among them.
struct DropEarlierValues<'a>(&'a mut String);

impl Visit for DropEarlierValues<'_> {
    fn record_debug(&mut self, field: &Field, _: &dyn std::fmt::Debug) {
        let name = field.name();
        if LATEST_VALUE_FIELDS.contains(&name) {
            drop_field(self.0, name);
        }
    }
}

/// The ANSI codes tracing puts around a field name when colours are on.
const ITALIC: &str = "\x1b[3m";
const NAME_END_COLOURED: &str = "\x1b[0m\x1b[2m=";

/// Removes `name=value` (plain or coloured) and its separating space from formatted
/// span fields; a value of these fields holds no space, so the next space ends it.
fn drop_field(formatted: &mut String, name: &str) {
    let mut from = 0;
    while let Some(found) = formatted[from..].find(name) {
        let at = from + found;
        let before = &formatted[..at];
        let after = &formatted[at + name.len()..];
        let start = if before.is_empty() || before.ends_with(' ') {
            Some(at)
        } else if before.ends_with(ITALIC)
            && (before.len() == ITALIC.len() || before[..at - ITALIC.len()].ends_with(' '))
        {
            Some(at - ITALIC.len())
        } else {
            None
        };
        match start {
            Some(start) if after.starts_with('=') || after.starts_with(NAME_END_COLOURED) => {
                let end = formatted[at..]
                    .find(' ')
                    .map_or(formatted.len(), |space| at + space + 1);
                let start = if end == formatted.len() {
                    start.saturating_sub(1)
                } else {
                    start
                };
                formatted.replace_range(start..end, "");
                return;
            }
            _ => from = at + name.len(),
        }
    }
}

/// Passes the fields a log line shows on to the visitor that formats them.
struct LogFieldVisitor<V>(V);

fn shown_in_logs(field: &Field) -> bool {
    let name = field.name();
    !name.starts_with("otel.") && !TRACE_ONLY_FIELDS.contains(&name)
}

impl<V: Visit> Visit for LogFieldVisitor<V> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if shown_in_logs(field) {
            self.0.record_debug(field, value);
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if shown_in_logs(field) {
            self.0.record_str(field, value);
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        if shown_in_logs(field) {
            self.0.record_error(field, value);
        }
    }
}

impl<V: VisitOutput<std::fmt::Result>> VisitOutput<std::fmt::Result> for LogFieldVisitor<V> {
    fn finish(self) -> std::fmt::Result {
        self.0.finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::telemetry::COMMAND_SPAN;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
        type Writer = Self;
        fn make_writer(&'a self) -> Self {
            self.clone()
        }
    }

    /// The text this formatter writes for what `emit` logs, with or without colours.
    fn log_output(colours: bool, emit: impl FnOnce()) -> String {
        let captured = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(colours)
            .fmt_fields(LogFields)
            .with_writer(captured.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, emit);
        let bytes = captured.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn log_lines_keep_what_an_operator_reads_and_leave_out_trace_only_fields() {
        let line = log_output(false, || {
            let span = tracing::info_span!(
                COMMAND_SPAN,
                otel.name = "payments.commands process",
                otel.kind = "consumer",
                messaging.system = "kafka",
                messaging.destination.name = "payments.commands",
                messaging.consumer.group.name = "workers",
                messaging.destination.partition.id = "2",
                messaging.kafka.offset = 41,
                payment.idempotency_key = tracing::field::Empty,
            );
            span.record("payment.idempotency_key", "order-7");
            let _entered = span.enter();
            tracing::warn!(attempt = 3, "gateway call failed");
        });
        assert!(
            line.contains(
                "process{messaging.destination.partition.id=\"2\" messaging.kafka.offset=41 \
                 payment.idempotency_key=\"order-7\"}"
            ),
            "{line}"
        );
        assert!(line.contains("gateway call failed attempt=3"), "{line}");
        for hidden in ["otel.", "kafka\"", "payments.commands", "workers"] {
            assert!(!line.contains(hidden), "{hidden} in {line}");
        }
    }

    fn line_after_three_verdicts(colours: bool) -> String {
        log_output(colours, || {
            let span = tracing::info_span!(
                COMMAND_SPAN,
                payment.idempotency_key = "order-7",
                token.verdict = tracing::field::Empty,
                payment.outcome = tracing::field::Empty,
            );
            for verdict in ["in_flight", "in_flight", "reserved"] {
                span.record("token.verdict", verdict);
            }
            span.record("payment.outcome", "charged");
            let _entered = span.enter();
            tracing::info!("done");
        })
    }

    #[test]
    fn a_field_recorded_on_every_attempt_shows_its_latest_value_once() {
        let line = line_after_three_verdicts(false);
        assert!(
            line.contains(
                "process{payment.idempotency_key=\"order-7\" token.verdict=\"reserved\" \
                 payment.outcome=\"charged\"}"
            ),
            "{line}"
        );
        let coloured = line_after_three_verdicts(true);
        assert_eq!(coloured.matches("token.verdict").count(), 1, "{coloured:?}");
        assert!(!coloured.contains("in_flight"), "{coloured:?}");
        assert!(coloured.contains("reserved"), "{coloured:?}");
    }

    #[test]
    fn dropping_a_field_leaves_its_neighbours_whole() {
        for (formatted, expected) in [
            ("a=1 token.verdict=\"x\" b=2", "a=1 b=2"),
            ("token.verdict=\"x\" b=2", "b=2"),
            ("a=1 token.verdict=\"x\"", "a=1"),
            ("token.verdict=\"x\"", ""),
            (
                "my.token.verdict=1 token.verdicts=2",
                "my.token.verdict=1 token.verdicts=2",
            ),
        ] {
            let mut formatted = formatted.to_owned();
            drop_field(&mut formatted, "token.verdict");
            assert_eq!(formatted, expected);
        }
    }
}
