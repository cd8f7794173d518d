//! The two bounds the end-to-end figures are read against: the Postgres ceiling
//! for the worker's own transaction, and Redis token round trips.
//!
//! The ceiling runs the real `Processor` with the token store and the gateway
//! replaced by in-memory stand-ins that answer at once, so Postgres sees exactly
//! the worker's statements (BEGIN, INSERT `processing` or return the row already
//! there, UPDATE to `succeeded`, COMMIT) through the same code and the same pool,
//! and the SQL cannot drift from what the worker sends.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use sqlx::PgPool;
use uuid::Uuid;

use super::cpu;
use super::report::LoopReport;
use payment_worker::gateway::{
    Charge, ChargeRequest, ChargeStatus, GatewayError, LeaseGuard, LedgerEntry, PaymentGateway,
};
use payment_worker::payment::{
    Attempt, CommandContext, GatewayLookup, Outcome, PaymentCommand, Processor, SourcePosition,
};
use payment_worker::token::{
    Claim, IdempotencyKey, IssueOutcome, LockOutcome, Predecessor, Reservation, TokenError,
    TokenPolicy, TokenStore, TokenView, Transition,
};

/// Every reservation is granted and every owner check passes: no round trip.
/// Not one of the real stores on purpose: the ceiling is the payment transaction
/// alone, and either real store would add its own round trips to that figure
/// (the Redis ones are measured apart, `round_trips.rs`).
struct GrantingTokens {
    policy: TokenPolicy,
}

fn unused(what: &str) -> TokenError {
    TokenError::Corrupt(format!("{what} is not part of the ceiling's transaction"))
}

#[async_trait::async_trait]
impl TokenStore for GrantingTokens {
    fn policy(&self) -> &TokenPolicy {
        &self.policy
    }
    async fn issue(&self, _: &IdempotencyKey, _: Duration) -> Result<IssueOutcome, TokenError> {
        Err(unused("issue"))
    }
    async fn consume(&self, _: &IdempotencyKey) -> Result<bool, TokenError> {
        Err(unused("consume"))
    }
    async fn lock(
        &self,
        _: &IdempotencyKey,
        _: &str,
        _: Duration,
    ) -> Result<LockOutcome, TokenError> {
        Err(unused("lock"))
    }
    async fn release(&self, _: &IdempotencyKey, _: &str) -> Result<bool, TokenError> {
        Err(unused("release"))
    }
    async fn reserve(&self, _: &IdempotencyKey, _: &str) -> Result<Reservation, TokenError> {
        Ok(Reservation::Reserved {
            fence: 1,
            predecessor: Predecessor::Nobody,
        })
    }
    async fn reserve_reclaiming(
        &self,
        key: &IdempotencyKey,
        owner: &str,
        _: &str,
    ) -> Result<Reservation, TokenError> {
        self.reserve(key, owner).await
    }
    async fn confirm(
        &self,
        _: &IdempotencyKey,
        _: &Claim,
        _: Uuid,
        _: &str,
    ) -> Result<Transition, TokenError> {
        Ok(Transition::Applied)
    }
    async fn restore(&self, _: &IdempotencyKey, _: &Claim) -> Result<Transition, TokenError> {
        Ok(Transition::Applied)
    }
    async fn extend(&self, _: &IdempotencyKey, _: &Claim) -> Result<Transition, TokenError> {
        Ok(Transition::Applied)
    }
    async fn show(&self, _: &IdempotencyKey) -> Result<Option<TokenView>, TokenError> {
        Ok(None)
    }
    async fn expired_leases(&self, _: usize) -> Result<Vec<IdempotencyKey>, TokenError> {
        Ok(Vec::new())
    }
}

/// Approves every charge at once with a fresh transaction id.
struct ApprovingGateway;

#[async_trait::async_trait]
impl PaymentGateway for ApprovingGateway {
    async fn charge(
        &self,
        _: &IdempotencyKey,
        _: &ChargeRequest,
        lease: &dyn LeaseGuard,
    ) -> Result<Charge, GatewayError> {
        // Checked as a real adapter does before its POST: the ceiling keeps its cost.
        lease.check().await.map_err(GatewayError::LeaseNotHeld)?;
        Ok(Charge {
            transaction_id: format!("ceiling_{}", Uuid::new_v4().simple()),
            status: ChargeStatus::Approved,
            decline_code: None,
        })
    }
    async fn lookup(&self, _: &IdempotencyKey) -> Result<Option<LedgerEntry>, GatewayError> {
        Ok(None)
    }
    async fn ledger(&self) -> Result<Vec<LedgerEntry>, GatewayError> {
        Ok(Vec::new())
    }
}

/// A valid command like the ones the end-to-end phases publish.
pub fn command_json(key: &str, n: usize) -> String {
    format!(
        r#"{{"idempotency_key":"{key}","account_id":"acct_{}","amount_minor":{},"currency":"USD","payment_method":"pm_card_visa","description":"bench"}}"#,
        n % 500,
        100 + (n * 7919) % 100_000
    )
}

