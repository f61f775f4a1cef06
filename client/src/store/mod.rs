//! The store facade: tiers, pins, verification, accounting and GC over a
//! pair of engines.
//!
//! A [`Store`] is cheap to clone (an `Arc`) and safe to share across tasks
//! and threads. Every operation carries a `tracing` span.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};
use tracing::Instrument;

use crate::backend::local::{LocalBackend, LocalOptions};
use crate::backend::sqlite::{SqliteBackend, SqliteOptions};
use crate::backend::{
    Backend, BackendExt, BlobReader, Durability, GcTables, KeyStream, MemGcTables, OpenMode,
    PutOutcome, StagedRow, StagedWrite,
};
use crate::{Error, Key, Result};

mod dispatch;
pub mod gc;
mod pins;
mod verify;

pub use dispatch::Tier;
pub use pins::PinGuard;
pub use verify::{CorruptEntry, VerifyProgress, VerifyReport};

use gc::{Gc, LiveCheck, LiveSet, LivenessSource, SweepOptions, SweepReport};
use pins::PinMap;

/// The default kv threshold: blobs up to this size live in the kv engine.
///
/// Chosen from `benches/benches/threshold.rs` on this project's reference
/// machine (see `docs/benchmarks.md`): sqlite reads stay ahead of `local`
/// file reads up to about this size, and the per-file cost of the large tier
/// (a staging file, two fsyncs, a directory entry) dominates below it.
pub const DEFAULT_THRESHOLD: u64 = 64 * 1024;

/// The largest threshold a store accepts: kv values are loaded whole.
pub const MAX_THRESHOLD: u64 = 64 * 1024 * 1024;

/// Chunk size of streaming puts and reads.
const CHUNK: usize = 1024 * 1024;

/// Above this size, hashing a buffer moves off the async worker threads.
const HASH_INLINE_MAX: usize = 256 * 1024;

/// An entry's metadata, from the cheap `size` probe (never a value load).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct EntryMeta {
    /// The key.
    pub key: Key,
    /// Length in bytes.
    pub size: u64,
    /// The tier holding it.
    pub tier: Tier,
}

/// A completed put.
#[derive(Debug)]
#[must_use = "the pin guard protects the new entry only while it is held"]
pub struct Put {
    /// The content key.
    pub key: Key,
    /// Length in bytes.
    pub size: u64,
    /// Where it went.
    pub tier: Tier,
    /// Whether the entry is new or was already present.
    pub outcome: PutOutcome,
    /// The pin taken before the content was published. Record the key in
    /// your liveness, then drop this.
    pub pin: PinGuard,
}

/// One entry of a [`Store::put_many`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PutInfo {
    /// The content key.
    pub key: Key,
    /// Length in bytes.
    pub size: u64,
    /// Where it went.
    pub tier: Tier,
    /// New or already present.
    pub outcome: PutOutcome,
}

/// A completed batched put: per-blob results and one guard pinning them all.
#[derive(Debug)]
#[must_use = "the pin guard protects the new entries only while it is held"]
pub struct PutMany {
    /// One entry per input blob, in input order.
    pub entries: Vec<PutInfo>,
    /// Pins on every key.
    pub pin: PinGuard,
}

/// Entries and bytes in one tier.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TierUsage {
    /// The engine's display name.
    pub engine: String,
    /// Entry count.
    pub entries: u64,
    /// Total bytes.
    pub bytes: u64,
}

/// Pool accounting per tier.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    /// The kv tier.
    pub kv: TierUsage,
    /// The large tier (absent in kv-only mode).
    pub large: Option<TierUsage>,
    /// Staged delete candidates.
    pub staged: u64,
    /// Persistent roots.
    pub roots: u64,
}

/// A cheap, shareable handle on a store.
#[derive(Clone, Debug)]
pub struct Store {
    inner: Arc<StoreInner>,
}

