//! `routed`: a large tier on another node, through its `alkblobs serve`
//! (feature `serve`). Every byte it receives is checked against its key
//! before it is returned. A range (and a whole get, 4 MiB at a time) is
//! one request for its verified stream (`GET /blobs/{key}/bao`, decoded by
//! [`crate::bao::decode`]); should that not verify, or the node be too old
//! to have it, the range is read again the long way — its bytes and the
//! node's outboard, itself checked against the key — which reads around a
//! damaged outboard and names the first bad offset of damaged bytes
//! ([`crate::Error::CorruptAt`]). Streams read the long way.
//!
//! Puts are verified uploads (`PUT /blobs/{key}`: the storage node stores
//! nothing that is not the key) and release the pin the node holds for
//! them at once: the putting store's own pin (pin-before-publish, in the
//! pool both share) protects the key. Deletion is the storage node's:
//! this engine refuses it ([`crate::Error::ReadOnly`]), so a pool whose
//! kv-only nodes route large content sweeps on its storage node.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::TryStreamExt;
use reqwest::{Method, StatusCode};
use tokio::io::AsyncWriteExt;

use super::{Backend, BlobReader, KeyStream, LargeBackend, PutOutcome, Sharing, StagedWrite};
use crate::integrity::Source;
use crate::integrity::verified::{range_verified, reader_verified};
use crate::{Error, Key, Result};

/// Keys one listing request returns.
const LIST_PAGE: usize = 1000;

/// The most one verified-stream request asks for: a longer read is several
/// (memory follows what arrived and verified, never a claimed size).
const BAO_WINDOW: u64 = 4 << 20;

/// What a verified-stream request gave.
enum Bao {
    /// Bytes that verified against the key, and the blob's size (proven
    /// by them: the stream always carries the last chunk).
    Bytes(Bytes, u64),
    /// Nothing usable: read the long way.
    Unverified,
}

/// Where a routed engine sends large content; build with
/// `RoutedOptions::new(url).token(..)`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RoutedOptions {
    /// The storage node's `alkblobs serve` URL, e.g. `https://store-1:7860`.
    pub url: String,
    /// A bearer token granting write (or read, for a read-only node).
    pub token: Option<String>,
    /// A PEM file of the CA that signed the node's certificate, when it is
    /// not one the system trusts.
    pub ca_file: Option<PathBuf>,
}

impl RoutedOptions {
    /// A node at `url`.
    pub fn new(url: impl Into<String>) -> RoutedOptions {
        RoutedOptions {
            url: url.into().trim_end_matches('/').to_owned(),
            token: None,
            ca_file: None,
        }
    }

    /// The bearer token.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// The CA certificate file.
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }
}

struct Inner {
    opts: RoutedOptions,
    client: reqwest::Client,
    display: String,
}

/// The engine: cloning shares the connection pool.
#[derive(Clone)]
pub struct RoutedBackend {
    inner: Arc<Inner>,
    /// The same node, unverified: what the verified reads read through.
    raw: Arc<dyn Source>,
}

/// The storage node's answers as they come, for the verifier to check.
struct Raw(Arc<Inner>);

/// The most of an error answer's body kept (its message).
const ERROR_BODY_MAX: usize = 4096;

/// A response's body, failing past `max` bytes (a node sending more than
/// it was asked for is not read to the end).
async fn body_capped(inner: &Inner, r: reqwest::Response, max: u64) -> Result<Bytes> {
    use futures::StreamExt;
    let mut out = bytes::BytesMut::new();
    let mut stream = r.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| inner.transport(e))?;
        if (out.len() + chunk.len()) as u64 > max {
            return Err(Error::engine(
                &inner.display,
                format!("the storage node sent more than the {max} bytes asked for"),
            ));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out.freeze())
}

