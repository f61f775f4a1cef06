//! Reads. Every read tries the kv engine, then the large one (a blob written
//! under an older threshold is still found): that fall-through is written
//! once, in [`Store::first`].

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use tracing::Instrument;

use super::{EntryMeta, Store, Tier};
use crate::backend::{BlobReader, KeyStream, LargeBackend};
use crate::record::Held;
use crate::{Error, Key, Result};

impl Store {
    /// Called when no engine holds `key`: `Ok(())` (absent) unless the
    /// pool's record says its content must be there — a published file of
    /// a fleet's shared tier that the tier no longer holds — which is
    /// [`Error::Lost`], not "never stored". (A large-object entry whose
    /// object is gone is reported by its engine, from the database.) Only
    /// on a miss, only where the tier is recorded: a lookup; and where it
    /// names a published file, the tier asked again and the record looked
    /// up again — a put that published it meanwhile, or a sweep that
    /// claimed and deleted it meanwhile, is no loss.
    pub(super) async fn absent_unless_lost(&self, key: &Key) -> Result<()> {
        let Some(record) = self.inner.record.as_ref().filter(|r| r.tier_recorded()) else {
            return Ok(());
        };
        let Some(large) = self.large() else {
            return Ok(());
        };
        let published = || async {
            let found = record.lookup(&[key.as_bytes().to_vec()], false).await?;
            Ok::<_, Error>(match found.first().and_then(|r| r.held) {
                Some(Held::File { generation }) => Some(generation),
                _ => None,
            })
        };
        let Some(generation) = published().await? else {
            return Ok(());
        };
        if large.has(key).await? || published().await? != Some(generation) {
            return Ok(());
        }
        Err(Error::Lost {
            key: *key,
            engine: large.to_string(),
            detail: format!(
                "the pool records it as published (object generation {generation}) and the tier does not hold it"
            ),
        })
    }

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
            self.absent_unless_lost(key).await?;
            return Ok(None);
        };
        // Off the async workers, on every core when big.
        let actual = crate::integrity::hash::hash(&v).await;
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
        let found = self
            .first(self.kv().get_range(key, offset, len), |l| {
                l.read_range(key, offset, len)
            })
            .instrument(span)
            .await?;
        if found.is_none() {
            self.absent_unless_lost(key).await?;
        }
        Ok(found.map(|(v, _)| v))
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
        let found = self.first(kv, |l| l.open_read(key)).await?;
        if found.is_none() {
            self.absent_unless_lost(key).await?;
        }
        Ok(found.map(|(r, _)| r))
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
        let found = self.first(self.kv().size(key), |l| l.size(key)).await?;
        if found.is_none() {
            self.absent_unless_lost(key).await?;
        }
        Ok(found.map(|(size, tier)| EntryMeta {
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
