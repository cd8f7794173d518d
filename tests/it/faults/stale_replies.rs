//! A connection used after a timeout answers the wrong question: its peer still
//! answers the earlier command, late. Shown here on the wire, then shown not to
//! happen to the worker's connections: the token store's Redis connection pairs
//! each reply with its own request and is replaced after two silent answers in a
//! row; a Postgres statement of the payment path that goes unanswered ends at its
//! deadline, and its connection is closed, not handed to the next payment.

use std::sync::Arc;
use std::time::Duration;

use payment_worker::configuration::DatabaseSettings;
use payment_worker::gateway::{HttpGateway, PaymentGateway};
use payment_worker::payment::{
    Attempt, ChargeEvidence, CommandContext, GatewayLookup, Outcome, PaymentCommand, Processor,
};
use payment_worker::token::{
    IdempotencyKey, RedisConnection, RedisTarget, RedisTokenStore, TokenPolicy, TokenStore,
};
use payment_worker_devtools::{GatewaySimulator, SimulatorConfig, SlowKey};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::fault_proxy::{Direction, Fault, FaultProxy, Latency};
use crate::support::helpers::{observer_connection, unique, TestDb, TestRedis, REDIS_URL};

const REDIS_ADDR: &str = "127.0.0.1:6379";
const POSTGRES_ADDR: &str = "127.0.0.1:5432";

async fn set(key: &str, value: &str) {
    let mut direct = observer_connection(REDIS_URL).await;
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("EX")
        .arg(60)
        .query_async(&mut direct)
        .await
        .unwrap();
}

/// One RESP bulk reply read off a plain socket, if one comes within `within`.
async fn bulk_reply(socket: &mut TcpStream, within: Duration) -> Option<String> {
    let mut reply = Vec::new();
    let mut byte = [0u8; 1];
    let reading = async {
        // `$<len>\r\n<bytes>\r\n`: read the header line, then the value and its CRLF.
        while !reply.ends_with(b"\r\n") {
            socket.read_exact(&mut byte).await.ok()?;
            reply.push(byte[0]);
        }
        let len: usize = std::str::from_utf8(&reply[1..reply.len() - 2])
            .ok()?
            .parse()
            .ok()?;
        let mut value = vec![0u8; len + 2];
        socket.read_exact(&mut value).await.ok()?;
        value.truncate(len);
        String::from_utf8(value).ok()
    };
    tokio::time::timeout(within, reading).await.ok().flatten()
}

/// The hazard itself, on a plain connection a naive client keeps after a timeout.
#[tokio::test]
async fn a_connection_reused_after_a_timeout_reads_the_answer_to_the_previous_command() {
    crate::support::helpers::ensure_services();
    let (first, second) = (unique("pw-stale-a"), unique("pw-stale-b"));
    set(&first, "first").await;
    set(&second, "second").await;
    let proxy = FaultProxy::start(REDIS_ADDR.parse().unwrap()).await;
    let mut socket = TcpStream::connect(proxy.addr()).await.unwrap();

    proxy.set(Fault::Blackhole);
    socket
        .write_all(format!("GET {first}\r\n").as_bytes())
        .await
        .unwrap();
    assert_eq!(
        bulk_reply(&mut socket, Duration::from_millis(500)).await,
        None,
        "the partition holds the answer: the client times out"
    );
    proxy.set(Fault::Pass);
    socket
        .write_all(format!("GET {second}\r\n").as_bytes())
        .await
        .unwrap();
    assert_eq!(
        bulk_reply(&mut socket, Duration::from_secs(5))
            .await
            .as_deref(),
        Some("first"),
        "the reused connection answers GET {second} with the value of {first}"
    );
}

async fn token_store_connection(proxy: &FaultProxy) -> RedisConnection {
    RedisTarget::parse(&format!("redis://{}", proxy.addr()), false)
        .unwrap()
        .connect()
        .await
        .unwrap()
}

fn replacements(connection: &RedisConnection) -> u64 {
    match connection {
        RedisConnection::Single(node) => node.replacements(),
        _ => unreachable!("one node"),
    }
}

async fn get(connection: &RedisConnection, key: &str) -> redis::RedisResult<Option<String>> {
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut connection.clone())
        .await
}

