//! The processor's pure decisions: given what an attempt knows, what it does next.
//! No I/O here: the processor (processor.rs, processor/charging.rs) performs the
//! steps, these functions choose them. They are public under the `model-testing`
//! feature so the model checker (model/) calls the very same rules: a change to
//! one of them changes, or breaks the build of, the model that checks it.

use super::outcome::ChargeEvidence;
use crate::gateway::{GatewayError, LeaseLoss};

/// When the processor asks the gateway for an existing charge before charging.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum GatewayLookup {
    /// After a timeout, or when the reservation is not the first (fence > 1).
    #[default]
    Uncertain,
    /// Before every charge: safe even against a gateway that ignores idempotency keys.
    Always,
}

/// What an attempt knows, before it charges, of an earlier charge for its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChargeHistory {
    /// The first reservation of the key, and no command with it was ever given up
    /// on with its charge unknown.
    Fresh,
    /// Not the first reservation (fence > 1): an earlier holder may have charged.
    Reserved,
    /// The key is in `unresolved_charges` (an earlier delivery ended while a charge
    /// may exist), or an earlier attempt of this delivery (or the token's previous
    /// holder) may have charged. Whatever the fence (a redrive after the token
    /// expired starts at 1), the charge is looked up first, and a look-up that
    /// cannot answer keeps the charge unknown.
    Unresolved,
}

/// The history an attempt holding the token under `fence` starts from:
/// `remembered_unknown` when the key is in `unresolved_charges`, `earlier` what this
/// delivery's attempts (or the previous holder) left.
pub fn charge_history(
    remembered_unknown: bool,
    earlier: ChargeEvidence,
    fence: u64,
) -> ChargeHistory {
    if remembered_unknown || earlier == ChargeEvidence::MayHaveCharged {
        ChargeHistory::Unresolved
    } else if fence > 1 {
        ChargeHistory::Reserved
    } else {
        ChargeHistory::Fresh
    }
}

/// What an attempt that holds the token does at the gateway first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FirstStep {
    /// Ask the gateway for a charge under the key before any POST.
    LookUp,
    /// POST the charge (the gateway's key joins a repeat).
    Charge,
}

/// Look up first unless the policy trusts the gateway's key and nobody can have
/// charged before.
pub fn first_step(lookup: GatewayLookup, history: ChargeHistory) -> FirstStep {
    if lookup == GatewayLookup::Always || history != ChargeHistory::Fresh {
        FirstStep::LookUp
    } else {
        FirstStep::Charge
    }
}

/// What a look-up before charging that could not answer leaves: a charge already
/// unknown stays unknown; otherwise nothing new was learnt.
pub fn failed_lookup_evidence(history: ChargeHistory) -> ChargeEvidence {
    match history {
        ChargeHistory::Unresolved => ChargeEvidence::MayHaveCharged,
        ChargeHistory::Fresh | ChargeHistory::Reserved => ChargeEvidence::Unchanged,
    }
}

/// Why an answer to a charge says nothing of whether it charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnknownCause {
    /// No answer in time.
    Timeout,
    /// An answer that cannot be read.
    Unreadable,
    /// 409: a request with the key is still being worked on.
    InFlight,
}

/// What a failed charge leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OnChargeError {
    /// The lease check refused the POST: nothing was sent, the new owner decides.
    LeaveNothingSent,
    /// Nothing was charged: restore the token and try again.
    RestoreRetry,
    /// The outcome is unknown: look the charge up now ([`settle_unknown`]).
    Resolve(UnknownCause),
    /// A 5xx after sending: restore, and the charge stays unknown (the next holder,
    /// fence + 1, looks it up before any POST).
    RestoreUnknown,
    /// 422: the key was used for another request (final).
    KeyReused,
    /// Refused for good without charging (final).
    Rejected,
}

