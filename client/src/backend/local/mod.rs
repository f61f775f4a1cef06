//! `local`: the large-tier engine on a filesystem — its options, errors,
//! open and the engine traits (this file); publishing a staged blob
//! (`publish.rs`), reclaiming abandoned staging files (`recovery.rs`), the
//! blob tree's names (`layout.rs`) and the streaming writer (`writer.rs`).
//! The protocol they share is here:
//!
//! # Layout
//!
//! ```text
//! <root>/alkblobs.lock              instance lock (writable opens)
//! <root>/staging/<random>.part      named staging files (shared media, or
//!                                   where unnamed files are unsupported)
//! <root>/blobs/ab/ab…(64 hex)       committed blobs, read-only (0444), immutable
//! <root>/blobs/ab/ab…(64 hex).obao  its BLAKE3 outboard (`outboard.rs`), if
//!                                   the blob is over one 16 KiB group
//! ```
//!
//! # Publishing a blob
//!
//! Where the filesystem offers them (ext4, XFS, btrfs, tmpfs: probed at
//! open) and the root is not shared media, bytes go to an **unnamed** file,
//! `open(staging, O_TMPFILE)`, created read-only (0444; its writer's
//! descriptor stays writable). It has no name until commit, so readers and
//! other writers cannot see it and a killed writer leaves nothing behind:
//! the kernel frees it (after a power cut, the filesystem's orphan list
//! does). At commit, if the key is already present the file is dropped;
//! otherwise it is `fsync`ed (durable mode) and given its sharded name with
//! `linkat("/proc/thread-self/fd/N", target, AT_SYMLINK_FOLLOW)`, which fails
//! with `EEXIST` rather than replace a committed blob, so a second writer of
//! the same key reports [`PutOutcome::Existed`]; then the shard directory is
//! `fsync`ed. Against a named staging file this saves its creation in the
//! one directory every put shares, the `flock`, the `chmod`, and a
//! cross-directory rename (which serialises on the filesystem's rename
//! lock); `docs/design.md` ("local") has the measurement.
//!
//! Otherwise (shared media, [`LocalOptions::named_staging`], or no
//! `O_TMPFILE`), bytes go to a fresh named staging file on the same
//! filesystem, which its writer holds `flock`ed while writing. At commit,
//! if the key is already present
//! the staging file is simply discarded (no fsync is paid for a dedup hit);
//! otherwise the file is `fsync`ed, closed
//! (the close's error is checked: on NFS it reports write-back failures),
//! made read-only, then renamed to its sharded path with
//! `renameat2(RENAME_NOREPLACE)`; finally the shard directory is `fsync`ed so
//! the new name survives a power cut. A no-replace rename never replaces an
//! existing name, so a committed blob is never rewritten: a second writer of
//! the same key gets `EEXIST`, discards its staging file and reports
//! [`PutOutcome::Existed`]. Filesystems without `RENAME_NOREPLACE` (NFS,
//! some FUSE) fall back to `link` + `unlink`, which is just as exclusive;
//! filesystems without hard links either, to a rename guarded by an
//! existence check. Readers only ever open sharded paths, so they see a
//! whole blob or none.
//!
//! # Recovery
//!
//! A killed writer of an unnamed file leaves nothing at all. A killed
//! writer of a named one leaves a staging file and nothing visible. Another
//! process may be writing into the same root right now (shared media), so a
//! staging file is removed only when provably abandoned: nobody holds its
//! lock **and** it has not been modified for [`LocalOptions::staging_grace`].
//! A writer touches its file with every chunk, so a live writer is never
//! reclaimed; a writer paused past the grace finds its staging file gone and
//! its put fails with an error (nothing is lost: the caller retries).

use std::fmt;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use futures::TryStreamExt;

use super::{
    Backend, BlobReader, Durability, InstanceLock, KeyStream, LargeBackend, OpenMode, PutOutcome,
    Sharing, StagedWrite, blocking,
};
use crate::{Error, Key, Result};
use alkblobs_core::{all_shards, shard_path};

mod layout;
mod outboard;
mod publish;
mod recovery;
mod writer;

use layout::{leaf_keys, leaf_orphan_outboards, shard_names};
use publish::unnamed_staging_works;
use writer::LocalWrite;