#[derive(Debug)]
pub(crate) struct StoreInner {
    kv: Arc<dyn Backend>,
    large: Option<Arc<dyn Backend>>,
    threshold: u64,
    pub(crate) pins: Arc<PinMap>,
    pub(crate) gc: Gc,
    /// Whether the kv engine hosts the GC tables (and so clears staged rows
    /// inside its own put transaction).
    kv_hosts_tables: bool,
}

impl StoreInner {
    pub(crate) fn engines(&self) -> impl Iterator<Item = &Arc<dyn Backend>> {
        std::iter::once(&self.kv).chain(self.large.as_ref())
    }

    pub(crate) fn engines_owned(&self) -> Vec<Arc<dyn Backend>> {
        self.engines().cloned().collect()
    }

    pub(crate) fn list_pool(&self) -> KeyStream<'_> {
        match &self.large {
            Some(l) => dispatch::merge_sorted(self.kv.list(), l.list()),
            None => self.kv.list(),
        }
    }
}

/// Builds a [`Store`] from engines.
///
/// ```no_run
/// # async fn f() -> alkblobs::Result<()> {
/// use alkblobs::backend::mem::MemBackend;
/// let store = alkblobs::Store::builder()
///     .kv(MemBackend::new())
///     .large(MemBackend::new())
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct StoreBuilder {
    kv: Option<Arc<dyn Backend>>,
    large: Option<Arc<dyn Backend>>,
    kv_only: bool,
    threshold: u64,
    window: Duration,
}

impl Default for StoreBuilder {
    fn default() -> Self {
        StoreBuilder {
            kv: None,
            large: None,
            kv_only: false,
            threshold: DEFAULT_THRESHOLD,
            window: gc::DEFAULT_WINDOW,
        }
    }
}

impl StoreBuilder {
    /// The kv engine (required).
    pub fn kv(self, engine: impl Backend + 'static) -> Self {
        self.kv_arc(Arc::new(engine))
    }

    /// The kv engine, shared.
    pub fn kv_arc(mut self, engine: Arc<dyn Backend>) -> Self {
        self.kv = Some(engine);
        self
    }

    /// The large engine.
    pub fn large(self, engine: impl Backend + 'static) -> Self {
        self.large_arc(Arc::new(engine))
    }

    /// The large engine, shared.
    pub fn large_arc(mut self, engine: Arc<dyn Backend>) -> Self {
        self.large = Some(engine);
        self
    }

    /// Declares kv-only mode: no large tier; over-threshold puts are refused
    /// with [`Error::TooLarge`].
    pub fn kv_only(mut self) -> Self {
        self.kv_only = true;
        self
    }

    /// The kv threshold in bytes (default [`DEFAULT_THRESHOLD`]).
    pub fn threshold(mut self, bytes: u64) -> Self {
        self.threshold = bytes;
        self
    }

    /// The delete window (default 5 minutes).
    pub fn delete_window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Checks the configuration and builds the store.
    pub fn build(self) -> Result<Store> {
        let kv = self
            .kv
            .ok_or_else(|| Error::Config("a store needs a kv engine: call .kv(engine)".into()))?;
        match (&self.large, self.kv_only) {
            (None, false) => {
                return Err(Error::Config(
                    "no large tier configured: call .large(engine), or .kv_only() to refuse blobs over the threshold".into(),
                ));
            }
            (Some(_), true) => {
                return Err(Error::Config(
                    "kv-only mode was declared but a large engine was also given; pick one".into(),
                ));
            }
            _ => {}
        }
        if self.threshold > MAX_THRESHOLD {
            return Err(Error::Config(format!(
                "threshold {} is over the maximum of {MAX_THRESHOLD} bytes: kv values are loaded whole",
                self.threshold
            )));
        }
        let (tables, kv_hosts_tables): (Arc<dyn GcTables>, bool) = match kv.gc_tables() {
            Some(t) => (t, true),
            None => match self.large.as_ref().and_then(|l| l.gc_tables()) {
                Some(t) => (t, false),
                None => (Arc::new(MemGcTables::default()), false),
            },
        };
        Ok(Store {
            inner: Arc::new(StoreInner {
                kv,
                large: self.large,
                threshold: self.threshold,
                pins: Arc::new(PinMap::default()),
                gc: Gc::new(tables, self.window),
                kv_hosts_tables,
            }),
        })
    }
}

