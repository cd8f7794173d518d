//! `--gateway stripe`: Stripe's PaymentIntents as the gateway. A charge is Stripe's
//! own two phases: create a PaymentIntent and record it, then confirm it.
mod adapter;
mod amount;
mod api;
mod intent_state;
mod listed;
mod lookup;
mod phases;
mod probe;
mod records;
mod refund_api;
mod refunds;

pub use adapter::{StripeGateway, StripeOptions};
pub use amount::stripe_amount;
pub use api::StripeCompat;