/// Options for [`LocalBackend::open`]; build with
/// `LocalOptions::default().durability(..).mode(..)`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LocalOptions {
    /// `Durable` (default): files and directories are fsynced before a put
    /// returns. `Relaxed`: no fsync (a power cut may lose, never tear, a
    /// recent blob).
    pub durability: Durability,
    /// Write (with the instance lock) or read-only.
    pub mode: OpenMode,
    /// A staging file untouched for this long whose lock nobody holds is
    /// abandoned and reclaimed (default 15 minutes).
    pub staging_grace: Duration,
    /// The directory is on media several fleet nodes share (the operator's
    /// assertion: atomic rename, close-to-open consistency): a writable
    /// open takes no instance lock (other nodes write here too, and no
    /// cross-node file lock is relied on) and the engine reports
    /// [`Sharing::Shared`], so only the fleet arbiter may sweep it.
    pub shared_media: bool,
    /// Stage writes in named files under `staging/` even where the
    /// filesystem offers unnamed ones (`O_TMPFILE`). Shared media always
    /// use named staging files: the same protocol on every node's mount,
    /// whatever it supports.
    pub named_staging: bool,
}

impl LocalOptions {
    /// Durability of puts (fsync of files and directories, or none).
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Write, wait for the instance lock, or read-only.
    pub fn mode(mut self, mode: OpenMode) -> Self {
        self.mode = mode;
        self
    }

    /// Declares the directory fleet-shared media (see
    /// [`LocalOptions::shared_media`]).
    pub fn shared_media(mut self, yes: bool) -> Self {
        self.shared_media = yes;
        self
    }

    /// How long an unlocked staging file must be untouched before it is
    /// reclaimed as abandoned.
    pub fn staging_grace(mut self, grace: Duration) -> Self {
        self.staging_grace = grace;
        self
    }

    /// Forces named staging files (see [`LocalOptions::named_staging`]).
    pub fn named_staging(mut self, yes: bool) -> Self {
        self.named_staging = yes;
        self
    }
}

impl Default for LocalOptions {
    fn default() -> Self {
        LocalOptions {
            durability: Durability::Durable,
            mode: OpenMode::Write,
            staging_grace: Duration::from_secs(15 * 60),
            shared_media: false,
            named_staging: false,
        }
    }
}

/// What went wrong inside the local engine, named for the failed action.
#[derive(Debug, thiserror::Error)]
#[allow(clippy::enum_variant_names)] // "UnableTo…" is the naming convention
enum LocalError {
    #[error(
        "unable to create directory {path}: {source} (check that the data directory exists and is writable)"
    )]
    UnableToCreateDir { path: PathBuf, source: io::Error },
    #[error("unable to create staging file {path}: {source}")]
    UnableToCreateStaging { path: PathBuf, source: io::Error },
    #[error("unable to write staging file {path}: {source}")]
    UnableToWriteStaging { path: PathBuf, source: io::Error },
    #[error("unable to sync {path}: {source}")]
    UnableToSync { path: PathBuf, source: io::Error },
    #[error("unable to publish staged {from} as {to}: {source}")]
    UnableToPublishStaged {
        from: PathBuf,
        to: PathBuf,
        source: io::Error,
    },
    #[error("unable to read {path}: {source}")]
    UnableToRead { path: PathBuf, source: io::Error },
    #[error("unable to delete {path}: {source}")]
    UnableToDelete { path: PathBuf, source: io::Error },
    #[error("unable to list {path}: {source}")]
    UnableToList { path: PathBuf, source: io::Error },
}

/// The local filesystem engine. Cloning shares the same root.
#[derive(Clone)]
pub struct LocalBackend {
    inner: Arc<Inner>,
}

struct Inner {
    root: PathBuf,
    blobs: PathBuf,
    staging: PathBuf,
    display: String,
    opts: LocalOptions,
    /// Writes go to unnamed files (`O_TMPFILE`); decided at open.
    unnamed: bool,
    /// The instance lock; taken out (released) by `close`.
    lock: std::sync::Mutex<Option<InstanceLock>>,
    /// Set by `close` (on shared media, where there is no lock to release).
    closed: std::sync::atomic::AtomicBool,
}

impl Inner {
    fn err(&self, e: LocalError) -> Error {
        Error::engine(&self.display, e)
    }

    fn path_of(&self, key: &Key) -> PathBuf {
        self.blobs.join(shard_path(key))
    }

    fn durable(&self) -> bool {
        self.opts.durability == Durability::Durable
    }

