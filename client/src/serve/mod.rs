//! `alkblobs serve`: the HTTP ops surface of a storage node, over any
//! [`Store`] (embedded, single-instance or one instance of a fleet).
//!
//! ```text
//! PUT    /blobs/{key}       a verified, streamed upload: 422 when the bytes are not the key
//! POST   /blobs             an upload whose key the server computes
//! GET    /blobs/{key}       the blob (or one `Range: bytes=…`), verified as it is sent
//! HEAD   /blobs/{key}       its length, ETag and Accept-Ranges
//! GET    /blobs?after=K&limit=N   keys in order, a page at a time (JSON)
//! GET    /blobs/{key}/outboard   its BLAKE3 outboard (ranges too)
//! PUT    /blobs/{key}/outboard   stores one (its length checked, 422)
//! DELETE /pins/{id}         releases the pin a put handed out
//! ```
//!
//! Every blob response carries the strong ETag `"<key>"` (the content
//! never changes), so `If-None-Match`, `If-Match` and `If-Range` work as
//! HTTP says. Errors are JSON, `{"error": {"code": …, "message": …}}`, with
//! the stable codes of [`ApiError`]. A put answers with the key and a pin
//! the server holds for the client until it releases it (`DELETE
//! /pins/{id}`, once the key is recorded in its liveness) or the pin's
//! hold ends (`pin_hold`, default 10 minutes): the protocol's
//! pin-before-publish, across the network.
//!
//! Access: bearer tokens (`Authorization: Bearer …`), each granting read or
//! read+write ([`Tokens`]); with none configured, loopback clients may read
//! and write and every other client is refused.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{Error, Result, Store};

mod api;
mod listen;
mod range;

pub use api::ApiError;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Grant {
    /// `GET` and `HEAD`.
    Read,
    /// Reads, puts and pin releases.
    Write,
}

/// The bearer tokens a server accepts, each with its grant. Held as their
/// BLAKE3 hashes, so a lookup leaks nothing through timing about a token's
/// prefix.
#[derive(Debug, Clone, Default)]
pub struct Tokens(HashMap<[u8; 32], Grant>);

impl Tokens {
    /// No tokens: loopback clients only.
    pub fn none() -> Tokens {
        Tokens::default()
    }

    /// Adds a token.
    pub fn with(mut self, token: &str, grant: Grant) -> Tokens {
        self.0
            .insert(*blake3::hash(token.as_bytes()).as_bytes(), grant);
        self
    }

