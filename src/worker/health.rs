//! `/healthz` and `/readyz`, and the facts they are computed from.
//!
//! Liveness is "the poll loop polled recently": a worker whose poll thread is
//! stuck still answers HTTP, so a constant "ok" would hide exactly the failure an
//! orchestrator must restart. Readiness is "a member of the group, not draining,
//! and both stores answer". With `OTEL_METRICS_EXPORTER=prometheus` the same
//! listener serves `/metrics` (Prometheus text, `telemetry/prometheus.rs`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::http::StatusCode;
use sqlx::{ConnectOptions, PgConnection};

use crate::payment::Processor;
use crate::token::IdempotencyKey;

/// What the poll thread reports about itself; read by the health endpoints and
/// the supervisor.
#[derive(Debug)]
pub struct Liveness {
    epoch: Instant,
    last_poll_ms: AtomicU64,
    in_group: AtomicBool,
    draining: AtomicBool,
}

impl Default for Liveness {
    fn default() -> Self {
        Self {
            epoch: Instant::now(),
            last_poll_ms: AtomicU64::new(0),
            in_group: AtomicBool::new(false),
            draining: AtomicBool::new(false),
        }
    }
}

impl Liveness {
    /// The poll loop just returned from `poll`.
    pub fn polled(&self) {
        let now = self.epoch.elapsed().as_millis() as u64;
        self.last_poll_ms.store(now, Ordering::Relaxed);
    }

    /// Time since the poll loop last polled.
    pub fn since_last_poll(&self) -> Duration {
        let last = Duration::from_millis(self.last_poll_ms.load(Ordering::Relaxed));
        self.epoch.elapsed().saturating_sub(last)
    }

    /// Records whether the member holds a group membership.
    pub fn set_in_group(&self, in_group: bool) {
        self.in_group.store(in_group, Ordering::SeqCst);
    }

    /// Whether the member holds its group membership (its last rebalance event was
    /// an assignment, possibly of no partitions).
    pub fn in_group(&self) -> bool {
        self.in_group.load(Ordering::SeqCst)
    }

    /// Shutting down: orchestrators should stop counting on this member.
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Whether a drain is running.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }
}

/// How long a store may take to answer a readiness probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The inputs of the two endpoints.
#[derive(Clone)]
pub struct HealthChecks {
    /// What the poll loop reports.
    pub liveness: Arc<Liveness>,
    /// `/healthz` fails once the poll loop has not polled for this long (the
    /// session timeout: by then the group has given up on this member anyway).
    pub stall_limit: Duration,
    /// The processor whose stores `/readyz` asks.
    pub processor: Arc<Processor>,
    /// `/readyz`'s own connection to Postgres.
    pub probe: PostgresProbe,
}

/// `/readyz`'s own connection to Postgres, opened on first use and again after a
/// failure. Not one of the payment pool's: that pool has one connection per payment
/// allowed at once, and a payment holds its connection across the gateway call, so
/// under a slow gateway the probe would wait behind them and report a database that
/// answers as down.
#[derive(Clone, Default)]
pub struct PostgresProbe {
    connection: Arc<tokio::sync::Mutex<Option<PgConnection>>>,
}

impl PostgresProbe {
    async fn select_one(&self, processor: &Processor) -> Result<(), sqlx::Error> {
        let mut slot = self.connection.lock().await;
        let mut connection = match slot.take() {
            Some(connection) => connection,
            None => processor.pool().connect_options().connect().await?,
        };
        // Named: a checked statement's columns become fields, and `?column?` cannot.
        // Its one row is read and dropped (a checked query with columns has no
        // `execute`): the same one round trip.
        sqlx::query!("SELECT 1 AS alive")
            .fetch_one(&mut connection)
            .await?;
        // Kept only once it answered: a broken or timed-out one is opened anew.
        *slot = Some(connection);
        Ok(())
    }
}