/// Classifies the gateway's answer to a charge.
pub fn on_charge_error(error: &GatewayError) -> OnChargeError {
    match error {
        GatewayError::LeaseNotHeld(LeaseLoss::Lost) => OnChargeError::LeaveNothingSent,
        GatewayError::LeaseNotHeld(LeaseLoss::Unchecked(_)) => OnChargeError::RestoreRetry,
        GatewayError::Timeout => OnChargeError::Resolve(UnknownCause::Timeout),
        GatewayError::UnreadableAnswer(_) => OnChargeError::Resolve(UnknownCause::Unreadable),
        GatewayError::InFlight => OnChargeError::Resolve(UnknownCause::InFlight),
        GatewayError::FailedAfterSending { .. } => OnChargeError::RestoreUnknown,
        GatewayError::Rejected { status: 422, .. } => OnChargeError::KeyReused,
        GatewayError::Rejected { .. } => OnChargeError::Rejected,
        GatewayError::Unavailable(_) | GatewayError::Protocol(_) => OnChargeError::RestoreRetry,
    }
}

/// What the look-up after an unknown outcome answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LookupAnswer {
    /// A charge under the key.
    Found,
    /// No charge shows yet (the request may still land).
    NoneYet,
    /// The look-up failed.
    Failed,
}

/// How an unknown outcome is settled once looked up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SettleBy {
    /// Book the charge found.
    Book,
    /// Restore the token, the charge still unknown: every later reservation looks up
    /// before it POSTs, and the gateway answers a repeated key with its first answer.
    RestoreUnknown,
    /// Leave the token to its lease, the charge unknown: the next owner (fence + 1)
    /// looks again after the lease.
    LeaveUnknown,
}

/// An unknown outcome is never restored on a guess: a charge found is booked; none
/// yet after a timeout or a 409 restores (the charge stays unknown); none after an
/// unreadable answer, or a failed look-up, leaves the token to its lease.
pub fn settle_unknown(cause: UnknownCause, answer: LookupAnswer) -> SettleBy {
    match (answer, cause) {
        (LookupAnswer::Found, _) => SettleBy::Book,
        (LookupAnswer::NoneYet, UnknownCause::Unreadable) => SettleBy::LeaveUnknown,
        (LookupAnswer::NoneYet, UnknownCause::Timeout | UnknownCause::InFlight) => {
            SettleBy::RestoreUnknown
        }
        (LookupAnswer::Failed, _) => SettleBy::LeaveUnknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_fresh_history_under_the_uncertain_policy_charges_first() {
        let unknown = ChargeEvidence::MayHaveCharged;
        let none = ChargeEvidence::Unchanged;
        assert_eq!(charge_history(false, none, 1), ChargeHistory::Fresh);
        assert_eq!(charge_history(false, none, 2), ChargeHistory::Reserved);
        assert_eq!(charge_history(true, none, 1), ChargeHistory::Unresolved);
        assert_eq!(charge_history(false, unknown, 1), ChargeHistory::Unresolved);
        let uncertain = GatewayLookup::Uncertain;
        assert_eq!(
            first_step(uncertain, ChargeHistory::Fresh),
            FirstStep::Charge
        );
        assert_eq!(
            first_step(uncertain, ChargeHistory::Reserved),
            FirstStep::LookUp
        );
        assert_eq!(
            first_step(GatewayLookup::Always, ChargeHistory::Fresh),
            FirstStep::LookUp
        );
        assert_eq!(failed_lookup_evidence(ChargeHistory::Unresolved), unknown);
        assert_eq!(failed_lookup_evidence(ChargeHistory::Reserved), none);
    }

    #[test]
    fn an_unknown_outcome_is_never_restored_as_if_nothing_was_charged() {
        use LookupAnswer::*;
        use UnknownCause::*;
        assert_eq!(settle_unknown(Timeout, Found), SettleBy::Book);
        assert_eq!(settle_unknown(Timeout, NoneYet), SettleBy::RestoreUnknown);
        assert_eq!(settle_unknown(InFlight, NoneYet), SettleBy::RestoreUnknown);
        assert_eq!(settle_unknown(Unreadable, NoneYet), SettleBy::LeaveUnknown);
        assert_eq!(settle_unknown(Timeout, Failed), SettleBy::LeaveUnknown);
        assert_eq!(
            on_charge_error(&GatewayError::FailedAfterSending {
                status: 502,
                reason: String::new()
            }),
            OnChargeError::RestoreUnknown
        );
        assert_eq!(
            on_charge_error(&GatewayError::LeaseNotHeld(LeaseLoss::Lost)),
            OnChargeError::LeaveNothingSent
        );
    }
}