impl Inner {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.opts.url)
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.client.request(method, self.url(path));
        match &self.opts.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    fn transport(&self, e: reqwest::Error) -> Error {
        Error::Unavailable {
            engine: self.display.clone(),
            source: Box::new(e.without_url()),
        }
    }

    /// An answer that is not the one expected, as an error: the node's
    /// JSON error when it sent one.
    async fn unexpected(&self, what: &str, key: Option<&Key>, r: reqwest::Response) -> Error {
        let status = r.status();
        let body = match body_capped(self, r, u64::MAX).await {
            Ok(b) => String::from_utf8_lossy(&b[..b.len().min(ERROR_BODY_MAX)]).into_owned(),
            Err(_) => String::new(),
        };
        let code = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"]["code"].as_str().map(str::to_owned))
            .unwrap_or_default();
        match (status, code.as_str(), key) {
            (StatusCode::UNPROCESSABLE_ENTITY, "hash_mismatch", Some(k)) => Error::HashMismatch {
                expected: *k,
                actual: *k,
            },
            // The storage node's pool records the key, its content is gone:
            // an integrity failure, not something a retry mends.
            (_, "lost", Some(k)) => Error::Lost {
                key: *k,
                engine: self.display.clone(),
                detail: format!("{what}: the storage node reports it lost"),
            },
            (StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN, ..) => Error::Config(format!(
                "{}: {what}: the storage node refused ({status}, {code}): check the routed tier's token",
                self.display
            )),
            (s, ..) if s.is_server_error() || s == StatusCode::REQUEST_TIMEOUT => {
                Error::Unavailable {
                    engine: self.display.clone(),
                    source: format!("{what}: {status} {body}").into(),
                }
            }
            _ => Error::engine(&self.display, format!("{what}: {status} {body}")),
        }
    }

    async fn size(&self, key: &Key) -> Result<Option<u64>> {
        let r = self
            .request(Method::HEAD, &format!("/blobs/{key}"))
            .send()
            .await
            .map_err(|e| self.transport(e))?;
        match r.status() {
            // The header itself: a HEAD response's body is empty, and
            // reqwest's content_length() is the body's.
            StatusCode::OK => r
                .headers()
                .get(reqwest::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
                .map(Some)
                .ok_or_else(|| {
                    Error::engine(&self.display, "a HEAD answer without Content-Length")
                }),
            StatusCode::NOT_FOUND => Ok(None),
            _ => Err(self.unexpected("stat a blob", Some(key), r).await),
        }
    }

    /// `[offset, offset+len)` of the blob or its outboard (`suffix`
    /// "/outboard"), as the node sends it; `None` when it has none.
    async fn window(
        &self,
        key: &Key,
        suffix: &str,
        offset: u64,
        len: u64,
    ) -> Result<Option<Bytes>> {
        if len == 0 {
            return Ok(Some(Bytes::new()));
        }
        let last = offset.saturating_add(len) - 1;
        let r = self
            .request(Method::GET, &format!("/blobs/{key}{suffix}"))
            .header(reqwest::header::RANGE, format!("bytes={offset}-{last}"))
            .send()
            .await
            .map_err(|e| self.transport(e))?;
        match r.status() {
            StatusCode::PARTIAL_CONTENT => Ok(Some(body_capped(self, r, len).await?)),
            // The whole of it for a window from the start (a node may
            // ignore a range): never read past the window.
            StatusCode::OK if offset == 0 => Ok(Some(body_capped(self, r, len).await?)),
            StatusCode::NOT_FOUND => Ok(None),
            // At or past the end.
            StatusCode::RANGE_NOT_SATISFIABLE => {
                let size = r
                    .headers()
                    .get(reqwest::header::CONTENT_RANGE)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("bytes */"))
                    .and_then(|v| v.parse::<u64>().ok());
                match size {
                    Some(s) if offset == s => Ok(Some(Bytes::new())),
                    Some(s) => Err(Error::InvalidRange {
                        key: *key,
                        offset,
                        size: s,
                    }),
                    None => Err(self.unexpected("read a range", Some(key), r).await),
                }
            }
            _ => Err(self.unexpected("read a range", Some(key), r).await),
        }
    }

    /// `[offset, offset+len)` of the blob through its verified stream,
    /// decoded here: `Ok(Bao::Bytes)` only for bytes that verified,
    /// `Ok(Bao::Unverified)` when the stream did not verify or the node has
    /// no such route (the caller reads the long way), errors of transport
    /// and of the node as they are. At most `len` of a window of at most
    /// [`BAO_WINDOW`] bytes (a claimed size allocates nothing).
    async fn bao(&self, key: &Key, offset: u64, len: u64) -> Result<Bao> {
        let last = offset.saturating_add(len.clamp(1, BAO_WINDOW)) - 1;
        let r = self
            .request(
                Method::GET,
                &format!("/blobs/{key}/bao?range={offset}-{last}"),
            )
            .send()
            .await
            .map_err(|e| self.transport(e))?;
        match r.status() {
            StatusCode::OK => {}
            StatusCode::NOT_FOUND | StatusCode::RANGE_NOT_SATISFIABLE => {
                // Absent, past the end, or a node without the route: the
                // long way tells which.
                return Ok(Bao::Unverified);
            }
            _ => return Err(self.unexpected("read a verified range", Some(key), r).await),
        }
        let size = r
            .headers()
            .get("alkblobs-size")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let Some(size) = size.filter(|s| offset < *s) else {
            return Ok(Bao::Unverified);
        };
        let want = offset..(last + 1).min(size);
        // The range, its pairs (one per 16 KiB group and two per tree
        // level), the pairs inside its edge groups, the last chunk and its
        // path: never more than this.
        let n = want.end - want.start;
        let bound = n + n / 128 + (64 << 10);
        let body = match body_capped(self, r, bound).await {
            Ok(b) => b,
            Err(Error::Engine { .. }) => return Ok(Bao::Unverified),
            Err(e) => return Err(e),
        };
        let k = *key;
        let decoded = tokio::task::spawn_blocking(move || {
            crate::integrity::bao::decode(&k, size, want, &body[..])
        })
        .await
        .map_err(|e| {
            Error::engine(
                &self.display,
                format!("decoding a verified range failed: {e}"),
            )
        })?;
        match decoded {
            Ok(b) => Ok(Bao::Bytes(b, size)),
            Err(e) => {
                tracing::warn!(key = %key, engine = %self.display, error = %e,
                    "a verified stream from the storage node did not verify; reading the range the long way");
                Ok(Bao::Unverified)
            }
        }
    }

    /// A verified upload of `body`; the node's pin on it is released (the
    /// caller's store pinned the key in the pool both share).
    async fn upload(&self, key: &Key, body: reqwest::Body) -> Result<PutOutcome> {
        let r = self
            .request(Method::PUT, &format!("/blobs/{key}"))
            .body(body)
            .send()
            .await
            .map_err(|e| self.transport(e))?;
        let outcome = match r.status() {
            StatusCode::CREATED => PutOutcome::Created,
            StatusCode::OK => PutOutcome::Existed,
            _ => return Err(self.unexpected("put a blob", Some(key), r).await),
        };
        let body = body_capped(self, r, 64 << 10).await?;
        let answer: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        // The path is built here from an id of the server's form, never
        // taken from the answer (a node could aim it, and the token, at
        // another host).
        if let Some(id) = answer["pin"]["id"].as_str()
            && id.len() == 32
            && id.bytes().all(|b| b.is_ascii_hexdigit())
        {
            // Best effort: a pin left behind ends with its hold.
            let _ = self
                .request(Method::DELETE, &format!("/pins/{id}"))
                .send()
                .await;
        }
        Ok(outcome)
    }
}

