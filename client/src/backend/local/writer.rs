//! The streaming write of one blob into its staging file, committed or
//! aborted (dropped: aborted).

use super::*;

/// A streaming write into a staging file.
pub(super) struct LocalWrite {
    pub(super) inner: Arc<Inner>,
    pub(super) file: Option<File>,
    /// The named staging file's path; `None` for an unnamed one.
    pub(super) path: Option<PathBuf>,
    pub(super) written: u64,
    pub(super) done: bool,
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

    async fn commit(mut self: Box<Self>, key: &Key, outboard: Bytes) -> Result<PutOutcome> {
        let file = self.file.take().ok_or_else(|| self.lost())?;
        self.done = true;
        let inner = self.inner.clone();
        let path = self.path.clone();
        let key = *key;
        blocking(&self.inner.display, move || {
            if let Err(e) = inner.outboard_before_commit(&key, &outboard) {
                if let Some(p) = &path {
                    let _ = fs::remove_file(p);
                }
                return Err(e);
            }
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
