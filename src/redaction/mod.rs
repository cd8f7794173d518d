//! Secrets out of what leaves the worker: a URL's password never reaches a log line,
//! an error message or a `Debug` output; a card number never reaches a topic, a log
//! line or a span.

mod card_numbers;
mod echo;
mod readings;
mod secret;
mod urls;

pub use card_numbers::{
    contains_card_number, contains_printed_card_number, mask_card_numbers,
    mask_printed_card_numbers,
};
pub use echo::{holds_card_number, key_holds_card_number, masked_for_echo};
pub(crate) use readings::wide_readings;
pub use secret::Secret;
pub use urls::redact_url;
