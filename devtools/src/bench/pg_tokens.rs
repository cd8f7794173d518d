//! The Postgres token store in the bench: the 0 ms end-to-end phase again with
//! `PostgresTokenStore` in place of Redis (same run, same pool, same worker), and
//! once more while the purge deletes expired token rows. Both are read as ratios
//! measured in the same run: Postgres tokens ÷ Redis tokens, purging ÷ not purging.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use super::audit::AuditReport;
use super::e2e::{Bed, Load, WorkerKind};
use super::phase::phase;
use super::report::{BenchReport, PurgeReport};
use payment_worker::configuration::DatabaseSettings;
use payment_worker::startup::purge_round;
use payment_worker::token::{PostgresTokenStore, TokenPolicy, TokenStore};

/// The worker's default lease-renewal pool.
const LEASE_CONNECTIONS: u32 = 4;
/// The worker's default purge statement size.
const PURGE_BATCH: usize = 1000;
/// Expired rows timed before the phase to learn how fast the purge deletes.
const CALIBRATION_ROWS: usize = 20_000;
/// However fast the purge, no more dead rows than this are planted (about 10 s of
/// inserting on the 2-core machine this was measured on).
const MAX_EXPIRED_ROWS: usize = 2_000_000;

pub(super) async fn postgres_token_phases(
    bed: &mut Bed,
    report: &mut BenchReport,
    commands: usize,
    audit: &mut AuditReport,
) -> anyhow::Result<()> {
    let maintenance = payment_worker::startup::connect_with_size(
        &DatabaseSettings::with_url(&bed.database_url),
        LEASE_CONNECTIONS,
    )
    .await?;
    let postgres: Arc<dyn TokenStore> = Arc::new(
        PostgresTokenStore::new(bed.pool.clone(), TokenPolicy::default())
            .with_maintenance_pool(maintenance.clone()),
    );
    let redis = std::mem::replace(&mut bed.tokens, Arc::clone(&postgres));
    let measured = measure(bed, report, commands, audit, &postgres).await;
    bed.tokens = redis;
    maintenance.close().await;
    measured
}

async fn measure(
    bed: &Bed,
    report: &mut BenchReport,
    commands: usize,
    audit: &mut AuditReport,
    postgres: &Arc<dyn TokenStore>,
) -> anyhow::Result<()> {
    let plain = phase(
        bed,
        "e2e-0ms-pgtokens",
        0,
        Load::Backlog(commands),
        WorkerKind::InProcess,
        audit,
    )
    .await?;
    report.e2e_tps_0ms_postgres_tokens = plain.payments_per_s;
    let plain_s = plain.first_to_last_result_s;
    report.phases.push(plain);

    // The purge must still have rows to delete when the phase ends, or the ratio
    // would compare a phase partly run without it. How fast it deletes depends on the
    // machine, so it is timed first on rows of its own; the phase then gets twice
    // what that rate deletes in the plain phase's time, at least ten rows per command.
    let dead_prefix = format!("{}-", bed.key_prefix("expired"));
    let rate = purge_rate(bed, postgres, &format!("{dead_prefix}calibration-")).await?;
    let expired = ((rate * plain_s * 2.0) as usize)
        .max(commands.saturating_mul(10))
        .clamp(10_000, MAX_EXPIRED_ROWS);
    plant_expired(bed, &dead_prefix, expired).await?;

    // The purge starts when the worker reserves its first token of the phase, not
    // while the backlog is being produced, and stops when the phase has ended.
    let phase_name = "e2e-0ms-pgtokens-purging";
    // The phase's keys are `numbered_key(prefix, n, 7)`: one of them with its counter
    // cut off is what they all start with.
    let first = payment_worker::operator::numbered_key(&bed.key_prefix(phase_name), 0, 1);
    let phase_keys = first.strip_suffix('0').unwrap_or(&first).to_owned();
    let admin = bed.admin.clone();
    let store = Arc::clone(postgres);
    let phase_over = CancellationToken::new();
    let purge = tokio::spawn({
        let phase_over = phase_over.clone();
        async move {
            loop {
                let started: bool = sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM idempotency_tokens WHERE starts_with(key, $1))",
                )
                .bind(&phase_keys)
                .fetch_one(&admin)
                .await?;
                if started {
                    break;
                }
                if phase_over.is_cancelled() {
                    return Ok((0, Duration::ZERO));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok::<_, sqlx::Error>(purge_until(store.as_ref(), &phase_over).await)
        }
    });
    let purging = phase(
        bed,
        phase_name,
        0,
        Load::Backlog(commands),
        WorkerKind::InProcess,
        audit,
    )
    .await;
    phase_over.cancel();
    let purged = tokio::time::timeout(Duration::from_secs(60), purge).await;
    let purging = purging?;
    let (rows, took) = purged
        .context("the purge did not stop")?
        .context("the purge task failed")?
        .context("waiting for the phase to start")?;
    // What the purge had no time for would slow the phases after this one.
    sqlx::query("DELETE FROM idempotency_tokens WHERE starts_with(key, $1)")
        .bind(&dead_prefix)
        .execute(&bed.admin)
        .await
        .context("deleting the expired rows the purge left")?;
    report.purge = PurgeReport {
        expired_rows: expired as u64,
        purged_rows: rows,
        purge_s: took.as_secs_f64(),
        phase_s: purging.first_to_last_result_s,
        batch: PURGE_BATCH,
    };
    report.e2e_tps_0ms_postgres_tokens_purging = purging.payments_per_s;
    report.phases.push(purging);
    Ok(())
}

/// Inserts `count` completed token rows that expired an hour ago.
async fn plant_expired(bed: &Bed, prefix: &str, count: usize) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO idempotency_tokens (key, status, fence, expires_at, payment_id, fingerprint)
         SELECT $1 || g, 'completed', 1, now() - interval '1 hour', gen_random_uuid(), 'bench'
           FROM generate_series(1, $2) AS g",
    )
    .bind(prefix)
    .bind(i64::try_from(count).unwrap_or(i64::MAX))
    .execute(&bed.admin)
    .await
    .context("inserting expired token rows")?;
    Ok(())
}

/// Rows per second the purge deletes with nothing else running.
async fn purge_rate(
    bed: &Bed,
    postgres: &Arc<dyn TokenStore>,
    prefix: &str,
) -> anyhow::Result<f64> {
    plant_expired(bed, prefix, CALIBRATION_ROWS).await?;
    let (rows, took) = purge_until(postgres.as_ref(), &CancellationToken::new()).await;
    anyhow::ensure!(
        rows > 0,
        "the purge deleted none of {CALIBRATION_ROWS} expired rows"
    );
    Ok(rows as f64 / took.as_secs_f64().max(0.001))
}

/// Purge rounds, as the worker runs them, back to back until a round finds nothing
/// expired or `stop` is cancelled (checked after each round, so at least one runs).
/// Returns the rows deleted and how long that took.
async fn purge_until(store: &dyn TokenStore, stop: &CancellationToken) -> (u64, Duration) {
    let since = Instant::now();
    let mut rows = 0;
    loop {
        match purge_round(store, PURGE_BATCH).await {
            0 => break,
            purged => rows += purged,
        }
        if stop.is_cancelled() {
            break;
        }
    }
    (rows, since.elapsed())
}
