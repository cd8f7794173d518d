//! What one payment costs in round trips, counted from the client spans the code
//! opens for each request (a regression here fails CI; time is never asserted).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use payment_worker::configuration::DatabaseSettings;
use payment_worker::payment::{CommandContext, GatewayLookup, Outcome, PaymentCommand, Processor};
use payment_worker::telemetry::{RoundTripCounter, RoundTrips};
use payment_worker_devtools::SimulatorConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::instrument::WithSubscriber;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer;

use crate::support::helpers::{final_outcome, Stack, TestDb, PG_ADDR};

fn command(key: &str) -> PaymentCommand {
    let value = serde_json::json!({"idempotency_key": key, "account_id": "acct_rt",
        "amount_minor": 1250, "currency": "EUR", "payment_method": "pm_card_visa"});
    PaymentCommand::parse(value.to_string().as_bytes()).unwrap()
}

async fn counted(stack: &Stack, command: &PaymentCommand) -> (Outcome, RoundTrips) {
    let counter = RoundTripCounter::default();
    // A per-layer filter, as the test binary's global subscriber has: spans of the
    // shared connection pools cross between the two registries.
    let subscriber = tracing_subscriber::registry().with(
        counter
            .clone()
            .with_filter(tracing_subscriber::filter::LevelFilter::TRACE),
    );
    let outcome = stack
        .processor("round-trips")
        .process(command, &CommandContext::default())
        .with_subscriber(subscriber)
        .await;
    (final_outcome(outcome), counter.snapshot())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_payment_costs_four_postgres_two_redis_and_one_gateway_round_trip() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let fresh = command("rt-fresh");
    let (outcome, trips) = counted(&stack, &fresh).await;
    assert!(matches!(outcome, Outcome::Succeeded { .. }), "{outcome:?}");
    // BEGIN, INSERT (with the pre-existing check), UPDATE, COMMIT; reserve and
    // confirm (the lease is fresh at the POST and at COMMIT); one POST.
    assert_eq!(
        trips,
        RoundTrips {
            postgres: 4,
            token_store: 2,
            gateway: 1
        }
    );
    // A duplicate decided by the Redis tombstone reads its original answer once.
    let (outcome, trips) = counted(&stack, &fresh).await;
    assert!(
        matches!(
            outcome,
            Outcome::Duplicate {
                original: Some(_),
                ..
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(
        trips,
        RoundTrips {
            postgres: 1,
            token_store: 1,
            gateway: 0
        }
    );
}

/// A proxy in front of Postgres that counts the server's `ReadyForQuery` messages:
/// every round trip on the wire ends with exactly one, whether it carried a
/// statement, a `BEGIN` or a pool's `Sync` check, which no client span sees.
struct ReadyForQueryCounter {
    address: std::net::SocketAddr,
    ready: Arc<AtomicU64>,
}

impl ReadyForQueryCounter {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let ready = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&ready);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = TcpStream::connect(PG_ADDR).await.unwrap();
                let (mut client_reads, client_writes) = client.into_split();
                let (server_reads, mut server_writes) = server.into_split();
                tokio::spawn(async move {
                    tokio::io::copy(&mut client_reads, &mut server_writes)
                        .await
                        .ok();
                });
                tokio::spawn(forward_counting(
                    server_reads,
                    client_writes,
                    Arc::clone(&counted),
                ));
            }
        });
        Self { address, ready }
    }

    fn count(&self) -> u64 {
        self.ready.load(Ordering::SeqCst)
    }
}

/// Backend messages are a type byte, a big-endian length that counts itself, then
/// the body (no TLS: the pool connects with `sslmode=disable`). Counted before the
/// message is forwarded, so a client that has its answer finds it counted.
async fn forward_counting(
    mut from_server: tokio::net::tcp::OwnedReadHalf,
    mut to_client: tokio::net::tcp::OwnedWriteHalf,
    ready: Arc<AtomicU64>,
) {
    let mut header = [0u8; 5];
    while from_server.read_exact(&mut header).await.is_ok() {
        let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        let mut body = vec![0u8; length.saturating_sub(4)];
        if from_server.read_exact(&mut body).await.is_err() {
            return;
        }
        if header[0] == b'Z' {
            ready.fetch_add(1, Ordering::SeqCst);
        }
        if to_client.write_all(&header).await.is_err() || to_client.write_all(&body).await.is_err()
        {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_wire_a_fresh_payment_costs_postgres_its_four_statements_and_one_check_on_release() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let wire = ReadyForQueryCounter::start().await;
    // The worker's own pool, of one connection, through the counting proxy.
    let settings = DatabaseSettings {
        max_connections: 1,
        ..DatabaseSettings::with_url(format!(
            "postgres://postgres@{}/{}?sslmode=disable",
            wire.address, stack.db.name
        ))
    };
    let pool = payment_worker::startup::connect(&settings).await.unwrap();
    let processor = Processor::new(
        Arc::clone(&stack.tokens),
        Arc::clone(&stack.gateway),
        pool.clone(),
        GatewayLookup::Uncertain,
        "wire",
    );
    // Holding the pool's only connection waits until sqlx has checked and returned
    // the one a payment used, so the count read meanwhile is settled.
    let settled_count = || async {
        let held = pool.acquire().await.unwrap();
        let count = wire.count();
        drop(held);
        count
    };
    // The first payment on a connection also prepares its statements.
    let first = processor
        .process(&command("wire-first"), &CommandContext::default())
        .await;
    assert!(matches!(final_outcome(first), Outcome::Succeeded { .. }));
    let before = settled_count().await;
    let fresh = processor
        .process(&command("wire-fresh"), &CommandContext::default())
        .await;
    assert!(matches!(final_outcome(fresh), Outcome::Succeeded { .. }));
    let after = settled_count().await;
    // sqlx's `Sync` as the counting hold's connection goes back; BEGIN, INSERT,
    // UPDATE, COMMIT; its `Sync` as the payment's goes back. A pool that also
    // checked connections on the way out would add two (the payment's acquire and
    // the second hold's).
    assert_eq!(after - before, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_connection_the_server_closed_while_idle_is_replaced_before_use() {
    let db = TestDb::new().await;
    let settings = DatabaseSettings {
        max_connections: 1,
        ..DatabaseSettings::with_url(&db.url)
    };
    let pool = payment_worker::startup::connect(&settings).await.unwrap();
    let backend = || async {
        sqlx::query_scalar::<_, i32>("SELECT pg_backend_pid()")
            .fetch_one(&pool)
            .await
    };
    let first = backend().await.unwrap();
    // What a restart or a failover does to the connections a pool holds idle.
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(first)
        .execute(&db.pool)
        .await
        .unwrap();
    // Idle for longer than the pool lets a connection go unchecked.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let second = backend()
        .await
        .expect("the dead connection is replaced, not handed out");
    assert_ne!(first, second);
}