impl RoutedBackend {
    /// Connects to the storage node at `opts.url` and checks that it
    /// answers (and accepts the token for reads).
    pub async fn open(opts: RoutedOptions) -> Result<RoutedBackend> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        // Bounded waits (a stalled node fails the call: retryable), and
        // no redirects (the token goes to the node named, nowhere else).
        let mut b = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            .read_timeout(std::time::Duration::from_secs(60))
            .redirect(reqwest::redirect::Policy::none());
        if let Some(ca) = &opts.ca_file {
            let pem = std::fs::read(ca).map_err(|source| Error::Input {
                what: ca.display().to_string(),
                source,
            })?;
            let cert = reqwest::Certificate::from_pem(&pem)
                .map_err(|e| Error::Config(format!("CA file {}: {e}", ca.display())))?;
            b = b.add_root_certificate(cert);
        }
        let client = b
            .build()
            .map_err(|e| Error::Config(format!("routed tier {}: {e}", opts.url)))?;
        if !(opts.url.starts_with("http://") || opts.url.starts_with("https://")) {
            return Err(Error::Config(format!(
                "routed tier {:?}: the storage node's URL starts with http:// or https://",
                opts.url
            )));
        }
        let inner = Arc::new(Inner {
            display: format!("routed({})", opts.url),
            opts,
            client,
        });
        let r = inner
            .request(Method::GET, "/blobs?limit=0")
            .send()
            .await
            .map_err(|e| inner.transport(e))?;
        if r.status() != StatusCode::OK {
            return Err(inner.unexpected("reach the storage node", None, r).await);
        }
        Ok(RoutedBackend {
            raw: Arc::new(Raw(inner.clone())),
            inner,
        })
    }
}