/// Options for [`Store::open_dir_with`]: a builder, so fields can be added
/// without breaking callers.
///
/// ```
/// use std::time::Duration;
/// let opts = alkblobs::DirOptions::new()
///     .relaxed()                                  // survive crashes, not power cuts
///     .threshold(128 * 1024)
///     .delete_window(Duration::from_secs(60));
/// # let _ = opts;
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DirOptions {
    /// Write (with the instance lock), wait for the lock, or read-only.
    pub mode: OpenMode,
    /// Durable (default) or relaxed.
    pub durability: Durability,
    /// The kv threshold.
    pub threshold: u64,
    /// The delete window.
    pub window: Duration,
}

impl Default for DirOptions {
    fn default() -> Self {
        DirOptions {
            mode: OpenMode::Write,
            durability: Durability::Durable,
            threshold: DEFAULT_THRESHOLD,
            window: gc::DEFAULT_WINDOW,
        }
    }
}

impl DirOptions {
    /// The defaults: writable (fail at once if another process holds the
    /// store), durable, [`DEFAULT_THRESHOLD`], a 5-minute delete window.
    pub fn new() -> DirOptions {
        DirOptions::default()
    }

    /// How to open: write, wait for the instance lock, or read-only.
    pub fn mode(mut self, mode: OpenMode) -> Self {
        self.mode = mode;
        self
    }

    /// Opens read-only: no lock, every write refused.
    pub fn read_only(self) -> Self {
        self.mode(OpenMode::ReadOnly)
    }

    /// Waits for another process to release the store instead of failing.
    pub fn wait_for_lock(self) -> Self {
        self.mode(OpenMode::WriteWait)
    }

    /// Durability of writes.
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// [`Durability::Relaxed`]: a returned put survives a process crash but
    /// may be lost (never torn) on a power cut. Much faster for small puts.
    pub fn relaxed(self) -> Self {
        self.durability(Durability::Relaxed)
    }

    /// The kv threshold in bytes.
    pub fn threshold(mut self, bytes: u64) -> Self {
        self.threshold = bytes;
        self
    }

    /// The store's delete window.
    pub fn delete_window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }
}

/// Hashes a buffer, off the async workers when it is big.
async fn hash(bytes: &Bytes) -> Key {
    if bytes.len() <= HASH_INLINE_MAX {
        return Key::of(bytes);
    }
    let b = bytes.clone();
    match tokio::task::spawn_blocking(move || Key::of(&b)).await {
        Ok(k) => k,
        Err(_) => Key::of(bytes),
    }
}

impl Store {
    /// A builder.
    pub fn builder() -> StoreBuilder {
        StoreBuilder::default()
    }

    /// Opens the embedded default under `dir`: sqlite kv at
    /// `dir/index.sqlite`, `local` large tier at `dir/large`, durable, with
    /// the instance locks taken.
    pub async fn open_dir(dir: impl AsRef<Path>) -> Result<Store> {
        Store::open_dir_with(dir, DirOptions::default()).await
    }

    /// [`Store::open_dir`] with options.
    pub async fn open_dir_with(dir: impl AsRef<Path>, opts: DirOptions) -> Result<Store> {
        let dir = dir.as_ref();
        let (sqlite, local) = Store::dir_paths(dir);
        let kv = SqliteBackend::open(
            sqlite,
            SqliteOptions {
                durability: opts.durability,
                mode: opts.mode,
                ..SqliteOptions::default()
            },
        )
        .await?;
        let large = LocalBackend::open(
            local,
            LocalOptions {
                durability: opts.durability,
                mode: opts.mode,
                ..LocalOptions::default()
            },
        )
        .await?;
        Store::builder()
            .kv(kv)
            .large(large)
            .threshold(opts.threshold)
            .delete_window(opts.window)
            .build()
    }

