//! The `stripe` phase: the same in-process worker with the Stripe adapter in place
//! of the `charges` client, against localstripe on this machine (a Python fake that
//! handles one request at a time). It is read as a ratio to the `charges` 0 ms
//! phase of the same run and carries no target: it shows what the two phases of a
//! Stripe charge (create, record, confirm) cost against a fake, not Stripe's speed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;

use super::audit::{self, AuditReport};
use super::e2e::Bed;
use super::load::produce_backlog;
use super::report::BenchReport;
use super::results::{summarize, ResultsReader, MOCK_FETCH_WAIT_MS};
use crate::{LocalStripe, LOCALSTRIPE_KEY};
use payment_worker::configuration::{DatabaseSettings, StripeCompat, DEFAULT_STRIPE_API_VERSION};
use payment_worker::gateway::{GatewayTransport, PaymentGateway, StripeGateway, StripeOptions};
use payment_worker::payment::{GatewayLookup, Processor};
use payment_worker::worker;

/// The adapter's own pool, as the worker's default.
const RECORD_CONNECTIONS: u32 = 4;
/// The phase fails when no command is answered for this long.
const STALL: Duration = Duration::from_secs(60);

/// Runs the phase and writes its figures into `report`; a machine without
/// localstripe skips it, saying why.
pub(super) async fn stripe_phase(
    bed: &Bed,
    report: &mut BenchReport,
    commands: usize,
    audit: &mut AuditReport,
) -> anyhow::Result<()> {
    let localstripe = match LocalStripe::start_with(bed.localstripe.as_deref()).await {
        Ok(server) => server,
        Err(error) => {
            eprintln!("{:<16} skipped: {error:#}", "stripe");
            report.stripe_skipped = Some(format!("{error:#}"));
            return Ok(());
        }
    };
    let measured = measure(bed, report, commands, audit, &localstripe.url()).await;
    localstripe.stop().await;
    measured
}

async fn measure(
    bed: &Bed,
    report: &mut BenchReport,
    commands: usize,
    audit: &mut AuditReport,
    url: &str,
) -> anyhow::Result<()> {
    let phase = "stripe";
    let kafka = bed.kafka(phase)?;
    let key_prefix = bed.key_prefix(phase);
    let records = payment_worker::startup::connect_with_size(
        &DatabaseSettings::with_url(&bed.database_url),
        RECORD_CONNECTIONS,
    )
    .await?;
    let gateway = Arc::new(StripeGateway::new(
        &StripeOptions {
            base_url: url.to_owned(),
            api_version: DEFAULT_STRIPE_API_VERSION.to_owned(),
            compat: StripeCompat::Localstripe,
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(1),
        },
        &GatewayTransport::with_api_key(LOCALSTRIPE_KEY.into()),
        records.clone(),
    )?);
    let processor = Arc::new(Processor::new(
        Arc::clone(&bed.tokens),
        Arc::clone(&gateway) as Arc<dyn PaymentGateway>,
        bed.pool.clone(),
        GatewayLookup::Uncertain,
        key_prefix.clone(),
    ));
    let handler = payment_worker::startup::handler(processor, &kafka, &bed.worker)?;
    let sent = produce_backlog(
        &bed.producer,
        &kafka.commands_topic,
        &key_prefix,
        commands,
        &ProgressBar::hidden(),
    )
    .await?;
    let reader = ResultsReader::start(&kafka, bed.partitions)?;
    let mut consumer = kafka.clone();
    consumer
        .extra
        .push(("fetch.wait.max.ms".into(), MOCK_FETCH_WAIT_MS.to_string()));
    let running = worker::start(&consumer, &bed.worker, handler)?;
    let (mut last, mut last_progress) = (0, Instant::now());
    while reader.answered() < sent.len() {
        if reader.answered() != last {
            (last, last_progress) = (reader.answered(), Instant::now());
        }
        if last_progress.elapsed() > STALL {
            running.stop().await?;
            anyhow::bail!(
                "stripe phase: no progress for {STALL:?}, {last} of {} answered",
                sent.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    running.stop().await?;
    let observations = reader.finish().await?;

    let rows = audit::rows_with_prefix(&bed.admin, &format!("{key_prefix}:")).await?;
    let ledger: Vec<_> = gateway
        .ledger()
        .await?
        .into_iter()
        .filter(|entry| entry.idempotency_key.starts_with(&key_prefix))
        .collect();
    let phase_audit = audit::reconcile(&ledger, &rows, sent.len(), observations.len());
    if !phase_audit.ok {
        eprintln!("{phase:<16} AUDIT VIOLATED: {phase_audit:?}");
    }
    audit.add(&phase_audit);
    // The PaymentIntents went with localstripe; their records go too.
    sqlx::query("DELETE FROM stripe_payment_intents WHERE starts_with(idempotency_key, $1)")
        .bind(format!("{key_prefix}:"))
        .execute(&bed.admin)
        .await?;
    records.close().await;

    let mut phase_report = summarize(&sent, &observations, i64::MIN);
    phase_report.name = "stripe-localstripe".to_owned();
    phase_report.worker = "in-process".to_owned();
    eprintln!(
        "{:<16} {:>9.0} payments/s ({} of {} answered, against localstripe)",
        phase_report.name,
        phase_report.payments_per_s,
        phase_report.answered,
        phase_report.commands
    );
    report.stripe_tps = phase_report.payments_per_s;
    report.phases.push(phase_report);
    Ok(())
}
