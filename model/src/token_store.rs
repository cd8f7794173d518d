//! The token store's operations on the model's one token, as the Lua scripts and
//! the Postgres store apply them: reserve, extend, confirm, restore. Both stores
//! answer alike; only Redis can lose every token (`State::token = None`), and only
//! the Postgres store completes the token inside the payment's COMMIT.

use payment_worker::token::{Predecessor, Reservation, Transition};

use crate::state::{Owner, Row, State, Token};

/// The owner string the code's `Predecessor::Holder` carries.
pub fn owner_name(owner: Owner) -> String {
    format!("w:{owner}")
}

/// `reserve` in implicit mode: a missing token is made at fence 1.
pub fn reserve(state: &mut State, owner: Owner) -> Reservation {
    let (fence, predecessor) = match state.token {
        None => (1, Predecessor::Nobody),
        Some(Token::Pending { fence, holder }) => (fence + 1, holder_of(holder)),
        Some(Token::Processing {
            fence,
            owner: held,
            live: false,
        }) => (fence + 1, holder_of(held)),
        Some(Token::Processing { live: true, .. }) => {
            return Reservation::InFlight {
                lease_left: std::time::Duration::from_secs(1),
            }
        }
        Some(Token::Completed) => {
            return Reservation::Completed {
                payment_id: uuid::Uuid::nil(),
                fingerprint: Some(String::new()),
            }
        }
    };
    state.token = Some(Token::Processing {
        fence,
        owner,
        live: true,
    });
    Reservation::Reserved {
        fence: u64::from(fence),
        predecessor,
    }
}

fn holder_of(owner: Owner) -> Predecessor {
    if owner == 0 {
        Predecessor::Unknown
    } else {
        Predecessor::Holder(owner_name(owner))
    }
}

fn held_by(state: &State, owner: Owner) -> bool {
    matches!(state.token, Some(Token::Processing { owner: held, .. }) if held == owner)
}

/// `extend` (a lease check, a renewal, the fence check before COMMIT): renews the
/// lease of the owner still named on the token.
pub fn extend(state: &mut State, owner: Owner) -> Transition {
    match state.token {
        Some(Token::Processing {
            fence, owner: held, ..
        }) if held == owner => {
            state.token = Some(Token::Processing {
                fence,
                owner,
                live: true,
            });
            Transition::Applied
        }
        _ => Transition::Refused,
    }
}

/// `confirm`: `processing → completed`, owner checked.
pub fn confirm(state: &mut State, owner: Owner) -> Transition {
    if held_by(state, owner) {
        state.token = Some(Token::Completed);
        Transition::Applied
    } else {
        Transition::Refused
    }
}

/// `restore`: `processing → pending`, owner checked unless `any_owner` (a mutant).
pub fn restore(state: &mut State, owner: Owner, any_owner: bool) -> Transition {
    match state.token {
        Some(Token::Processing {
            fence, owner: held, ..
        }) if held == owner || any_owner => {
            state.token = Some(Token::Pending {
                fence,
                holder: owner,
            });
            Transition::Applied
        }
        _ => Transition::Refused,
    }
}

/// The row an attempt inserted goes when its transaction ends without COMMIT.
pub fn roll_back(state: &mut State, owner: Owner) {
    if state.row == Row::Uncommitted(owner) {
        state.row = Row::None;
    }
}
