//! The invariants, as stateright properties. Liveness is stated as safety at
//! quiescence (every worker idle, nothing queued at the gateway, the offset
//! committed): stateright 0.31's `eventually` judges terminal states only.

use stateright::Property;

use crate::state::{Row, State, Token, Verdict};
use crate::PaymentModel;

/// I1: the key is charged at most once.
pub const AT_MOST_ONE_CHARGE: &str = "I1: at most one charge per key";
/// At quiescence every charge is booked by a row, or its key is in
/// `unresolved_charges`, or its token is left processing with no row (`audit`'s
/// stuck tokens).
pub const CHARGE_BOOKED_OR_FLAGGED: &str = "every charge booked or flagged at quiescence";
/// An offset is committed only after the record was answered.
pub const OFFSET_AFTER_ANSWER: &str = "offset committed only past a final answer";
/// At quiescence the token agrees with the row: a committed row's token is
/// completed, gone or left to its lease; no row, no completed token.
pub const NO_TOKEN_STUCK: &str = "no token stuck at quiescence";
/// I5: a payment is committed only by the token's current holder.
pub const FENCED_COMMIT: &str = "I5: only the token's holder commits";
/// Every duplicate answers the original's answer.
pub const DUPLICATE_ANSWERS_ORIGINAL: &str = "a duplicate answers the original";

pub fn all() -> Vec<Property<PaymentModel>> {
    vec![
        Property::always(AT_MOST_ONE_CHARGE, |_, s: &State| s.gateway.charges <= 1),
        Property::always(CHARGE_BOOKED_OR_FLAGGED, |_, s: &State| {
            !s.quiescent()
                || s.gateway.charges == 0
                || s.row == Row::Committed(Verdict::Approved)
                || s.unresolved
                // `audit` lists a token left processing past its lease with no
                // committed row as a stuck token (src/audit/checks.rs).
                || (matches!(s.token, Some(Token::Processing { .. })) && s.row == Row::None)
        }),
        Property::always(OFFSET_AFTER_ANSWER, |_, s: &State| !s.offset_unanswered),
        Property::always(NO_TOKEN_STUCK, |_, s: &State| {
            !s.quiescent()
                || match s.row {
                    Row::Committed(_) => !matches!(s.token, Some(Token::Pending { .. })),
                    _ => s.token != Some(Token::Completed),
                }
        }),
        Property::always(FENCED_COMMIT, |_, s: &State| !s.stale_commit),
        Property::always(DUPLICATE_ANSWERS_ORIGINAL, |_, s: &State| {
            !s.wrong_duplicate
        }),
        // Reachability: the model does reach what the properties talk about.
        Property::sometimes("a charge is booked", |_, s: &State| {
            s.row == Row::Committed(Verdict::Approved)
        }),
        Property::sometimes("a duplicate is answered", |_, s: &State| {
            s.duplicate_answered
        }),
        Property::sometimes("a delivery ends with its charge unknown", |_, s: &State| {
            s.unresolved && s.quiescent()
        }),
    ]
}
