//! A TCP relay in front of a real service (Redis, Postgres, the gateway) with a switch
//! a test flips while the worker runs: the faults a network shows that killing a
//! process does not. No `tc netem` in this kernel, so they are made in user space:
//!
//! - `Pass`: bytes relayed as they come.
//! - `Delay`: each chunk held for a fixed time plus a uniform jitter, per direction,
//!   order kept (as a slow path keeps TCP's order).
//! - `Blackhole`: a silent partition. Sockets stay open, no RST, no FIN; what either
//!   side sends is held, and delivered when the switch goes back, as TCP delivers
//!   what it retransmits after a path heals. A client that reuses a connection after
//!   a timeout then reads the answers to its earlier commands: the stale-reply hazard.
//! - `HalfOpen`: the same, one direction only.
//! - `Refuse`: a new connection is reset as soon as it is accepted; open ones carry on.
//! - `reset_all`: every open connection is ended with an RST (both sides), as a
//!   failover or a middlebox that dropped its state does.
//!
//! Connections accepted while the path is blackholed are held too: the upstream
//! connection is made, nothing is relayed until the heal.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// Which way bytes go through the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the client (the worker) to the service.
    ToService,
    /// From the service back to the client.
    ToClient,
}

/// A delay: `fixed` plus a uniform draw from `0..=jitter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Latency {
    pub fixed: Duration,
    pub jitter: Duration,
}

impl Latency {
    pub fn fixed(fixed: Duration) -> Self {
        Self {
            fixed,
            jitter: Duration::ZERO,
        }
    }

    fn sample(&self) -> Duration {
        if self.jitter.is_zero() {
            return self.fixed;
        }
        let jitter_us = u64::try_from(self.jitter.as_micros()).unwrap_or(u64::MAX);
        self.fixed + Duration::from_micros(rand::rng().random_range(0..=jitter_us))
    }
}

/// What the proxy does to the traffic from now on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Pass,
    /// The same latency each way.
    Delay(Latency),
    /// A latency per direction.
    DelayEach {
        to_service: Latency,
        to_client: Latency,
    },
    Blackhole,
    /// Only `Direction`'s bytes are held.
    HalfOpen(Direction),
    Refuse,
}

/// What happens to a chunk going one way.
enum Flow {
    Pass,
    Delay(Latency),
    Hold,
}

impl Fault {
    fn flow(&self, direction: Direction) -> Flow {
        match (*self, direction) {
            (Fault::Pass | Fault::Refuse, _) => Flow::Pass,
            (Fault::Delay(latency), _) => Flow::Delay(latency),
            (Fault::DelayEach { to_service, .. }, Direction::ToService) => Flow::Delay(to_service),
            (Fault::DelayEach { to_client, .. }, Direction::ToClient) => Flow::Delay(to_client),
            (Fault::Blackhole, _) => Flow::Hold,
            (Fault::HalfOpen(held), direction) if held == direction => Flow::Hold,
            (Fault::HalfOpen(_), _) => Flow::Pass,
        }
    }
}

/// The switch every connection watches: the fault, a generation that `reset_all`
/// bumps, and a fault armed to apply when the client sends a given byte string.
#[derive(Debug, Clone, Copy)]
struct Switch {
    fault: Fault,
    /// Where new connections go.
    upstream: SocketAddr,
    resets: u64,
    armed: Option<(&'static [u8], Fault)>,
}

pub struct FaultProxy {
    addr: SocketAddr,
    switch: Arc<watch::Sender<Switch>>,
    accepted: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
        // Ends every connection too: they watch the switch, which is going away.
    }
}