impl RoutedBackend {
    /// `[offset, offset+len)` verified: through the node's verified stream,
    /// [`BAO_WINDOW`] at a time; a window that does not come verified
    /// that way (and everything after it) is read the long way.
    async fn verified_range(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        if len == 0 {
            return range_verified(&self.raw, key, offset, len, true).await;
        }
        let mut out = bytes::BytesMut::new();
        let mut at = offset;
        loop {
            let left = len - (at - offset);
            match self.inner.bao(key, at, left).await? {
                Bao::Bytes(b, size) => {
                    out.extend_from_slice(&b);
                    at += b.len() as u64;
                    if at >= size || at - offset == len || b.is_empty() {
                        return Ok(Some(out.freeze()));
                    }
                }
                Bao::Unverified => {
                    return match range_verified(&self.raw, key, at, left, true).await? {
                        Some(rest) if at == offset => Ok(Some(rest)),
                        Some(rest) => {
                            out.extend_from_slice(&rest);
                            Ok(Some(out.freeze()))
                        }
                        // Deleted between two windows: gone.
                        None => Ok(None),
                    };
                }
            }
        }
    }
}

impl fmt::Debug for RoutedBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RoutedBackend")
            .field("url", &self.inner.opts.url)
            .finish()
    }
}

impl fmt::Display for RoutedBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.inner.display)
    }
}

impl fmt::Debug for Raw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.display)
    }
}

impl fmt::Display for Raw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.display)
    }
}

fn refused(engine: &str) -> Error {
    Error::ReadOnly {
        engine: engine.to_owned(),
        action: "delete (a routed tier's deletions run on its storage node: sweep there)",
    }
}

#[async_trait]
impl Backend for RoutedBackend {
    fn name(&self) -> &str {
        "routed"
    }

    fn sharing(&self) -> Sharing {
        Sharing::Shared
    }

    async fn has(&self, key: &Key) -> Result<bool> {
        Ok(self.inner.size(key).await?.is_some())
    }

    async fn get(&self, key: &Key) -> Result<Option<Bytes>> {
        self.verified_range(key, 0, u64::MAX).await
    }

    async fn put(&self, key: &Key, value: Bytes) -> Result<PutOutcome> {
        self.inner.upload(key, reqwest::Body::from(value)).await
    }

    async fn delete(&self, _key: &Key) -> Result<Option<u64>> {
        Err(refused(&self.inner.display))
    }

    fn list(&self) -> KeyStream<'_> {
        let inner = self.inner.clone();
        crate::pager::paged(
            LIST_PAGE,
            |k: &Key| *k,
            move |after: Option<Key>| {
                let inner = inner.clone();
                async move {
                    let path = match after {
                        Some(a) => format!("/blobs?after={a}&limit={LIST_PAGE}"),
                        None => format!("/blobs?limit={LIST_PAGE}"),
                    };
                    let r = inner
                        .request(Method::GET, &path)
                        .send()
                        .await
                        .map_err(|e| inner.transport(e))?;
                    if r.status() != StatusCode::OK {
                        return Err(inner.unexpected("list blobs", None, r).await);
                    }
                    let body = body_capped(&inner, r, (LIST_PAGE as u64 + 1) * 70).await?;
                    let hex: Vec<String> = serde_json::from_slice(&body).map_err(|e| {
                        Error::engine(
                            &inner.display,
                            format!("the node's listing is not keys: {e}"),
                        )
                    })?;
                    let keys = hex
                        .iter()
                        .map(|h| h.parse::<Key>().map_err(Error::from))
                        .collect::<Result<Vec<Key>>>()?;
                    // Strictly ascending after the cursor, at most a page:
                    // a node repeating a page cannot make the listing loop.
                    let mut last = after;
                    for k in &keys {
                        if last.is_some_and(|l| *k <= l) {
                            return Err(Error::engine(
                                &inner.display,
                                format!("the node listed {k} out of order"),
                            ));
                        }
                        last = Some(*k);
                    }
                    if keys.len() > LIST_PAGE {
                        return Err(Error::engine(
                            &inner.display,
                            "the node sent more than a page",
                        ));
                    }
                    Ok(keys)
                }
            },
        )
    }

    async fn size(&self, key: &Key) -> Result<Option<u64>> {
        self.inner.size(key).await
    }

    async fn get_range(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        LargeBackend::read_range(self, key, offset, len).await
    }
}

