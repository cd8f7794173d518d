//! What a run leaves behind, removed: its payment rows (their refunds with them)
//! and its tokens, in Postgres and in Redis.

use anyhow::Context;

/// [`clean_up`] unless `--keep-data`; a failed clean-up is only reported.
pub(super) async fn clean_up_unless_kept(
    args: &super::BenchArgs,
    pool: &sqlx::PgPool,
    run_id: &str,
    run_prefix: &str,
) {
    if args.keep_data {
        return;
    }
    if let Err(error) = clean_up(pool, &args.redis_url, run_prefix).await {
        eprintln!("warning: cleaning up run {run_id} failed: {error:#}");
    }
}

/// Deletes this run's rows and tokens, so repeated runs measure the same table.
async fn clean_up(pool: &sqlx::PgPool, redis_url: &str, run_prefix: &str) -> anyhow::Result<()> {
    payment_worker::payment::delete_payments_with_prefix(pool, &format!("{run_prefix}-"))
        .await
        .context("deleting the run's payment rows")?;
    sqlx::query("DELETE FROM idempotency_tokens WHERE starts_with(key, $1)")
        .bind(format!("{run_prefix}-"))
        .execute(pool)
        .await
        .context("deleting the run's Postgres tokens")?;
    let client = redis::Client::open(redis_url)?;
    // Patient: redis-rs answers a SCAN late on a loaded machine after its default
    // half second, and a clean-up cut short leaves the run's tokens behind.
    let config = redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(std::time::Duration::from_secs(10)));
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    let pattern = format!("{run_prefix}:*");
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(2000)
            .query_async(&mut conn)
            .await?;
        if !keys.is_empty() {
            redis::cmd("UNLINK")
                .arg(&keys)
                .query_async::<()>(&mut conn)
                .await?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}
