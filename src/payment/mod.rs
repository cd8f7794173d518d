mod command;
#[cfg(feature = "model-testing")]
pub mod decisions;
#[cfg(not(feature = "model-testing"))]
mod decisions;
mod outcome;
mod persistence;
mod processor;
mod refunds;
mod unresolved;

pub use command::{
    dead_letter_redaction, mask_card_numbers, redact_payload, Command, CommandKind, Fingerprint,
    InvalidCommand, PaymentCommand, RedactedPayload, RefundCommand,
};

pub use decisions::GatewayLookup;
pub use outcome::{Attempt, ChargeEvidence, OriginalAnswer, Outcome, RejectionKind};
pub use persistence::{
    booked_payments, delete_payments_with_prefix, find_payment, payments_table_exists,
    BookedPayment, PaymentRecord, PaymentStatus, SourcePosition,
};
pub use processor::{ChargeAtStake, CommandContext, Processor, Watched, WAITING_FOR_PAYMENT};
pub use refunds::{
    find_refund, lock_refund, record_refund, refunded_of, Locked, RefundRecord, RefundStatus,
};
pub use unresolved::{record_unresolved_stake, unresolved_charges, UnresolvedCharge};