    /// Parses a token file: one `TOKEN read|write` per line; blank lines
    /// and `#` comments are skipped. A token is at least 16 characters.
    pub fn parse(text: &str) -> Result<Tokens> {
        let mut t = Tokens::none();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: &str| Error::Config(format!("token file line {}: {why}", i + 1));
            let mut parts = line.split_whitespace();
            let (Some(token), Some(grant), None) = (parts.next(), parts.next(), parts.next())
            else {
                return Err(bad("expected `TOKEN read` or `TOKEN write`"));
            };
            if token.len() < 16 {
                return Err(bad("a token is at least 16 characters"));
            }
            let grant = match grant {
                "read" => Grant::Read,
                "write" => Grant::Write,
                other => return Err(bad(&format!("{other:?} is not read or write"))),
            };
            t = t.with(token, grant);
        }
        if t.0.is_empty() {
            return Err(Error::Config("the token file holds no token".into()));
        }
        Ok(t)
    }

    /// Reads a token file (see [`Tokens::parse`]).
    pub fn load(path: &Path) -> Result<Tokens> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Input {
            what: path.display().to_string(),
            source,
        })?;
        Tokens::parse(&text)
    }

    fn grant(&self, token: &str) -> Option<Grant> {
        self.0
            .get(blake3::hash(token.as_bytes()).as_bytes())
            .copied()
    }

    /// Whether any token is configured.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// How a server runs; build with `ServeOptions::new(addr).tokens(..)`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServeOptions {
    /// Where to listen.
    pub listen: SocketAddr,
    /// Who may do what.
    pub tokens: Tokens,
    /// TLS certificate chain and private key (PEM files); plain HTTP
    /// without.
    pub tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// The largest upload body (default 64 GiB): 413 beyond.
    pub max_body: u64,
    /// Requests served at once, by the whole server (default 64); more
    /// wait their turn.
    pub max_concurrency: usize,
    /// Connections open at once (default 512; keep it under the process's
    /// descriptor limit, less what the store needs): past it the server
    /// accepts no more until one closes.
    pub max_connections: usize,
    /// Connections open at once from one client address (default 64):
    /// past it that address's further connections are closed as they
    /// are accepted, so one client cannot fill `max_connections`. Behind a
    /// reverse proxy every client has the proxy's address: raise it to
    /// `max_connections` there.
    pub max_connections_per_client: usize,
    /// The slowest a client may read a response, on average over the time
    /// the server waits on it once that reaches `idle_timeout` (default
    /// 4 KiB/s, 0: none): a slower reader is cut off instead of holding
    /// its connection, a request slot and the store's read for hours.
    pub min_download_rate: u64,
    /// The slowest an upload may send its body, on average once it has
    /// run for `idle_timeout` (default 4 KiB/s): a body trickled slower
    /// ends with 408 instead of holding a request slot.
    pub min_upload_rate: u64,
    /// How long a put's pin is held for its client (default 10 minutes).
    pub pin_hold: Duration,
    /// Pins held for clients at once (default 100,000): a put beyond is
    /// refused (503 `pins_full`) before its body is read, until clients
    /// release theirs or holds end.
    pub max_held_pins: usize,
    /// A connection that waits this long on its client is cut off
    /// (default 30 s): a TLS handshake, a request's headers (counted from
    /// the first byte the server waits for), a silence in a body, or a
    /// response the client does not read.
    pub idle_timeout: Duration,
}

impl ServeOptions {
    /// Defaults, listening on `listen`.
    pub fn new(listen: SocketAddr) -> ServeOptions {
        ServeOptions {
            listen,
            tokens: Tokens::none(),
            tls: None,
            max_body: 64 << 30,
            max_concurrency: 64,
            max_connections: 512,
            max_connections_per_client: 64,
            min_download_rate: 4096,
            min_upload_rate: 4096,
            pin_hold: Duration::from_secs(600),
            max_held_pins: 100_000,
            idle_timeout: Duration::from_secs(30),
        }
    }

    /// The bearer tokens.
    pub fn tokens(mut self, tokens: Tokens) -> Self {
        self.tokens = tokens;
        self
    }

    /// TLS from PEM files.
    pub fn tls(
        mut self,
        cert: impl Into<std::path::PathBuf>,
        key: impl Into<std::path::PathBuf>,
    ) -> Self {
        self.tls = Some((cert.into(), key.into()));
        self
    }

    /// The largest upload.
    pub fn max_body(mut self, bytes: u64) -> Self {
        self.max_body = bytes;
        self
    }

    /// Requests served at once.
    pub fn max_concurrency(mut self, n: usize) -> Self {
        self.max_concurrency = n.max(1);
        self
    }

    /// Connections open at once.
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// Connections open at once from one client address.
    pub fn max_connections_per_client(mut self, n: usize) -> Self {
        self.max_connections_per_client = n.max(1);
        self
    }

    /// The slowest average download rate, in bytes a second (0: none).
    pub fn min_download_rate(mut self, bytes_per_second: u64) -> Self {
        self.min_download_rate = bytes_per_second;
        self
    }

    /// The slowest average upload rate, in bytes a second (0: none).
    pub fn min_upload_rate(mut self, bytes_per_second: u64) -> Self {
        self.min_upload_rate = bytes_per_second;
        self
    }

    /// How long a put's pin is held.
    pub fn pin_hold(mut self, d: Duration) -> Self {
        self.pin_hold = d;
        self
    }

    /// How many pins may be held for clients at once.
    pub fn max_held_pins(mut self, n: usize) -> Self {
        self.max_held_pins = n.max(1);
        self
    }

