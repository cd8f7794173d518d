//! What a panic must not lose: the charge an attempt may have made (its POST sent,
//! or a look-up found it) until an attempt for the key answers for good.

use std::sync::{MutexGuard, PoisonError};

use super::*;

/// A charge that may exist for a key while no attempt has settled it: kept from
/// right before the POST (or from a look-up that found a charge) until an attempt
/// for the key ends with a final answer. Only a panic leaves it behind, and the
/// record given up on after its panics is then marked as possibly charged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChargeAtStake {
    /// The command's key.
    pub idempotency_key: IdempotencyKey,
    /// Amount asked for, in minor units.
    pub amount_minor: i64,
    /// ISO 4217 code.
    pub currency: String,
    /// A charge or a refund at stake.
    pub kind: CommandKind,
}

impl ChargeAtStake {
    /// What is kept of `command` while its charge (or refund) is at stake.
    pub fn of(command: &Command) -> Self {
        match command {
            Command::Charge(charge) => Self::of_charge(charge),
            Command::Refund(refund) => Self::of_refund(refund),
        }
    }

    /// What is kept of a charge while it is at stake.
    pub fn of_charge(command: &PaymentCommand) -> Self {
        Self {
            idempotency_key: command.idempotency_key.clone(),
            amount_minor: command.amount_minor,
            currency: command.currency.clone(),
            kind: CommandKind::Charge,
        }
    }

    /// What is kept of a refund while it is at stake.
    pub fn of_refund(command: &RefundCommand) -> Self {
        Self {
            idempotency_key: command.idempotency_key.clone(),
            amount_minor: command.amount_minor,
            currency: command.currency.clone(),
            kind: CommandKind::Refund,
        }
    }
}

/// A charge at stake and the command record it was made for, when the attempt knew
/// it: a record without a Kafka key is found again by its position.
#[derive(Debug, Clone)]
pub(super) struct Stake {
    charge: ChargeAtStake,
    record: Option<SourcePosition>,
}

impl Processor {
    /// The charge that may exist for `key` after attempts that never ended (a panic
    /// after the POST). It stays listed until an attempt for the key answers for
    /// good: in exactly-once mode a dead letter given up on after panics may be
    /// aborted with its transaction and given up on again, flagged again.
    pub fn charge_at_stake(&self, key: &str) -> Option<ChargeAtStake> {
        self.stakes().get(key).map(|stake| stake.charge.clone())
    }

    /// The charge at stake for the command record at `record`: by its Kafka key when
    /// it has one (a command's key is its record key), else by the record's position,
    /// which the attempts noted. A record without a key that panicked after its POST
    /// is flagged like any other.
    pub fn charge_at_stake_of(
        &self,
        record_key: Option<&str>,
        record: &SourcePosition,
    ) -> Option<ChargeAtStake> {
        let stakes = self.stakes();
        match record_key {
            // A refund may be keyed by its payment's key: then its position finds it.
            Some(key) => stakes
                .get(key)
                .or_else(|| {
                    stakes
                        .values()
                        .find(|stake| stake.record.as_ref() == Some(record))
                })
                .map(|stake| stake.charge.clone()),
            // Only charges between their POST and a final answer are listed: a few.
            None => stakes
                .values()
                .find(|stake| stake.record.as_ref() == Some(record))
                .map(|stake| stake.charge.clone()),
        }
    }

    fn stakes(&self) -> MutexGuard<'_, HashMap<String, Stake>> {
        // Only inserts and removes happen under the lock: a poisoned map is whole.
        self.at_stake.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// From here on a charge may exist for `command` (read from `record`) that no
    /// row records.
    pub(super) fn mark_at_stake(&self, charge: ChargeAtStake, record: Option<&SourcePosition>) {
        self.stakes().insert(
            charge.idempotency_key.as_str().to_owned(),
            Stake {
                charge,
                record: record.cloned(),
            },
        );
    }

    /// An attempt for `key` answered for good: nothing is at stake any more.
    pub(super) fn settle_stake(&self, key: &str) {
        self.stakes().remove(key);
    }
}
