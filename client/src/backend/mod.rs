//! The engine contract and the engines that ship with the crate.
//!
//! An engine stores opaque bytes under [`Key`]s. It knows nothing of tiers,
//! thresholds, pins or garbage collection: the [`crate::Store`] facade adds
//! tiers on top of any pair of engines, and its `arbiter::Arbiter`
//! decides what may be deleted. Third parties add engines by implementing
//! [`Backend`] (and [`LargeBackend`] for the large tier); the traits are
//! object-safe, the store holds engines as `Arc<dyn …>`, and `Arc<T>` /
//! `Box<T>` of an engine are engines too. The conformance suites in
//! `alkblobs::conformance` (feature `conformance`) run the same cases over a
//! third-party engine that ours pass.

use std::fmt;

use async_trait::async_trait;
use bytes::Bytes;

use crate::{Key, Result};

pub mod local;
pub mod mem;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "serve")]
pub mod routed;
#[cfg(feature = "s3")]
pub mod s3;
pub mod sqlite;

// The object generations a fleet's database hands a shared tier's puts:
// the fleet arbiter (postgres) and the s3 engine share them.
#[cfg(any(feature = "postgres", feature = "s3"))]
mod generation;
mod lockfile;
#[cfg(any(feature = "postgres", feature = "s3"))]
pub(crate) use generation::Generations;
pub(crate) use lockfile::{InstanceLock, Wait};

pub use crate::tier::KeyStream;

/// A stream of entries — key, recorded length, value — ascending by key
/// ([`Backend::scan`]).
pub type EntryStream<'a> = futures::stream::BoxStream<'a, Result<(Key, u64, Bytes)>>;

/// [`Backend::scan`] by [`Backend::list`], then [`Backend::size`] and
/// [`Backend::get`] for each key, eight at once: the default, and what an
/// engine without a one-statement scan says it does.
pub(crate) fn scan_by_lookup<B: Backend + ?Sized>(b: &B, after: Option<Key>) -> EntryStream<'_> {
    use futures::{StreamExt, TryStreamExt};
    b.list()
        .try_filter(move |k| std::future::ready(after.is_none_or(|a| *k > a)))
        .map_ok(move |k| async move {
            let (size, value) = futures::try_join!(b.size(&k), b.get(&k))?;
            Ok::<_, crate::Error>(size.zip(value).map(|(n, v)| (k, n, v)))
        })
        .try_buffered(8)
        .try_filter_map(|e| std::future::ready(Ok(e)))
        .boxed()
}

pub use crate::integrity::BlobReader;
pub(crate) use crate::integrity::clamp_range;
pub(crate) use crate::offload::{blocking, inline};

/// Space an engine's files take on disk ([`Backend::disk_space`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct DiskSpace {
    /// Bytes on disk.
    pub on_disk: u64,
    /// Of those, bytes that hold nothing: freed by deletions and not yet
    /// given back (reused by later puts).
    pub free: u64,
}

/// What a put found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PutOutcome {
    /// The entry is new.
    Created,
    /// The key was already present; nothing was rewritten.
    Existed,
}

/// How hard an engine works to make a returned write survive a power cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// A write that returned survives a power cut: SQLite `synchronous=FULL`,
    /// files and their directories fsynced. The default.
    #[default]
    Durable,
    /// Faster: a write that returned survives a process crash but may be lost
    /// (never torn) on a power cut. SQLite `synchronous=NORMAL` in WAL mode,
    /// no fsync of files or directories.
    Relaxed,
}

/// How an embedded engine is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OpenMode {
    /// Read, write and sweep. Takes the engine's instance lock and fails at
    /// once with [`crate::Error::InUse`] if another process holds it.
    #[default]
    Write,
    /// Like [`OpenMode::Write`], but waits for the instance lock.
    WriteWait,
    /// Reads only: takes no lock; every write is refused with
    /// [`crate::Error::ReadOnly`].
    ReadOnly,
}

impl OpenMode {
    /// Whether writes are allowed.
    pub fn writable(self) -> bool {
        !matches!(self, OpenMode::ReadOnly)
    }

