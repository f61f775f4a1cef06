//! A blob's outboard beside it: `blobs/ab/<hex>.obao` (see
//! [`crate::outboard`]). Written before the blob is published, replaced by
//! rename, never fsynced: every reader checks an outboard against the key,
//! so a torn one after a power cut is found, read around and rebuilt by
//! `verify --repair-outboards`; the shard directory's fsync at the blob's
//! publication makes its name durable with the blob's.

use super::*;

/// The suffix of outboard files in the blob tree.
pub(super) const SUFFIX: &str = ".obao";

impl Inner {
    pub(super) fn outboard_path(&self, key: &Key) -> PathBuf {
        let mut p = self.path_of(key).into_os_string();
        p.push(SUFFIX);
        PathBuf::from(p)
    }

    /// Writes `key`'s outboard through a named staging file and a rename
    /// over any older one (blocking). An empty outboard has no file.
    pub(super) fn write_outboard(&self, key: &Key, outboard: &[u8]) -> Result<()> {
        if outboard.is_empty() {
            return Ok(());
        }
        let (mut file, staging) = self.new_named_staging()?;
        let target = self.outboard_path(key);
        let written = file
            .write_all(outboard)
            .and_then(|()| file.set_permissions(fs::Permissions::from_mode(0o444)))
            .map_err(|source| {
                self.err(LocalError::UnableToWriteStaging {
                    path: staging.clone(),
                    source,
                })
            })
            .and_then(|()| {
                fs::rename(&staging, &target).map_err(|source| {
                    self.err(LocalError::UnableToPublishStaged {
                        from: staging.clone(),
                        to: target.clone(),
                        source,
                    })
                })
            });
        if written.is_err() {
            let _ = fs::remove_file(&staging);
        }
        written
    }

    /// Writes the outboard unless the blob and its outboard are both there
    /// already (a dedup hit): the first step of every commit.
    pub(super) fn outboard_before_commit(&self, key: &Key, outboard: &[u8]) -> Result<()> {
        if outboard.is_empty() || (self.path_of(key).exists() && self.outboard_path(key).exists()) {
            return Ok(());
        }
        self.write_outboard(key, outboard)
    }

    /// Removes the outboard of a deleted blob. A failure leaves an orphan,
    /// which is harmless (it is right for a later put of the same key) and
    /// only logged.
    pub(super) fn remove_outboard(&self, key: &Key) {
        let path = self.outboard_path(key);
        if let Err(e) = fs::remove_file(&path)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(path = %path.display(), error = %e, "could not remove a deleted blob's outboard");
        }
    }

    /// A window of `key`'s outboard (blocking); see
    /// [`LargeBackend::read_outboard`].
    pub(super) fn read_outboard(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        let window = offset..offset.saturating_add(len);
        Ok(self
            .read_outboard_windows(key, std::slice::from_ref(&window))?
            .map(|mut w| w.remove(0)))
    }

    /// Windows of `key`'s outboard through one open (blocking).
    pub(super) fn read_outboard_windows(
        &self,
        key: &Key,
        windows: &[std::ops::Range<u64>],
    ) -> Result<Option<Vec<Bytes>>> {
        let blob = self.path_of(key);
        let size = match not_found_is_none(fs::metadata(&blob)) {
            Ok(Some(m)) => m.len(),
            Ok(None) => return Ok(None),
            Err(source) => return Err(self.err(LocalError::UnableToRead { path: blob, source })),
        };
        if crate::integrity::outboard::outboard_len(size) == 0 {
            return Ok(Some(windows.iter().map(|_| Bytes::new()).collect()));
        }
        let path = self.outboard_path(key);
        let read_err = |source| {
            self.err(LocalError::UnableToRead {
                path: path.clone(),
                source,
            })
        };
        let Some(file) = not_found_is_none(File::open(&path)).map_err(read_err)? else {
            return Ok(None);
        };
        let stored = file.metadata().map_err(read_err)?.len();
        let mut out = Vec::with_capacity(windows.len());
        for w in windows {
            let r = crate::backend::clamp_range(key, stored, w.start, w.end - w.start)?;
            let mut buf = vec![0u8; (r.end - r.start) as usize];
            file.read_exact_at(&mut buf, r.start).map_err(read_err)?;
            out.push(Bytes::from(buf));
        }
        Ok(Some(out))
    }

    /// Bytes of every outboard file (blocking): one walk of the blob tree.
    pub(super) fn outboard_usage(&self) -> Result<u64> {
        let list_err = |path: &Path| {
            let path = path.to_owned();
            move |source| self.err(LocalError::UnableToList { path, source })
        };
        let mut total = 0;
        for shard in shard_names(&self.blobs).map_err(list_err(&self.blobs))? {
            let dir = self.blobs.join(shard);
            let entries = match fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(list_err(&dir)(e)),
            };
            for e in entries {
                let e = e.map_err(list_err(&dir))?;
                if e.file_name().to_str().is_some_and(|n| n.ends_with(SUFFIX))
                    && let Ok(m) = e.metadata()
                {
                    total += m.len();
                }
            }
        }
        Ok(total)
    }
}