    fn check_writable(&self, action: &'static str) -> Result<()> {
        let closed = self.closed.load(std::sync::atomic::Ordering::Acquire)
            || (self.opts.mode.writable()
                && !self.opts.shared_media
                && self
                    .lock
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .is_none());
        if closed {
            return Err(crate::Error::Closed);
        }
        if self.opts.mode.writable() {
            Ok(())
        } else {
            Err(Error::ReadOnly {
                engine: self.display.clone(),
                action,
            })
        }
    }
}

impl LocalBackend {
    /// Opens (creating if needed, unless read-only) a root directory.
    ///
    /// A writable open takes the instance lock `<root>/alkblobs.lock` and
    /// reclaims abandoned staging files.
    pub async fn open(root: impl AsRef<Path>, opts: LocalOptions) -> Result<LocalBackend> {
        let root = root.as_ref().to_owned();
        let display = format!("local({})", root.display());
        blocking(&display.clone(), move || {
            Self::open_blocking(root, display, opts)
        })
        .await
    }

    fn open_blocking(root: PathBuf, display: String, opts: LocalOptions) -> Result<LocalBackend> {
        let blobs = root.join("blobs");
        let staging = root.join("staging");
        let mut inner = Inner {
            root: root.clone(),
            blobs,
            staging,
            display,
            opts,
            unnamed: false,
            lock: std::sync::Mutex::new(None),
            closed: std::sync::atomic::AtomicBool::new(false),
        };
        if inner.opts.mode.writable() {
            for dir in [&inner.root, &inner.blobs, &inner.staging] {
                fs::create_dir_all(dir).map_err(|source| {
                    inner.err(LocalError::UnableToCreateDir {
                        path: dir.clone(),
                        source,
                    })
                })?;
            }
            if !inner.opts.shared_media {
                let lock = InstanceLock::acquire(
                    &inner.root.join("alkblobs.lock"),
                    inner.opts.mode.wait(),
                    &inner.display,
                )?;
                inner.lock = std::sync::Mutex::new(Some(lock));
            }
            // All 256 shards up front: a put then never creates a directory.
            let mut created = false;
            for shard in all_shards() {
                let dir = inner.blobs.join(shard);
                match fs::create_dir(&dir) {
                    Ok(()) => created = true,
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(source) => {
                        return Err(inner.err(LocalError::UnableToCreateDir { path: dir, source }));
                    }
                }
            }
            if created && inner.durable() {
                inner.sync_dir(&inner.blobs)?;
            }
            // Prove the staging area is writable now rather than at the
            // first put, and choose unnamed staging files where they work.
            inner.unnamed = !inner.opts.shared_media
                && !inner.opts.named_staging
                && unnamed_staging_works(&inner.staging);
            if !inner.unnamed {
                let (probe, path) = inner.new_named_staging()?;
                drop(probe);
                let _ = fs::remove_file(path);
            }
            tracing::debug!(root = %inner.root.display(), unnamed = inner.unnamed, "staging");
            // Named staging files a killed writer left (this or an earlier
            // open's mode).
            inner.reclaim()?;
        }
        Ok(LocalBackend {
            inner: Arc::new(inner),
        })
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    /// Where `key`'s file lives (whether or not it exists).
    pub fn path_of(&self, key: &Key) -> PathBuf {
        self.inner.path_of(key)
    }
}

impl fmt::Debug for LocalBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalBackend")
            .field("root", &self.inner.root)
            .field("opts", &self.inner.opts)
            .finish()
    }
}

impl fmt::Display for LocalBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.inner.display)
    }
}

fn not_found_is_none<T>(r: io::Result<T>) -> io::Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

#[async_trait]
impl Backend for LocalBackend {
    fn name(&self) -> &str {
        "local"
    }

    fn sharing(&self) -> Sharing {
        // A writable open holds the root's instance lock; a read-only one
        // deletes nothing. Shared media (the fleet-validity rule's
        // declaration) is written by other nodes too.
        if self.inner.opts.shared_media {
            Sharing::Shared
        } else {
            Sharing::Process
        }
    }

    async fn has(&self, key: &Key) -> Result<bool> {
        Ok(self.size(key).await?.is_some())
    }