    pub(crate) fn wait(self) -> Wait {
        if self == OpenMode::WriteWait {
            Wait::Yes
        } else {
            Wait::No
        }
    }
}

/// Who else can reach an engine's entries. The store's arbiter decides who
/// may delete what; an in-process arbiter is only sound when nothing outside
/// this process can put, pin or delete behind its back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Sharing {
    /// Only this process writes the entries: an in-memory engine, or an
    /// embedded engine holding its exclusive instance lock (or opened
    /// read-only, so it deletes nothing).
    Process,
    /// Other processes or nodes can reach and change the entries without
    /// this process knowing: a database server, shared media without an
    /// instance lock. An in-process arbiter over such an engine would sweep
    /// a shared pool against only its own pins — the data-loss shape of
    /// ADR-008 §2 — so the store builder refuses it unless the embedder
    /// declares a single-instance topology.
    Shared,
}

/// The engine contract: storage of immutable blobs under their keys, and
/// nothing else. Engines know nothing of tiers, pins or garbage collection;
/// the store's `arbiter::Arbiter` decides what may be deleted and
/// is the only caller of [`Backend::delete`] on pool entries.
///
/// # Contract
///
/// - **Keys are trusted.** An engine stores `value` under `key` as given; the
///   store hashes content before calling it. Engines never re-hash.
/// - **Atomic, immutable puts.** A reader sees either no entry or the whole
///   value, never a prefix. Once committed an entry is never rewritten: a put
///   of a present key returns [`PutOutcome::Existed`] and leaves the stored
///   bytes alone.
/// - **Missing keys are not errors.** Reads of a missing key return `None` /
///   `false`; deleting a missing key returns `Ok(None)`.
/// - **`list` streams** keys in ascending byte order, each at most once, in
///   bounded memory (engines page or walk; a pool of ten million keys never
///   becomes one `Vec`). Entries put or deleted while a listing runs may or
///   may not appear.
/// - **`size` is cheap**: an indexed column read, a `stat`, a companion row —
///   never a value load.
/// - **Errors name the engine and classify**: every engine implements
///   `Display` (e.g. `sqlite(/data/index.sqlite)`) and wraps its failures
///   with [`crate::Error::engine`]. An engine may also return
///   [`crate::Error::Conflict`] or [`crate::Error::Unavailable`] (both
///   retryable: the call changed nothing, or is idempotent),
///   [`crate::Error::ReadOnly`], [`crate::Error::InUse`] (at open) and
///   [`crate::Error::InvalidRange`]. [`crate::Error::from_sqlstate`]
///   classifies database errors.
/// - **Sharing is declared** ([`Backend::sharing`]): an engine that other
///   processes can reach says so, and the store will not sweep it with an
///   in-process arbiter.
/// - Large engines also implement [`LargeBackend`]: streaming writes and
///   ranged, streaming reads with no whole-blob buffering.
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug + fmt::Display {
    /// The engine's kind, e.g. `"sqlite"`.
    fn name(&self) -> &str;

    /// Who else can reach the entries (see [`Sharing`]). Required, so that a
    /// network engine cannot forget to say it is shared.
    fn sharing(&self) -> Sharing;

    /// Whether `key` is present.
    ///
    /// # Behavior
    /// - A pure existence probe: no value is loaded.
    /// - The answer may be stale the moment it returns; it is not a promise
    ///   (see `Store::pin`).
    async fn has(&self, key: &Key) -> Result<bool>;

    /// The whole value, or `None`.
    ///
    /// # Behavior
    /// - Loads the value into memory; the store reads big blobs through
    ///   [`LargeBackend::open_read`] and [`LargeBackend::read_range`].
    async fn get(&self, key: &Key) -> Result<Option<Bytes>>;

    /// Stores `value` under `key`.
    ///
    /// # Behavior
    /// - Atomic: readers never observe a partial value.
    /// - A large engine stores no outboard with it (engines never hash):
    ///   the store puts large blobs through [`LargeBackend::begin_write`],
    ///   whose commit carries the outboard of the put's own hash pass.
    /// - A present key is left untouched and reported as
    ///   [`PutOutcome::Existed`].
    /// - Durable on return when the engine was opened with
    ///   [`Durability::Durable`].
    async fn put(&self, key: &Key, value: Bytes) -> Result<PutOutcome>;

    /// Removes `key`, returning the freed length if it was present.
    ///
    /// # Behavior
    /// - Deleting a missing key is `Ok(None)`, not an error.
    /// - The engine deletes what it is told; whether a pool entry *may* be
    ///   deleted is the arbiter's decision, taken before this call.
    async fn delete(&self, key: &Key) -> Result<Option<u64>>;

    /// Every key, ascending, streamed (see the contract).
    fn list(&self) -> KeyStream<'_>;

    /// The entry's length in bytes, or `None`.
    ///
    /// # Behavior
    /// - Never loads the value: an indexed column, a `stat`, a companion row.
    async fn size(&self, key: &Key) -> Result<Option<u64>>;

    /// Up to `len` bytes starting at `offset`, or `None` if the key is absent.
    ///
    /// # Behavior
    /// - The range is clamped to the blob: a read at `offset == size` is
    ///   empty.
    /// - `offset > size` is [`crate::Error::InvalidRange`].
    /// - The default loads the whole value and slices it: right for kv
    ///   engines, whose values are at most the kv threshold. The store reads
    ///   ranges of the large tier through [`LargeBackend::read_range`].
    async fn get_range(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        let Some(value) = self.get(key).await? else {
            return Ok(None);
        };
        slice_range(key, &value, offset, len).map(Some)
    }

    /// Each of `keys` with its recorded size and value, in order (`None`
    /// for an absent one): what `verify` reads a page of a pool's record
    /// with.
    ///
    /// # Behavior
    /// - The default asks one key at a time ([`Backend::size`], then
    ///   [`Backend::get`]); an engine across a network answers the batch in
    ///   one request.
    async fn get_many(&self, keys: &[Key]) -> Result<Vec<Option<(u64, Bytes)>>> {
        get_each(self, keys).await
    }

    /// Stores many small values; kv engines do it in one transaction.
    ///
    /// # Behavior
    /// - All or nothing on engines with transactions; the default loops over
    ///   [`Backend::put`].
    async fn put_many(&self, items: &[(Key, Bytes)]) -> Result<Vec<PutOutcome>> {
        let mut out = Vec::with_capacity(items.len());
        for (k, v) in items {
            out.push(self.put(k, v.clone()).await?);
        }
        Ok(out)
    }

    /// Deletes many keys; kv engines do it in one transaction.
    ///
    /// # Behavior
    /// - Returns each key's freed length (`None` if it was absent).
    async fn delete_many(&self, keys: &[Key]) -> Result<Vec<Option<u64>>> {
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            out.push(self.delete(k).await?);
        }
        Ok(out)
    }

    /// Every entry with its recorded length and its value, ascending by
    /// key, from after `after` (`None`: the first): what a scrub reads.
    ///
    /// # Behavior
    /// - Each key at most once; a key deleted while the scan runs may be
    ///   missing, never torn.
    /// - Values arrive whole: for kv engines, whose values are at most the
    ///   kv threshold. The default is [`Backend::list`] then
    ///   [`Backend::size`] and [`Backend::get`] for each key (eight at
    ///   once); a kv engine reads pages of rows in one statement each.
    fn scan(&self, after: Option<Key>) -> EntryStream<'_> {
        scan_by_lookup(self, after)
    }

    /// Entry count and total bytes, if the engine can answer with an
    /// aggregate cheaper than `list` + `size`. The default says it cannot.
    async fn usage(&self) -> Result<Option<(u64, u64)>> {
        Ok(None)
    }

    /// The bytes this engine's files take on disk and, of those, how many
    /// hold nothing (space deleted entries left for reuse), for an engine
    /// that keeps its entries in files of its own (a SQLite database). The
    /// default: it cannot tell (`None`).
    async fn disk_space(&self) -> Result<Option<DiskSpace>> {
        Ok(None)
    }

    /// Gives the space deleted entries left back to the filesystem,
    /// rewriting the engine's files if need be (it may hold writes back
    /// meanwhile, and refuses when the disk cannot hold the copy it needs);
    /// returns the space before and after. The default: nothing to give
    /// back (`None`).
    async fn compact(&self) -> Result<Option<(DiskSpace, DiskSpace)>> {
        Ok(None)
    }

    /// Removes abandoned partial writes (e.g. staging files of killed
    /// processes), only when provably abandoned. Returns how many.
    async fn reclaim_abandoned(&self) -> Result<u64> {
        Ok(0)
    }

    /// Finishes background work and releases the engine's resources (a
    /// SQLite engine checkpoints and removes its WAL). Later calls may fail.
    /// The default has nothing to do.
    async fn close(&self) -> Result<()> {
        Ok(())
    }

    /// An optional ability: the SQLite database this engine keeps its
    /// entries in, when it has one ([`sqlite::SqliteBackend`] answers
    /// itself). [`crate::StoreBuilder::kv`] then keeps the single-node
    /// arbiter's durable tables (staged candidates, roots) in that same
    /// database, as [`crate::StoreBuilder::sqlite`] does, so roots survive
    /// a restart and a put clears its key's staged row in its own
    /// transaction. `None` (the default) for every other engine; a wrapper
    /// that forwards it (as `Arc` and `Box` do) keeps the pairing.
    fn sqlite_database(&self) -> Option<&sqlite::SqliteBackend> {
        None
    }
}

