//! Traces, metrics and logs as an operator receives them, and what they must never carry
//! (secrets, card numbers: `secrets.rs`, `card_numbers.rs`).

mod card_numbers;
mod events;
mod metric_export;
pub(crate) mod metric_names;
mod otlp_tls;
mod secrets;
pub(crate) mod traces;
