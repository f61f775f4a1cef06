//! `s3`: the large-tier engine on S3 or any service speaking its API,
//! through the `object_store` crate (feature `s3`) — its options, errors,
//! open and the engine traits (this file); where objects live
//! (`location.rs`), where credentials come from (`config.rs`), publishing
//! a blob and reclaiming abandoned uploads (`upload.rs`), the streaming
//! writer (`writer.rs`), reads and a fleet prefix's later generations
//! (`read.rs`), the lease of a prefix one process writes (`lease.rs`) and
//! the store or pool a prefix belongs to (`owner.rs`). (Long because the module docs below are the engine's
//! design, and its error classification and the whole contract live
//! together, as in the other engines' `mod.rs`.)
//!
//! # What S3 promises, and what the engine relies on
//!
//! An object appears whole or not at all (a reader never sees part of a
//! `PutObject` or of a completed multipart upload), reads after a write
//! see it (strong read-after-write, as AWS S3 has offered since 2020 and
//! compatible services do), and there are no locks. Those are the media
//! qualities ADR-008 asks of shared media, so under a fleet a prefix is
//! used like a shared `local` tier: existence is decided in the database
//! (pin row first, upload, publish; tombstones before deletion), never by
//! the bucket.
//!
//! # Publishing a blob
//!
//! The key is known only when the last byte was hashed, and S3 cannot
//! rename. So a streaming write keeps its first `part_size` bytes in memory
//! and spills the rest to an unnamed temporary file (memory stays bounded
//! by the part size, whatever the blob's size); at commit, if the key is
//! present the bytes are dropped ([`PutOutcome::Existed`]); otherwise a
//! blob of at most one part is one `PutObject` with `If-None-Match: *`
//! (the conditional create, where the service has it) and a bigger one a
//! multipart upload straight to its final name, `upload_concurrency` parts
//! in flight. A multipart upload is recorded first in an upload marker
//! (`uploads/<random>`: the object path and upload id), touched while it
//! runs and deleted when it completes or is aborted; a writer killed
//! mid-upload leaves a marker that [`Backend::reclaim_abandoned`] (every
//! sweep) finds once it is older than `upload_grace`, aborting its upload.
//! No server-side copy is needed, so there is no 5 GiB copy limit.
//!
//! Correctness never depends on the conditional create: puts of one key in
//! one process are serialised (exactly one reports `Created`); across
//! processes, two writers of one key write the same bytes (the key is their
//! hash), so a completed upload that replaces another replaces it with
//! itself, and the fleet decides existence in the database.
//!
//! # One writer per prefix, unless a fleet shares it
//!
//! An in-process arbiter sweeps a prefix against its own pins only, so a
//! writable open that is not fleet-shared takes the prefix's **lease**
//! (`alkblobs.lock`, renewed every third of its TTL) and a second process
//! gets [`Error::InUse`] naming the holder, as a second writer of a local
//! directory does; the engine then reports [`Sharing::Process`]. A fleet's
//! prefix ([`S3Options::shared`]) takes no lease and reports
//! [`Sharing::Shared`]: only the fleet arbiter may sweep it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt, RetryConfig};

use super::{
    Backend, BlobReader, Generations, KeyStream, LargeBackend, OpenMode, PutOutcome, Sharing,
    StagedWrite,
};
use crate::{Error, Key, Result};

mod config;
mod lease;
mod location;
mod owner;
mod read;
mod upload;
mod writer;

pub use location::S3Location;
use upload::{KeyLocks, Source};
use writer::S3Write;

