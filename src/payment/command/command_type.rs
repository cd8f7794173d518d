//! Which command a record carries: a charge (no `type`, or `"charge"`: every
//! producer written before refunds keeps working) or a refund (`"refund"`).

use serde_json::Value;

use super::envelope::{json_kind, read_fields, Slot};
use super::invalid::TYPE;
use super::{Fingerprint, InvalidCommand, PaymentCommand, RefundCommand};
use crate::token::IdempotencyKey;

/// A command that passed every rule of its kind.
#[derive(Debug, Clone)]
pub enum Command {
    /// Charge a payment method.
    Charge(PaymentCommand),
    /// Give back (part of) a booked charge.
    Refund(RefundCommand),
}

impl Command {
    /// Reads a record value: its `type`, then the fields of that kind of command.
    pub fn parse(payload: &[u8]) -> Result<Self, InvalidCommand> {
        let fields = read_fields(payload)?;
        match &fields.kind {
            Slot::Absent | Slot::Present(Value::Null) => {
                PaymentCommand::from_fields(&fields).map(Self::Charge)
            }
            Slot::Present(Value::String(kind)) => match kind.as_str() {
                "charge" => PaymentCommand::from_fields(&fields).map(Self::Charge),
                "refund" => RefundCommand::from_fields(&fields).map(Self::Refund),
                _ => Err(InvalidCommand::UnknownCommandType),
            },
            Slot::Present(other) => Err(InvalidCommand::WrongType {
                field: TYPE,
                expected: "a string",
                found: json_kind(other),
            }),
        }
    }

    /// The command's own key.
    pub fn idempotency_key(&self) -> &IdempotencyKey {
        match self {
            Self::Charge(charge) => &charge.idempotency_key,
            Self::Refund(refund) => &refund.idempotency_key,
        }
    }

    /// What makes two commands under one key the same request.
    pub fn fingerprint(&self) -> Fingerprint {
        match self {
            Self::Charge(charge) => charge.fingerprint(),
            Self::Refund(refund) => refund.fingerprint(),
        }
    }

    /// A charge or a refund.
    pub fn kind(&self) -> CommandKind {
        match self {
            Self::Charge(_) => CommandKind::Charge,
            Self::Refund(_) => CommandKind::Refund,
        }
    }
}

/// What a command asks the gateway for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandKind {
    /// A charge.
    Charge,
    /// A refund.
    Refund,
}

impl CommandKind {
    /// `charge` or `refund` (a low-cardinality label; the `kind` column).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Charge => "charge",
            Self::Refund => "refund",
        }
    }
}

impl From<PaymentCommand> for Command {
    fn from(charge: PaymentCommand) -> Self {
        Self::Charge(charge)
    }
}
