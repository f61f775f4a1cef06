//! Publishing one blob under its key — one conditional `PutObject`, or a
//! multipart upload recorded in an upload marker — and the sweep's side of
//! it: aborting the uploads of writers that died.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use super::{Inner, unsupported};
use crate::backend::PutOutcome;
use crate::{Error, Key, Result};

/// Where a blob's bytes are when it is published.
pub(super) enum Source {
    /// In memory.
    Memory(Bytes),
    /// In a spool file (unnamed: freed when dropped), `len` bytes.
    File(std::fs::File, u64),
}

impl Source {
    fn len(&self) -> u64 {
        match self {
            Source::Memory(b) => b.len() as u64,
            Source::File(_, n) => *n,
        }
    }
}

/// Per-key serialisation of this process's puts: at most one put of a key
/// runs at a time, so of concurrent puts of one key exactly one creates it
/// (S3 alone would let several "create" it, byte for byte the same).
#[derive(Default)]
pub(super) struct KeyLocks(Mutex<HashMap<Key, Arc<tokio::sync::Mutex<()>>>>);

impl KeyLocks {
    async fn lock(&self, key: &Key) -> KeyGuard<'_> {
        let m = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(*key)
            .or_default()
            .clone();
        let guard = m.clone().lock_owned().await;
        KeyGuard {
            locks: self,
            key: *key,
            _guard: guard,
        }
    }
}

struct KeyGuard<'a> {
    locks: &'a KeyLocks,
    key: Key,
    _guard: tokio::sync::OwnedMutexGuard<()>,
}

impl Drop for KeyGuard<'_> {
    fn drop(&mut self) {
        let mut map = self.locks.0.lock().unwrap_or_else(|p| p.into_inner());
        // Only this guard and the map hold the mutex: nobody waits for it.
        if map
            .get(&self.key)
            .is_some_and(|m| Arc::strong_count(m) <= 2)
        {
            map.remove(&self.key);
        }
    }
}

/// An upload marker's body: the object the upload writes and its id.
fn marker_body(path: &Path, upload_id: &str) -> PutPayload {
    PutPayload::from(format!("{path}\n{upload_id}\n"))
}

impl Inner {
    /// Publishes `source` under `key` unless it is present, and its
    /// outboard beside it (written whether or not the blob was present, so
    /// a put mends a blob stored without one; beside the upload, not before
    /// it: a put that fails either way fails, and a retry writes both). A
    /// blob of at most `outboard_floor` bytes gets none (see
    /// [`super::S3Options::outboard_floor`]).
    pub(super) async fn publish(
        &self,
        key: &Key,
        source: Source,
        outboard: Bytes,
    ) -> Result<PutOutcome> {
        if source.len() <= self.opts.outboard_floor {
            return self.publish_blob(key, source).await;
        }
        let (outcome, ob) = futures::join!(
            self.publish_blob(key, source),
            self.put_outboard_object(key, outboard)
        );
        ob?;
        outcome
    }

    /// Writes `key`'s outboard object (none when it is empty).
    pub(super) async fn put_outboard_object(&self, key: &Key, outboard: Bytes) -> Result<()> {
        if outboard.is_empty() {
            return Ok(());
        }
        self.check_writable("put an outboard")?;
        self.store
            .put(
                &self.opts.location.outboard(key),
                PutPayload::from(outboard),
            )
            .await
            .map(|_| ())
            .map_err(|e| self.err("put an outboard", e))
    }

    async fn publish_blob(&self, key: &Key, source: Source) -> Result<PutOutcome> {
        // The generation the fleet's database handed this put (0 off a
        // fleet, and for almost every key on one).
        let path = self
            .opts
            .location
            .blob_generation(key, self.generation(key));
        let _one = self.keys.lock(key).await;
        // The lease is checked again after the wait: a lost lease must not
        // publish.
        self.check_writable("put a blob")?;
        match source {
            Source::Memory(bytes) if bytes.len() <= self.opts.part_size => {
                // Dedup without uploading a byte: committed blobs are
                // immutable. (Not left to `If-None-Match` alone: Garage
                // ignores it and overwrites, answering 200.)
                if self.head_size(&path).await?.is_some() {
                    return Ok(PutOutcome::Existed);
                }
                self.put_object(&path, bytes).await
            }
            source => self.put_multipart(&path, source).await,
        }
    }

    /// One `PutObject`, `If-None-Match: *` where the service has it.
    async fn put_object(&self, path: &Path, bytes: Bytes) -> Result<PutOutcome> {
        let payload = PutPayload::from(bytes);
        if self.conditional.load(Ordering::Relaxed) {
            let opts = PutOptions {
                mode: PutMode::Create,
                ..PutOptions::default()
            };
            match self.store.put_opts(path, payload.clone(), opts).await {
                Ok(_) => return Ok(PutOutcome::Created),
                Err(
                    object_store::Error::AlreadyExists { .. }
                    | object_store::Error::Precondition { .. },
                ) => return Ok(PutOutcome::Existed),
                Err(e) if unsupported(&e) => {
                    tracing::info!(engine = %self.display, "the service does not support conditional puts; relying on content addressing");
                    self.conditional.store(false, Ordering::Relaxed);
                }
                Err(e) => return Err(self.err("put a blob", e)),
            }
        }
        self.store
            .put(path, payload)
            .await
            .map(|_| PutOutcome::Created)
            .map_err(|e| self.err("put a blob", e))
    }