    /// The sqlite file and the local root of the embedded layout in `dir`.
    pub fn dir_paths(dir: &Path) -> (PathBuf, PathBuf) {
        (dir.join("index.sqlite"), dir.join("large"))
    }

    /// The kv threshold.
    pub fn threshold(&self) -> u64 {
        self.inner.threshold
    }

    /// The kv engine.
    pub fn kv(&self) -> &Arc<dyn Backend> {
        &self.inner.kv
    }

    /// The large engine, if any.
    pub fn large(&self) -> Option<&Arc<dyn Backend>> {
        self.inner.large.as_ref()
    }

    /// The store's default delete window.
    pub fn delete_window(&self) -> Duration {
        self.inner.gc.window
    }

    fn engine(&self, tier: Tier) -> &Arc<dyn Backend> {
        match tier {
            Tier::Kv => &self.inner.kv,
            Tier::Large => self
                .inner
                .large
                .as_ref()
                .expect("tier_checked never returns Large without a large engine"),
        }
    }

    fn tier_checked(&self, size: u64) -> Result<Tier> {
        let tier = dispatch::tier_for(size, self.inner.threshold);
        if tier == Tier::Large && self.inner.large.is_none() {
            return Err(Error::TooLarge {
                size,
                threshold: self.inner.threshold,
            });
        }
        Ok(tier)
    }

    /// Clears staged rows of freshly published keys, unless the engine did
    /// it inside its own transaction. A put restarts a key's window.
    async fn after_publish(&self, tier: Tier, keys: &[Key]) -> Result<()> {
        if tier == Tier::Kv && self.inner.kv_hosts_tables {
            return Ok(());
        }
        self.inner.gc.tables.unstage(keys).await.map(|_| ())
    }

    async fn put_keyed(&self, key: Key, bytes: Bytes) -> Result<Put> {
        let size = bytes.len() as u64;
        let tier = self.tier_checked(size)?;
        // Pin before publish: from here on no sweep can delete the key.
        let pin = self.inner.pins.acquire(&[key]).await;
        let outcome = self.engine(tier).put(&key, bytes).await?;
        self.after_publish(tier, &[key]).await?;
        tracing::debug!(%key, size, %tier, ?outcome, "put");
        Ok(Put {
            key,
            size,
            tier,
            outcome,
            pin,
        })
    }

    /// Stores `bytes`, returning its key and a pin on it.
    pub async fn put(&self, bytes: impl Into<Bytes>) -> Result<Put> {
        let bytes = bytes.into();
        let span = tracing::debug_span!("put", size = bytes.len());
        async {
            if self.tier_checked(bytes.len() as u64)? == Tier::Large {
                return self.put_large(bytes).await;
            }
            let key = hash(&bytes).await;
            self.put_keyed(key, bytes).await
        }
        .instrument(span)
        .await
    }

    /// A large blob: hash on a second thread while the bytes stream to the
    /// engine's staging area, then pin, then publish. Hashing hides behind
    /// the write instead of preceding it; a dedup hit is discarded at commit
    /// before any fsync.
    async fn put_large(&self, bytes: Bytes) -> Result<Put> {
        let size = bytes.len() as u64;
        let large = self.engine(Tier::Large);
        let mut writer = large.begin_write().await?;
        let b = bytes.clone();
        let hashing = tokio::task::spawn_blocking(move || Key::of(&b));
        if let Err(e) = writer.write(bytes.clone()).await {
            let _ = writer.abort().await;
            return Err(e);
        }
        let key = match hashing.await {
            Ok(k) => k,
            Err(_) => Key::of(&bytes),
        };
        self.publish_staged(writer, key, size).await
    }

