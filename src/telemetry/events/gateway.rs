//! Gateway calls that did not answer usably.

use std::fmt::Display;

use opentelemetry::{KeyValue, Value};

use super::InternalEvent;
use crate::telemetry::metrics::metrics;

/// A gateway call failed (`payment_worker.gateway.failures`, by operation, class and
/// HTTP status). Logged at `error` when the gateway refuses our access (401, 403,
/// 404, 405: credentials, URL or method), at `warn` otherwise. The gateway's error
/// text and the request body stay out of the log: either could echo a payment method.
pub struct GatewayCallFailed<'a> {
    /// The payment's key (written by its own `Display`, which redacts card numbers).
    pub key: &'a dyn Display,
    /// `charge`, `lookup`, …
    pub operation: &'static str,
    /// What the failure means for the charge: `unknown_outcome`, `transient`, …
    pub class: &'static str,
    /// The HTTP status, when an answer came.
    pub status: Option<u16>,
    /// The failure; logged only for a transport failure (no status), whose
    /// description names the host and the cause only.
    pub error: &'a dyn Display,
}

impl InternalEvent for GatewayCallFailed<'_> {
    fn emit(self) {
        count_failure(self.operation, self.class, self.status);
        let (key, operation, class) = (self.key, self.operation, self.class);
        match self.status {
            Some(code @ (401 | 403 | 404 | 405)) => tracing::error!(
                idempotency_key = %key, operation, status = code, class,
                "the gateway refuses our access (credentials, URL or method): nothing was charged, retrying"
            ),
            Some(code) => tracing::warn!(
                idempotency_key = %key, operation, status = code, class,
                "gateway call failed"
            ),
            None => tracing::warn!(
                idempotency_key = %key, operation, class, error = %self.error,
                "gateway call failed"
            ),
        }
    }
}

/// A Stripe listing, looking for a create whose answer was lost, stopped before
/// covering its window (its page limit): the look-up failed, and retrying it alone
/// will not help (`payment_worker.gateway.failures`, operation `lookup`, class
/// `incomplete_listing`, no status). Logged at `error`.
pub struct GatewayListingIncomplete<'a> {
    /// The payment's key.
    pub key: &'a dyn Display,
    /// Where the listing stopped, in words.
    pub why: &'a dyn Display,
}

impl InternalEvent for GatewayListingIncomplete<'_> {
    fn emit(self) {
        count_failure("lookup", "incomplete_listing", None);
        tracing::error!(
            idempotency_key = %self.key,
            why = %self.why,
            "a listing to find a create whose answer was lost stopped before covering its \
             window: the look-up failed"
        );
    }
}

fn count_failure(operation: &'static str, class: &'static str, status: Option<u16>) {
    metrics().gateway_failures.add(
        1,
        &[
            KeyValue::new("operation", operation),
            KeyValue::new("class", class),
            KeyValue::new("http.response.status_code", status_label(status)),
        ],
    );
}

/// The status as the attribute's text ("503"; "none" without an answer). A failure
/// is off the payment's hot path: formatting its status costs nothing that matters.
fn status_label(status: Option<u16>) -> Value {
    status.map_or(Value::from("none"), |code| Value::from(code.to_string()))
}
