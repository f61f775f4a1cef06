//! A fault-injecting engine: wraps another and fails the Nth write or
//! delete, to prove the store and the GC lose nothing when an engine fails.
//!
//! Every trait method is written out (`clippy::missing_trait_methods` is
//! denied on the impls), so a method the trait gains cannot silently fall
//! back to a default that bypasses the wrapped engine.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use async_trait::async_trait;
use bytes::Bytes;

use crate::backend::{Backend, BlobReader, KeyStream, LargeBackend, Sharing, StagedWrite};
use crate::{Error, Key, PutOutcome, Result};

/// Wraps an engine; see the module docs.
#[derive(Debug)]
pub struct FaultBackend<E: ?Sized = dyn Backend> {
    inner: Arc<E>,
    shared: AtomicBool,
    writes: AtomicU64,
    deletes: AtomicU64,
    fail_write: AtomicU64,
    fail_delete: AtomicU64,
    write_delay_ms: AtomicU64,
}

impl<E: Backend + ?Sized> FaultBackend<E> {
    /// Wraps `inner` with no faults armed.
    pub fn new(inner: Arc<E>) -> FaultBackend<E> {
        FaultBackend {
            inner,
            shared: AtomicBool::new(false),
            writes: AtomicU64::new(0),
            deletes: AtomicU64::new(0),
            fail_write: AtomicU64::new(0),
            fail_delete: AtomicU64::new(0),
            write_delay_ms: AtomicU64::new(0),
        }
    }

    /// Makes the wrapper report [`Sharing::Shared`], like an engine other
    /// processes can reach.
    pub fn declare_shared(&self) {
        self.shared.store(true, Ordering::SeqCst);
    }

    /// Delays every later write (put, batch, a streamed write's start and
    /// its commit) by `d` before it reaches the inner engine: a put stays
    /// in flight that long.
    pub fn delay_writes(&self, d: std::time::Duration) {
        self.write_delay_ms
            .store(d.as_millis() as u64, Ordering::SeqCst);
    }

    async fn write_delay(&self) {
        let ms = self.write_delay_ms.load(Ordering::SeqCst);
        if ms > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        }
    }

    /// Fails the `n`th write from now (1 = the next one); 0 disarms.
    pub fn fail_nth_write(&self, n: u64) {
        let base = self.writes.load(Ordering::SeqCst);
        self.fail_write
            .store(if n == 0 { 0 } else { base + n }, Ordering::SeqCst);
    }

    /// Fails the `n`th delete call from now (1 = the next one); 0 disarms.
    pub fn fail_nth_delete(&self, n: u64) {
        let base = self.deletes.load(Ordering::SeqCst);
        self.fail_delete
            .store(if n == 0 { 0 } else { base + n }, Ordering::SeqCst);
    }

    fn write_fault(&self) -> Result<()> {
        let n = self.writes.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.fail_write.load(Ordering::SeqCst) {
            return Err(Error::engine(
                self,
                format!("injected failure of write #{n}"),
            ));
        }
        Ok(())
    }

    fn delete_fault(&self) -> Result<()> {
        let n = self.deletes.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.fail_delete.load(Ordering::SeqCst) {
            return Err(Error::engine(
                self,
                format!("injected failure of delete #{n}"),
            ));
        }
        Ok(())
    }
}

impl<E: Backend + ?Sized> fmt::Display for FaultBackend<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "fault({})", self.inner)
    }
}

