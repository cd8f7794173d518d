//! Secrets out of what leaves the worker: a URL's password never reaches a log line,
//! an error message or a `Debug` output; a card number never reaches a topic, a
//! table, a log line, a span or a panic message.

#[cfg(test)]
pub(crate) mod card_cases;
mod card_numbers;
mod digits;
mod echo;
mod key_hash;
mod panics;
#[cfg(test)]
mod properties;
mod readings;
mod secret;
mod urls;

pub(crate) use card_numbers::is_invisible;
pub use card_numbers::mask_card_numbers;
pub use echo::{
    contains_card_number, holds_card_number, masked_for_echo, masked_text, masked_within,
};
pub use key_hash::{EmptyKeySecret, KeyHasher, KeySecretSource};
pub use panics::{install_panic_hook, panic_message};
pub(crate) use readings::wide_readings;
pub use secret::Secret;
pub use urls::redact_url;
