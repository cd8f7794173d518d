//! An HTTPS front for a plain TCP server: TLS terminated with the test PKI's server
//! certificate (optionally requiring a client certificate the test CA signed), the
//! bytes relayed to the server behind it. Counts the handshakes it refused.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

pub struct TlsFront {
    addr: SocketAddr,
    refused: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TlsFront {
    pub async fn start(config: Arc<rustls::ServerConfig>, upstream: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let refused = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&refused);
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let counter = Arc::clone(&counter);
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(socket).await else {
                        counter.fetch_add(1, Ordering::SeqCst);
                        return;
                    };
                    if let Ok(mut plain) = tokio::net::TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                    }
                });
            }
        });
        Self {
            addr,
            refused,
            task,
        }
    }

    /// `https://127.0.0.1:<port>` (the server certificate names the address).
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.addr.port())
    }

    /// Handshakes the front refused (no or an untrusted client certificate, or a
    /// client that refused the server's).
    pub fn refused(&self) -> usize {
        self.refused.load(Ordering::SeqCst)
    }
}
