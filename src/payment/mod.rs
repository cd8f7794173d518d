mod command;
mod outcome;
mod persistence;
mod processor;

pub use command::{
    mask_card_numbers, redact_payload, Fingerprint, InvalidCommand, PaymentCommand, RedactedPayload,
};

pub use outcome::{Outcome, RejectionKind};
pub use persistence::{find_payment, PaymentRecord, PaymentStatus, SourcePosition};
pub use processor::{CommandContext, GatewayLookup, Processor};