    async fn get(&self, key: &Key) -> Result<Option<Bytes>> {
        let inner = self.inner.clone();
        let path = inner.path_of(key);
        blocking(&self.inner.display, move || {
            not_found_is_none(fs::read(&path))
                .map(|o| o.map(Bytes::from))
                .map_err(|source| inner.err(LocalError::UnableToRead { path, source }))
        })
        .await
    }

    async fn put(&self, key: &Key, value: Bytes) -> Result<PutOutcome> {
        self.inner.check_writable("put a blob")?;
        let inner = self.inner.clone();
        let key = *key;
        blocking(&self.inner.display, move || {
            // Dedup without writing a byte: committed blobs are immutable.
            if inner.path_of(&key).exists() {
                return Ok(PutOutcome::Existed);
            }
            let (mut file, staging) = inner.new_staging()?;
            if let Err(source) = file.write_all(&value) {
                if let Some(path) = &staging {
                    let _ = fs::remove_file(path);
                }
                return Err(inner.err(LocalError::UnableToWriteStaging {
                    path: staging.unwrap_or_else(|| inner.staging.clone()),
                    source,
                }));
            }
            inner.commit_staged(file, staging.as_deref(), &key)
        })
        .await
    }

    async fn delete(&self, key: &Key) -> Result<Option<u64>> {
        self.inner.check_writable("delete a blob")?;
        let inner = self.inner.clone();
        let path = inner.path_of(key);
        let key = *key;
        blocking(&self.inner.display, move || {
            let size = match not_found_is_none(fs::metadata(&path)) {
                Ok(Some(m)) => m.len(),
                // No blob: its outboard goes all the same (a writer that
                // stopped before publishing left it, or the blob was
                // removed behind the engine's back).
                Ok(None) => {
                    inner.remove_outboard(&key);
                    return Ok(None);
                }
                Err(source) => return Err(inner.err(LocalError::UnableToRead { path, source })),
            };
            let removed = match not_found_is_none(fs::remove_file(&path)) {
                Ok(Some(())) => Ok(Some(size)),
                Ok(None) => Ok(None),
                Err(source) => return Err(inner.err(LocalError::UnableToDelete { path, source })),
            };
            inner.remove_outboard(&key);
            removed
        })
        .await
    }

    fn list(&self) -> KeyStream<'_> {
        self.inner.walk(leaf_keys)
    }

    async fn size(&self, key: &Key) -> Result<Option<u64>> {
        let inner = self.inner.clone();
        let path = inner.path_of(key);
        blocking(&self.inner.display, move || {
            not_found_is_none(fs::metadata(&path))
                .map(|o| o.map(|m| m.len()))
                .map_err(|source| inner.err(LocalError::UnableToRead { path, source }))
        })
        .await
    }

    async fn get_range(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        self.read_range(key, offset, len).await
    }

    async fn close(&self) -> Result<()> {
        // Refuses later writes and lets another process take the root.
        self.inner
            .closed
            .store(true, std::sync::atomic::Ordering::Release);
        self.inner
            .lock
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        Ok(())
    }

    async fn reclaim_abandoned(&self) -> Result<u64> {
        if !self.inner.opts.mode.writable() {
            return Ok(0);
        }
        let inner = self.inner.clone();
        blocking(&self.inner.display, move || inner.reclaim()).await
    }
}

#[async_trait]
impl LargeBackend for LocalBackend {
    async fn read_range(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        let inner = self.inner.clone();
        let path = inner.path_of(key);
        let k = *key;
        blocking(&self.inner.display, move || {
            let read_err = |source| {
                inner.err(LocalError::UnableToRead {
                    path: path.clone(),
                    source,
                })
            };
            let Some(file) = not_found_is_none(File::open(&path)).map_err(read_err)? else {
                return Ok(None);
            };
            let size = file.metadata().map_err(read_err)?.len();
            let r = crate::backend::clamp_range(&k, size, offset, len)?;
            let n = (r.end - r.start) as usize;
            let mut buf = vec![0u8; n];
            file.read_exact_at(&mut buf, offset).map_err(read_err)?;
            Ok(Some(Bytes::from(buf)))
        })
        .await
    }

