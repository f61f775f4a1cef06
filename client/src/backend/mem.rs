//! `mem`: an in-memory engine, usable as either tier. Nothing survives the
//! process; tests, caches and examples use it.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Bound;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use bytes::Bytes;

use super::{
    Backend, BlobReader, KeyStream, LargeBackend, PutOutcome, Sharing, StagedWrite, slice_range,
};
use crate::{Key, Result};

/// How many keys one page of `list` copies out under the read lock.
const LIST_PAGE: usize = 1024;

/// The in-memory engine. Cloning shares the same map.
#[derive(Clone, Default)]
pub struct MemBackend {
    map: Arc<RwLock<BTreeMap<Key, Bytes>>>,
    /// Outboards of large blobs put through a staged write (an engine-level
    /// `put` stores none, like a blob stored before outboards).
    outboards: Arc<RwLock<BTreeMap<Key, Bytes>>>,
}

impl MemBackend {
    /// An empty engine.
    pub fn new() -> MemBackend {
        MemBackend::default()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<Key, Bytes>> {
        // Every mutation is one map call, so a poisoned lock still guards a
        // consistent map.
        self.map.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<Key, Bytes>> {
        self.map.write().unwrap_or_else(|p| p.into_inner())
    }

    fn outboards(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<Key, Bytes>> {
        self.outboards.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Replaces a stored value behind the contract's back. Test support for
    /// corruption detection; never used by the store.
    #[doc(hidden)]
    pub fn corrupt_for_test(&self, key: &Key, value: Bytes) {
        self.write().insert(*key, value);
    }
}

impl fmt::Debug for MemBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemBackend")
            .field("entries", &self.read().len())
            .finish()
    }
}

impl fmt::Display for MemBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("mem")
    }
}

#[async_trait]
impl Backend for MemBackend {
    fn name(&self) -> &str {
        "mem"
    }

    fn sharing(&self) -> Sharing {
        Sharing::Process
    }

    async fn has(&self, key: &Key) -> Result<bool> {
        Ok(self.read().contains_key(key))
    }

    async fn get(&self, key: &Key) -> Result<Option<Bytes>> {
        Ok(self.read().get(key).cloned())
    }

    async fn put(&self, key: &Key, value: Bytes) -> Result<PutOutcome> {
        let mut map = self.write();
        if map.contains_key(key) {
            return Ok(PutOutcome::Existed);
        }
        map.insert(*key, value);
        Ok(PutOutcome::Created)
    }

    async fn delete(&self, key: &Key) -> Result<Option<u64>> {
        let freed = self.write().remove(key).map(|v| v.len() as u64);
        self.outboards().remove(key);
        Ok(freed)
    }

    fn list(&self) -> KeyStream<'_> {
        // One page at a time under the read lock: a huge map is never
        // copied whole.
        crate::pager::paged(
            LIST_PAGE,
            |k: &Key| *k,
            move |after: Option<Key>| {
                let lower = after.map_or(Bound::Unbounded, Bound::Excluded);
                let page: Vec<Key> = self
                    .read()
                    .range((lower, Bound::Unbounded))
                    .take(LIST_PAGE)
                    .map(|(k, _)| *k)
                    .collect();
                futures::future::ready(Ok(page))
            },
        )
    }

    async fn size(&self, key: &Key) -> Result<Option<u64>> {
        Ok(self.read().get(key).map(|v| v.len() as u64))
    }

    async fn put_many(&self, items: &[(Key, Bytes)]) -> Result<Vec<PutOutcome>> {
        let mut map = self.write();
        Ok(items
            .iter()
            .map(|(k, v)| {
                if map.contains_key(k) {
                    PutOutcome::Existed
                } else {
                    map.insert(*k, v.clone());
                    PutOutcome::Created
                }
            })
            .collect())
    }

    async fn usage(&self) -> Result<Option<(u64, u64)>> {
        let map = self.read();
        let bytes = map.values().map(|v| v.len() as u64).sum();
        Ok(Some((map.len() as u64, bytes)))
    }
}

/// As a large engine the map already holds every blob in memory, so a
/// buffered write costs nothing the engine would not pay anyway.
#[async_trait]
impl LargeBackend for MemBackend {
    async fn begin_write(&self) -> Result<Box<dyn StagedWrite + '_>> {
        Ok(Box::new(MemWrite {
            engine: self,
            buf: bytes::BytesMut::new(),
        }))
    }

    async fn open_read(&self, key: &Key) -> Result<Option<BlobReader>> {
        Ok(self
            .read()
            .get(key)
            .cloned()
            .map(|b| Box::pin(std::io::Cursor::new(b)) as BlobReader))
    }

    async fn read_range(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        let value = self.read().get(key).cloned();
        match value {
            Some(v) => slice_range(key, &v, offset, len).map(Some),
            None => Ok(None),
        }
    }

    async fn read_outboard(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        let Some(size) = self.read().get(key).map(|v| v.len() as u64) else {
            return Ok(None);
        };
        if crate::integrity::outboard::outboard_len(size) == 0 {
            return Ok(Some(Bytes::new()));
        }
        let ob = self.outboards().get(key).cloned();
        match ob {
            Some(ob) => slice_range(key, &ob, offset, len).map(Some),
            None => Ok(None),
        }
    }

    async fn put_outboard(&self, key: &Key, outboard: Bytes) -> Result<bool> {
        let map = self.read();
        if !map.contains_key(key) {
            return Ok(false);
        }
        self.outboards().insert(*key, outboard);
        Ok(true)
    }

    async fn outboard_usage(&self) -> Result<Option<u64>> {
        Ok(Some(
            self.outboards().values().map(|v| v.len() as u64).sum(),
        ))
    }
}

struct MemWrite<'a> {
    engine: &'a MemBackend,
    buf: bytes::BytesMut,
}

#[async_trait]
impl StagedWrite for MemWrite<'_> {
    async fn write(&mut self, chunk: Bytes) -> Result<()> {
        self.buf.extend_from_slice(&chunk);
        Ok(())
    }
    fn written(&self) -> u64 {
        self.buf.len() as u64
    }
    async fn commit(self: Box<Self>, key: &Key, outboard: Bytes) -> Result<PutOutcome> {
        let mut map = self.engine.write();
        let outcome = if map.contains_key(key) {
            PutOutcome::Existed
        } else {
            map.insert(*key, self.buf.freeze());
            PutOutcome::Created
        };
        // Under the map's lock: a delete cannot slip between the two.
        let mut outboards = self.engine.outboards();
        outboards.entry(*key).or_insert(outboard);
        Ok(outcome)
    }
    async fn abort(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}
