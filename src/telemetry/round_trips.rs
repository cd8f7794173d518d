//! Round trips, counted from the client spans the code opens for each one: a layer
//! for the benchmark and tests, where the cost of a payment is measured.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tracing_subscriber::Layer;

/// Round trips made, by peer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RoundTrips {
    /// Statements on the `payments` table (`BEGIN` and `COMMIT` included).
    pub postgres: u64,
    /// Token-store operations: one Lua script each on Redis, one statement each on
    /// the Postgres token store.
    pub token_store: u64,
    /// HTTP requests to the gateway (charges and look-ups).
    pub gateway: u64,
}

/// A layer that counts round trips: every `statement`, `token` and `gateway …` span
/// stands for exactly one request to its peer. Install it (alone or beside the
/// others) where the cost of a payment is measured: the benchmark and tests.
#[derive(Debug, Clone, Default)]
pub struct RoundTripCounter {
    postgres: Arc<AtomicU64>,
    token_store: Arc<AtomicU64>,
    gateway: Arc<AtomicU64>,
}

impl RoundTripCounter {
    /// The round trips counted so far.
    pub fn snapshot(&self) -> RoundTrips {
        RoundTrips {
            postgres: self.postgres.load(Ordering::Relaxed),
            token_store: self.token_store.load(Ordering::Relaxed),
            gateway: self.gateway.load(Ordering::Relaxed),
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for RoundTripCounter {
    fn on_new_span(
        &self,
        attributes: &tracing::span::Attributes<'_>,
        _id: &tracing::span::Id,
        _context: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let counter = match attributes.metadata().name() {
            "statement" => &self.postgres,
            "token" => &self.token_store,
            name if name.starts_with("gateway ") => &self.gateway,
            _ => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
