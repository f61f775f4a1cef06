//! Reads of a key's object: its own name, or on a fleet's prefix, when that
//! is absent, its latest later generation (`<key>.gN`, one listing request,
//! only on a miss); ranged reads in one request.

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

use super::{Inner, transport_failure};
use crate::backend::clamp_range;
use crate::{Key, Result};

impl Inner {
    /// The key's objects of generations above 0, with their sizes: the
    /// names after the key's own in its shard, one listing request (the
    /// listing starts after the key's name and stops at the next key).
    pub(super) async fn later_generations(&self, key: &Key) -> Result<Vec<(u64, Path, u64)>> {
        let loc = &self.opts.location;
        let mut names = self
            .store
            .list_with_offset(Some(&loc.shard(key)), &loc.blob(key));
        let hex = key.to_string();
        let mut found = Vec::new();
        while let Some(m) = names
            .try_next()
            .await
            .map_err(|e| self.err("list a blob's generations", e))?
        {
            if !m.location.filename().is_some_and(|n| n.starts_with(&hex)) {
                break;
            }
            if let Some((k, g)) = loc.key_of(&m.location)
                && k == *key
                && g > 0
            {
                found.push((g, m.location, m.size));
            }
        }
        Ok(found)
    }

    /// Where a read of `key` goes when its own name is absent: on a
    /// fleet's prefix, its latest later generation (every generation holds
    /// the same bytes: the key is their hash); elsewhere nowhere.
    pub(super) async fn later(&self, key: &Key) -> Result<Option<(Path, u64)>> {
        if !self.opts.shared {
            return Ok(None);
        }
        Ok(self
            .later_generations(key)
            .await?
            .into_iter()
            .max_by_key(|(g, _, _)| *g)
            .map(|(_, p, size)| (p, size)))
    }

    pub(super) async fn get_at(&self, path: &Path) -> Result<Option<Bytes>> {
        let got = match self.store.get(path).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.err("read a blob", e)),
        };
        got.bytes()
            .await
            .map(Some)
            .map_err(|e| self.err("read a blob", e))
    }

    /// A ranged read of the object at `path` (one generation of `key`).
    pub(super) async fn read_range_at(
        &self,
        key: &Key,
        path: &Path,
        offset: u64,
        len: u64,
    ) -> Result<Option<Bytes>> {
        // One ranged GET (the service clamps the end to the object's
        // size); only an empty range, or a start the service refuses as
        // past the end (416), takes the HEAD below to answer exactly.
        if len > 0 {
            let opts = object_store::GetOptions {
                range: Some(object_store::GetRange::Bounded(
                    offset..offset.saturating_add(len),
                )),
                ..Default::default()
            };
            match self.store.get_opts(path, opts).await {
                Ok(r) => {
                    return r
                        .bytes()
                        .await
                        .map(Some)
                        .map_err(|e| self.err("read a range", e));
                }
                Err(object_store::Error::NotFound { .. }) => return Ok(None),
                Err(e) if transport_failure(&e) => {
                    return Err(self.err("read a range", e));
                }
                Err(_) => {}
            }
        }
        let Some(size) = self.head_size(path).await? else {
            return Ok(None);
        };
        let range = clamp_range(key, size, offset, len)?;
        if range.is_empty() {
            return Ok(Some(Bytes::new()));
        }
        match self.store.get_range(path, range).await {
            Ok(b) => Ok(Some(b)),
            // Deleted between the two requests.
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.err("read a range", e)),
        }
    }
}