    async fn open_read(&self, key: &Key) -> Result<Option<BlobReader>> {
        let path = self.inner.path_of(key);
        match tokio::fs::File::open(&path).await {
            Ok(f) => Ok(Some(Box::pin(f))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(self.inner.err(LocalError::UnableToRead { path, source })),
        }
    }

    /// One blocking call per blob: open, read and hash (a `tokio::fs` read
    /// is a hop to the blocking pool and a copy per 1 MiB, which made a
    /// scrub of 1 MiB files 0.55× read + BLAKE3; see `docs/benchmarks.md`).
    /// On the blocking pool, not in place: `verify --jobs` runs several
    /// at once in one task, and they should use every core.
    async fn digest(
        &self,
        key: &Key,
        _size_hint: u64,
    ) -> Result<Option<crate::integrity::outboard::Digest>> {
        let inner = self.inner.clone();
        let path = self.inner.path_of(key);
        let read = tokio::task::spawn_blocking(move || match File::open(&path) {
            Ok(mut f) => Ok(Some(crate::integrity::outboard::digest_sync(&mut f))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(inner.err(LocalError::UnableToRead { path, source })),
        });
        match read.await {
            Ok(r) => r,
            Err(e) => Err(Error::engine(
                &self.inner.display,
                format!("blocking task failed: {e}"),
            )),
        }
    }

    async fn read_outboard(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        let inner = self.inner.clone();
        let key = *key;
        blocking(&self.inner.display, move || {
            inner.read_outboard(&key, offset, len)
        })
        .await
    }

    async fn read_outboard_windows(
        &self,
        key: &Key,
        windows: &[std::ops::Range<u64>],
    ) -> Result<Option<Vec<Bytes>>> {
        let inner = self.inner.clone();
        let key = *key;
        let windows = windows.to_vec();
        blocking(&self.inner.display, move || {
            inner.read_outboard_windows(&key, &windows)
        })
        .await
    }

    async fn put_outboard(&self, key: &Key, outboard: Bytes) -> Result<bool> {
        self.inner.check_writable("put an outboard")?;
        let inner = self.inner.clone();
        let key = *key;
        blocking(&self.inner.display, move || {
            if !inner.path_of(&key).exists() {
                return Ok(false);
            }
            inner.write_outboard(&key, &outboard)?;
            Ok(true)
        })
        .await
    }

    async fn outboard_usage(&self) -> Result<Option<u64>> {
        let inner = self.inner.clone();
        blocking(&self.inner.display, move || {
            inner.outboard_usage().map(Some)
        })
        .await
    }

    fn orphan_outboards(&self) -> KeyStream<'_> {
        self.inner.walk(leaf_orphan_outboards)
    }

    async fn begin_write(&self) -> Result<Box<dyn StagedWrite + '_>> {
        self.inner.check_writable("put a blob")?;
        let inner = self.inner.clone();
        let (file, path) = blocking(&self.inner.display, move || inner.new_staging()).await?;
        Ok(Box::new(LocalWrite {
            inner: self.inner.clone(),
            file: Some(file),
            path,
            written: 0,
            done: false,
        }))
    }
}

impl Inner {
    /// Every key `per_leaf` finds in each leaf shard, ascending: the shards
    /// in order, then each shard's keys sorted (hex order is byte order and
    /// a shard name is its keys' prefix, so the concatenation is globally
    /// sorted). One shard's listing is in memory at a time.
    fn walk(
        self: &Arc<Self>,
        per_leaf: fn(&Path, &str) -> std::io::Result<Vec<Key>>,
    ) -> KeyStream<'static> {
        let inner = self.clone();
        let blobs = inner.blobs.clone();
        let shards = futures::stream::once({
            let inner = inner.clone();
            async move {
                let b = blobs.clone();
                let e = inner.clone();
                blocking(&inner.display, move || {
                    shard_names(&b).map_err(|source| {
                        e.err(LocalError::UnableToList {
                            path: b.clone(),
                            source,
                        })
                    })
                })
                .await
            }
        })
        .map_ok(|names| futures::stream::iter(names.into_iter().map(Ok::<_, Error>)))
        .try_flatten();
        let keys = shards
            .and_then(move |shard| {
                let inner = inner.clone();
                async move {
                    let dir = inner.blobs.join(&shard);
                    let e = inner.clone();
                    blocking(&inner.display, move || {
                        per_leaf(&dir, &shard).map_err(|source| {
                            e.err(LocalError::UnableToList {
                                path: dir.clone(),
                                source,
                            })
                        })
                    })
                    .await
                }
            })
            .map_ok(|keys| futures::stream::iter(keys.into_iter().map(Ok)))
            .try_flatten();
        Box::pin(keys)
    }
}