    /// The end of every large-tier put: pin before publish, commit the
    /// staged bytes, restart the key's window.
    async fn publish_staged(
        &self,
        writer: Box<dyn StagedWrite + '_>,
        key: Key,
        size: u64,
    ) -> Result<Put> {
        let pin = self.inner.pins.acquire(&[key]).await;
        let outcome = writer.commit(&key).await?;
        self.after_publish(Tier::Large, &[key]).await?;
        tracing::debug!(%key, size, ?outcome, "large put");
        Ok(Put {
            key,
            size,
            tier: Tier::Large,
            outcome,
            pin,
        })
    }

    /// Stores `bytes` only if they hash to `key` (the ops surface for
    /// content fetched from another node). A mismatch stores nothing.
    pub async fn put_verified(&self, key: &Key, bytes: impl Into<Bytes>) -> Result<Put> {
        let bytes = bytes.into();
        let span = tracing::debug_span!("put_verified", %key, size = bytes.len());
        async {
            let actual = hash(&bytes).await;
            if actual != *key {
                return Err(Error::HashMismatch {
                    expected: *key,
                    actual,
                });
            }
            self.put_keyed(actual, bytes).await
        }
        .instrument(span)
        .await
    }

    /// Stores many small blobs: the kv ones in one transaction. Blobs over
    /// the threshold go to the large tier one by one. In kv-only mode an
    /// oversized blob refuses the whole batch before anything is written.
    pub async fn put_many<I, B>(&self, blobs: I) -> Result<PutMany>
    where
        I: IntoIterator<Item = B>,
        B: Into<Bytes>,
    {
        let blobs: Vec<Bytes> = blobs.into_iter().map(Into::into).collect();
        let span = tracing::debug_span!("put_many", count = blobs.len());
        async {
            let mut entries = Vec::with_capacity(blobs.len());
            for b in &blobs {
                let size = b.len() as u64;
                entries.push(PutInfo {
                    key: hash(b).await,
                    size,
                    tier: self.tier_checked(size)?,
                    outcome: PutOutcome::Created,
                });
            }
            let keys: Vec<Key> = entries.iter().map(|e| e.key).collect();
            let pin = self.inner.pins.acquire(&keys).await;
            let kv_items: Vec<(Key, Bytes)> = entries
                .iter()
                .zip(&blobs)
                .filter(|(e, _)| e.tier == Tier::Kv)
                .map(|(e, b)| (e.key, b.clone()))
                .collect();
            let mut kv_outcomes = self.inner.kv.put_many(&kv_items).await?.into_iter();
            let mut large_keys = Vec::new();
            for (e, b) in entries.iter_mut().zip(&blobs) {
                e.outcome = match e.tier {
                    Tier::Kv => kv_outcomes.next().ok_or_else(|| {
                        Error::engine(&self.inner.kv, "put_many returned too few outcomes")
                    })?,
                    Tier::Large => {
                        large_keys.push(e.key);
                        self.engine(Tier::Large).put(&e.key, b.clone()).await?
                    }
                };
            }
            let kv_keys: Vec<Key> = kv_items.iter().map(|(k, _)| *k).collect();
            self.after_publish(Tier::Kv, &kv_keys).await?;
            if !large_keys.is_empty() {
                self.after_publish(Tier::Large, &large_keys).await?;
            }
            Ok(PutMany { entries, pin })
        }
        .instrument(span)
        .await
    }