/// Runs `operation(i)` for i in 0..count on `concurrency` tasks; returns how long
/// all took and how many returned false.
async fn run_loop<F, Fut>(
    count: usize,
    concurrency: usize,
    database: &str,
    bar: &ProgressBar,
    operation: F,
) -> LoopReport
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let operation = Arc::new(operation);
    let next = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(AtomicUsize::new(0));
    let cpu_before = cpu::sample(None, database);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let (operation, next, failures, bar) = (
            Arc::clone(&operation),
            Arc::clone(&next),
            Arc::clone(&failures),
            bar.clone(),
        );
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    break;
                }
                if !operation(i).await {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
                bar.inc(1);
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = cpu_before.cost_until(&cpu::sample(None, database), count, elapsed);
    LoopReport {
        operations: count,
        concurrency,
        elapsed_s: elapsed,
        per_s: count as f64 / elapsed.max(1e-9),
        failures: failures.load(Ordering::Relaxed),
        cpu: Some(cpu),
    }
}

/// `count` payment transactions of the worker's shape, `concurrency` at a time, on
/// `pool` (the worker's pool size). Rows get keys `<key_prefix>-<n>`.
pub async fn postgres_ceiling(
    pool: &PgPool,
    key_prefix: &str,
    count: usize,
    concurrency: usize,
    database: &str,
    bar: &ProgressBar,
) -> anyhow::Result<LoopReport> {
    // Built before the clock starts: decoding is the worker's cost, not Postgres's.
    let commands: Vec<PaymentCommand> = (0..count)
        .map(|n| {
            let key = payment_worker::operator::numbered_key(key_prefix, n, 7);
            PaymentCommand::parse(command_json(&key, n).as_bytes())
                .map_err(|e| anyhow::anyhow!("{}: {e}", e.code()))
        })
        .collect::<anyhow::Result<_>>()?;
    let commands = Arc::new(commands);
    let processor = Arc::new(Processor::new(
        Arc::new(GrantingTokens {
            policy: TokenPolicy::default(),
        }),
        Arc::new(ApprovingGateway),
        pool.clone(),
        GatewayLookup::Uncertain,
        "bench-ceiling",
    ));
    let topic: Arc<str> = Arc::from(format!("{key_prefix}.ceiling"));
    Ok(run_loop(count, concurrency, database, bar, move |n| {
        let (processor, commands, topic) = (
            Arc::clone(&processor),
            Arc::clone(&commands),
            Arc::clone(&topic),
        );
        async move {
            // The worker stores the source position on every row; so does the ceiling.
            let source = SourcePosition {
                topic: topic.to_string(),
                partition: (n % 3) as i32,
                offset: n as i64,
            };
            let context = CommandContext {
                source: Some(&source),
                ..CommandContext::default()
            };
            let outcome = processor.process(&commands[n], &context).await;
            if let Attempt::Retry { reason, .. }
            | Attempt::Final(Outcome::Rejected { reason, .. }) = &outcome
            {
                tracing::warn!(%reason, "ceiling transaction failed");
            }
            matches!(outcome, Attempt::Final(Outcome::Succeeded { .. }))
        }
    })
    .await)
}

/// `count` reserve + confirm pairs on `tokens`, `concurrency` at a time.
pub async fn token_round_trips(
    tokens: Arc<dyn TokenStore>,
    key_prefix: &str,
    count: usize,
    concurrency: usize,
    database: &str,
    bar: &ProgressBar,
) -> anyhow::Result<LoopReport> {
    let keys: Vec<IdempotencyKey> = (0..count)
        .map(|n| IdempotencyKey::try_from(payment_worker::operator::numbered_key(key_prefix, n, 7)))
        .collect::<Result<_, _>>()?;
    let keys = Arc::new(keys);
    let fingerprint: Arc<str> = Arc::from("0".repeat(64));
    Ok(run_loop(count, concurrency, database, bar, move |n| {
        let (tokens, keys, fingerprint) = (
            Arc::clone(&tokens),
            Arc::clone(&keys),
            Arc::clone(&fingerprint),
        );
        async move {
            let key = &keys[n];
            let owner = format!("bench:{}", Uuid::new_v4().simple());
            let fence = match tokens.reserve(key, &owner).await {
                Ok(Reservation::Reserved { fence, .. }) => fence,
                other => {
                    tracing::warn!(?other, "token reserve did not reserve");
                    return false;
                }
            };
            let claim = Claim { owner, fence };
            matches!(
                tokens
                    .confirm(key, &claim, Uuid::now_v7(), &fingerprint)
                    .await,
                Ok(Transition::Applied)
            )
        }
    })
    .await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_commands_are_valid_and_distinct() {
        let a = PaymentCommand::parse(command_json("bench-x-1", 1).as_bytes()).unwrap();
        let b = PaymentCommand::parse(command_json("bench-x-2", 2).as_bytes()).unwrap();
        assert_eq!(a.idempotency_key.as_str(), "bench-x-1");
        assert_ne!(a.fingerprint(), b.fingerprint());
    }
}
