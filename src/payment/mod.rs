mod command;
mod outcome;
mod persistence;
mod processor;

pub use command::{Fingerprint, InvalidCommand, PaymentCommand};

pub use outcome::{Outcome, RejectionKind};
pub use persistence::{find_payment, PaymentRecord, PaymentStatus, SourcePosition};
pub use processor::{CommandContext, GatewayLookup, Processor};