    /// Stores a stream, hashing while it is written: memory stays bounded
    /// (the threshold plus one chunk) whatever the stream's length.
    pub async fn put_reader<R: AsyncRead + Unpin + Send>(&self, mut reader: R) -> Result<Put> {
        let span = tracing::debug_span!("put_reader");
        async move {
            let input = |source| Error::Input {
                what: "the input stream".into(),
                source,
            };
            // Read up to threshold + 1 bytes: enough to choose the tier.
            let limit = self.inner.threshold as usize + 1;
            let mut head = BytesMut::with_capacity(limit.min(CHUNK));
            while head.len() < limit {
                let want = (limit - head.len()).min(CHUNK);
                head.reserve(want);
                let n = (&mut reader)
                    .take(want as u64)
                    .read_buf(&mut head)
                    .await
                    .map_err(input)?;
                if n == 0 {
                    break;
                }
            }
            if head.len() < limit {
                return self.put(head.freeze()).await;
            }
            if self.inner.large.is_none() {
                return Err(Error::TooLarge {
                    size: head.len() as u64,
                    threshold: self.inner.threshold,
                });
            }
            let large = self.engine(Tier::Large);
            let mut writer = large.begin_write().await?;
            let mut hasher = blake3::Hasher::new();
            let mut chunk = head.freeze();
            let streamed: Result<()> = async {
                loop {
                    hasher.update(&chunk);
                    writer.write(chunk).await?;
                    let mut buf = BytesMut::with_capacity(CHUNK);
                    while buf.len() < CHUNK {
                        let n = (&mut reader)
                            .take((CHUNK - buf.len()) as u64)
                            .read_buf(&mut buf)
                            .await
                            .map_err(input)?;
                        if n == 0 {
                            break;
                        }
                    }
                    if buf.is_empty() {
                        return Ok(());
                    }
                    chunk = buf.freeze();
                }
            }
            .await;
            if let Err(e) = streamed {
                let _ = writer.abort().await;
                return Err(e);
            }
            let key = Key::from_hash(hasher.finalize());
            let size = writer.written();
            self.publish_staged(writer, key, size).await
        }
        .instrument(span)
        .await
    }

    /// Stores a file's content, streamed (see [`Store::put_reader`]).
    pub async fn put_file(&self, path: impl AsRef<Path>) -> Result<Put> {
        let path = path.as_ref();
        let file = tokio::fs::File::open(path)
            .await
            .map_err(|source| Error::Input {
                what: path.display().to_string(),
                source,
            })?;
        self.put_reader(tokio::io::BufReader::with_capacity(CHUNK, file))
            .await
            .map_err(|e| match e {
                Error::Input { source, .. } => Error::Input {
                    what: path.display().to_string(),
                    source,
                },
                other => other,
            })
    }

    /// Pins an existing key, failing with [`Error::NotFound`] if it is absent
    /// or already collected. This — not [`Store::has`] — is the only safe
    /// way to start referencing content you did not just put.
    pub async fn pin(&self, key: &Key) -> Result<PinGuard> {
        let guard = self.inner.pins.acquire(&[*key]).await;
        // The pin is held, so from here the key cannot be deleted; a delete
        // that was in flight finished before `acquire` returned.
        if self.has(key).await? {
            Ok(guard)
        } else {
            Err(Error::NotFound { key: *key })
        }
    }

    /// How many pins this instance holds on `key`.
    pub fn pin_count(&self, key: &Key) -> u32 {
        self.inner.pins.count(key)
    }

    /// The whole blob, or `None`. Loads it into memory; use
    /// [`Store::open_read`] for large blobs.
    pub async fn get(&self, key: &Key) -> Result<Option<Bytes>> {
        let span = tracing::debug_span!("get", %key);
        async {
            if let Some(v) = self.inner.kv.get(key).await? {
                return Ok(Some(v));
            }
            match &self.inner.large {
                Some(l) => l.get(key).await,
                None => Ok(None),
            }
        }
        .instrument(span)
        .await
    }

    /// Like [`Store::get`], re-hashing the bytes: corruption is
    /// [`Error::Corrupt`].
    pub async fn get_verified(&self, key: &Key) -> Result<Option<Bytes>> {
        // Remember which engine answered: that is the one to blame.
        let (v, engine) = match self.inner.kv.get(key).await? {
            Some(v) => (v, &self.inner.kv),
            None => match &self.inner.large {
                Some(l) => match l.get(key).await? {
                    Some(v) => (v, l),
                    None => return Ok(None),
                },
                None => return Ok(None),
            },
        };
        let actual = hash(&v).await;
        if actual != *key {
            return Err(Error::Corrupt {
                key: *key,
                engine: engine.to_string(),
                detail: format!("content hashes to {actual}"),
            });
        }
        Ok(Some(v))
    }