impl FaultProxy {
    /// A proxy on 127.0.0.1 (a free port) in front of `upstream`, passing traffic.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy bind");
        let addr = listener.local_addr().expect("proxy address");
        let (switch, watching) = watch::channel(Switch {
            fault: Fault::Pass,
            upstream,
            resets: 0,
            armed: None,
        });
        let switch = Arc::new(switch);
        let accepted = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(accept_loop(
            listener,
            Arc::clone(&switch),
            watching,
            Arc::clone(&accepted),
            Arc::clone(&open),
        ));
        Self {
            addr,
            switch,
            accepted,
            open,
            task,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Applies `fault` to every connection, open or new, from now on.
    pub fn set(&self, fault: Fault) {
        self.switch.send_modify(|s| s.fault = fault);
    }

    /// Sends new connections to `upstream` from now on (a service's endpoint moved
    /// to a new server, as after a failover); open ones stay where they are.
    pub fn retarget(&self, upstream: SocketAddr) {
        self.switch.send_modify(|s| s.upstream = upstream);
    }

    /// Applies `fault` the moment a client sends a chunk holding `marker`, before that
    /// chunk goes on: e.g. the answer to a `COMMIT` lost, not the statements before.
    /// The bytes must be in clear (no TLS on the proxied connection).
    pub fn arm(&self, marker: &'static [u8], fault: Fault) {
        self.switch.send_modify(|s| s.armed = Some((marker, fault)));
    }

    /// Ends every open connection with an RST on both sides.
    pub fn reset_all(&self) {
        self.switch.send_modify(|s| s.resets += 1);
    }

    /// Connections accepted since the start (refused ones included).
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Connections relaying now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

async fn accept_loop(
    listener: TcpListener,
    switch: Arc<watch::Sender<Switch>>,
    watching: watch::Receiver<Switch>,
    accepted: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
) {
    while let Ok((client, _)) = listener.accept().await {
        accepted.fetch_add(1, Ordering::SeqCst);
        let _ = client.set_nodelay(true);
        let now = *watching.borrow();
        if now.fault == Fault::Refuse {
            let _ = client.set_zero_linger();
            drop(client);
            continue;
        }
        let watching = watching.clone();
        let switch = Arc::clone(&switch);
        let open = Arc::clone(&open);
        tokio::spawn(async move {
            let Ok(service) = TcpStream::connect(now.upstream).await else {
                let _ = client.set_zero_linger();
                return;
            };
            let _ = service.set_nodelay(true);
            open.fetch_add(1, Ordering::SeqCst);
            relay(client, service, switch, watching, now.resets).await;
            open.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// Relays both ways until either side closes, or `reset_all` ends the connection
/// with an RST.
async fn relay(
    client: TcpStream,
    service: TcpStream,
    switch: Arc<watch::Sender<Switch>>,
    mut watching: watch::Receiver<Switch>,
    resets_at_start: u64,
) {
    // Zero linger: dropping a socket sends an RST instead of a FIN, which is what a
    // reset must do. A side that closes cleanly is passed on by `shutdown` first.
    let _ = client.set_zero_linger();
    let _ = service.set_zero_linger();
    // `io::split`, not `into_split`: a dropped `OwnedWriteHalf` sends a FIN, which
    // would reach the peer before the RST of a reset.
    let (client_read, client_write) = tokio::io::split(client);
    let (service_read, service_write) = tokio::io::split(service);
    let to_service = tokio::spawn(pump(
        client_read,
        service_write,
        Direction::ToService,
        Some(switch),
        watching.clone(),
    ));
    let to_client = tokio::spawn(pump(
        service_read,
        client_write,
        Direction::ToClient,
        None,
        watching.clone(),
    ));
    let (to_service_abort, to_client_abort) = (to_service.abort_handle(), to_client.abort_handle());
    let both_done = async {
        let _ = to_service.await;
        let _ = to_client.await;
    };
    let reset = async {
        loop {
            if watching.changed().await.is_err() {
                return;
            }
            if watching.borrow().resets != resets_at_start {
                return;
            }
        }
    };
    tokio::select! {
        () = both_done => {}
        () = reset => {
            // Aborting drops the halves: both sockets close with an RST.
            to_service_abort.abort();
            to_client_abort.abort();
        }
    }
}

/// One direction: a reader that timestamps each chunk, and a writer that delivers it
/// when the switch lets it. The client's side (`arming`) fires an armed fault.
async fn pump(
    mut from: ReadHalf<TcpStream>,
    mut to: WriteHalf<TcpStream>,
    direction: Direction,
    arming: Option<Arc<watch::Sender<Switch>>>,
    mut watching: watch::Receiver<Switch>,
) {
    let (chunks, mut queued) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = tokio::spawn(async move {
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            match from.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if chunks.send((Instant::now(), buffer[..n].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
    });
    // Ends the reader with the writer (an abort of this task drops it too).
    let _reader_guard = AbortOnDrop(reader);
    // Delayed chunks keep their order: none is delivered before the one before it.
    let mut not_before = Instant::now();
    while let Some((read_at, chunk)) = queued.recv().await {
        if let Some(switch) = &arming {
            switch.send_if_modified(|s| match s.armed {
                Some((marker, fault)) if contains(&chunk, marker) => {
                    s.fault = fault;
                    s.armed = None;
                    true
                }
                _ => false,
            });
        }
        loop {
            let flow = watching.borrow_and_update().fault.flow(direction);
            match flow {
                Flow::Pass => break,
                Flow::Delay(latency) => {
                    not_before = not_before.max(read_at + latency.sample());
                    tokio::time::sleep_until(not_before).await;
                    break;
                }
                Flow::Hold => {
                    if watching.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
        if to.write_all(&chunk).await.is_err() {
            return;
        }
    }
    // The sender closed cleanly: pass the FIN on.
    let _ = to.shutdown().await;
}

fn contains(chunk: &[u8], marker: &[u8]) -> bool {
    !marker.is_empty() && chunk.windows(marker.len()).any(|w| w == marker)
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