/// Options for [`S3Backend::open`]: a builder.
///
/// The endpoint, region and credentials come from the AWS environment and
/// files unless set here; nothing secret is ever set through these
/// options, so they can be printed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct S3Options {
    /// Where the objects live.
    pub location: S3Location,
    /// The service's URL (`http://127.0.0.1:3900`), when it is not AWS's
    /// (default: `AWS_ENDPOINT_URL`, then the profile's `endpoint_url`).
    pub endpoint: Option<String>,
    /// The region (default: `AWS_REGION`/`AWS_DEFAULT_REGION`, then the
    /// profile's, then `us-east-1`).
    pub region: Option<String>,
    /// Write (taking the prefix's lease), wait for the lease, or read-only.
    pub mode: OpenMode,
    /// The prefix is a fleet's, shared by every node (the fleet-validity
    /// rule's declaration): no lease, [`Sharing::Shared`].
    pub shared: bool,
    /// Bytes per multipart part and the most a write holds in memory
    /// (default 8 MiB; at least 5 MiB, S3's smallest part).
    pub part_size: usize,
    /// Parts uploaded at once (default 4): a write holds at most this many
    /// parts in memory while it uploads.
    pub upload_concurrency: usize,
    /// An upload marker untouched this long belongs to a writer that died:
    /// a sweep aborts its upload (default 15 minutes).
    pub upload_grace: Duration,
    /// The prefix lease's TTL (default 30 s): a holder renews it every
    /// third; another process takes it over once it is three TTLs old.
    pub lease_ttl: Duration,
    /// How long one request is retried on transient failures (connection
    /// errors, timeouts, 5xx) before the call fails (default 30 s).
    pub retry_timeout: Duration,
    /// Where a streaming write spills what does not fit in memory (an
    /// unnamed temporary file; default the system's temporary directory).
    pub spool_dir: Option<std::path::PathBuf>,
    /// The store or pool the prefix belongs to (the stores set it: an
    /// embedded store's id, `fleet pool NAME`, `single-instance pool
    /// NAME`). A writable open records it in `prefix/alkblobs.owner` the
    /// first time and fails with [`Error::Config`] if the prefix is
    /// recorded as another's: another store's sweep would collect what
    /// this one holds. `None` (the engine on its own): no check.
    pub owner: Option<String>,
    /// Blobs of at most this many bytes are stored without an outboard
    /// (default 1 MiB): on S3 an outboard is one more object to `PUT`
    /// (twice the requests of a small put), while a verified range of a
    /// small blob costs about the same read whole — one `GET` instead of
    /// a range and its outboard's. Reads of these verify by the whole
    /// blob; `verify` does not count them missing. 0 stores one for
    /// every blob.
    pub outboard_floor: u64,
}

impl S3Options {
    /// Objects under `location`, the rest from the AWS environment.
    pub fn new(location: S3Location) -> S3Options {
        S3Options {
            location,
            endpoint: None,
            region: None,
            mode: OpenMode::Write,
            shared: false,
            part_size: 8 << 20,
            upload_concurrency: 4,
            upload_grace: Duration::from_secs(15 * 60),
            lease_ttl: Duration::from_secs(30),
            retry_timeout: Duration::from_secs(30),
            spool_dir: None,
            owner: None,
            outboard_floor: 1 << 20,
        }
    }

    /// Blobs of at most `bytes` get no outboard (see
    /// [`S3Options::outboard_floor`]).
    pub fn outboard_floor(mut self, bytes: u64) -> Self {
        self.outboard_floor = bytes;
        self
    }

    /// The service's URL.
    pub fn endpoint(mut self, url: impl Into<String>) -> Self {
        self.endpoint = Some(url.into());
        self
    }