    /// The idle cut-off.
    pub fn idle_timeout(mut self, d: Duration) -> Self {
        self.idle_timeout = d;
        self
    }
}

/// Pins handed to clients by puts, by unguessable id, until released or
/// their hold ends.
#[derive(Default)]
struct HeldPins(Mutex<HashMap<String, (crate::PinGuard, Instant)>>);

impl HeldPins {
    fn hold(&self, pin: crate::PinGuard, until: Instant) -> String {
        let id = format!("{:032x}", rand::random::<u128>());
        self.lock().insert(id.clone(), (pin, until));
        id
    }

    fn release(&self, id: &str) -> bool {
        self.lock().remove(id).is_some()
    }

    /// Drops the pins whose hold has ended.
    fn expire(&self, now: Instant) {
        self.lock().retain(|_, (_, until)| *until > now);
    }

    /// Whether `max` pins are held (after dropping the ended holds). A
    /// put checks before it starts, so puts in flight can pass it by at
    /// most the concurrency limit.
    fn full(&self, now: Instant, max: usize) -> bool {
        let mut held = self.lock();
        if held.len() < max {
            return false;
        }
        held.retain(|_, (_, until)| *until > now);
        held.len() >= max
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (crate::PinGuard, Instant)>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A running server: its address, and the way to stop it.
pub struct Server {
    addr: SocketAddr,
    stop: tokio_util::sync::CancellationToken,
    kill: tokio_util::sync::CancellationToken,
    connections: tokio_util::task::TaskTracker,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    /// Where it listens (the real port when asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, lets requests in flight finish (up to `grace`),
    /// then returns.
    pub async fn shutdown(self, grace: Duration) -> Result<()> {
        self.stop.cancel();
        self.connections.close();
        if tokio::time::timeout(grace, self.connections.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                ?grace,
                "requests still in flight after the shutdown grace: cut off"
            );
            self.kill.cancel();
            self.connections.wait().await;
        }
        match self.task.await {
            Ok(r) => r.map_err(|e| Error::engine("serve", e)),
            Err(e) => Err(Error::engine(
                "serve",
                format!("the server task failed: {e}"),
            )),
        }
    }
}

/// Starts serving `store`; returns once it listens.
pub async fn start(store: Store, opts: ServeOptions) -> Result<Server> {
    let tls = match &opts.tls {
        None => None,
        Some((cert, key)) => Some(listen::tls_acceptor(cert, key).map_err(Error::Config)?),
    };
    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .map_err(|e| Error::Config(format!("cannot listen on {}: {e}", opts.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::Config(format!("cannot listen on {}: {e}", opts.listen)))?;
    let state = Arc::new(api::State {
        store,
        tokens: opts.tokens.clone(),
        pins: HeldPins::default(),
        pin_hold: opts.pin_hold,
        max_held_pins: opts.max_held_pins,
        max_body: opts.max_body,
        idle: opts.idle_timeout,
        min_rate: opts.min_upload_rate,
    });
    let reaper = Arc::downgrade(&state);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let Some(s) = reaper.upgrade() else { return };
            s.pins.expire(Instant::now());
        }
    });
    // One limit for the server: a layer on the router would give each
    // route and method its own.
    let app = tower::limit::ConcurrencyLimit::new(api::router(state), opts.max_concurrency);
    let stop = tokio_util::sync::CancellationToken::new();
    let kill = tokio_util::sync::CancellationToken::new();
    let connections = tokio_util::task::TaskTracker::new();
    let limits = listen::Limits {
        idle: opts.idle_timeout,
        max_connections: opts.max_connections,
        max_per_client: opts.max_connections_per_client,
        min_download_rate: opts.min_download_rate,
    };
    let task = tokio::spawn(listen::accept_loop(
        listener,
        tls,
        app,
        limits,
        stop.clone(),
        kill.clone(),
        connections.clone(),
    ));
    Ok(Server {
        addr,
        stop,
        kill,
        connections,
        task,
    })
}
