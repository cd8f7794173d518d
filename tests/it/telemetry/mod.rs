//! Traces, metrics and logs as an operator receives them, and what they must never carry.

mod metric_export;
pub(crate) mod metric_names;
mod otlp_tls;
mod secrets;
pub(crate) mod traces;