    /// The region.
    pub fn region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }

    /// Write, wait for the lease, or read-only.
    pub fn mode(mut self, mode: OpenMode) -> Self {
        self.mode = mode;
        self
    }

    /// Declares the prefix a fleet's (see [`S3Options::shared`]).
    pub fn shared(mut self, yes: bool) -> Self {
        self.shared = yes;
        self
    }

    /// Bytes per part (at least 5 MiB).
    pub fn part_size(mut self, bytes: usize) -> Self {
        self.part_size = bytes;
        self
    }

    /// Parts uploaded at once (at least 1).
    pub fn upload_concurrency(mut self, n: usize) -> Self {
        self.upload_concurrency = n;
        self
    }

    /// How long an untouched upload marker waits before a sweep aborts it.
    pub fn upload_grace(mut self, grace: Duration) -> Self {
        self.upload_grace = grace;
        self
    }

    /// The prefix lease's TTL.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// How long a request is retried before the call fails.
    pub fn retry_timeout(mut self, timeout: Duration) -> Self {
        self.retry_timeout = timeout;
        self
    }

    /// Where streaming writes spill.
    pub fn spool_dir(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.spool_dir = Some(dir.into());
        self
    }

    /// The store or pool the prefix belongs to (see [`S3Options::owner`]).
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }
}

/// The S3 engine. Cloning shares the connection and the lease.
#[derive(Clone)]
pub struct S3Backend {
    inner: Arc<Inner>,
}

struct Inner {
    store: AmazonS3,
    opts: S3Options,
    display: String,
    /// Puts of one key in this process, one at a time.
    keys: KeyLocks,
    /// Part buffers of multipart uploads, reused.
    buffers: upload::PartBuffers,
    /// Cleared when the service refused `If-None-Match` (some compatible
    /// services do): puts then rely on the per-key serialisation and
    /// content addressing alone.
    conditional: AtomicBool,
    /// The prefix's lease (a writable open that is not fleet-shared).
    lease: std::sync::Mutex<Option<lease::Lease>>,
    closed: AtomicBool,
    /// An access key came from the environment or the AWS files (else the
    /// client asks the instance's metadata service or container role).
    keys_given: bool,
    /// The generations the fleet's database handed this process's puts
    /// (a fleet's prefix; none elsewhere: every object is generation 0).
    generations: Option<Arc<Generations>>,
}

impl Inner {
    /// A failure of `action` on `what`, classified: lost connections and
    /// timeouts are [`Error::Unavailable`] (retryable), refused
    /// credentials and a missing bucket [`Error::Config`].
    fn err(&self, action: &str, e: object_store::Error) -> Error {
        use object_store::Error as E;
        let bucket = self.opts.location.bucket();
        match &e {
            E::PermissionDenied { .. } | E::Unauthenticated { .. } => Error::Config(format!(
                "{}: the service refused the credentials for bucket {bucket:?} while trying to {action} (check AWS_ACCESS_KEY_ID / AWS_PROFILE and the bucket's policy)",
                self.display
            )),
            _ if transport_failure(&e) => Error::Unavailable {
                engine: self.display.clone(),
                source: format!("unable to {action}: {}", redact(&e)).into(),
            },
            _ => Error::engine(&self.display, format!("unable to {action}: {}", redact(&e))),
        }
    }

    fn check_writable(&self, action: &'static str) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if !self.opts.mode.writable() {
            return Err(Error::ReadOnly {
                engine: self.display.clone(),
                action,
            });
        }
        if let Some(l) = &*self.lease.lock().unwrap_or_else(|p| p.into_inner()) {
            l.check()?;
        }
        Ok(())
    }

    /// The object's size, or `None` if it is absent.
    async fn head_size(&self, path: &object_store::path::Path) -> Result<Option<u64>> {
        match self.store.head(path).await {
            Ok(m) => Ok(Some(m.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.err("read an object's size", e)),
        }
    }

    /// The generation a put of `key` publishes (see [`Generations`]).
    fn generation(&self, key: &Key) -> u64 {
        self.generations.as_ref().map_or(0, |g| g.get(key))
    }
}

