//! Round trips per fresh payment, counted rather than timed: the worker's own
//! `Processor` handles fresh commands one after another under a
//! [`RoundTripCounter`], which sees the client span of every request.

use std::sync::Arc;
use std::time::Duration;

use tracing::instrument::WithSubscriber;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer;

use super::e2e::Bed;
use super::report::RoundTripsPerPayment;
use crate::{GatewaySimulator, SimulatorConfig};
use payment_worker::gateway::{HttpGateway, PaymentGateway};
use payment_worker::payment::{
    Attempt, CommandContext, GatewayLookup, Outcome, PaymentCommand, Processor,
};
use payment_worker::telemetry::RoundTripCounter;

pub(super) async fn per_fresh_payment(
    bed: &Bed,
    payments: usize,
) -> anyhow::Result<RoundTripsPerPayment> {
    let simulator = GatewaySimulator::bind(
        "127.0.0.1:0".parse()?,
        SimulatorConfig {
            seed: None,
            ..SimulatorConfig::default()
        },
    )?
    .spawn();
    let gateway: Arc<dyn PaymentGateway> = Arc::new(HttpGateway::new(
        &simulator.url(),
        Duration::from_secs(5),
        Duration::from_secs(1),
    )?);
    let prefix = bed.key_prefix("roundtrips");
    let processor = Processor::new(
        Arc::clone(&bed.tokens),
        gateway,
        bed.pool.clone(),
        GatewayLookup::Uncertain,
        prefix.clone(),
    );
    let counter = RoundTripCounter::default();
    let mut fresh = 0usize;
    for n in 0..payments {
        let value = serde_json::json!({
            "idempotency_key": payment_worker::operator::numbered_key(&prefix, n, 1), "account_id": "acct_bench",
            "amount_minor": 1000 + n, "currency": "EUR", "payment_method": "pm_card_visa",
        });
        let command = PaymentCommand::parse(value.to_string().as_bytes())
            .map_err(|e| anyhow::anyhow!("bench command: {e}"))?;
        // The global subscriber stays as it is; this one counts for this command only.
        let subscriber = tracing_subscriber::registry().with(
            counter
                .clone()
                .with_filter(tracing_subscriber::filter::LevelFilter::TRACE),
        );
        let outcome = processor
            .process(&command, &CommandContext::default())
            .with_subscriber(subscriber)
            .await;
        if matches!(
            outcome,
            Attempt::Final(Outcome::Succeeded { .. } | Outcome::Declined { .. })
        ) {
            fresh += 1;
        }
    }
    anyhow::ensure!(
        fresh == payments,
        "{} of {payments} payments were not fresh",
        payments - fresh
    );
    let counted = counter.snapshot();
    let per = |n: u64| n as f64 / payments.max(1) as f64;
    Ok(RoundTripsPerPayment {
        postgres: per(counted.postgres),
        redis: per(counted.token_store),
        gateway: per(counted.gateway),
    })
}
