//! What a text log line shows of a span: tracing's own field format, less the
//! fields that only describe the span to trace back ends.

use tracing::field::{Field, Visit};
use tracing_subscriber::field::{MakeVisitor, VisitFmt, VisitOutput};
use tracing_subscriber::fmt::format::{DefaultVisitor, Writer};

/// Span fields meant for trace back ends only, the same on every line of a worker.
const TRACE_ONLY_FIELDS: [&str; 5] = [
    "messaging.system",
    "messaging.operation.type",
    "messaging.operation.name",
    "messaging.destination.name",
    "messaging.consumer.group.name",
];

/// The text log format's fields: tracing's own, without `otel.*` and
/// [`TRACE_ONLY_FIELDS`]. The log layer formats the command span's fields when the
/// span opens, whether or not a line is ever printed under it; formatting these
/// for every command cost the worker a few per cent of its CPU, for nothing a
/// reader of the logs needs.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogFields;

impl<'writer> MakeVisitor<Writer<'writer>> for LogFields {
    type Visitor = LogFieldVisitor<DefaultVisitor<'writer>>;

    fn make_visitor(&self, target: Writer<'writer>) -> Self::Visitor {
        LogFieldVisitor(DefaultVisitor::new(target, true))
    }
}

/// Passes the fields a log line shows on to the visitor that formats them.
pub struct LogFieldVisitor<V>(V);

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

impl<V: VisitFmt> VisitFmt for LogFieldVisitor<V> {
    fn writer(&mut self) -> &mut dyn std::fmt::Write {
        self.0.writer()
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

    #[test]
    fn log_lines_keep_what_an_operator_reads_and_leave_out_trace_only_fields() {
        let captured = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .fmt_fields(LogFields)
            .with_writer(captured.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
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
        let line = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
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
}
