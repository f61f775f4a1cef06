//! Verified ranged reads of the store: a kv value verified whole (it is
//! at most the threshold), a large blob's range through its BLAKE3 outboard
//! (`integrity/verified.rs`, which the `routed` engine reads through too),
//! whether a blob's ranges verify without reading it whole, and a range's
//! bao encoding (`integrity/bao`) for `serve`.

use bytes::Bytes;
use tracing::Instrument;

use super::{Store, Tier};
use futures::StreamExt;

use crate::backend::{BlobReader, source};
use crate::integrity::bao::{
    Encoded,
    encode::{encode_bytes, encode_stream},
};
use crate::integrity::outboard;
use crate::integrity::verified::{range_verified, reader_verified};
use crate::{EntryMeta, Error, Key, Result};

/// Whether a large blob's ranges can be verified without reading it whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RangeCheck {
    /// By its outboard (or it is small enough to need none; kv blobs too,
    /// which are read whole).
    Outboard,
    /// It has no outboard: a verified range costs reading the whole blob
    /// (`alkblobs verify --repair-outboards` stores one).
    WholeBlob,
    /// It is at most its engine's outboard floor
    /// ([`crate::LargeBackend::outboard_floor`]): it has none by design, and
    /// a verified range reads it whole, about as cheaply there as a range
    /// and an outboard (nothing to repair).
    BelowFloor,
}

impl Store {
    /// Up to `len` bytes from `offset` (clamped to the end), verified
    /// against the key, or `None`. A large blob's range is checked through
    /// its outboard: only the 16 KiB chunk groups it covers and their path
    /// to the root are read. Damage is [`Error::CorruptAt`], naming the
    /// first bad offset; `offset` past the end is [`Error::InvalidRange`].
    pub async fn get_range_verified(
        &self,
        key: &Key,
        offset: u64,
        len: u64,
    ) -> Result<Option<Bytes>> {
        self.check_open()?;
        let span = tracing::debug_span!("get_range_verified", %key, offset, len);
        async {
            if let Some(v) = self.kv().get(key).await? {
                return self.kv_range_verified(key, v, offset, len).await.map(Some);
            }
            let found = match self.large() {
                Some(large) => range_verified(&source(large), key, offset, len, false).await?,
                None => None,
            };
            if found.is_none() {
                self.absent_unless_lost(key).await?;
            }
            Ok(found)
        }
        .instrument(span)
        .await
    }

    /// A kv value verified whole (it is at most the threshold), then sliced.
    async fn kv_range_verified(&self, key: &Key, v: Bytes, offset: u64, len: u64) -> Result<Bytes> {
        let actual = crate::integrity::hash::hash(&v).await;
        if actual != *key {
            return Err(Error::Corrupt {
                key: *key,
                engine: self.kv().to_string(),
                detail: format!("its {} bytes hash to {actual}", v.len()),
            });
        }
        crate::backend::slice_range(key, &v, offset, len)
    }

    /// A reader over up to `len` bytes from `offset` that yields only
    /// verified bytes: each 4 MiB window is checked through the outboard
    /// before any of it is returned (the next window is read meanwhile),
    /// and damage fails the read that reaches it with
    /// `io::ErrorKind::InvalidData` naming the first bad offset. `None` if
    /// the key is absent.
    pub async fn open_range_verified(
        &self,
        key: &Key,
        offset: u64,
        len: u64,
    ) -> Result<Option<BlobReader>> {
        self.check_open()?;
        if let Some(v) = self.kv().get(key).await? {
            let v = self.kv_range_verified(key, v, offset, len).await?;
            return Ok(Some(Box::pin(std::io::Cursor::new(v))));
        }
        let found = match self.large() {
            Some(large) => reader_verified(&source(large), key, offset, len).await?,
            None => None,
        };
        if found.is_none() {
            self.absent_unless_lost(key).await?;
        }
        Ok(found)
    }

    /// Whether `key`'s ranges can be verified without reading it whole, or
    /// `None` if it is absent.
    pub async fn range_check(&self, key: &Key) -> Result<Option<RangeCheck>> {
        self.check_open()?;
        let Some((size, tier)) = self.first(self.kv().size(key), |l| l.size(key)).await? else {
            self.absent_unless_lost(key).await?;
            return Ok(None);
        };
        if tier == Tier::Kv || outboard::outboard_len(size) == 0 {
            return Ok(Some(RangeCheck::Outboard));
        }
        let large = self.large_engine()?;
        if size <= large.outboard_floor() {
            return Ok(Some(RangeCheck::BelowFloor));
        }
        let stored = large.read_outboard(key, 0, 0).await;
        Ok(Some(match stored {
            Ok(Some(_)) => RangeCheck::Outboard,
            Ok(None) | Err(Error::InvalidRange { .. }) => RangeCheck::WholeBlob,
            Err(e) => return Err(e),
        }))
    }

    /// The bao encoding of `range` (clamped to the blob's end) of `key`,
    /// or `None` if the store holds no such blob (see [`crate::bao`]): what
    /// a client decodes with [`crate::bao::decode`], checking every byte
    /// against the key. A kv-tier blob is encoded from its bytes; a large
    /// one streamed from its engine, a page at a time.
    ///
    /// # Errors
    /// [`Error::InvalidRange`] when the range starts past the blob's end;
    /// the store's errors.
    pub async fn bao_encode(
        &self,
        key: &Key,
        range: std::ops::Range<u64>,
    ) -> Result<Option<Encoded>> {
        match self.stat(key).await? {
            Some(meta) => self.bao_encode_entry(&meta, range).await,
            None => Ok(None),
        }
    }

    /// [`Store::bao_encode`] for an entry already looked up
    /// ([`Store::stat`]), which a caller that checked the range against
    /// its size has: no second lookup. `None` if it was deleted since.
    pub async fn bao_encode_entry(
        &self,
        meta: &EntryMeta,
        range: std::ops::Range<u64>,
    ) -> Result<Option<Encoded>> {
        let (key, size) = (&meta.key, meta.size);
        if range.start > size {
            return Err(Error::InvalidRange {
                key: *key,
                offset: range.start,
                size,
            });
        }
        let range = range.start..range.end.clamp(range.start, size);
        let body = match (meta.tier, self.large()) {
            (Tier::Large, Some(large)) => {
                let rx = encode_stream(source(large), *key, size, range.clone()).await?;
                futures::stream::unfold(
                    rx,
                    |mut rx| async move { rx.recv().await.map(|x| (x, rx)) },
                )
                .boxed()
            }
            _ => {
                let Some(bytes) = self.get(key).await? else {
                    return Ok(None);
                };
                let (b, r) = (bytes, range.clone());
                let enc = crate::offload::blocking("bao", move || encode_bytes(&b, r)).await?;
                futures::stream::once(async move { Ok(Bytes::from(enc)) }).boxed()
            }
        };
        Ok(Some(Encoded { size, range, body }))
    }
}
