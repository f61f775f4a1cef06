//! The streaming write of one blob: its first part in memory, the rest
//! spilled to an unnamed temporary file, published at commit (`upload.rs`).
//! A blob handed over as one buffer bigger than a part (`Store::put` of a
//! `Bytes`) is kept as that buffer, shared with the caller, never copied:
//! it is in memory already.

use std::io::Write;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};

use super::Inner;
use super::upload::Source;
use crate::backend::{PutOutcome, StagedWrite};
use crate::{Error, Key, Result};

/// A streaming write; nothing reaches the service before `commit`.
pub(super) struct S3Write {
    inner: Arc<Inner>,
    memory: BytesMut,
    /// The whole blob so far, when its first write was one buffer bigger
    /// than a part (shared with the caller: no copy, no spool).
    whole: Option<Bytes>,
    /// Everything written, once it outgrew the memory (unnamed: a killed
    /// writer leaves nothing behind).
    spool: Option<std::fs::File>,
    written: u64,
    failed: bool,
}

impl S3Write {
    pub(super) fn new(inner: Arc<Inner>) -> S3Write {
        S3Write {
            inner,
            memory: BytesMut::new(),
            whole: None,
            spool: None,
            written: 0,
            failed: false,
        }
    }

    fn spool_err(&self, e: std::io::Error) -> Error {
        Error::engine(
            &self.inner.display,
            format!(
                "unable to write the spool file in {}: {e}",
                self.spool_dir().display()
            ),
        )
    }

    fn spool_dir(&self) -> std::path::PathBuf {
        self.inner
            .opts
            .spool_dir
            .clone()
            .unwrap_or_else(std::env::temp_dir)
    }
}

#[async_trait]
impl StagedWrite for S3Write {
    async fn write(&mut self, chunk: Bytes) -> Result<()> {
        if self.failed {
            return Err(Error::engine(
                &self.inner.display,
                "an earlier write failed or was cancelled",
            ));
        }
        let n = chunk.len() as u64;
        if self.written == 0 && chunk.len() > self.inner.opts.part_size {
            // One buffer the caller holds anyway: keep a reference to it.
            self.whole = Some(chunk);
            self.written = n;
            return Ok(());
        }
        if self.spool.is_none()
            && self.whole.is_none()
            && self.memory.len() + chunk.len() <= self.inner.opts.part_size
        {
            self.memory.extend_from_slice(&chunk);
            self.written += n;
            return Ok(());
        }
        // Outgrew the memory: everything goes to the spool file.
        self.failed = true; // until this write is through
        let dir = self.spool_dir();
        let mut file = self.spool.take();
        let head = match self.whole.take() {
            Some(whole) => whole,
            None => std::mem::take(&mut self.memory).freeze(),
        };
        let r = tokio::task::spawn_blocking(move || -> std::io::Result<std::fs::File> {
            let mut f = match file.take() {
                Some(f) => f,
                None => tempfile::tempfile_in(&dir)?,
            };
            f.write_all(&head)?;
            f.write_all(&chunk)?;
            Ok(f)
        })
        .await
        .map_err(|e| Error::engine(&self.inner.display, format!("blocking task failed: {e}")))?;
        self.spool = Some(r.map_err(|e| self.spool_err(e))?);
        self.failed = false;
        self.written += n;
        Ok(())
    }

    fn written(&self) -> u64 {
        self.written
    }

    async fn commit(mut self: Box<Self>, key: &Key, outboard: Bytes) -> Result<PutOutcome> {
        if self.failed {
            return Err(Error::engine(
                &self.inner.display,
                "an earlier write failed or was cancelled",
            ));
        }
        self.inner.check_writable("put a blob")?;
        let source = match (self.spool.take(), self.whole.take()) {
            (Some(f), _) => Source::File(f, self.written),
            (None, Some(whole)) => Source::Memory(whole),
            (None, None) => Source::Memory(std::mem::take(&mut self.memory).freeze()),
        };
        self.inner.publish(key, source, outboard).await
    }

    async fn abort(self: Box<Self>) -> Result<()> {
        // Nothing reached the service; the spool file is unnamed.
        Ok(())
    }
}
