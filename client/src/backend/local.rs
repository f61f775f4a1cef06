//! `local`: the large-tier engine on a filesystem.
//!
//! (One engine, one file: the publish protocol, recovery and the streaming
//! writer share invariants that read best side by side; that is why it is
//! long.)
//!
//! # Layout
//!
//! ```text
//! <root>/alkblobs.lock              instance lock (writable opens)
//! <root>/staging/<random>.part      named staging files (shared media, or
//!                                   where unnamed files are unsupported)
//! <root>/blobs/ab/ab…(64 hex)       committed blobs, read-only (0444), immutable
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

    /// Creates a staging file: unnamed where the open decided so (the path
    /// is then `None`), else named and locked.
    fn new_staging(&self) -> Result<(File, Option<PathBuf>)> {
        if self.unnamed {
            let file = open_unnamed(&self.staging).map_err(|source| {
                self.err(LocalError::UnableToCreateStaging {
                    path: self.staging.clone(),
                    source,
                })
            })?;
            return Ok((file, None));
        }
        let (file, path) = self.new_named_staging()?;
        Ok((file, Some(path)))
    }

    /// Creates a locked, named staging file.
    fn new_named_staging(&self) -> Result<(File, PathBuf)> {
        let name = format!(
            "{:016x}{:016x}.part",
            rand::random::<u64>(),
            rand::random::<u64>()
        );
        let path = self.staging.join(name);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|source| {
                self.err(LocalError::UnableToCreateStaging {
                    path: path.clone(),
                    source,
                })
            })?;
        // Our lock tells a reclaimer this file is alive. A fresh file we just
        // created cannot be locked by anyone else.
        file.lock().map_err(|source| {
            self.err(LocalError::UnableToCreateStaging {
                path: path.clone(),
                source,
            })
        })?;
        Ok((file, path))
    }

    fn sync_dir(&self, dir: &Path) -> Result<()> {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|source| {
                self.err(LocalError::UnableToSync {
                    path: dir.to_owned(),
                    source,
                })
            })
    }

    /// Creates `dir` if missing; fsyncs its parent when it was created so the
    /// new directory entry is durable too.
    fn ensure_dir(&self, dir: &Path) -> Result<()> {
        match fs::create_dir(dir) {
            Ok(()) => {
                if self.durable() {
                    self.sync_dir(dir.parent().expect("shard dirs have parents"))?;
                }
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            Err(source) => Err(self.err(LocalError::UnableToCreateDir {
                path: dir.to_owned(),
                source,
            })),
        }
    }

    /// Syncs, closes and publishes a staging file under `key` (blocking).
    fn commit_staged(&self, file: File, staging: Option<&Path>, key: &Key) -> Result<PutOutcome> {
        let Some(staging) = staging else {
            return self.commit_unnamed(file, key);
        };
        let mut renamed = false;
        let result = self.commit_inner(file, staging, key, &mut renamed);
        // Whatever happened, the staging name must not outlive the commit.
        // (Renamed, it is gone already: no unlink, which would take the
        // staging directory's lock that every concurrent put contends for.)
        if !renamed {
            let _ = fs::remove_file(staging);
        }
        result
    }

    /// Sets `renamed` once the staging name has become the blob's.
    fn commit_inner(
        &self,
        file: File,
        staging: &Path,
        key: &Key,
        renamed: &mut bool,
    ) -> Result<PutOutcome> {
        let target = self.path_of(key);
        // A dedup hit pays no fsync: the staged bytes are discarded.
        if target.exists() {
            return Ok(PutOutcome::Existed);
        }
        let sync_err = |source| {
            self.err(LocalError::UnableToSync {
                path: staging.to_owned(),
                source,
            })
        };
        if self.durable() {
            file.sync_all().map_err(sync_err)?;
        }
        file.set_permissions(fs::Permissions::from_mode(0o444))
            .map_err(sync_err)?;
        close_checked(file).map_err(sync_err)?;

        let leaf = target.parent().expect("sharded paths have parents");
        let publish_err = |source| {
            self.err(LocalError::UnableToPublishStaged {
                from: staging.to_owned(),
                to: target.clone(),
                source,
            })
        };
        let mut published = rename_noreplace(staging, &target);
        if published.is_err() && !leaf.is_dir() {
            // Shards are created at open; this only recreates one an
            // operator removed (then renames again, or falls back to a link
            // below if this kernel has no RENAME_NOREPLACE).
            self.ensure_dir(leaf)?;
            published = rename_noreplace(staging, &target);
        }
        let outcome = match published {
            Ok(true) => {
                *renamed = true;
                PutOutcome::Created
            }
            Ok(false) => PutOutcome::Existed,
            Err(e)
                if !matches!(
                    e.raw_os_error(),
                    Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP)
                ) =>
            {
                return Err(publish_err(e));
            }
            Err(_) => self
                .publish_by_link(staging, &target)
                .map_err(publish_err)?,
        };
        if outcome == PutOutcome::Created && self.durable() {
            self.sync_dir(leaf)?;
        }
        Ok(outcome)
    }

    /// Publishes an unnamed staging file under `key` (blocking): sync, link
    /// (never over an existing name), sync the shard directory. The file
    /// was created read-only, and on the local filesystems that offer
    /// unnamed files `close` reports nothing `fsync` did not.
    fn commit_unnamed(&self, file: File, key: &Key) -> Result<PutOutcome> {
        let target = self.path_of(key);
        // A dedup hit pays no fsync: the unnamed file is simply dropped.
        if target.exists() {
            return Ok(PutOutcome::Existed);
        }
        if self.durable() {
            file.sync_all().map_err(|source| {
                self.err(LocalError::UnableToSync {
                    path: self.staging.clone(),
                    source,
                })
            })?;
        }
        let leaf = target.parent().expect("sharded paths have parents");
        let mut linked = link_unnamed(&file, &target);
        if matches!(&linked, Err(e) if e.kind() == io::ErrorKind::NotFound) && !leaf.is_dir() {
            // Shards are created at open; this recreates one an operator
            // removed.
            self.ensure_dir(leaf)?;
            linked = link_unnamed(&file, &target);
        }
        let created = linked.map_err(|source| {
            self.err(LocalError::UnableToPublishStaged {
                from: self.staging.clone(),
                to: target.clone(),
                source,
            })
        })?;
        drop(file);
        if !created {
            return Ok(PutOutcome::Existed);
        }
        if self.durable() {
            self.sync_dir(leaf)?;
        }
        Ok(PutOutcome::Created)
    }

    /// Publishes with `link` (exclusive) where `RENAME_NOREPLACE` is missing.
    fn publish_by_link(&self, staging: &Path, target: &Path) -> io::Result<PutOutcome> {
        Ok(match fs::hard_link(staging, target) {
            Ok(()) => PutOutcome::Created,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => PutOutcome::Existed,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EPERM | libc::EOPNOTSUPP | libc::EXDEV | libc::EMLINK)
                ) =>
            {
                // No hard links here: rename, never over an existing blob.
                if target.exists() {
                    PutOutcome::Existed
                } else {
                    fs::rename(staging, target)?;
                    PutOutcome::Created
                }
            }
            Err(e) => return Err(e),
        })
    }

    /// Removes staging files that are provably abandoned (blocking).
    fn reclaim(&self) -> Result<u64> {
        let entries = match fs::read_dir(&self.staging) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(source) => {
                return Err(self.err(LocalError::UnableToList {
                    path: self.staging.clone(),
                    source,
                }));
            }
        };
        let now = SystemTime::now();
        let mut reclaimed = 0;
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(file) = OpenOptions::new().read(true).open(&path) else {
                continue;
            };
            match file.try_lock() {
                Ok(()) => {}
                // A live writer holds it.
                Err(TryLockError::WouldBlock) => continue,
                Err(TryLockError::Error(_)) => continue,
            }
            let idle = file
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|m| now.duration_since(m).ok())
                .unwrap_or(Duration::ZERO);
            if idle >= self.opts.staging_grace && fs::remove_file(&path).is_ok() {
                tracing::info!(path = %path.display(), ?idle, "reclaimed abandoned staging file");
                reclaimed += 1;
            }
        }
        Ok(reclaimed)
    }
}