/// A large-tier engine: a [`Backend`] that can hold blobs far bigger than
/// memory. Every method is required — there is no whole-blob default that
/// compiles and then exhausts memory on a 10 GiB blob.
///
/// # Contract
/// - [`LargeBackend::begin_write`] streams to a staging area invisible to
///   readers; its commit publishes atomically (the same atomic, immutable
///   put as [`Backend::put`]).
/// - [`LargeBackend::open_read`] and [`LargeBackend::read_range`] read in
///   memory bounded by the request, not by the blob.
#[async_trait]
pub trait LargeBackend: Backend {
    /// Starts a streaming write whose key is known only at the end.
    ///
    /// # Behavior
    /// - Bytes go to a staging area invisible to readers;
    ///   [`StagedWrite::commit`] publishes them atomically under a key;
    ///   dropping or aborting the write discards them.
    async fn begin_write(&self) -> Result<Box<dyn StagedWrite + '_>>;

    /// A reader over the value, or `None`, streaming from storage.
    async fn open_read(&self, key: &Key) -> Result<Option<BlobReader>>;

    /// Up to `len` bytes from `offset`, reading only that window.
    ///
    /// # Behavior
    /// - Clamped to the end like [`Backend::get_range`]; `offset > size` is
    ///   [`crate::Error::InvalidRange`].
    async fn read_range(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>>;

    /// Deletes the key's content of every object generation up to
    /// `through`, and none after it; returns its size if anything was
    /// deleted. The fleet arbiter deletes a claimed key of a shared tier
    /// with the generation its tombstone carries, so a claimer that stalls
    /// and resumes late cannot delete a later generation put since (see
    /// `docs/design.md`, "The shared tier over S3").
    ///
    /// # Behavior
    /// - An engine that keeps one object per key (every engine but s3)
    ///   has only generation 0: the default is [`Backend::delete`].
    async fn delete_through(&self, key: &Key, through: u64) -> Result<Option<u64>> {
        let _ = through;
        self.delete(key).await
    }

    /// The size of generation `generation` of `key`'s object, or `None`
    /// when the tier holds no object of that generation (whatever other
    /// generations it holds). A fleet's file record names the generation
    /// the tier must hold: `verify` asks for that one, so a recorded
    /// object that is gone is not hidden by an older one a late delete may
    /// still remove.
    ///
    /// # Behavior
    /// - An engine that keeps one object per key (every engine but s3)
    ///   has only generation 0: the default is [`Backend::size`].
    async fn generation_size(&self, key: &Key, generation: u64) -> Result<Option<u64>> {
        let _ = generation;
        self.size(key).await
    }

    /// `key`'s content read to its end and hashed in one pass (its key as
    /// the bytes say, their number, their outboard), or `None` when it is
    /// absent: what `verify` holds a large blob against. `size_hint`: the
    /// recorded size, for the read buffer.
    ///
    /// # Behavior
    /// - A read that fails, at its first byte or midway, is
    ///   [`crate::outboard::Digest::Unreadable`] (the blob is damaged), not
    ///   an error; an error is the engine's, before the read starts (the
    ///   open: [`crate::Error::Lost`] for content gone behind a record).
    /// - The default streams [`LargeBackend::open_read`]; an engine whose
    ///   reads are system calls does the whole read in one blocking call.
    async fn digest(
        &self,
        key: &Key,
        size_hint: u64,
    ) -> Result<Option<crate::integrity::outboard::Digest>> {
        let Some(reader) = self.open_read(key).await? else {
            return Ok(None);
        };
        Ok(Some(
            crate::integrity::outboard::digest_async(reader, size_hint).await,
        ))
    }

    /// Up to `len` bytes of `key`'s outboard from `offset` (clamped to its
    /// end), or `None` when the blob has none: it is absent, or was stored
    /// before outboards existed (see [`crate::outboard`]).
    ///
    /// # Behavior
    /// - A blob of one chunk group or less has an empty outboard: answer
    ///   `Some` of an empty window for a present one.
    /// - Reads only the window. The answer is not trusted: every reader
    ///   checks it against the key.
    async fn read_outboard(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>>;

    /// Several windows of `key`'s outboard in one call, each like
    /// [`LargeBackend::read_outboard`]; `None` when the blob has no
    /// outboard. A verified range needs a dozen scattered windows (its
    /// groups' parents and their path to the root): an engine answers them
    /// with one open, query or batch of requests. The default asks for them
    /// all at once (a network engine's round trips overlap).
    async fn read_outboard_windows(
        &self,
        key: &Key,
        windows: &[std::ops::Range<u64>],
    ) -> Result<Option<Vec<Bytes>>> {
        crate::integrity::each_window(windows, |w| {
            self.read_outboard(key, w.start, w.end - w.start)
        })
        .await
    }

    /// Stores `outboard` as the outboard of the present blob `key`,
    /// replacing any it has (an outboard is a function of the key, so a
    /// replacement only mends a damaged or missing one). Returns `false`,
    /// storing nothing, if the blob is absent.
    ///
    /// # Behavior
    /// - Need not be durable: a lost or torn outboard is found by the
    ///   first read that checks it and rebuilt by `verify --repair-outboards`.
    async fn put_outboard(&self, key: &Key, outboard: Bytes) -> Result<bool>;

    /// Blobs of at most this many bytes carry no outboard in this engine,
    /// by design (default 0: every blob of more than one chunk group
    /// does). A verified range of one reads it whole, `verify` does not
    /// count it missing, and a put does not store one. For an engine where
    /// an outboard costs a request of its own (`s3`), small blobs read
    /// whole as cheaply.
    fn outboard_floor(&self) -> u64 {
        0
    }

    /// Bytes of stored outboards, when the engine can tell without reading
    /// them. The default says it cannot.
    async fn outboard_usage(&self) -> Result<Option<u64>> {
        Ok(None)
    }

    /// Keys whose outboard is stored but whose blob is not, ascending: a
    /// writer that stopped between storing the outboard and publishing the
    /// blob, or a blob removed behind the engine's back. A fleet's tier
    /// listing stages them with the blobs (a delete removes a key's
    /// outboard whether or not its blob is there), and `verify` reports
    /// them as unrecorded.
    ///
    /// # Behavior
    /// - The default has none: an engine whose outboards live in its
    ///   blobs' own records (`mem`, `pg-lo`) cannot leave one behind.
    fn orphan_outboards(&self) -> KeyStream<'_> {
        Box::pin(futures::stream::empty())
    }
}

/// A write in progress; see [`LargeBackend::begin_write`].
#[async_trait]
pub trait StagedWrite: Send {
    /// Appends a chunk.
    async fn write(&mut self, chunk: Bytes) -> Result<()>;

