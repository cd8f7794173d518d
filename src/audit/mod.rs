//! `payment-worker audit`: reconciles the gateway ledger, the `payments` table and
//! the token store against the invariants I1–I7 (docs/CONTRACT.md), the gateway's refunds
//! against the `refunds` rows (R1–R3), and repairs stuck tokens and refunds.
mod args;
mod books;
mod checks;
mod refund_books;
mod refund_repair;
mod refund_rows;
mod repair;
mod report;

pub use args::{run, AuditArgs, ViolationsFound};
pub use books::{reconcile, Books};
pub use checks::{audit, AuditOptions};
pub use repair::{RepairAction, TokenRepair};
pub use report::{AuditReport, Example, Finding, MAX_EXAMPLES};
