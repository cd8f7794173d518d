//! One book of entries made under idempotency keys (the charges, the refunds):
//! each kept with the hash of the body that made it, so a POST of a key already
//! used is replayed with the first answer, or refused as another body.

use std::collections::HashMap;

use super::ledger::{Decision, Delivery};
use payment_worker::gateway::{Charge, LedgerEntry, RefundEntry};

/// An entry a book keeps: the answer it gives, and the POSTs it received.
pub(super) trait Booked: Clone {
    fn key(&self) -> &str;
    fn answer(&self) -> Charge;
    fn attempts_mut(&mut self) -> &mut u64;
}

impl Booked for LedgerEntry {
    fn key(&self) -> &str {
        &self.idempotency_key
    }

    fn answer(&self) -> Charge {
        self.charge()
    }

    fn attempts_mut(&mut self) -> &mut u64 {
        &mut self.attempts
    }
}

impl Booked for RefundEntry {
    fn key(&self) -> &str {
        &self.idempotency_key
    }

    fn answer(&self) -> Charge {
        RefundEntry::answer(self)
    }

    fn attempts_mut(&mut self) -> &mut u64 {
        &mut self.attempts
    }
}

struct Kept<P> {
    public: P,
    /// SHA-256 of the first request body (a payment method itself is not kept).
    body_hash: [u8; 32],
}

pub(super) struct Book<P> {
    entries: Vec<Kept<P>>,
    /// Key → index of its latest entry.
    latest: HashMap<String, usize>,
}

impl<P> Default for Book<P> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            latest: HashMap::new(),
        }
    }
}

impl<P: Booked> Book<P> {
    /// The decision for a POST of `key` already answered: the first answer
    /// (an attempt counted), or a conflict when the body differs. `None`: the
    /// key made nothing yet.
    pub(super) fn replay(
        &mut self,
        key: &str,
        body_hash: [u8; 32],
        delivery: Delivery,
    ) -> Option<Decision> {
        let kept = self
            .latest
            .get(key)
            .and_then(|&index| self.entries.get_mut(index))?;
        if kept.body_hash != body_hash {
            return Some(Decision::Conflict);
        }
        *kept.public.attempts_mut() += 1;
        Some(Decision::Answer {
            charge: kept.public.answer(),
            delivery,
        })
    }

    /// Keeps `public`, made by a body of this hash, as its key's latest entry.
    pub(super) fn insert(&mut self, public: P, body_hash: [u8; 32]) {
        self.latest
            .insert(public.key().to_owned(), self.entries.len());
        self.entries.push(Kept { public, body_hash });
    }

    /// The latest entry of `key`.
    pub(super) fn latest(&self, key: &str) -> Option<P> {
        self.latest
            .get(key)
            .and_then(|&index| self.entries.get(index))
            .map(|kept| kept.public.clone())
    }

    /// Every entry, or those of `key`, in the order made.
    pub(super) fn snapshot(&self, key: Option<&str>) -> Vec<P> {
        self.iter()
            .filter(|public| key.is_none_or(|key| public.key() == key))
            .cloned()
            .collect()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &P> {
        self.entries.iter().map(|kept| &kept.public)
    }
}
