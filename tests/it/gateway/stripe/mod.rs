//! `--gateway stripe`: the PaymentIntents adapter against localstripe (a stateful
//! Stripe fake that ignores `Idempotency-Key`) and, for what localstripe cannot do,
//! against a scripted Stripe-like server; crashes between the two phases; a group
//! of worker processes with kills, a Redis flush and a replay; two holders racing
//! after a lost lease; listings that find a lost create; the account probed at
//! start.

mod crashes;
mod group;
mod leases;
mod listing;
mod localstripe;
mod probe;
mod refund_group;
mod refund_keys;
mod refunds;
mod scripted;