    /// A multipart upload straight to `path` unless it is present, recorded
    /// in a marker while it runs; aborted (and its marker removed) if it
    /// fails.
    async fn put_multipart(&self, path: &Path, source: Source) -> Result<PutOutcome> {
        let marker = self.opts.location.upload_marker(&random_id());
        // The dedup check and the upload's start are one round trip: a
        // present object (rare for a blob this big) costs an abort instead.
        let (present, id) = futures::join!(self.head_size(path), self.store.create_multipart(path));
        let id = id.map_err(|e| self.err("start a multipart upload", e))?;
        match present {
            Ok(None) => {}
            other => {
                let _ = self.store.abort_multipart(path, &id).await;
                return other.map(|_| PutOutcome::Existed);
            }
        }
        // Recorded before the first part: a writer killed from here on
        // leaves a marker a sweep finds. (Killed between the two calls, it
        // leaves an empty upload only a bucket lifecycle rule removes:
        // docs/operations.md says to add one.)
        if let Err(e) = self.store.put(&marker, marker_body(path, &id)).await {
            let _ = self.store.abort_multipart(path, &id).await;
            return Err(self.err("record a multipart upload", e));
        }
        let result = self.upload_parts(path, &id, &marker, source).await;
        match result {
            Ok(parts) => {
                // The marker goes while the upload completes: a writer
                // killed in that round trip leaves an upload that completes
                // or one only the lifecycle rule removes, as between the
                // upload's start and its marker above.
                let (done, _) = futures::join!(
                    self.store.complete_multipart(path, &id, parts),
                    self.store.delete(&marker)
                );
                match done {
                    Ok(_) => Ok(PutOutcome::Created),
                    Err(e) => {
                        let _ = self.store.abort_multipart(path, &id).await;
                        Err(self.err("complete a multipart upload", e))
                    }
                }
            }
            Err(e) => {
                let _ = self.store.abort_multipart(path, &id).await;
                let _ = self.store.delete(&marker).await;
                Err(e)
            }
        }
    }

    /// Uploads every part of `source`, `upload_concurrency` at a time,
    /// touching the marker as it goes; the part ids in order.
    async fn upload_parts(
        &self,
        path: &Path,
        id: &str,
        marker: &Path,
        source: Source,
    ) -> Result<Vec<PartId>> {
        let len = source.len();
        // S3 takes at most 10,000 parts: a blob over 10,000 × part_size
        // (78 GiB at 8 MiB) goes in bigger parts instead of failing at the
        // 10,001st.
        let part = (self.opts.part_size as u64).max(len.div_ceil(MAX_PARTS));
        let count = len.div_ceil(part).max(1);
        let source = Arc::new(Mutex::new(source));
        let id = id.to_owned();
        let touch_every = (self.opts.upload_grace / 4).min(Duration::from_secs(30));
        let mut touched = Instant::now();
        let mut ids: Vec<Option<PartId>> = vec![None; count as usize];
        // Unordered: a part that finishes frees its slot at once, whichever
        // it is (in order, a slow first part would hold three finished ones
        // in their slots); the ids are put back in order below.
        let mut parts = futures::stream::iter(0..count)
            .map(|i| {
                let source = source.clone();
                let id = id.clone();
                async move {
                    let start = i * part;
                    let n = part.min(len - start) as usize;
                    let bytes = read_part(&self.display, &self.buffers, source, start, n).await?;
                    self.check_writable("put a blob")?;
                    self.store
                        .put_part(path, &id, i as usize, PutPayload::from(bytes))
                        .await
                        .map(|p| (i as usize, p))
                        .map_err(|e| self.err("upload a part", e))
                }
            })
            .buffer_unordered(self.opts.upload_concurrency);
        // A live writer's marker stays younger than the grace: touched on
        // a clock, not only as parts finish (parts slower than the grace, on
        // a slow link, would let a sweep abort a live upload).
        // (A zero grace, every marker stale at once, still ticks: an
        // interval's period must not be zero.)
        let period = touch_every.max(Duration::from_millis(100));
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let next = tokio::select! {
                next = parts.try_next() => next?,
                _ = tick.tick() => {
                    self.touch(path, &id, marker).await?;
                    touched = Instant::now();
                    continue;
                }
            };
            let Some((i, p)) = next else { break };
            ids[i] = Some(p);
            if touched.elapsed() >= touch_every {
                self.touch(path, &id, marker).await?;
                touched = Instant::now();
            }
        }
        // Every part answered (an error returned above).
        Ok(ids.into_iter().flatten().collect())
    }

    /// Writes an upload's marker again: its age restarts.
    async fn touch(&self, path: &Path, id: &str, marker: &Path) -> Result<()> {
        self.store
            .put(marker, marker_body(path, id))
            .await
            .map(drop)
            .map_err(|e| self.err("touch an upload marker", e))
    }

    /// Aborts the uploads whose markers are older than the grace (their
    /// writers died mid-upload); returns how many.
    pub(super) async fn reclaim(&self) -> Result<u64> {
        // The marker's age by this host's clock against the service's
        // last-modified time: skew shortens or lengthens the grace by as
        // much (the grace is minutes; docs/design.md's clock assumption).
        let now = std::time::SystemTime::now();
        let grace = self.opts.upload_grace;
        let markers: Vec<_> = self
            .store
            .list(Some(&self.opts.location.uploads()))
            .try_collect()
            .await
            .map_err(|e| self.err("list upload markers", e))?;
        let mut reclaimed = 0;
        for m in markers {
            // Only this location's markers (the listing is recursive), and
            // only marker-sized ones.
            if !self.opts.location.is_marker(&m.location) || m.size > 4096 {
                continue;
            }
            let age = now
                .duration_since(std::time::SystemTime::from(m.last_modified))
                .unwrap_or_default();
            if age < grace {
                continue;
            }
            let body = match self.store.get(&m.location).await {
                Ok(g) => g.bytes().await.unwrap_or_default(),
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(self.err("read an upload marker", e)),
            };
            let text = String::from_utf8_lossy(&body);
            let mut lines = text.lines();
            if let (Some(object), Some(upload_id)) = (lines.next(), lines.next())
                // The upload of one of this location's blobs, nothing else.
                && self
                    .opts
                    .location
                    .key_of(&Path::from(object))
                    .is_some()
            {
                match self
                    .store
                    .abort_multipart(&Path::from(object), &upload_id.to_owned())
                    .await
                {
                    // Aborted, or already gone (completed or aborted by
                    // another sweep).
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(self.err("abort an abandoned upload", e)),
                }
            }
            match self.store.delete(&m.location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => reclaimed += 1,
                Err(e) => return Err(self.err("delete an upload marker", e)),
            }
            tracing::info!(engine = %self.display, marker = %m.location, "aborted an abandoned multipart upload");
        }
        Ok(reclaimed)
    }
}