#[tokio::test]
async fn the_token_stores_redis_connection_pairs_each_reply_with_its_command_and_is_replaced_after_silence(
) {
    crate::support::helpers::ensure_services();
    let (first, second) = (unique("pw-stale-a"), unique("pw-stale-b"));
    set(&first, "first").await;
    set(&second, "second").await;
    let proxy = FaultProxy::start(REDIS_ADDR.parse().unwrap()).await;
    let connection = token_store_connection(&proxy).await;
    assert_eq!(
        get(&connection, &first).await.unwrap().as_deref(),
        Some("first")
    );
    let connections_before = proxy.accepted();

    proxy.set(Fault::Blackhole);
    for key in [&first, &second] {
        let silent = get(&connection, key).await;
        assert!(
            matches!(&silent, Err(e) if e.is_timeout()),
            "a silent Redis is a timeout: {silent:?}"
        );
    }
    assert_eq!(
        replacements(&connection),
        1,
        "two silent answers in a row replace the connection"
    );
    proxy.set(Fault::Pass);
    // The old connection's late answers (to GET first, GET second) arrive now; they
    // must reach nobody.
    for _ in 0..3 {
        assert_eq!(
            get(&connection, &second).await.unwrap().as_deref(),
            Some("second")
        );
        assert_eq!(
            get(&connection, &first).await.unwrap().as_deref(),
            Some("first")
        );
    }
    assert!(
        proxy.accepted() > connections_before,
        "the commands after the heal went over a new connection"
    );
}

#[tokio::test]
async fn one_late_answer_does_not_replace_the_redis_connection() {
    crate::support::helpers::ensure_services();
    let key = unique("pw-stale-late");
    set(&key, "value").await;
    let proxy = FaultProxy::start(REDIS_ADDR.parse().unwrap()).await;
    let connection = token_store_connection(&proxy).await;
    // Longer than the 2 s answer timeout, once.
    proxy.set(Fault::Delay(Latency::fixed(Duration::from_millis(2500))));
    assert!(get(&connection, &key).await.is_err_and(|e| e.is_timeout()));
    proxy.set(Fault::Pass);
    // The delayed reply is still in flight on this connection: the next command
    // waits behind it, gets its own answer, and the connection is kept.
    assert_eq!(
        get(&connection, &key).await.unwrap().as_deref(),
        Some("value")
    );
    assert_eq!(replacements(&connection), 0);
    // A later single timeout starts the count again: no replacement either.
    proxy.set(Fault::Delay(Latency::fixed(Duration::from_millis(2500))));
    assert!(get(&connection, &key).await.is_err_and(|e| e.is_timeout()));
    proxy.set(Fault::Pass);
    assert_eq!(
        get(&connection, &key).await.unwrap().as_deref(),
        Some("value")
    );
    assert_eq!(replacements(&connection), 0);
}

/// Where the answers from Postgres stop coming back during one payment.
enum Cut {
    /// From the statement after the charge on: the charge's UPDATE runs, its answer
    /// is lost, the COMMIT is never sent and the transaction rolls back when the
    /// connection closes.
    AfterTheCharge,
    /// Only at the COMMIT: the payment commits, its answer is lost.
    AtTheCommit,
}