/// Whether an `object_store` error is the transport's (connect, request,
/// timeout, interrupted): by the error types in its source chain, never
/// by its message.
fn transport_failure(e: &object_store::Error) -> bool {
    use object_store::client::{HttpError, HttpErrorKind};
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = src {
        if let Some(h) = s.downcast_ref::<HttpError>() {
            return matches!(
                h.kind(),
                HttpErrorKind::Connect
                    | HttpErrorKind::Request
                    | HttpErrorKind::Timeout
                    | HttpErrorKind::Interrupted
            );
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::TimedOut
                    | std::io::ErrorKind::UnexpectedEof
            );
        }
        src = s.source();
    }
    false
}

/// An error's text without any query string: a presigned or signed URL
/// would carry credentials there (object_store signs headers, but a
/// redirect or a future change must not leak them into a log line).
fn redact(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        src = s.source();
    }
    // The query string of every URL in it (up to the next space or quote).
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(at) = [rest.find("http://"), rest.find("https://")]
        .into_iter()
        .flatten()
        .min()
    {
        out.push_str(&rest[..at]);
        let url = &rest[at..];
        let end = url
            .find(|c: char| c.is_whitespace() || c == '"' || c == '\'' || c == '<')
            .unwrap_or(url.len());
        match url[..end].find('?') {
            Some(q) => {
                out.push_str(&url[..q]);
                out.push_str("?…");
            }
            None => out.push_str(&url[..end]),
        }
        rest = &url[end..];
    }
    out.push_str(rest);
    out
}

impl S3Backend {
    /// Opens the prefix: checks that the bucket answers and the credentials
    /// are accepted (one listing), takes the prefix's lease if the open is
    /// writable and not fleet-shared, and aborts nothing (abandoned uploads
    /// wait for a sweep and their grace).
    ///
    /// Fails with [`Error::Config`] naming the bucket if it does not exist
    /// or the credentials are refused, [`Error::Unavailable`] if the
    /// service cannot be reached, and [`Error::InUse`] if another process
    /// holds the lease.
    pub async fn open(opts: S3Options) -> Result<S3Backend> {
        Self::open_with(opts, None).await
    }

    /// A fleet's prefix, its objects named by the generations the fleet
    /// arbiter writes into `generations`.
    pub(crate) async fn open_fleet(
        opts: S3Options,
        generations: Arc<Generations>,
    ) -> Result<S3Backend> {
        Self::open_with(opts.shared(true), Some(generations)).await
    }

    async fn open_with(
        opts: S3Options,
        generations: Option<Arc<Generations>>,
    ) -> Result<S3Backend> {
        if opts.part_size < 5 << 20 || opts.part_size > 1 << 30 {
            return Err(Error::Config(format!(
                "the S3 part size is 5 MiB to 1 GiB, got {} bytes",
                opts.part_size
            )));
        }
        if opts.upload_concurrency == 0 || opts.upload_concurrency > 64 {
            return Err(Error::Config(format!(
                "S3 upload concurrency is 1 to 64, got {}",
                opts.upload_concurrency
            )));
        }
        if opts.lease_ttl < Duration::from_secs(3) || opts.lease_ttl > Duration::from_secs(3600) {
            return Err(Error::Config(format!(
                "the S3 prefix lease's TTL is 3 s to 1 hour, got {:?}",
                opts.lease_ttl
            )));
        }
        let display = format!("s3({})", opts.location);
        let (store, keys_given) = build(&opts).map_err(|e| {
            Error::Config(format!(
                "{display}: cannot configure the S3 client: {}",
                redact(&e)
            ))
        })?;
        let inner = Arc::new(Inner {
            store,
            generations,
            display,
            keys: KeyLocks::default(),
            buffers: upload::PartBuffers::default(),
            conditional: AtomicBool::new(true),
            lease: std::sync::Mutex::new(None),
            closed: AtomicBool::new(false),
            keys_given,
            opts,
        });
        inner.check_bucket().await?;
        if inner.opts.mode.writable()
            && let Some(owner) = &inner.opts.owner
        {
            owner::claim(&inner, owner).await?;
        }
        if inner.opts.mode.writable() && !inner.opts.shared {
            let l = lease::Lease::take(&inner).await?;
            *inner.lease.lock().unwrap_or_else(|p| p.into_inner()) = Some(l);
        }
        Ok(S3Backend { inner })
    }

