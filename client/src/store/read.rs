//! Reads. Every read tries the kv engine, then the large one (a blob written
//! under an older threshold is still found): that fall-through is written
//! once, in [`Store::first`].

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use tracing::Instrument;

use super::{EntryMeta, Store, Tier};
use crate::backend::{BlobReader, KeyStream, LargeBackend};
use crate::{Error, Key, Result};

impl Store {
    /// The kv engine's answer, else the large engine's: the one fall-through.
    pub(super) async fn first<'a, T, L, LF>(
        &'a self,
        kv: impl Future<Output = Result<Option<T>>>,
        large: L,
    ) -> Result<Option<(T, Tier)>>
    where
        L: FnOnce(&'a Arc<dyn LargeBackend>) -> LF,
        LF: Future<Output = Result<Option<T>>> + 'a,
    {
        if let Some(v) = kv.await? {
            return Ok(Some((v, Tier::Kv)));
        }
        match self.inner.pool.large() {
            Some(l) => Ok(large(l).await?.map(|v| (v, Tier::Large))),
            None => Ok(None),
        }
    }

    /// The whole blob, or `None`, verified against its key: content that
    /// does not hash to it is [`Error::Corrupt`] (bit rot, tampering, or a
    /// forged key that a server which cannot hash accepted: the SQL-only
    /// flavour). Loads it into memory; use [`Store::open_read_verified`]
    /// for large blobs.
    pub async fn get(&self, key: &Key) -> Result<Option<Bytes>> {
        self.check_open()?;
        let span = tracing::debug_span!("get", %key);
        let found = self
            .first(self.kv().get(key), |l| l.get(key))
            .instrument(span)
            .await?;
        let Some((v, tier)) = found else {
            return Ok(None);
        };
        // Off the async workers, on every core when big.
        let actual = super::put::hash(&v).await;
        if actual != *key {
            return Err(Error::Corrupt {
                key: *key,
                engine: format!("the {tier} tier"),
                detail: format!("its {} bytes hash to {actual}", v.len()),
            });
        }
        Ok(Some(v))
    }

    /// Up to `len` bytes from `offset` (clamped to the end), or `None`.
    pub async fn get_range(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        self.check_open()?;
        let span = tracing::debug_span!("get_range", %key, offset, len);
        self.first(self.kv().get_range(key, offset, len), |l| {
            l.read_range(key, offset, len)
        })
        .instrument(span)
        .await
        .map(|o| o.map(|(v, _)| v))
    }

    /// A streaming reader over the blob, or `None`.
    pub async fn open_read(&self, key: &Key) -> Result<Option<BlobReader>> {
        self.check_open()?;
        let kv = async {
            Ok(self
                .kv()
                .get(key)
                .await?
                .map(|b| Box::pin(std::io::Cursor::new(b)) as BlobReader))
        };
        self.first(kv, |l| l.open_read(key))
            .await
            .map(|o| o.map(|(r, _)| r))
    }

    /// Whether the key is present now. Not a promise: see [`Store::pin`].
    pub async fn has(&self, key: &Key) -> Result<bool> {
        self.check_open()?;
        let present = |r: Result<bool>| r.map(|b| b.then_some(()));
        self.first(
            async { present(self.kv().has(key).await) },
            |l| async move { present(l.has(key).await) },
        )
        .await
        .map(|o| o.is_some())
    }

    /// Size and tier from the cheap length probe; never loads the value.
    pub async fn stat(&self, key: &Key) -> Result<Option<EntryMeta>> {
        self.check_open()?;
        Ok(self
            .first(self.kv().size(key), |l| l.size(key))
            .await?
            .map(|(size, tier)| EntryMeta {
                key: *key,
                size,
                tier,
            }))
    }

    /// Every key in the pool, ascending, each once, streamed.
    pub fn list(&self) -> KeyStream<'_> {
        if let Err(e) = self.check_open() {
            return Box::pin(futures::stream::once(async { Err(e) }));
        }
        self.inner.pool.list()
    }
}