    /// Bytes written so far.
    fn written(&self) -> u64;

    /// Publishes the staged bytes under `key` with their `outboard` (the
    /// caller guarantees `key` is their BLAKE3 hash and `outboard` their
    /// [`crate::outboard`]). The outboard is stored first, so a published
    /// blob has one. If `key` is already present the staged bytes are
    /// discarded and the entry is left untouched (an engine may store the
    /// outboard then, if the blob has none).
    async fn commit(self: Box<Self>, key: &Key, outboard: Bytes) -> Result<PutOutcome>;

    /// Discards the staged bytes. Dropping the write does the same, best
    /// effort.
    async fn abort(self: Box<Self>) -> Result<()>;
}

mod forward;

/// Conveniences over any [`Backend`]; engines never implement this.
#[async_trait]
pub trait BackendExt: Backend {
    /// Collects `list` into a vector. For tests and small pools only.
    async fn list_all(&self) -> Result<Vec<Key>> {
        use futures::TryStreamExt;
        self.list().try_collect().await
    }

    /// Entry count and bytes: the engine's aggregate if it has one, else
    /// `list` + `size` (never a value load).
    async fn count_and_bytes(&self) -> Result<(u64, u64)> {
        use futures::TryStreamExt;
        if let Some(u) = self.usage().await? {
            return Ok(u);
        }
        let mut keys = self.list();
        let (mut n, mut bytes) = (0u64, 0u64);
        while let Some(k) = keys.try_next().await? {
            if let Some(s) = self.size(&k).await? {
                n += 1;
                bytes += s;
            }
        }
        Ok((n, bytes))
    }
}

impl<T: Backend + ?Sized> BackendExt for T {}

/// [`Backend::get_many`] one key at a time: a size, then a get.
pub(crate) async fn get_each<E: Backend + ?Sized>(
    engine: &E,
    keys: &[Key],
) -> Result<Vec<Option<(u64, Bytes)>>> {
    let mut out = Vec::with_capacity(keys.len());
    for k in keys {
        out.push(match engine.size(k).await? {
            Some(n) => engine.get(k).await?.map(|v| (n, v)),
            None => None,
        });
    }
    Ok(out)
}

/// Every large engine is what verification reads through.
#[async_trait]
impl<T: LargeBackend + ?Sized> crate::integrity::Source for T {
    async fn size(&self, key: &Key) -> Result<Option<u64>> {
        Backend::size(self, key).await
    }
    async fn open_read(&self, key: &Key) -> Result<Option<BlobReader>> {
        LargeBackend::open_read(self, key).await
    }
    async fn read_range(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        LargeBackend::read_range(self, key, offset, len).await
    }
    async fn read_outboard(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        LargeBackend::read_outboard(self, key, offset, len).await
    }
    async fn read_outboard_windows(
        &self,
        key: &Key,
        windows: &[std::ops::Range<u64>],
    ) -> Result<Option<Vec<Bytes>>> {
        LargeBackend::read_outboard_windows(self, key, windows).await
    }
    fn outboard_floor(&self) -> u64 {
        LargeBackend::outboard_floor(self)
    }
}

/// `large` as verification reads it (`crate::integrity`).
pub(crate) fn source(
    large: &std::sync::Arc<dyn LargeBackend>,
) -> std::sync::Arc<dyn crate::integrity::Source> {
    std::sync::Arc::new(large.clone())
}

/// The `[offset, offset+len)` window of `value`, clamped to its end.
pub(crate) fn slice_range(key: &Key, value: &Bytes, offset: u64, len: u64) -> Result<Bytes> {
    let r = clamp_range(key, value.len() as u64, offset, len)?;
    Ok(value.slice(r.start as usize..r.end as usize))
}