    /// Up to `len` bytes from `offset` (clamped to the end), or `None`.
    pub async fn get_range(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        let span = tracing::debug_span!("get_range", %key, offset, len);
        async {
            if let Some(v) = self.inner.kv.get_range(key, offset, len).await? {
                return Ok(Some(v));
            }
            match &self.inner.large {
                Some(l) => l.get_range(key, offset, len).await,
                None => Ok(None),
            }
        }
        .instrument(span)
        .await
    }

    /// A streaming reader over the blob, or `None`.
    pub async fn open_read(&self, key: &Key) -> Result<Option<BlobReader>> {
        if let Some(r) = self.inner.kv.open_read(key).await? {
            return Ok(Some(r));
        }
        match &self.inner.large {
            Some(l) => l.open_read(key).await,
            None => Ok(None),
        }
    }

    /// A streaming reader that re-hashes as it goes: if the content does not
    /// match the key, the read that reaches the end fails with
    /// `io::ErrorKind::InvalidData` instead of returning end-of-file.
    pub async fn open_read_verified(&self, key: &Key) -> Result<Option<BlobReader>> {
        Ok(self.open_read(key).await?.map(|inner| {
            Box::pin(VerifyingReader {
                inner,
                hasher: blake3::Hasher::new(),
                expected: *key,
            }) as BlobReader
        }))
    }

    /// Whether the key is present now. Not a promise: see [`Store::pin`].
    pub async fn has(&self, key: &Key) -> Result<bool> {
        if self.inner.kv.has(key).await? {
            return Ok(true);
        }
        match &self.inner.large {
            Some(l) => l.has(key).await,
            None => Ok(false),
        }
    }

    /// Size and tier from the cheap length probe; never loads the value.
    pub async fn stat(&self, key: &Key) -> Result<Option<EntryMeta>> {
        if let Some(size) = self.inner.kv.size(key).await? {
            return Ok(Some(EntryMeta {
                key: *key,
                size,
                tier: Tier::Kv,
            }));
        }
        if let Some(l) = &self.inner.large
            && let Some(size) = l.size(key).await?
        {
            return Ok(Some(EntryMeta {
                key: *key,
                size,
                tier: Tier::Large,
            }));
        }
        Ok(None)
    }

