//! `audit`: reconciling the gateway ledger, the payments table and the tokens.

mod reconcile;
mod refunds;
