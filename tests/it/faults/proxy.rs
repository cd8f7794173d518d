//! The fault proxy does what the fault tests take it to do: a blackhole holds bytes
//! and delivers them at the heal, a half-open path holds one direction, a delay
//! keeps order, a reset ends connections with an RST, a refusal turns new
//! connections away while open ones carry on.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::fault_proxy::{Direction, Fault, FaultProxy, Latency};

/// A server that echoes every byte back.
async fn echo_server() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut read, mut write) = socket.split();
                let _ = tokio::io::copy(&mut read, &mut write).await;
            });
        }
    });
    addr
}

async fn read_exactly(stream: &mut TcpStream, n: usize, within: Duration) -> Option<Vec<u8>> {
    let mut buffer = vec![0u8; n];
    match tokio::time::timeout(within, stream.read_exact(&mut buffer)).await {
        Ok(Ok(_)) => Some(buffer),
        _ => None,
    }
}

#[tokio::test]
async fn a_blackhole_holds_the_bytes_and_delivers_them_in_order_at_the_heal() {
    let proxy = FaultProxy::start(echo_server().await).await;
    let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
    client.write_all(b"before").await.unwrap();
    assert_eq!(
        read_exactly(&mut client, 6, Duration::from_secs(5))
            .await
            .as_deref(),
        Some(&b"before"[..])
    );

    proxy.set(Fault::Blackhole);
    client.write_all(b"held-1").await.unwrap();
    client.write_all(b"held-2").await.unwrap();
    assert_eq!(
        read_exactly(&mut client, 1, Duration::from_millis(700)).await,
        None,
        "nothing passes a silent partition"
    );
    assert_eq!(proxy.open(), 1, "the connection stays open: no RST, no FIN");

    proxy.set(Fault::Pass);
    assert_eq!(
        read_exactly(&mut client, 12, Duration::from_secs(5))
            .await
            .as_deref(),
        Some(&b"held-1held-2"[..]),
        "what was held arrives at the heal, in order"
    );
}

#[tokio::test]
async fn a_half_open_path_holds_one_direction_only() {
    let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = FaultProxy::start(upstream.local_addr().unwrap()).await;
    let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
    let (mut service, _) = upstream.accept().await.unwrap();

    proxy.set(Fault::HalfOpen(Direction::ToClient));
    client.write_all(b"ask").await.unwrap();
    assert_eq!(
        read_exactly(&mut service, 3, Duration::from_secs(5))
            .await
            .as_deref(),
        Some(&b"ask"[..]),
        "the request reaches the service"
    );
    service.write_all(b"answer").await.unwrap();
    assert_eq!(
        read_exactly(&mut client, 1, Duration::from_millis(700)).await,
        None,
        "the answer is held"
    );
    proxy.set(Fault::Pass);
    assert_eq!(
        read_exactly(&mut client, 6, Duration::from_secs(5))
            .await
            .as_deref(),
        Some(&b"answer"[..])
    );
}

#[tokio::test]
async fn a_delay_holds_each_chunk_and_keeps_the_order() {
    let proxy = FaultProxy::start(echo_server().await).await;
    proxy.set(Fault::DelayEach {
        to_service: Latency {
            fixed: Duration::from_millis(150),
            jitter: Duration::from_millis(100),
        },
        to_client: Latency::fixed(Duration::from_millis(150)),
    });
    let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
    let started = std::time::Instant::now();
    for chunk in [&b"a"[..], b"b", b"c", b"d"] {
        client.write_all(chunk).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let echoed = read_exactly(&mut client, 4, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(echoed, b"abcd", "jitter never reorders");
    // Each way is delayed: the echo comes back no sooner than twice the fixed part.
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn a_reset_ends_open_connections_and_a_refusal_turns_new_ones_away() {
    let proxy = FaultProxy::start(echo_server().await).await;
    let mut open = TcpStream::connect(proxy.addr()).await.unwrap();
    open.write_all(b"x").await.unwrap();
    assert!(read_exactly(&mut open, 1, Duration::from_secs(5))
        .await
        .is_some());

    proxy.set(Fault::Refuse);
    open.write_all(b"y").await.unwrap();
    assert!(
        read_exactly(&mut open, 1, Duration::from_secs(5))
            .await
            .is_some(),
        "a refusal leaves open connections alone"
    );
    let mut turned_away = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(5), turned_away.read(&mut byte))
        .await
        .expect("a refused connection ends at once");
    assert!(
        matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "reset, not a clean close: {read:?}"
    );

    proxy.set(Fault::Pass);
    proxy.reset_all();
    let read = tokio::time::timeout(Duration::from_secs(5), open.read(&mut byte))
        .await
        .expect("a reset ends the connection at once");
    assert!(
        matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "{read:?}"
    );
    let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
    fresh.write_all(b"z").await.unwrap();
    assert!(read_exactly(&mut fresh, 1, Duration::from_secs(5))
        .await
        .is_some());
}