    /// Where the objects live.
    pub fn location(&self) -> &S3Location {
        &self.inner.opts.location
    }

    /// Multipart uploads whose markers this engine can see (in progress or
    /// abandoned): for tests and `alkblobs usage`.
    pub async fn uploads_in_progress(&self) -> Result<u64> {
        let markers: Vec<_> = self
            .inner
            .store
            .list(Some(&self.inner.opts.location.uploads()))
            .try_collect()
            .await
            .map_err(|e| self.inner.err("list upload markers", e))?;
        Ok(markers.len() as u64)
    }
}

/// The `object_store` client for these options: the AWS environment first,
/// the shared files for what it lacks, then the options themselves.
fn build(opts: &S3Options) -> object_store::Result<(AmazonS3, bool)> {
    // reqwest's rustls needs a process-wide crypto provider; the crate uses
    // ring everywhere (an embedder's own choice, installed first, stays).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut b = AmazonS3Builder::from_env().with_bucket_name(opts.location.bucket());
    let file = config::profile(|k| std::env::var(k).ok());
    let unset = |b: &AmazonS3Builder, k: AmazonS3ConfigKey| b.get_config_value(&k).is_none();
    if unset(&b, AmazonS3ConfigKey::AccessKeyId)
        && let (Some(id), Some(secret)) = (file.access_key_id, file.secret_access_key)
    {
        b = b.with_access_key_id(id).with_secret_access_key(secret);
        if let Some(t) = file.session_token {
            b = b.with_token(t);
        }
    }
    if unset(&b, AmazonS3ConfigKey::Region)
        && let Some(r) = file.region
    {
        b = b.with_region(r);
    }
    if unset(&b, AmazonS3ConfigKey::Endpoint)
        && let Some(e) = file.endpoint_url
    {
        b = b.with_endpoint(e);
    }
    if let Some(r) = &opts.region {
        b = b.with_region(r);
    }
    if let Some(e) = &opts.endpoint {
        b = b.with_endpoint(e);
    }
    let keys_given = !unset(&b, AmazonS3ConfigKey::AccessKeyId);
    let endpoint = b.get_config_value(&AmazonS3ConfigKey::Endpoint);
    // Credentials belong in the AWS environment or files, never in a URL
    // that options, errors and logs print.
    if endpoint.as_deref().is_some_and(|e| {
        e.split_once("://")
            .map_or(e, |(_, rest)| rest)
            .split('/')
            .next()
            .is_some_and(|authority| authority.contains('@'))
    }) {
        return Err(object_store::Error::Generic {
            store: "S3",
            source: "the endpoint URL holds credentials (user:secret@host): give them in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the AWS files instead".into(),
        });
    }
    let plain_http = endpoint.is_some_and(|e| e.starts_with("http://"));
    b.with_client_options(ClientOptions::new().with_allow_http(plain_http))
        .with_retry(RetryConfig {
            retry_timeout: opts.retry_timeout,
            max_retries: 10,
            ..RetryConfig::default()
        })
        .build()
        .map(|s| (s, keys_given))
}