impl HealthChecks {
    fn healthz(&self) -> (StatusCode, String) {
        let since = self.liveness.since_last_poll();
        if since > self.stall_limit {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("poll loop has not polled for {} ms", since.as_millis()),
            )
        } else {
            (StatusCode::OK, "ok".to_owned())
        }
    }

    async fn readyz(&self) -> (StatusCode, String) {
        let unavailable = |why: String| (StatusCode::SERVICE_UNAVAILABLE, why);
        if self.liveness.draining() {
            return unavailable("draining".to_owned());
        }
        if !self.liveness.in_group() {
            return unavailable("not a member of the consumer group".to_owned());
        }
        // A stalled poll loop reads no command, whatever the group and the stores
        // say (the group's view is only updated by that loop's rebalance callback).
        let (alive, stalled) = self.healthz();
        if alive != StatusCode::OK {
            return unavailable(stalled);
        }
        // Both stores at once, each within its own deadline: a cut Postgres does not
        // hide the state of Redis behind its time-out (the two together stay within
        // a probe's few seconds), and the answer names every dependency that is cut.
        let (postgres, tokens) = tokio::join!(self.postgres_state(), self.token_store_state());
        let cut: Vec<String> = [postgres, tokens].into_iter().flatten().collect();
        if cut.is_empty() {
            (StatusCode::OK, "ready".to_owned())
        } else {
            unavailable(cut.join("; "))
        }
    }

    /// What is wrong with Postgres, if anything.
    async fn postgres_state(&self) -> Option<String> {
        let postgres = self.probe.select_one(&self.processor);
        match tokio::time::timeout(PROBE_TIMEOUT, postgres).await {
            Ok(Ok(())) => None,
            Ok(Err(error)) => Some(format!("postgres: {error}")),
            Err(_) => Some("postgres: no answer".to_owned()),
        }
    }

    /// What is wrong with the token store, if anything.
    async fn token_store_state(&self) -> Option<String> {
        if self.processor.tokens().in_transaction().is_some() {
            // The Postgres token store reads through the payment pool, whose
            // connections may all be held across gateway calls; its database is
            // probed on the probe's own connection.
            return None;
        }
        // Reading a token that never exists exercises the store's real path.
        let Ok(probe) = IdempotencyKey::try_from("readyz-probe") else {
            return Some("token store: probe key refused".to_owned());
        };
        let tokens = self.processor.tokens().show(&probe);
        match tokio::time::timeout(PROBE_TIMEOUT, tokens).await {
            Ok(Ok(_)) => None,
            Ok(Err(error)) => Some(format!("token store: {error}")),
            Err(_) => Some("token store: no answer".to_owned()),
        }
    }
}

/// Keeps the health endpoint served while alive.
pub struct HealthServer {
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for HealthServer {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// `/metrics`: what the meter provider holds now, as Prometheus text.
async fn metrics() -> (StatusCode, [(&'static str, &'static str); 1], String) {
    const TEXT: [(&str, &str); 1] = [("content-type", "text/plain; version=0.0.4; charset=utf-8")];
    match crate::telemetry::prometheus::scrape() {
        Some(Ok(text)) => (StatusCode::OK, TEXT, text),
        Some(Err(error)) => (StatusCode::INTERNAL_SERVER_ERROR, TEXT, error),
        None => (
            StatusCode::NOT_FOUND,
            TEXT,
            "metrics are not served here: set OTEL_METRICS_EXPORTER=prometheus".to_owned(),
        ),
    }
}

/// Serves `/healthz`, `/readyz` and (when enabled) `/metrics` on `listen`; nothing
/// when `listen` is `None`.
pub async fn serve_health(
    listen: Option<SocketAddr>,
    checks: HealthChecks,
) -> anyhow::Result<HealthServer> {
    let Some(listen) = listen else {
        if crate::telemetry::prometheus::enabled() {
            tracing::warn!(
                "OTEL_METRICS_EXPORTER asks for prometheus but HEALTH_LISTEN is not set: /metrics is not served"
            );
        }
        return Ok(HealthServer { task: None });
    };
    let live = checks.clone();
    let mut app = axum::Router::new()
        .route(
            "/healthz",
            axum::routing::get(move || {
                let checks = live.clone();
                async move { checks.healthz() }
            }),
        )
        .route(
            "/readyz",
            axum::routing::get(move || {
                let checks = checks.clone();
                async move { checks.readyz().await }
            }),
        );
    if crate::telemetry::prometheus::enabled() {
        app = app.route("/metrics", axum::routing::get(metrics));
    }
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding the health endpoint on {listen}"))?;
    let task = tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::warn!(%error, "health endpoint stopped");
        }
    });
    Ok(HealthServer { task: Some(task) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liveness_ages_from_the_last_poll() {
        let liveness = Liveness::default();
        std::thread::sleep(Duration::from_millis(30));
        assert!(liveness.since_last_poll() >= Duration::from_millis(30));
        liveness.polled();
        assert!(liveness.since_last_poll() < Duration::from_millis(30));
        assert!(!liveness.in_group());
        liveness.set_in_group(true);
        assert!(liveness.in_group());
    }
}
