//! Wiring: the gateway adapter, the processor and the record handler, built from
//! settings.

use std::sync::Arc;

use crate::configuration::{
    read_named_setting_file, read_secret, DatabaseSettings, GatewayAccess, GatewayKind,
    GatewaySettings, KafkaSettings, ProcessorSettings, WorkerSettings,
};
use crate::gateway::{GatewayTransport, HttpGateway, PaymentGateway, StripeGateway, StripeOptions};
use crate::payment::Processor;
use crate::retry::RetryPolicy;
use crate::worker::{Handler, Publisher};

use super::database::connect_with_size;
use super::stores::{check_connection_budget, open_stores};

/// The gateway adapter `settings` describe, its credentials and TLS files read
/// now. The Stripe adapter records its PaymentIntents on a pool of its own
/// (`STRIPE_RECORD_CONNECTIONS`) to `database`, never on the payment pool, and
/// probes the account first: a key Stripe refuses or a server without its routes
/// is an error here.
pub async fn gateway(
    settings: &GatewaySettings,
    database: &DatabaseSettings,
) -> anyhow::Result<Arc<dyn PaymentGateway>> {
    let access = &settings.access;
    let transport = transport(access)?;
    Ok(match access.kind {
        GatewayKind::Charges => Arc::new(HttpGateway::with_transport(
            access.url(),
            settings.timeout,
            settings.connect_timeout,
            &transport,
        )?),
        GatewayKind::Stripe => {
            let records = connect_with_size(database, access.stripe.record_connections).await?;
            let gateway =
                StripeGateway::new(&stripe_options(access, settings), &transport, records)?;
            // A key or URL that cannot work ends the command here, not every payment.
            gateway.probe().await?;
            Arc::new(gateway)
        }
    })
}

/// The credentials and TLS material `access` names, read now: the API key (or its
/// file), the CA bundle, the client certificate and its key.
pub fn transport(access: &GatewayAccess) -> anyhow::Result<GatewayTransport> {
    let api_key = read_secret(
        "GATEWAY_API_KEY",
        access.api_key.as_ref(),
        access.api_key_file.as_deref(),
    )?;
    let ca_pem = access
        .ca_cert
        .as_deref()
        .map(|path| read_named_setting_file("GATEWAY_CA_CERT", path))
        .transpose()?;
    let identity_pem = match (&access.client_cert, &access.client_key) {
        (Some(cert), Some(key)) => {
            let mut pem = read_named_setting_file("GATEWAY_CLIENT_CERT", cert)?;
            pem.push(b'\n');
            pem.extend(read_named_setting_file("GATEWAY_CLIENT_KEY", key)?);
            Some(pem)
        }
        (None, None) => None,
        _ => anyhow::bail!("GATEWAY_CLIENT_CERT and GATEWAY_CLIENT_KEY go together"),
    };
    Ok(GatewayTransport::new(api_key, ca_pem, identity_pem))
}

/// Where Stripe is, as `access` and the timeouts of `settings` say.
pub fn stripe_options(access: &GatewayAccess, settings: &GatewaySettings) -> StripeOptions {
    StripeOptions {
        base_url: access.url().to_owned(),
        api_version: access.stripe.api_version.clone(),
        compat: access.stripe.compat,
        timeout: settings.timeout,
        connect_timeout: settings.connect_timeout,
    }
}

/// Connections the gateway adapter opens to Postgres besides the payment pool.
pub fn gateway_connections(settings: &GatewaySettings) -> u32 {
    match settings.access.kind {
        GatewayKind::Charges => 0,
        GatewayKind::Stripe => settings.access.stripe.record_connections,
    }
}

/// The processor of `run` and `process`: stores opened (and the connection budget
/// checked), gateway adapter built, attempts owned by `worker_id`.
pub async fn build_processor(
    settings: &ProcessorSettings,
    worker_id: &str,
) -> anyhow::Result<Processor> {
    let (pool, tokens) = open_stores(&settings.stores).await?;
    check_connection_budget(
        &settings.stores,
        &pool,
        gateway_connections(&settings.gateway),
    )
    .await?;
    let gateway = gateway(&settings.gateway, &settings.stores.database).await?;
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