#[async_trait]
impl LargeBackend for RoutedBackend {
    async fn begin_write(&self) -> Result<Box<dyn StagedWrite + '_>> {
        let file = tempfile::tempfile().map_err(|e| Error::engine(&self.inner.display, e))?;
        Ok(Box::new(RoutedWrite {
            inner: self.inner.clone(),
            spool: tokio::fs::File::from_std(file),
            written: 0,
        }))
    }

    async fn open_read(&self, key: &Key) -> Result<Option<BlobReader>> {
        reader_verified(&self.raw, key, 0, u64::MAX).await
    }

    async fn read_range(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        self.verified_range(key, offset, len).await
    }

    async fn delete_through(&self, _key: &Key, _through: u64) -> Result<Option<u64>> {
        Err(refused(&self.inner.display))
    }

    async fn read_outboard(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        self.inner.window(key, "/outboard", offset, len).await
    }

    async fn put_outboard(&self, key: &Key, outboard: Bytes) -> Result<bool> {
        let r = self
            .inner
            .request(Method::PUT, &format!("/blobs/{key}/outboard"))
            .body(outboard)
            .send()
            .await
            .map_err(|e| self.inner.transport(e))?;
        match r.status() {
            StatusCode::NO_CONTENT => Ok(true),
            StatusCode::NOT_FOUND => Ok(false),
            _ => Err(self.inner.unexpected("put an outboard", Some(key), r).await),
        }
    }
}

/// What the verifier reads through: the node's bytes and outboards as sent.
#[async_trait]
impl Source for Raw {
    async fn size(&self, key: &Key) -> Result<Option<u64>> {
        self.0.size(key).await
    }
    async fn open_read(&self, key: &Key) -> Result<Option<BlobReader>> {
        let r = self
            .0
            .request(Method::GET, &format!("/blobs/{key}"))
            .send()
            .await
            .map_err(|e| self.0.transport(e))?;
        match r.status() {
            StatusCode::OK => {
                let stream = r.bytes_stream().map_err(std::io::Error::other);
                Ok(Some(Box::pin(tokio_util::io::StreamReader::new(stream))))
            }
            StatusCode::NOT_FOUND => Ok(None),
            _ => Err(self.0.unexpected("read a blob", Some(key), r).await),
        }
    }
    async fn read_range(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        self.0.window(key, "", offset, len).await
    }
    async fn read_outboard(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        self.0.window(key, "/outboard", offset, len).await
    }
    fn outboard_floor(&self) -> u64 {
        0
    }
}

/// A write spooled to an unnamed temporary file, uploaded at commit (the
/// node verifies it against the key and computes its own outboard).
struct RoutedWrite {
    inner: Arc<Inner>,
    spool: tokio::fs::File,
    written: u64,
}

#[async_trait]
impl StagedWrite for RoutedWrite {
    async fn write(&mut self, chunk: Bytes) -> Result<()> {
        self.spool
            .write_all(&chunk)
            .await
            .map_err(|e| Error::engine(&self.inner.display, format!("spooling a put: {e}")))?;
        self.written += chunk.len() as u64;
        Ok(())
    }

    fn written(&self) -> u64 {
        self.written
    }

    async fn commit(mut self: Box<Self>, key: &Key, _outboard: Bytes) -> Result<PutOutcome> {
        use tokio::io::AsyncSeekExt;
        let spool_err =
            |e: std::io::Error| Error::engine(&self.inner.display, format!("spooling a put: {e}"));
        self.spool.flush().await.map_err(spool_err)?;
        self.spool.rewind().await.map_err(spool_err)?;
        let file = std::mem::replace(
            &mut self.spool,
            tokio::fs::File::from_std(tempfile::tempfile().map_err(spool_err)?),
        );
        let body =
            reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::with_capacity(file, 1 << 20));
        self.inner.upload(key, body).await
    }

    async fn abort(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}