impl Inner {
    /// One listing: the bucket exists and the credentials are accepted.
    async fn check_bucket(&self) -> Result<()> {
        let mut probe = self.store.list(Some(&self.opts.location.blobs()));
        match probe.next().await {
            None | Some(Ok(_)) => Ok(()),
            Some(Err(object_store::Error::NotFound { .. })) => Err(Error::Config(format!(
                "{}: bucket {:?} does not exist (create it, or check AWS_ENDPOINT_URL and the region)",
                self.display,
                self.opts.location.bucket()
            ))),
            // Any other refusal of the first listing (S3 answers a missing
            // bucket with a 404 that object_store reports as a generic
            // error, as it does a wrong region or endpoint path) is the
            // configuration's: not retryable, and it names the bucket.
            Some(Err(e))
                if !transport_failure(&e)
                    && !matches!(
                        e,
                        object_store::Error::PermissionDenied { .. }
                            | object_store::Error::Unauthenticated { .. }
                    ) =>
            {
                let creds = if self.keys_given {
                    ""
                } else {
                    "; no access key in AWS_ACCESS_KEY_ID or the AWS profile, so the credentials were asked of the instance metadata service or container role"
                };
                Err(Error::Config(format!(
                    "{}: bucket {:?} cannot be listed: it does not exist or the service refused the credentials (check AWS_ENDPOINT_URL, the region, AWS_ACCESS_KEY_ID / AWS_PROFILE and the bucket's policy{creds}): {}",
                    self.display,
                    self.opts.location.bucket(),
                    redact(&e)
                )))
            }
            Some(Err(e)) => Err(self.err("list the bucket", e)),
        }
    }
}

impl fmt::Debug for S3Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Backend")
            .field("location", &self.inner.opts.location.to_string())
            .field("shared", &self.inner.opts.shared)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for S3Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.inner.display)
    }
}

#[async_trait]
impl Backend for S3Backend {
    fn name(&self) -> &str {
        "s3"
    }

    fn sharing(&self) -> Sharing {
        // A writable open holds the prefix's lease; a read-only one deletes
        // nothing; a fleet's prefix is written by every node.
        if self.inner.opts.shared {
            Sharing::Shared
        } else {
            Sharing::Process
        }
    }

    async fn has(&self, key: &Key) -> Result<bool> {
        Ok(self.size(key).await?.is_some())
    }

    async fn get(&self, key: &Key) -> Result<Option<Bytes>> {
        let inner = &self.inner;
        if let Some(b) = inner.get_at(&inner.opts.location.blob(key)).await? {
            return Ok(Some(b));
        }
        match inner.later(key).await? {
            Some((path, _)) => inner.get_at(&path).await,
            None => Ok(None),
        }
    }

    async fn put(&self, key: &Key, value: Bytes) -> Result<PutOutcome> {
        self.inner.check_writable("put a blob")?;
        // Engines never hash: an engine-level put stores no outboard.
        self.inner
            .publish(key, Source::Memory(value), Bytes::new())
            .await
    }

    async fn delete(&self, key: &Key) -> Result<Option<u64>> {
        self.delete_through(key, 0).await
    }

