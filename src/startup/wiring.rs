//! Wiring: the gateway client, the processor and the record handler, built from
//! settings.

use std::sync::Arc;

use crate::configuration::{GatewaySettings, KafkaSettings, ProcessorSettings, WorkerSettings};
use crate::gateway::{HttpGateway, PaymentGateway};
use crate::payment::Processor;
use crate::retry::RetryPolicy;
use crate::worker::{Handler, Publisher};

use super::stores::{check_connection_budget, open_stores};

/// The HTTP gateway client `settings` describe.
pub fn gateway(settings: &GatewaySettings) -> anyhow::Result<Arc<dyn PaymentGateway>> {
    Ok(Arc::new(HttpGateway::new(
        &settings.url,
        settings.timeout,
        settings.connect_timeout,
    )?))
}

/// The processor of `run` and `process`: stores opened (and the connection budget
/// checked), gateway client built, attempts owned by `worker_id`.
pub async fn build_processor(
    settings: &ProcessorSettings,
    worker_id: &str,
) -> anyhow::Result<Processor> {
    let (pool, tokens) = open_stores(&settings.stores).await?;
    check_connection_budget(&settings.stores, &pool).await?;
    let gateway = gateway(&settings.gateway)?;
    Ok(Processor::new(
        tokens,
        gateway,
        pool,
        settings.gateway.lookup,
        worker_id,
    ))
}

/// The handler of `run`: `processor` behind the retry budget of `worker`, results
/// and dead letters published to the topics of `kafka`.
pub fn handler(
    processor: Arc<Processor>,
    kafka: &KafkaSettings,
    worker: &WorkerSettings,
) -> anyhow::Result<Arc<Handler>> {
    let retry = RetryPolicy {
        budget: worker.retry_budget,
        ..RetryPolicy::default()
    };
    Ok(Arc::new(Handler::new(
        processor,
        Publisher::for_mode(kafka, worker)?,
        retry,
    )))
}
