//! `Arc<T>` and `Box<T>` of an engine are engines: the store, wrappers and
//! tests can share one engine value without paired `kv`/`kv_arc` methods.
//!
//! Every method forwards, including the provided ones, so an engine's own
//! override is never replaced by the trait default behind a pointer;
//! `clippy::missing_trait_methods` keeps it that way when the trait grows.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use super::{Backend, BlobReader, KeyStream, LargeBackend, PutOutcome, Sharing, StagedWrite};
use crate::{Key, Result};

macro_rules! forward_backend {
    ($ptr:ident) => {
        #[async_trait]
        #[deny(clippy::missing_trait_methods)]
        impl<T: Backend + ?Sized> Backend for $ptr<T> {
            fn name(&self) -> &str {
                (**self).name()
            }
            fn sharing(&self) -> Sharing {
                (**self).sharing()
            }
            async fn has(&self, key: &Key) -> Result<bool> {
                (**self).has(key).await
            }
            async fn get(&self, key: &Key) -> Result<Option<Bytes>> {
                (**self).get(key).await
            }
            async fn put(&self, key: &Key, value: Bytes) -> Result<PutOutcome> {
                (**self).put(key, value).await
            }
            async fn delete(&self, key: &Key) -> Result<Option<u64>> {
                (**self).delete(key).await
            }
            fn list(&self) -> KeyStream<'_> {
                (**self).list()
            }
            fn scan(&self, after: Option<Key>) -> super::EntryStream<'_> {
                (**self).scan(after)
            }
            async fn size(&self, key: &Key) -> Result<Option<u64>> {
                (**self).size(key).await
            }
            async fn get_range(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
                (**self).get_range(key, offset, len).await
            }
            async fn get_many(&self, keys: &[Key]) -> Result<Vec<Option<(u64, Bytes)>>> {
                (**self).get_many(keys).await
            }
            async fn put_many(&self, items: &[(Key, Bytes)]) -> Result<Vec<PutOutcome>> {
                (**self).put_many(items).await
            }
            async fn delete_many(&self, keys: &[Key]) -> Result<Vec<Option<u64>>> {
                (**self).delete_many(keys).await
            }
            async fn usage(&self) -> Result<Option<(u64, u64)>> {
                (**self).usage().await
            }
            async fn disk_space(&self) -> Result<Option<super::DiskSpace>> {
                (**self).disk_space().await
            }
            async fn compact(&self) -> Result<Option<(super::DiskSpace, super::DiskSpace)>> {
                (**self).compact().await
            }
            async fn reclaim_abandoned(&self) -> Result<u64> {
                (**self).reclaim_abandoned().await
            }
            async fn close(&self) -> Result<()> {
                (**self).close().await
            }
            fn sqlite_database(&self) -> Option<&super::sqlite::SqliteBackend> {
                (**self).sqlite_database()
            }
        }

        #[async_trait]
        #[deny(clippy::missing_trait_methods)]
        impl<T: LargeBackend + ?Sized> LargeBackend for $ptr<T> {
            async fn begin_write(&self) -> Result<Box<dyn StagedWrite + '_>> {
                (**self).begin_write().await
            }
            async fn open_read(&self, key: &Key) -> Result<Option<BlobReader>> {
                (**self).open_read(key).await
            }
            async fn read_range(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
                (**self).read_range(key, offset, len).await
            }
            async fn delete_through(&self, key: &Key, through: u64) -> Result<Option<u64>> {
                (**self).delete_through(key, through).await
            }
            async fn generation_size(&self, key: &Key, generation: u64) -> Result<Option<u64>> {
                (**self).generation_size(key, generation).await
            }
            async fn digest(
                &self,
                key: &Key,
                size_hint: u64,
            ) -> Result<Option<crate::integrity::outboard::Digest>> {
                (**self).digest(key, size_hint).await
            }
            async fn read_outboard(
                &self,
                key: &Key,
                offset: u64,
                len: u64,
            ) -> Result<Option<Bytes>> {
                (**self).read_outboard(key, offset, len).await
            }
            async fn put_outboard(&self, key: &Key, outboard: Bytes) -> Result<bool> {
                (**self).put_outboard(key, outboard).await
            }
            async fn read_outboard_windows(
                &self,
                key: &Key,
                windows: &[std::ops::Range<u64>],
            ) -> Result<Option<Vec<Bytes>>> {
                (**self).read_outboard_windows(key, windows).await
            }
            async fn outboard_usage(&self) -> Result<Option<u64>> {
                (**self).outboard_usage().await
            }
            fn orphan_outboards(&self) -> KeyStream<'_> {
                (**self).orphan_outboards()
            }
            fn outboard_floor(&self) -> u64 {
                (**self).outboard_floor()
            }
        }
    };
}

forward_backend!(Arc);
forward_backend!(Box);