    fn list(&self) -> KeyStream<'_> {
        let inner = self.inner.clone();
        let mut last: Option<Key> = None;
        // ListObjectsV2 returns names in byte order, and a blob's name is
        // its shard (its key's first byte) then its key: key order, a
        // key's later generations (`<key>.gN`) right after its own name
        // and listed once with it. A name out of order would break the
        // contract, so it is an error rather than a silent duplicate.
        let keys = inner
            .store
            .list(Some(&inner.opts.location.blobs()))
            .map_err({
                let inner = inner.clone();
                move |e| inner.err("list blobs", e)
            })
            .try_filter_map(move |meta| {
                let key = inner.opts.location.key_of(&meta.location);
                let out = match key {
                    None => {
                        tracing::warn!(object = %meta.location, "ignoring an object that is not a blob under blobs/");
                        Ok(None)
                    }
                    Some((k, _)) if last == Some(k) => Ok(None),
                    Some((k, _)) if last.is_some_and(|l| l > k) => Err(Error::engine(
                        &inner.display,
                        format!("the service listed {k} after {}: not in key order", last.unwrap()),
                    )),
                    Some((k, _)) => {
                        last = Some(k);
                        Ok(Some(k))
                    }
                };
                futures::future::ready(out)
            });
        Box::pin(keys)
    }

    async fn size(&self, key: &Key) -> Result<Option<u64>> {
        let inner = &self.inner;
        if let Some(size) = inner.head_size(&inner.opts.location.blob(key)).await? {
            return Ok(Some(size));
        }
        Ok(inner.later(key).await?.map(|(_, size)| size))
    }

    async fn get_range(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        self.read_range(key, offset, len).await
    }

    async fn usage(&self) -> Result<Option<(u64, u64)>> {
        // The listing carries every object's size: one pass, no HEADs.
        let mut metas = self
            .inner
            .store
            .list(Some(&self.inner.opts.location.blobs()));
        let (mut n, mut bytes) = (0u64, 0u64);
        let mut last = None;
        while let Some(m) = metas
            .try_next()
            .await
            .map_err(|e| self.inner.err("list blobs", e))?
        {
            // A key's generations count once (they hold the same bytes).
            if let Some((k, _)) = self.inner.opts.location.key_of(&m.location)
                && last != Some(k)
            {
                last = Some(k);
                n += 1;
                bytes += m.size;
            }
        }
        Ok(Some((n, bytes)))
    }

    async fn reclaim_abandoned(&self) -> Result<u64> {
        if !self.inner.opts.mode.writable() {
            return Ok(0);
        }
        self.inner.reclaim().await
    }

    async fn close(&self) -> Result<()> {
        self.inner.closed.store(true, Ordering::Release);
        let lease = self
            .inner
            .lease
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(l) = lease {
            l.release(&self.inner).await;
        }
        Ok(())
    }
}

#[async_trait]
impl LargeBackend for S3Backend {
    async fn read_range(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        let inner = &self.inner;
        if let Some(b) = inner
            .read_range_at(key, &inner.opts.location.blob(key), offset, len)
            .await?
        {
            return Ok(Some(b));
        }
        match inner.later(key).await? {
            Some((path, _)) => inner.read_range_at(key, &path, offset, len).await,
            None => Ok(None),
        }
    }