struct FaultWrite<'a, E: ?Sized> {
    owner: &'a FaultBackend<E>,
    inner: Box<dyn StagedWrite + 'a>,
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<E: Backend + ?Sized> StagedWrite for FaultWrite<'_, E> {
    async fn write(&mut self, chunk: Bytes) -> Result<()> {
        self.inner.write(chunk).await
    }
    fn written(&self) -> u64 {
        self.inner.written()
    }
    async fn commit(self: Box<Self>, key: &Key, outboard: Bytes) -> Result<PutOutcome> {
        if let Err(e) = self.owner.write_fault() {
            self.inner.abort().await?;
            return Err(e);
        }
        self.owner.write_delay().await;
        self.inner.commit(key, outboard).await
    }
    async fn abort(self: Box<Self>) -> Result<()> {
        self.inner.abort().await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<E: Backend + ?Sized> Backend for FaultBackend<E> {
    fn name(&self) -> &str {
        "fault"
    }
    fn sharing(&self) -> Sharing {
        if self.shared.load(Ordering::SeqCst) {
            Sharing::Shared
        } else {
            self.inner.sharing()
        }
    }
    async fn has(&self, key: &Key) -> Result<bool> {
        self.inner.has(key).await
    }
    async fn get(&self, key: &Key) -> Result<Option<Bytes>> {
        self.inner.get(key).await
    }
    async fn put(&self, key: &Key, value: Bytes) -> Result<PutOutcome> {
        self.write_fault()?;
        self.write_delay().await;
        self.inner.put(key, value).await
    }
    async fn delete(&self, key: &Key) -> Result<Option<u64>> {
        self.delete_fault()?;
        self.inner.delete(key).await
    }
    fn list(&self) -> KeyStream<'_> {
        self.inner.list()
    }
    fn scan(&self, after: Option<Key>) -> crate::backend::EntryStream<'_> {
        self.inner.scan(after)
    }
    async fn size(&self, key: &Key) -> Result<Option<u64>> {
        self.inner.size(key).await
    }
    async fn get_range(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        self.inner.get_range(key, offset, len).await
    }
    async fn get_many(&self, keys: &[Key]) -> Result<Vec<Option<(u64, Bytes)>>> {
        self.inner.get_many(keys).await
    }
    async fn put_many(&self, items: &[(Key, Bytes)]) -> Result<Vec<PutOutcome>> {
        self.write_fault()?;
        self.write_delay().await;
        self.inner.put_many(items).await
    }
    async fn delete_many(&self, keys: &[Key]) -> Result<Vec<Option<u64>>> {
        self.delete_fault()?;
        self.inner.delete_many(keys).await
    }
    async fn usage(&self) -> Result<Option<(u64, u64)>> {
        self.inner.usage().await
    }
    async fn disk_space(&self) -> Result<Option<crate::backend::DiskSpace>> {
        self.inner.disk_space().await
    }
    async fn compact(
        &self,
    ) -> Result<Option<(crate::backend::DiskSpace, crate::backend::DiskSpace)>> {
        self.inner.compact().await
    }
    async fn reclaim_abandoned(&self) -> Result<u64> {
        self.inner.reclaim_abandoned().await
    }
    async fn close(&self) -> Result<()> {
        self.inner.close().await
    }
    fn sqlite_database(&self) -> Option<&crate::backend::sqlite::SqliteBackend> {
        self.inner.sqlite_database()
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<E: LargeBackend + ?Sized> LargeBackend for FaultBackend<E> {
    async fn begin_write(&self) -> Result<Box<dyn StagedWrite + '_>> {
        self.write_delay().await;
        Ok(Box::new(FaultWrite {
            owner: self,
            inner: self.inner.begin_write().await?,
        }))
    }
    async fn open_read(&self, key: &Key) -> Result<Option<BlobReader>> {
        self.inner.open_read(key).await
    }
    async fn read_range(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        self.inner.read_range(key, offset, len).await
    }
    async fn delete_through(&self, key: &Key, through: u64) -> Result<Option<u64>> {
        self.delete_fault()?;
        self.inner.delete_through(key, through).await
    }
    async fn generation_size(&self, key: &Key, generation: u64) -> Result<Option<u64>> {
        self.inner.generation_size(key, generation).await
    }
    async fn digest(
        &self,
        key: &Key,
        size_hint: u64,
    ) -> Result<Option<crate::integrity::outboard::Digest>> {
        self.inner.digest(key, size_hint).await
    }
    async fn read_outboard(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        self.inner.read_outboard(key, offset, len).await
    }
    async fn put_outboard(&self, key: &Key, outboard: Bytes) -> Result<bool> {
        self.inner.put_outboard(key, outboard).await
    }
    async fn read_outboard_windows(
        &self,
        key: &Key,
        windows: &[std::ops::Range<u64>],
    ) -> Result<Option<Vec<Bytes>>> {
        self.inner.read_outboard_windows(key, windows).await
    }
    async fn outboard_usage(&self) -> Result<Option<u64>> {
        self.inner.outboard_usage().await
    }
    fn orphan_outboards(&self) -> crate::backend::KeyStream<'_> {
        self.inner.orphan_outboards()
    }
    fn outboard_floor(&self) -> u64 {
        self.inner.outboard_floor()
    }
}
