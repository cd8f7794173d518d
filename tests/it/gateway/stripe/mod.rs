//! `--gateway stripe`: the PaymentIntents adapter against localstripe (a stateful
//! Stripe fake that ignores `Idempotency-Key`) and, for what localstripe cannot do,
//! against a scripted Stripe-like server; crashes between the two phases; a group
//! of worker processes with kills, a Redis flush and a replay.

mod crashes;
mod group;
mod localstripe;
mod scripted;
