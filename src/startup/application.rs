//! The worker process as one object, built from its settings and then run until a
//! shutdown: `run` on the command line is `Application::build(…)` then `run_until`.
//! Building connects the stores, opens every payment connection and wires the
//! handler, each step stoppable by the shutdown signal; nothing polls Kafka before
//! all of it is ready.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::configuration::{KafkaSettings, ProcessorSettings, WorkerSettings};
use crate::worker::{self, Handler};

use super::{build_processor, handler, open_all_connections, spawn_token_purge};

/// Everything `run` is given.
#[derive(Debug)]
pub struct RunSettings {
    /// The worker's Kafka topics, group and client settings.
    pub kafka: KafkaSettings,
    /// How the worker admits, retries and drains commands.
    pub worker: WorkerSettings,
    /// Stores and gateway.
    pub processor: ProcessorSettings,
}

/// A worker ready to join its group: stores connected, the payment pool open,
/// the token purge running.
pub struct Application {
    kafka: KafkaSettings,
    worker: WorkerSettings,
    handler: Arc<Handler>,
    // Runs as long as the process: the purge of expired token rows (Postgres store).
    _purge: tokio::task::JoinHandle<()>,
}

/// The shutdown signal, awaited by every step of the start and then by the run.
pub type Shutdown = Pin<Box<dyn Future<Output = ()> + Send>>;

impl Application {
    /// Checks the settings, connects and wires; `None` when `shutdown` came first
    /// (the process then ends at once, exit 0).
    pub async fn build(
        settings: RunSettings,
        shutdown: &mut Shutdown,
    ) -> anyhow::Result<Option<Self>> {
        let RunSettings {
            kafka,
            worker,
            processor: settings,
        } = settings;
        // Before any connection (and any migration): a refused Kafka setting or
        // drain deadline is a configuration error.
        kafka.check_topics()?;
        kafka.check_passthrough()?;
        worker::check_drain_fits_session(&kafka, &worker)?;
        let worker_id = worker.worker_id();
        tracing::info!(?kafka, ?worker, processor = ?settings, %worker_id, "starting worker");
        check_drain_deadline(&worker, &settings);
        check_lifetimes(&worker, &settings);
        let processor = tokio::select! {
            built = build_processor(&settings, &worker_id) => Arc::new(built?),
            () = &mut *shutdown => {
                tracing::info!("stopped while connecting to the stores");
                return Ok(None);
            }
        };
        // Every payment connection open before the first poll: the first burst of a
        // backlog must not open them all at once while its payments wait.
        tokio::select! {
            opened = open_all_connections(processor.pool()) => opened?,
            () = &mut *shutdown => {
                tracing::info!("stopped while opening the payment pool");
                return Ok(None);
            }
        }
        tracing::info!(
            payments_at_once = processor.attempt_slots(),
            admitted_per_partition = worker.max_in_flight,
            "payments run at most one per payment-pool connection; admitted commands beyond that wait before reserving their token"
        );
        let purge = spawn_token_purge(Arc::clone(processor.tokens()), &settings.stores.token_table);
        let handler = handler(processor, &kafka, &worker)?;
        Ok(Some(Self {
            kafka,
            worker,
            handler,
            _purge: purge,
        }))
    }

    /// Joins the group and processes commands until `shutdown`; then drains,
    /// commits and leaves the group.
    pub async fn run_until(self, shutdown: Shutdown) -> anyhow::Result<()> {
        worker::run_until(&self.kafka, &self.worker, self.handler, shutdown).await
    }
}

/// A drain that can outlast its deadline abandons in-flight commands at every
/// rebalance (safe, but they are redone by the next owner after their lease).
fn check_drain_deadline(worker: &WorkerSettings, processor: &ProcessorSettings) {
    let bound = worker::drain_bound(
        worker.max_in_flight,
        processor.gateway.timeout,
        processor.stores.database.max_connections,
    );
    if worker.drain_deadline < bound {
        tracing::warn!(
            drain_deadline = ?worker.drain_deadline,
            drain_bound = ?bound,
            "a drain may outlast --drain-deadline when the gateway answers at its timeout: \
             lower --gateway-timeout or --max-in-flight, or raise --drain-deadline (below the session timeout)"
        );
    } else {
        tracing::info!(drain_deadline = ?worker.drain_deadline, drain_bound = ?bound, "drains fit their deadline");
    }
}

/// Two lifetimes must outlast a charge whose outcome is unknown, which waits for its
/// lease to end (the token is ours until then) and is then looked up: the retry
/// budget, or the command is dead-lettered `retries_exhausted` before the look-up
/// could settle it; and the token's own TTL, or a restore deletes the expired token
/// and the next reservation, fence 1 again, charges without looking up first.
fn check_lifetimes(worker: &WorkerSettings, processor: &ProcessorSettings) {
    let tokens = &processor.stores.tokens;
    let unknown_settles_within = tokens.lease + processor.gateway.timeout * 2;
    if worker.retry_budget < unknown_settles_within {
        tracing::warn!(
            retry_budget = ?worker.retry_budget,
            lease = ?tokens.lease,
            gateway_timeout = ?processor.gateway.timeout,
            "a charge with an unknown outcome waits out its lease before it is looked up: \
             a retry budget shorter than the lease plus two gateway timeouts dead-letters it \
             as retries_exhausted first; raise --retry-budget or lower --lease"
        );
    }
    if tokens.pending_ttl < unknown_settles_within {
        tracing::warn!(
            token_ttl = ?tokens.pending_ttl,
            lease = ?tokens.lease,
            gateway_timeout = ?processor.gateway.timeout,
            "a token may expire while its charge is unknown; the next reservation then \
             starts a new token and charges without looking up first: raise --token-ttl"
        );
    }
}