/// Part buffers, reused: each part read from a spool goes into one, and it
/// comes back here when the request that sent it drops it. Fresh 8 MiB
/// allocations per part would let glibc's adaptive mmap threshold keep
/// freed parts in the heap (a 2 GiB put peaked at 137 MiB of RSS, measured;
/// 50 MiB with the threshold pinned), so the engine holds at most a few
/// buffers instead, however many parts a blob has.
#[derive(Default, Clone)]
pub(super) struct PartBuffers(Arc<Mutex<Vec<Vec<u8>>>>);

/// A buffer on loan to a request; back to the pool on drop.
struct Loaned {
    buf: Vec<u8>,
    home: PartBuffers,
}

impl AsRef<[u8]> for Loaned {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Loaned {
    fn drop(&mut self) {
        let mut free = self.home.0.lock().unwrap_or_else(|p| p.into_inner());
        // More than a handful means concurrency changed: let the rest go.
        if free.len() < 16 {
            free.push(std::mem::take(&mut self.buf));
        }
    }
}

impl PartBuffers {
    /// A buffer of exactly `n` bytes (contents unspecified).
    fn take(&self, n: usize) -> Vec<u8> {
        let mut buf = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
            .unwrap_or_default();
        buf.resize(n, 0);
        buf
    }
}

/// `n` bytes of `source` from `start`, read off the async workers.
async fn read_part(
    engine: &str,
    buffers: &PartBuffers,
    source: Arc<Mutex<Source>>,
    start: u64,
    n: usize,
) -> Result<Bytes> {
    {
        let s = source.lock().unwrap_or_else(|p| p.into_inner());
        if let Source::Memory(b) = &*s {
            return Ok(b.slice(start as usize..start as usize + n));
        }
    }
    let engine = engine.to_owned();
    let home = buffers.clone();
    tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::FileExt;
        let s = source.lock().unwrap_or_else(|p| p.into_inner());
        let Source::File(f, _) = &*s else {
            unreachable!("checked above")
        };
        let mut buf = home.take(n);
        f.read_exact_at(&mut buf, start)
            .map_err(|e| Error::engine(&engine, format!("unable to read the spool file: {e}")))?;
        Ok(Bytes::from_owner(Loaned { buf, home }))
    })
    .await
    .map_err(|e| Error::engine("s3", format!("blocking task failed: {e}")))?
}

/// S3's most parts per multipart upload.
const MAX_PARTS: u64 = 10_000;

/// A fresh random name for an upload marker.
fn random_id() -> String {
    use rand::Rng;
    let r: u128 = rand::rng().random();
    format!("{r:032x}")
}
