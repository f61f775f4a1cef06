//! The server's accept loop. HTTP/1.1 only: over TLS by ALPN, and over
//! plain TCP without protocol detection (an HTTP/2 preface is a malformed
//! HTTP/1 request, answered and closed), so that no phase of a connection
//! waits on its client unbounded:
//!
//! - at most `max_connections` open at once: past it the server stops
//!   accepting until one closes (the kernel's backlog holds the rest);
//!   at most `max_per_client` of them from one address: past it that
//!   address's connections are closed as they are accepted;
//! - a TLS handshake, and a request's headers (from the first byte the
//!   server waits for, keep-alive included), must arrive within `idle`;
//! - a request body must send a byte every `idle` (`api::body_reader`),
//!   and keep up a minimum rate;
//! - a response the client stops reading is cut off once its writes have
//!   made no progress for `idle`, and one it reads slower than
//!   `min_download_rate` on average over the time the server waited on
//!   it, once that reaches `idle`.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What every connection is held to.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub(super) idle: Duration,
    pub(super) max_connections: usize,
    pub(super) max_per_client: usize,
    pub(super) min_download_rate: u64,
}

/// Open connections by client address.
#[derive(Default)]
struct PerClient(std::sync::Mutex<HashMap<IpAddr, usize>>);

/// One open connection of an address, counted until dropped.
struct ClientSlot(Arc<PerClient>, IpAddr);

impl PerClient {
    fn take(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<ClientSlot> {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(ClientSlot(self.clone(), ip))
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut m = self.0.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.1);
            }
        }
    }
}

/// The service every request goes to: the router behind one concurrency
/// limit for the whole server (a clone shares its permits).
pub(super) type App = tower::limit::ConcurrencyLimit<axum::Router>;

/// Accepts until `stop`; each connection runs on `tracker`.
pub(super) async fn accept_loop(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    app: App,
    limits: Limits,
    stop: CancellationToken,
    kill: CancellationToken,
    tracker: TaskTracker,
) -> std::io::Result<()> {
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let per_client = Arc::new(PerClient::default());
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            () = stop.cancelled() => return Ok(()),
        };
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                // Out of descriptors, or a connection reset before it was
                // accepted: not the listener's end. Pause on the first.
                // A connection reset before it was accepted is its own end;
                // anything else (out of descriptors, of memory, of
                // buffers) waits a moment rather than spin.
                Err(e) => {
                    if !matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset
                    ) {
                        tracing::warn!(error = %e, "accept failed; retrying in 100 ms");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    continue;
                }
            },
            () = stop.cancelled() => return Ok(()),
        };
        // Closed at once (its server slot back) when its address has its
        // share open already.
        let Some(client_slot) = per_client.take(peer.ip(), limits.max_per_client.max(1)) else {
            tracing::debug!(%peer, "connection refused: its address has the most connections a client may open");
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let (tls, app, stop, kill) = (tls.clone(), app.clone(), stop.clone(), kill.clone());
        tracker.spawn(async move {
            let _permit = permit;
            let _client_slot = client_slot;
            // `kill`: the shutdown's grace is over, whatever phase this
            // connection is in (a handshake, a request).
            tokio::select! {
                r = connection(tcp, peer, tls, app, limits, stop) => if let Err(e) = r {
                    tracing::debug!(%peer, error = %e, "connection ended");
                },
                () = kill.cancelled() => tracing::debug!(%peer, "connection cut off at shutdown"),
            }
        });
    }
}

async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    tls: Option<tokio_rustls::TlsAcceptor>,
    app: App,
    limits: Limits,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let io = WriteStall::new(tcp, limits.idle, limits.min_download_rate);
    match tls {
        None => serve(io, peer, app, limits, stop).await,
        Some(acceptor) => {
            let s = tokio::time::timeout(limits.idle, acceptor.accept(io))
                .await
                .map_err(|_| {
                    std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the TLS handshake did not finish within the idle cut-off",
                    )
                })??;
            serve(s, peer, app, limits, stop).await
        }
    }
}

