//! A payment command as it arrives on the commands topic (docs/CONTRACT.md, "Messages"): parsed once,
//! validated completely, and from then on only handled as a [`PaymentCommand`].
//!
//! The payment method is treated as a credential reference. It lives in a private
//! field, `Debug` redacts it, and no error message ever contains it, so a command
//! (or a rejection) can be logged without leaking it. A value that looks like a
//! raw card number (PAN) is rejected outright: storing it would put the whole
//! system in PCI scope.
mod card;
mod command_type;
mod currency;
mod envelope;
mod fingerprint;
mod invalid;
mod payment_command;
mod refund_command;
#[cfg(test)]
mod text_properties;

pub use card::{dead_letter_redaction, mask_card_numbers, redact_payload, RedactedPayload};
pub use command_type::{Command, CommandKind};
pub use fingerprint::Fingerprint;
pub use invalid::{InvalidCommand, TextProblem};
pub use payment_command::{
    PaymentCommand, MAX_ACCOUNT_ID_LEN, MAX_AMOUNT_MINOR, MAX_DESCRIPTION_LEN,
    MAX_PAYMENT_METHOD_LEN, MIN_AMOUNT_MINOR,
};
pub use refund_command::RefundCommand;