/// One payment whose transaction loses Postgres's answers at `cut`: the attempt ends
/// at the statement deadline (not at the heal) with the outcome unknown, never a
/// final answer; its connection is closed rather than returned to the pool; after
/// the heal and the lease, the next owner books the one charge. Returns whether the
/// payment had committed when the first attempt gave up.
async fn lose_the_answers(cut: Cut) -> bool {
    let db = TestDb::new().await;
    let redis = TestRedis::new().await;
    let key = unique("pw-lost-answer");
    let simulator = GatewaySimulator::bind(
        "127.0.0.1:0".parse().unwrap(),
        SimulatorConfig {
            slow_keys: vec![SlowKey {
                key: IdempotencyKey::try_from(key.as_str()).unwrap(),
                delay: Duration::from_millis(800),
            }],
            ..SimulatorConfig::default()
        },
    )
    .unwrap()
    .spawn();
    let gateway: Arc<dyn PaymentGateway> = Arc::new(
        HttpGateway::new(
            &simulator.url(),
            Duration::from_secs(15),
            Duration::from_secs(1),
        )
        .unwrap(),
    );
    let policy = TokenPolicy {
        lease: Duration::from_secs(3),
        ..TokenPolicy::default()
    };
    let tokens: Arc<dyn TokenStore> = Arc::new(RedisTokenStore::new(
        redis.conn.clone(),
        redis.prefix.clone(),
        policy,
    ));
    let proxy = FaultProxy::start(POSTGRES_ADDR.parse().unwrap()).await;
    let proxied = DatabaseSettings {
        max_connections: 2,
        // In clear: the proxy recognises the COMMIT it must lose the answer to.
        ..DatabaseSettings::with_url(format!(
            "postgres://postgres@{}/{}?sslmode=disable",
            proxy.addr(),
            db.name
        ))
    };
    let pool = payment_worker::startup::connect(&proxied).await.unwrap();
    let processor = Processor::new(
        Arc::clone(&tokens),
        gateway,
        pool.clone(),
        GatewayLookup::Uncertain,
        "w-lost-answer",
    );
    let command = PaymentCommand::new(&key, "acct_42", 1234, "USD", "pm_card_visa", None).unwrap();

    let lost = Fault::HalfOpen(Direction::ToClient);
    let cutting = async {
        match cut {
            // The gateway holds the charge 800 ms: the cut falls inside it.
            Cut::AfterTheCharge => {
                tokio::time::sleep(Duration::from_millis(300)).await;
                proxy.set(lost);
            }
            Cut::AtTheCommit => proxy.arm(b"COMMIT", lost),
        }
    };
    let started = std::time::Instant::now();
    let fresh = CommandContext::default();
    let (attempt, ()) = tokio::join!(
        tokio::time::timeout(Duration::from_secs(20), processor.process(&command, &fresh)),
        cutting
    );
    let attempt = attempt.expect("the statement deadline ends the attempt, not the heal");
    eprintln!("the attempt ended after {:?}", started.elapsed());
    match &attempt {
        Attempt::Retry { charge, reason, .. } => {
            assert_eq!(*charge, ChargeEvidence::MayHaveCharged, "{reason}");
            assert!(reason.contains("no answer from Postgres"), "{reason}");
        }
        other => panic!("a lost answer after the charge is no final outcome: {other:?}"),
    }
    assert_eq!(
        pool.size(),
        0,
        "the connection whose statement went unanswered left the pool"
    );
    proxy.set(Fault::Pass);
    // Whatever the server did, it did once the closed connection reached it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let committed = loop {
        let in_flight: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND state LIKE 'idle in transaction%'",
        )
        .bind(&db.name)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if in_flight == 0 {
            break sqlx::query_scalar::<_, String>(
                "SELECT status FROM payments WHERE idempotency_key = $1",
            )
            .bind(&key)
            .fetch_optional(&db.pool)
            .await
            .unwrap();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the cut transaction never ended"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    // The next owner (after the 3 s lease): the committed row, or the gateway's
    // look-up, answers; never a second POST.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let outcome = loop {
        let context = CommandContext {
            earlier: ChargeEvidence::MayHaveCharged,
            ..CommandContext::default()
        };
        match processor.process(&command, &context).await {
            Attempt::Final(outcome) => break outcome,
            Attempt::Retry { reason, .. } => {
                assert!(std::time::Instant::now() < deadline, "{reason}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => panic!("{other:?}"),
        }
    };
    assert!(
        matches!(
            outcome,
            Outcome::Duplicate { .. } | Outcome::Succeeded { .. }
        ),
        "{outcome:?}"
    );
    let charges = simulator
        .ledger()
        .iter()
        .filter(|e| e.idempotency_key == key)
        .count();
    assert_eq!(charges, 1, "charged once");
    let status: String =
        sqlx::query_scalar("SELECT status FROM payments WHERE idempotency_key = $1")
            .bind(&key)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(status, "succeeded");
    committed.is_some()
}

#[tokio::test]
async fn an_answer_lost_after_the_charge_ends_at_the_deadline_and_the_charge_is_looked_up() {
    let committed = lose_the_answers(Cut::AfterTheCharge).await;
    assert!(
        !committed,
        "no COMMIT was sent: the transaction rolled back"
    );
}

#[tokio::test]
async fn a_commit_whose_answer_is_lost_is_an_unknown_outcome_and_its_connection_is_not_reused() {
    let committed = lose_the_answers(Cut::AtTheCommit).await;
    assert!(committed, "the COMMIT ran; only its answer was lost");
}

/// A statement the worker gives up on is abandoned with its connection, and the
/// server never hears of it: every connection the pools open asks the server to
/// find a vanished client within about a minute (keepalives), so an abandoned
/// transaction does not hold its payment's key locked for the two hours of the
/// kernel's default. (Over TCP: over a Unix socket the settings read 0.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_pooled_connection_asks_the_server_to_end_what_a_lost_client_left() {
    let db = TestDb::new().await;
    let pool = payment_worker::startup::connect(&DatabaseSettings {
        max_connections: 2,
        ..DatabaseSettings::with_url(db.url.clone())
    })
    .await
    .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    for (setting, expected) in [
        ("tcp_keepalives_idle", "30"),
        ("tcp_keepalives_interval", "10"),
        ("tcp_keepalives_count", "3"),
    ] {
        let shown: String = sqlx::query_scalar(&format!("SHOW {setting}"))
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        assert_eq!(shown, expected, "{setting}");
    }
}
