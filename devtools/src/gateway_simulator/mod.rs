//! An in-memory payment gateway speaking the gateway contract (docs/CONTRACT.md), with fault injection, so the
//! worker's exactly-once behaviour can be tested against timeouts, outages,
//! declines and a gateway that ignores idempotency keys.
//!
//! Routes:
//! - `POST /charges` (header `Idempotency-Key`, body `{amount_minor, currency,
//!   payment_method}`) → 200 `{transaction_id, status}`; the same key replays the
//!   first answer (and counts an attempt); the same key with another body → 422;
//!   a missing or invalid key or body → 400; an injected fault → 503.
//! - `GET /charges/{key}` → the (latest) charge made under `key`, or 404.
//! - `GET /charges` → the whole ledger as a JSON array of [`LedgerEntry`];
//!   `?idempotency_key=K` narrows it to one key (the way to ask for the keys `.`
//!   and `..`, which cannot travel as a path segment).
//! - `POST /refunds` (header `Idempotency-Key`, body `{payment_transaction_id,
//!   amount_minor, currency}`) → 200 `{transaction_id, status}` (`approved` =
//!   refunded, `declined` = refused by the gateway); the same key replays the
//!   first answer and never refunds twice; another body → 422. Refused with 400
//!   and nothing stored: `charge_not_found` (no charge has that transaction id),
//!   `charge_not_refundable` (a declined charge), `currency_mismatch`,
//!   `amount_too_large` (with the charge's approved refunds it would exceed the
//!   amount charged). The fault flags apply to refunds as to charges.
//! - `GET /refunds/{key}` → the refund made under `key`, or 404; `GET /refunds`
//!   → every refund ([`RefundEntry`](payment_worker::gateway::RefundEntry)),
//!   `?idempotency_key=K` as for charges.
//! - `GET /refund-refusals` → every refused `POST /refunds` (idempotency_key,
//!   payment_transaction_id, amount_minor, reason), so a test can tell that an
//!   over-refund was asked for although nothing was stored.
//!
//! Test hook: the payment method `pm_card_declined` is always declined.
//!
//! Payment methods are never logged and never kept: a replay is matched against a
//! SHA-256 of the first request body.
mod book;
mod config;
mod ledger;
mod refunds;
mod routes;
mod server;

pub use config::{SimulatorConfig, SlowKey};
pub use refunds::RefundRefusal;
pub use server::{run_cli, GatewaySimulator, RunningSimulator};