    async fn open_read(&self, key: &Key) -> Result<Option<BlobReader>> {
        let inner = &self.inner;
        let got = match inner.store.get(&inner.opts.location.blob(key)).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => match inner.later(key).await? {
                Some((path, _)) => match inner.store.get(&path).await {
                    Ok(g) => g,
                    Err(object_store::Error::NotFound { .. }) => return Ok(None),
                    Err(e) => return Err(inner.err("read a blob", e)),
                },
                None => return Ok(None),
            },
            Err(e) => return Err(inner.err("read a blob", e)),
        };
        let display = inner.display.clone();
        let stream = got.into_stream().map_err(move |e| {
            std::io::Error::other(format!("{display}: reading a blob failed: {}", redact(&e)))
        });
        Ok(Some(Box::pin(tokio_util::io::StreamReader::new(stream))))
    }

    async fn begin_write(&self) -> Result<Box<dyn StagedWrite + '_>> {
        self.inner.check_writable("put a blob")?;
        Ok(Box::new(S3Write::new(self.inner.clone())))
    }

    async fn generation_size(&self, key: &Key, generation: u64) -> Result<Option<u64>> {
        let inner = &self.inner;
        inner
            .head_size(&inner.opts.location.blob_generation(key, generation))
            .await
    }

    async fn delete_through(&self, key: &Key, through: u64) -> Result<Option<u64>> {
        let mut freed = self.inner.delete_generation_0(key).await?;
        // A generation above `through`: the key was recorded again since
        // its deletion was handed out, and that object keeps the outboard.
        let mut later_kept = false;
        if through > 0 {
            for (g, path, size) in self.inner.later_generations(key).await? {
                if g > through {
                    later_kept = true;
                    continue;
                }
                match self.inner.store.delete(&path).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                        freed.get_or_insert(size);
                    }
                    Err(e) => return Err(self.inner.err("delete a blob", e)),
                }
            }
        }
        // No generation of the key is left: its outboard goes too, whether
        // or not this call found a blob (a claim handed out again after
        // its first claimer deleted the blob but not the outboard, a writer
        // that stopped between its outboard and its blob). A put of the key
        // racing this deletion may lose its outboard here: its blob is then
        // read unverified-by-range until `verify --repair-outboards`, never
        // lost.
        if !later_kept {
            self.inner.delete_outboard(key).await?;
        }
        Ok(freed)
    }

    async fn read_outboard(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        let inner = &self.inner;
        inner
            .read_range_at(key, &inner.opts.location.outboard(key), offset, len)
            .await
    }

    async fn put_outboard(&self, key: &Key, outboard: Bytes) -> Result<bool> {
        self.inner.check_writable("put an outboard")?;
        if self.size(key).await?.is_none() {
            return Ok(false);
        }
        self.inner.put_outboard_object(key, outboard).await?;
        Ok(true)
    }

    fn outboard_floor(&self) -> u64 {
        self.inner.opts.outboard_floor
    }

    async fn outboard_usage(&self) -> Result<Option<u64>> {
        let inner = &self.inner;
        let mut metas = inner.store.list(Some(&inner.opts.location.outboards()));
        let mut bytes = 0;
        while let Some(m) = metas
            .try_next()
            .await
            .map_err(|e| inner.err("list outboards", e))?
        {
            bytes += m.size;
        }
        Ok(Some(bytes))
    }

    fn orphan_outboards(&self) -> KeyStream<'_> {
        // Both listings are in key order (a shard, then the key): the
        // outboards' keys that the blobs' listing lacks. A blob of a later
        // generation is listed under its key, so its outboard is no orphan.
        let inner = self.inner.clone();
        let outboards = inner
            .store
            .list(Some(&inner.opts.location.outboards()))
            .map_err({
                let inner = inner.clone();
                move |e| inner.err("list outboards", e)
            })
            .try_filter_map(move |meta| {
                let key = inner.opts.location.outboard_key_of(&meta.location);
                if key.is_none() {
                    tracing::warn!(object = %meta.location, "ignoring an object that is not an outboard under outboards/");
                }
                futures::future::ready(Ok(key))
            });
        crate::tier::subtract_sorted(Box::pin(outboards), self.list())
    }
}

impl Inner {
    /// Deletes the key's own object (generation 0); its size if it was there.
    async fn delete_generation_0(&self, key: &Key) -> Result<Option<u64>> {
        self.check_writable("delete a blob")?;
        let path = self.opts.location.blob(key);
        let Some(size) = self.head_size(&path).await? else {
            return Ok(None);
        };
        match self.store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(Some(size)),
            Err(e) => Err(self.err("delete a blob", e)),
        }
    }

    async fn delete_outboard(&self, key: &Key) -> Result<()> {
        match self.store.delete(&self.opts.location.outboard(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.err("delete an outboard", e)),
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The lease's renewal task stops; the lease expires on its own.
        if let Some(l) = self
            .lease
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            l.abandon();
        }
    }
}

/// Whether the service answered a conditional request as one it does not
/// support (some S3-compatible services refuse `If-None-Match`).
fn unsupported(e: &object_store::Error) -> bool {
    matches!(
        e,
        object_store::Error::NotSupported { .. } | object_store::Error::NotImplemented { .. }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_drops_query_strings() {
        let e = std::io::Error::other(
            "GET http://h/b/k?X-Amz-Signature=abc&X-Amz-Credential=AK failed",
        );
        let r = redact(&e);
        assert!(!r.contains("abc") && !r.contains("AK "), "{r}");
        assert!(r.contains("http://h/b/k?…") && r.ends_with("failed"), "{r}");
        let xml = std::io::Error::other("404: <?xml version=\"1.0\"?><Error>NoSuchBucket</Error>");
        assert_eq!(redact(&xml), xml.to_string(), "text outside URLs stays");
    }
}