/// Opens an unnamed, read-only (0444) file in `dir` for writing
/// (`O_TMPFILE`).
fn open_unnamed(dir: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = OpenOptions::new()
        .write(true)
        .mode(0o444)
        .custom_flags(libc::O_TMPFILE)
        .open(dir)?;
    // The umask applied to the mode (a service's 027 would make it 0440):
    // set it exactly, as the named path does.
    file.set_permissions(fs::Permissions::from_mode(0o444))?;
    Ok(file)
}

/// Gives an unnamed file the name `to` through its `/proc/thread-self/fd`
/// link (this thread's descriptor table, whatever other threads share):
/// `Ok(true)` if linked, `Ok(false)` if `to` exists (nothing changed).
fn link_unnamed(file: &File, to: &Path) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    let from = c_path(Path::new(&format!(
        "/proc/thread-self/fd/{}",
        file.as_raw_fd()
    )))?;
    let to = c_path(to)?;
    // SAFETY: both pointers are valid NUL-terminated strings for the call.
    let rc = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    made_unless_exists(rc)
}

/// A path as the C string a system call takes.
fn c_path(p: &Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// The result of a system call that makes a name without replacing one:
/// `Ok(true)` made, `Ok(false)` the name exists (`EEXIST`), `Err` otherwise.
fn made_unless_exists(rc: libc::c_int) -> io::Result<bool> {
    if rc == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EEXIST) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// Whether unnamed staging works in `dir`: a local filesystem known to
/// support it (on FUSE and network mounts `close` may report write-back
/// errors, which an unnamed file is never closed in time to see), and a
/// probe that creates one, names it and removes the name. Any failure (no
/// `O_TMPFILE`, no `/proc`) means named staging.
fn unnamed_staging_works(dir: &Path) -> bool {
    const EXT4: i64 = 0xEF53;
    const XFS: i64 = 0x5846_5342;
    const BTRFS: i64 = 0x9123_683E;
    const TMPFS: i64 = 0x0102_1994;
    let local = {
        let Ok(c) = c_path(dir) else {
            return false;
        };
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is a valid NUL-terminated path and `st` a valid
        // out-pointer for the call.
        let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
        #[allow(clippy::unnecessary_cast)] // `f_type`'s width varies by target
        let known = matches!(st.f_type as i64, EXT4 | XFS | BTRFS | TMPFS);
        rc == 0 && known
    };
    if !local {
        return false;
    }
    let probe = dir.join(format!("{:016x}.probe", rand::random::<u64>()));
    let works = open_unnamed(dir)
        .and_then(|f| link_unnamed(&f, &probe))
        .unwrap_or(false);
    if works {
        let _ = fs::remove_file(&probe);
    }
    works
}

/// `renameat2(from, to, RENAME_NOREPLACE)`: `Ok(true)` if renamed,
/// `Ok(false)` if `to` exists (nothing changed), `Err` otherwise (EINVAL or
/// ENOSYS where the filesystem or kernel lacks the flag).
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<bool> {
    let (f, t) = (c_path(from)?, c_path(to)?);
    // SAFETY: both pointers are valid NUL-terminated strings for the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    made_unless_exists(rc)
}

/// Closes `file`, reporting the error `close(2)` returns (which `Drop`
/// would swallow).
fn close_checked(file: File) -> io::Result<()> {
    use std::os::fd::IntoRawFd;
    let fd = file.into_raw_fd();
    // SAFETY: `fd` came from `into_raw_fd`, so we own it and close it once.
    let rc = unsafe { libc::close(fd) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn is_shard_name(name: &str) -> bool {
    name.len() == 2
        && name
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Sorted shard directory names under `dir` (missing dir = none).
fn shard_names(dir: &Path) -> io::Result<Vec<String>> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut names = Vec::new();
    for e in rd {
        let e = e?;
        if let Some(n) = e.file_name().to_str().filter(|n| is_shard_name(n)) {
            names.push(n.to_owned());
        }
    }
    names.sort_unstable();
    Ok(names)
}

/// Sorted keys whose files sit in the leaf shard `dir` named `prefix`.
fn leaf_keys(dir: &Path, prefix: &str) -> io::Result<Vec<Key>> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut keys = Vec::new();
    for e in rd {
        let e = e?;
        let name = e.file_name();
        match name.to_str().and_then(|n| Key::parse(n).ok()) {
            // A file in the wrong shard is not where readers look: not listed.
            Some(k) if k.to_hex().starts_with(prefix) => keys.push(k),
            _ => tracing::warn!(file = %e.path().display(), "stray file in the blob tree, ignored"),
        }
    }
    keys.sort_unstable();
    Ok(keys)
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
        blocking(&self.inner.display, move || {
            let size = match not_found_is_none(fs::metadata(&path)) {
                Ok(Some(m)) => m.len(),
                Ok(None) => return Ok(None),
                Err(source) => return Err(inner.err(LocalError::UnableToRead { path, source })),
            };
            match not_found_is_none(fs::remove_file(&path)) {
                Ok(Some(())) => Ok(Some(size)),
                Ok(None) => Ok(None),
                Err(source) => Err(inner.err(LocalError::UnableToDelete { path, source })),
            }
        })
        .await
    }

    fn list(&self) -> KeyStream<'_> {
        let inner = self.inner.clone();
        let blobs = inner.blobs.clone();
        // Walk the shards in order, then each shard's files sorted: hex order
        // is byte order and a shard name is its keys' prefix, so the
        // concatenation is globally sorted. One shard listing is in memory
        // at a time.
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
                        leaf_keys(&dir, &shard).map_err(|source| {
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
            if offset > size {
                return Err(Error::InvalidRange {
                    key: k,
                    offset,
                    size,
                });
            }
            let n = len.min(size - offset) as usize;
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

/// A streaming write into a staging file.
struct LocalWrite {
    inner: Arc<Inner>,
    file: Option<File>,
    /// The named staging file's path; `None` for an unnamed one.
    path: Option<PathBuf>,
    written: u64,
    done: bool,
}

impl LocalWrite {
    fn lost(&self) -> Error {
        self.inner.err(LocalError::UnableToWriteStaging {
            path: self.shown_path(),
            source: io::Error::other("an earlier write failed or was cancelled"),
        })
    }

    /// The path an error names: the staging file, or for an unnamed one
    /// the directory it lives in.
    fn shown_path(&self) -> PathBuf {
        self.path
            .clone()
            .unwrap_or_else(|| self.inner.staging.clone())
    }
}

#[async_trait]
impl StagedWrite for LocalWrite {
    async fn write(&mut self, chunk: Bytes) -> Result<()> {
        let mut file = self.file.take().ok_or_else(|| self.lost())?;
        let n = chunk.len() as u64;
        let (file, r) = tokio::task::spawn_blocking(move || {
            let r = file.write_all(&chunk);
            (file, r)
        })
        .await
        .map_err(|e| Error::engine(&self.inner.display, format!("blocking task failed: {e}")))?;
        r.map_err(|source| {
            self.inner.err(LocalError::UnableToWriteStaging {
                path: self.shown_path(),
                source,
            })
        })?;
        self.file = Some(file);
        self.written += n;
        Ok(())
    }

    fn written(&self) -> u64 {
        self.written
    }

    async fn commit(mut self: Box<Self>, key: &Key) -> Result<PutOutcome> {
        let file = self.file.take().ok_or_else(|| self.lost())?;
        self.done = true;
        let inner = self.inner.clone();
        let path = self.path.clone();
        let key = *key;
        blocking(&self.inner.display, move || {
            inner.commit_staged(file, path.as_deref(), &key)
        })
        .await
    }

    async fn abort(mut self: Box<Self>) -> Result<()> {
        self.file = None;
        self.done = true;
        if let Some(path) = self.path.clone() {
            let _ = tokio::fs::remove_file(&path).await;
        }
        Ok(())
    }
}

impl Drop for LocalWrite {
    fn drop(&mut self) {
        if !self.done {
            // Abandoned mid-write (error or cancellation): nothing was
            // published; remove the staging file now rather than at reclaim.
            self.file = None;
            if let Some(path) = &self.path {
                let _ = fs::remove_file(path);
            }
        }
    }
}
