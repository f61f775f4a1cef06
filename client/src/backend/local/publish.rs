//! Publishing a staged blob under its key: staging files (unnamed or
//! named), fsyncs, and the no-replace link or rename (the protocol is in
//! the module's docs, `super`).

use super::*;

impl Inner {
    /// Creates a staging file: unnamed where the open decided so (the path
    /// is then `None`), else named and locked.
    pub(super) fn new_staging(&self) -> Result<(File, Option<PathBuf>)> {
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
    pub(super) fn new_named_staging(&self) -> Result<(File, PathBuf)> {
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

    pub(super) fn sync_dir(&self, dir: &Path) -> Result<()> {
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
    pub(super) fn ensure_dir(&self, dir: &Path) -> Result<()> {
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
    pub(super) fn commit_staged(
        &self,
        file: File,
        staging: Option<&Path>,
        key: &Key,
    ) -> Result<PutOutcome> {
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
    pub(super) fn commit_inner(
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
    pub(super) fn commit_unnamed(&self, file: File, key: &Key) -> Result<PutOutcome> {
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
    pub(super) fn publish_by_link(&self, staging: &Path, target: &Path) -> io::Result<PutOutcome> {
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
}

/// Opens an unnamed, read-only (0444) file in `dir` for writing
/// (`O_TMPFILE`).
pub(super) fn open_unnamed(dir: &Path) -> io::Result<File> {
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
pub(super) fn link_unnamed(file: &File, to: &Path) -> io::Result<bool> {
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
pub(super) fn c_path(p: &Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// The result of a system call that makes a name without replacing one:
/// `Ok(true)` made, `Ok(false)` the name exists (`EEXIST`), `Err` otherwise.
pub(super) fn made_unless_exists(rc: libc::c_int) -> io::Result<bool> {
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
pub(super) fn unnamed_staging_works(dir: &Path) -> bool {
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
pub(super) fn rename_noreplace(from: &Path, to: &Path) -> io::Result<bool> {
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
pub(super) fn close_checked(file: File) -> io::Result<()> {
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