async fn serve<I>(
    io: I,
    peer: SocketAddr,
    app: App,
    limits: Limits,
    stop: CancellationToken,
) -> std::io::Result<()>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(ConnectInfo(peer));
        let app = app.clone();
        tower::ServiceExt::oneshot(app, req.map(axum::body::Body::new))
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.idle)
        .serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    let r = tokio::select! {
        r = conn.as_mut() => r,
        () = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    r.map_err(std::io::Error::other)
}

/// A connection whose writes fail with `TimedOut` once they have made no
/// progress for `idle` (a client that stops reading a response), or once
/// the client has read slower than `min_rate` bytes a second on average
/// over the time writes waited on it, when that reaches `idle` (a client
/// reading a byte a minute). Only waits count: the server's own pauses (a
/// slow store read) are not the client's. The average is taken when a
/// wait ends, with what it let through: a wait lasts until the kernel has
/// room for a write, which a steady reader above the minimum may take
/// most of `idle` to make, and that reader must not be cut mid-wait.
struct WriteStall<T> {
    inner: T,
    idle: Duration,
    min_rate: u64,
    /// The wait in progress: since when, and when it is cut off.
    stalled: Option<(Instant, Pin<Box<tokio::time::Sleep>>)>,
    /// How long writes have waited on the client, in all.
    waited: Duration,
    /// Bytes written since the first wait (the socket's buffer was full
    /// then: from there on, what is written is what the client read).
    drained: Option<u64>,
    /// The average fell below the minimum: every further write fails.
    too_slow: bool,
}

impl<T> WriteStall<T> {
    fn new(inner: T, idle: Duration, min_rate: u64) -> Self {
        WriteStall {
            inner,
            idle,
            min_rate,
            stalled: None,
            waited: Duration::ZERO,
            drained: None,
            too_slow: false,
        }
    }

    fn slow<R>() -> Poll<std::io::Result<R>> {
        Poll::Ready(Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the client read slower than the minimum download rate",
        )))
    }

    /// After a pending write: time out once the wait has lasted `idle`.
    fn pending<R>(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<R>> {
        let idle = self.idle;
        if self.stalled.is_none() {
            self.drained.get_or_insert(0);
            self.stalled = Some((Instant::now(), Box::pin(tokio::time::sleep(idle))));
        }
        let (_, timer) = self.stalled.as_mut().expect("set above");
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client read nothing for the idle cut-off",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn done<R>(
        &mut self,
        r: Poll<std::io::Result<R>>,
        cx: &mut Context<'_>,
        written: impl Fn(&R) -> usize,
    ) -> Poll<std::io::Result<R>> {
        match r {
            Poll::Pending => self.pending(cx),
            ready => {
                if let (Some(d), Poll::Ready(Ok(v))) = (self.drained.as_mut(), &ready) {
                    *d += written(v) as u64;
                }
                if let Some((since, _)) = self.stalled.take() {
                    // A wait ended: the average over all of them so far.
                    self.waited += since.elapsed();
                    let drained = self.drained.unwrap_or(0) as f64;
                    if self.min_rate > 0
                        && self.waited >= self.idle
                        && drained < self.min_rate as f64 * self.waited.as_secs_f64()
                    {
                        self.too_slow = true;
                    }
                }
                ready
            }
        }
    }
}

use std::future::Future;

impl<T: AsyncRead + Unpin> AsyncRead for WriteStall<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteStall<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.too_slow {
            return Self::slow();
        }
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.done(r, cx, |n| *n)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        if self.too_slow {
            return Self::slow();
        }
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.done(r, cx, |n| *n)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.too_slow {
            return Self::slow();
        }
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.done(r, cx, |()| 0)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.done(r, cx, |()| 0)
    }
}

/// A TLS acceptor from PEM files: HTTP/1.1 by ALPN.
pub(super) fn tls_acceptor(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Result<tokio_rustls::TlsAcceptor, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect())
        .map_err(|e| format!("TLS certificate {}: {e}", cert.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "TLS certificate {}: no certificate in it",
            cert.display()
        ));
    }
    let key_der =
        PrivateKeyDer::from_pem_file(key).map_err(|e| format!("TLS key {}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| {
            format!(
                "TLS certificate {} / key {}: {e}",
                cert.display(),
                key.display()
            )
        })?;
    // HTTP/1.1 only, as over plain TCP: the router is built for it (an
    // early answer to an unread upload, a 401 say, is a stream error under
    // HTTP/2's flow control, not an answer).
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}