    /// Every key in the pool, ascending, each once, streamed.
    pub fn list(&self) -> KeyStream<'_> {
        self.inner.list_pool()
    }

    /// Entries and bytes per tier (aggregates or `list` + `size`; never
    /// value loads).
    pub async fn usage(&self) -> Result<Usage> {
        let tier_usage = |e: &Arc<dyn Backend>| {
            let e = e.clone();
            async move {
                let (entries, bytes) = e.count_and_bytes().await?;
                Ok::<_, Error>(TierUsage {
                    engine: e.to_string(),
                    entries,
                    bytes,
                })
            }
        };
        let kv = tier_usage(&self.inner.kv).await?;
        let large = match &self.inner.large {
            Some(l) => Some(tier_usage(l).await?),
            None => None,
        };
        let tables = &self.inner.gc.tables;
        let staged = count_pages(|after| tables.staged(after, 4096), |r: &StagedRow| r.key).await?;
        let roots = count_pages(|after| tables.roots(after, 4096), |k: &Key| *k).await?;
        Ok(Usage {
            kv,
            large,
            staged,
            roots,
        })
    }

    /// Registers (or replaces) a named liveness source.
    pub fn register_liveness(&self, name: &str, source: impl LivenessSource) -> Result<()> {
        self.inner.gc.register(name, Arc::new(source))
    }

    /// Registers a "set of live keys" source.
    pub fn register_live_set<F, Fut>(&self, name: &str, f: F) -> Result<()>
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<std::collections::HashSet<Key>, crate::BoxError>>
            + Send
            + 'static,
    {
        self.register_liveness(name, LiveSet::new(f))
    }

    /// Registers an "is this key live?" source.
    pub fn register_live_check<F, Fut>(&self, name: &str, f: F) -> Result<()>
    where
        F: Fn(Key) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<bool, crate::BoxError>> + Send + 'static,
    {
        self.register_liveness(name, LiveCheck::new(f))
    }

    /// Removes a liveness source; true if it was registered.
    pub fn unregister_liveness(&self, name: &str) -> bool {
        self.inner.gc.unregister(name)
    }

    /// The registered liveness sources' names (including `roots`).
    pub fn liveness_sources(&self) -> Vec<String> {
        self.inner.gc.source_names()
    }

    /// Runs a sweep. An abort (a failing source, another sweep running) is
    /// `Ok(report)` with [`SweepReport::aborted`] set; `Err` means the store
    /// itself failed.
    pub async fn sweep(&self, opts: SweepOptions) -> Result<SweepReport> {
        let span = tracing::info_span!("sweep", dry_run = opts.dry_run);
        async {
            let report = gc::sweep(&self.inner, opts).await?;
            tracing::info!(
                examined = report.examined,
                staged = report.staged,
                deleted = report.deleted,
                kept = report.kept,
                aborted = ?report.aborted,
                "sweep finished"
            );
            Ok(report)
        }
        .instrument(span)
        .await
    }

    /// Staged rows with key after `after`, ascending, at most `limit`.
    pub async fn staged(&self, after: Option<Key>, limit: usize) -> Result<Vec<StagedRow>> {
        self.inner.gc.tables.staged(after, limit).await
    }

    /// Whether the GC tables survive a restart (true on sqlite).
    pub fn gc_durable(&self) -> bool {
        self.inner.gc.tables.durable()
    }

    /// Adds persistent roots: keys the `roots` liveness source reports
    /// live. Returns how many were new.
    pub async fn add_roots(&self, keys: &[Key]) -> Result<u64> {
        self.inner.gc.tables.add_roots(keys).await
    }

    /// Removes roots. Returns how many were present.
    pub async fn remove_roots(&self, keys: &[Key]) -> Result<u64> {
        self.inner.gc.tables.remove_roots(keys).await
    }

    /// Every root, ascending, streamed.
    pub fn roots(&self) -> KeyStream<'_> {
        let tables = self.inner.gc.tables.clone();
        let pages = futures::stream::unfold(Some(None::<Key>), move |cursor| {
            let tables = tables.clone();
            async move {
                let after = cursor?;
                match tables.roots(after, 4096).await {
                    Err(e) => Some((vec![Err(e)], None)),
                    Ok(page) if page.is_empty() => None,
                    Ok(page) => {
                        let next = Some(page.last().copied());
                        Some((page.into_iter().map(Ok).collect::<Vec<_>>(), next))
                    }
                }
            }
        });
        Box::pin(pages.flat_map(futures::stream::iter))
    }
}

async fn count_pages<T, F, Fut, K>(mut page: F, key: K) -> Result<u64>
where
    F: FnMut(Option<Key>) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<T>>>,
    K: Fn(&T) -> Key,
{
    let mut after = None;
    let mut n = 0;
    loop {
        let rows = page(after).await?;
        let Some(last) = rows.last() else {
            return Ok(n);
        };
        after = Some(key(last));
        n += rows.len() as u64;
    }
}

/// Re-hashes a blob as it is read; see [`Store::open_read_verified`].
struct VerifyingReader {
    inner: BlobReader,
    hasher: blake3::Hasher,
    expected: Key,
}

impl AsyncRead for VerifyingReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        match this.inner.as_mut().poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let new = &buf.filled()[before..];
                if new.is_empty() && buf.remaining() > 0 {
                    let actual = Key::from_hash(this.hasher.finalize());
                    if actual != this.expected {
                        return Poll::Ready(Err(std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            format!(
                                "blob {} is corrupt: its content hashes to {actual}",
                                this.expected
                            ),
                        )));
                    }
                } else {
                    this.hasher.update(new);
                }
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

// A `Store` must stay shareable across tasks and threads.
const _: fn() = || {
    fn shareable<T: Send + Sync + Clone + 'static>() {}
    shareable::<Store>();
};
