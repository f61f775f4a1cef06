//! Every put path: whole buffers, verified puts, batches, streams and files.
//! Each pins its key through the arbiter *before* an engine publishes the
//! content, and tells the arbiter after (a put restarts the key's window).

use std::path::Path;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};
use tracing::Instrument;

use super::{CHUNK, Put, PutInfo, PutMany, Store, Tier};
use crate::backend::{PutOutcome, StagedWrite};
use crate::integrity::hash::{HASH_INLINE_MAX, hash, key_and_outboard};
use crate::integrity::outboard;
use crate::{Error, Key, Result};

/// Reads up to one [`CHUNK`] (less only at the end of the stream).
async fn read_chunk<R: AsyncRead + Unpin>(reader: &mut R) -> std::io::Result<BytesMut> {
    let mut buf = BytesMut::with_capacity(CHUNK);
    while buf.len() < CHUNK {
        let n = reader
            .take((CHUNK - buf.len()) as u64)
            .read_buf(&mut buf)
            .await?;
        if n == 0 {
            break;
        }
    }
    Ok(buf)
}

impl Store {
    /// A kv-tier blob whose key is known (the large tier goes through
    /// [`Store::put_large`], which computes the outboard with the key).
    async fn put_kv_keyed(&self, key: Key, bytes: Bytes) -> Result<Put> {
        let size = bytes.len() as u64;
        // Pin before publish: from here on no sweep can delete the key.
        let publication = self.begin_publication(Tier::Kv, vec![key]).await?;
        let outcome = self.inner.pool.kv().put(&key, bytes).await?;
        let pin = publication.published().await?;
        tracing::debug!(%key, size, ?outcome, "put");
        Ok(Put {
            key,
            size,
            tier: Tier::Kv,
            outcome,
            pin,
        })
    }

    /// Writes a large blob whose key and outboard are known (a batch's):
    /// the caller has pinned the key.
    async fn write_large(&self, key: &Key, bytes: Bytes, outboard: Bytes) -> Result<PutOutcome> {
        let mut writer = self.large_engine()?.begin_write().await?;
        if let Err(e) = writer.write(bytes).await {
            let _ = writer.abort().await;
            return Err(e);
        }
        writer.commit(key, outboard).await
    }

    /// Stores `bytes`, returning its key and a pin on it.
    pub async fn put(&self, bytes: impl Into<Bytes>) -> Result<Put> {
        self.check_open()?;
        let bytes = bytes.into();
        let span = tracing::debug_span!("put", size = bytes.len());
        async {
            if self.tier_checked(bytes.len() as u64)? == Tier::Large {
                return self.put_large(bytes, None).await;
            }
            let key = hash(&bytes).await;
            self.put_kv_keyed(key, bytes).await
        }
        .instrument(span)
        .await
    }

    /// A large blob: its key and outboard computed on other threads (every
    /// core) while the bytes stream to the engine's staging area, then pin,
    /// then publish. Hashing hides behind the write instead of preceding
    /// it; a dedup hit is discarded at commit before any fsync. With
    /// `expected`, bytes that do not hash to it store nothing
    /// ([`Error::HashMismatch`]).
    async fn put_large(&self, bytes: Bytes, expected: Option<Key>) -> Result<Put> {
        let size = bytes.len() as u64;
        let mut writer = self.large_engine()?.begin_write().await?;
        let b = bytes.clone();
        let hashing = tokio::task::spawn_blocking(move || outboard::of(&b));
        if let Err(e) = writer.write(bytes.clone()).await {
            let _ = writer.abort().await;
            return Err(e);
        }
        let (key, ob) = match hashing.await {
            Ok(done) => done,
            Err(_) => outboard::of(&bytes),
        };
        self.publish_staged(writer, key, expected, size, ob.into())
            .await
    }

    /// The end of every large-tier put: bytes that are not the `expected`
    /// key are discarded ([`Error::HashMismatch`]); else pin before
    /// publish, commit the staged bytes with their outboard, restart the
    /// key's window.
    async fn publish_staged(
        &self,
        writer: Box<dyn StagedWrite + '_>,
        key: Key,
        expected: Option<Key>,
        size: u64,
        outboard: Bytes,
    ) -> Result<Put> {
        if let Some(expected) = expected
            && expected != key
        {
            let _ = writer.abort().await;
            return Err(Error::HashMismatch {
                expected,
                actual: key,
            });
        }
        let publication = match self.begin_publication(Tier::Large, vec![key]).await {
            Ok(p) => p,
            Err(e) => {
                let _ = writer.abort().await;
                return Err(e);
            }
        };
        let outcome = writer.commit(&key, outboard).await?;
        let pin = publication.published().await?;
        tracing::debug!(%key, size, ?outcome, "large put");
        Ok(Put {
            key,
            size,
            tier: Tier::Large,
            outcome,
            pin,
        })
    }

    /// Stores `bytes` only if they hash to `key` (the ops surface for
    /// content fetched from another node). A mismatch stores nothing.
    pub async fn put_verified(&self, key: &Key, bytes: impl Into<Bytes>) -> Result<Put> {
        self.check_open()?;
        let bytes = bytes.into();
        let span = tracing::debug_span!("put_verified", %key, size = bytes.len());
        async {
            if self.tier_checked(bytes.len() as u64)? == Tier::Large {
                return self.put_large(bytes, Some(*key)).await;
            }
            let actual = hash(&bytes).await;
            if actual != *key {
                return Err(Error::HashMismatch {
                    expected: *key,
                    actual,
                });
            }
            self.put_kv_keyed(actual, bytes).await
        }
        .instrument(span)
        .await
    }

    /// Stores many small blobs: the kv ones in one transaction. Blobs over
    /// the threshold go to the large tier one by one. In kv-only mode an
    /// oversized blob refuses the whole batch before anything is written.
    pub async fn put_many<I, B>(&self, blobs: I) -> Result<PutMany>
    where
        I: IntoIterator<Item = B>,
        B: Into<Bytes>,
    {
        self.check_open()?;
        let blobs: Vec<Bytes> = blobs.into_iter().map(Into::into).collect();
        let span = tracing::debug_span!("put_many", count = blobs.len());
        async {
            let mut entries = Vec::with_capacity(blobs.len());
            // A large blob's outboard comes from its key's hash pass.
            let mut outboards = Vec::with_capacity(blobs.len());
            for b in &blobs {
                let size = b.len() as u64;
                let tier = self.tier_checked(size)?;
                let (key, ob) = match tier {
                    Tier::Kv => (hash(b).await, Bytes::new()),
                    Tier::Large => key_and_outboard(b).await,
                };
                outboards.push(ob);
                entries.push(PutInfo {
                    key,
                    size,
                    tier,
                    outcome: PutOutcome::Created,
                });
            }
            let tier_keys = |t: Tier| -> Vec<Key> {
                entries
                    .iter()
                    .filter(|e| e.tier == t)
                    .map(|e| e.key)
                    .collect()
            };
            let kv_publication = self
                .begin_publication(Tier::Kv, tier_keys(Tier::Kv))
                .await?;
            let large_publication = self
                .begin_publication(Tier::Large, tier_keys(Tier::Large))
                .await?;
            let kv_items: Vec<(Key, Bytes)> = entries
                .iter()
                .zip(&blobs)
                .filter(|(e, _)| e.tier == Tier::Kv)
                .map(|(e, b)| (e.key, b.clone()))
                .collect();
            let kv = self.inner.pool.kv();
            let mut kv_outcomes = kv.put_many(&kv_items).await?.into_iter();
            for ((e, b), ob) in entries.iter_mut().zip(&blobs).zip(outboards) {
                e.outcome = match e.tier {
                    Tier::Kv => kv_outcomes
                        .next()
                        .ok_or_else(|| Error::engine(kv, "put_many returned too few outcomes"))?,
                    Tier::Large => self.write_large(&e.key, b.clone(), ob).await?,
                };
            }
            let mut pin = kv_publication.published().await?;
            pin.merge(large_publication.published().await?);
            Ok(PutMany { entries, pin })
        }
        .instrument(span)
        .await
    }

    /// Stores a stream, hashing while it is written: memory stays bounded
    /// (the threshold plus one chunk) whatever the stream's length.
    pub async fn put_reader<R: AsyncRead + Unpin + Send>(&self, reader: R) -> Result<Put> {
        self.put_reader_expecting(reader, None).await
    }

    /// Stores a stream only if it hashes to `key` (the ops surface's
    /// verified upload): a mismatch stores nothing
    /// ([`Error::HashMismatch`]), however long the stream.
    pub async fn put_reader_verified<R: AsyncRead + Unpin + Send>(
        &self,
        key: &Key,
        reader: R,
    ) -> Result<Put> {
        self.put_reader_expecting(reader, Some(*key)).await
    }

    async fn put_reader_expecting<R: AsyncRead + Unpin + Send>(
        &self,
        mut reader: R,
        expected: Option<Key>,
    ) -> Result<Put> {
        self.check_open()?;
        let span = tracing::debug_span!("put_reader");
        async move {
            let input = |source| Error::Input {
                what: "the input stream".into(),
                source,
            };
            // Read up to threshold + 1 bytes: enough to choose the tier.
            let limit = self.inner.threshold as usize + 1;
            let mut head = BytesMut::with_capacity(limit.min(CHUNK));
            while head.len() < limit {
                let want = (limit - head.len()).min(CHUNK);
                head.reserve(want);
                let n = (&mut reader)
                    .take(want as u64)
                    .read_buf(&mut head)
                    .await
                    .map_err(input)?;
                if n == 0 {
                    break;
                }
            }
            if head.len() < limit {
                return match expected {
                    Some(k) => self.put_verified(&k, head.freeze()).await,
                    None => self.put(head.freeze()).await,
                };
            }
            let Some(large) = self.inner.pool.large() else {
                return Err(Error::TooLarge {
                    size: head.len() as u64,
                    threshold: self.inner.threshold,
                });
            };
            let mut writer = large.begin_write().await?;
            // Three stages overlap per chunk: it is hashed (on a blocking
            // thread when big) and written while the next chunk is read.
            // Bytes are read once and copied into the engine's writes
            // without a second pass over the source.
            let mut hasher = outboard::Builder::new();
            let mut chunk = head.freeze();
            let streamed: Result<()> = async {
                loop {
                    let hashing = if chunk.len() > HASH_INLINE_MAX {
                        let (mut h, c) = (std::mem::take(&mut hasher), chunk.clone());
                        Some(tokio::task::spawn_blocking(move || {
                            h.update(&c);
                            h
                        }))
                    } else {
                        hasher.update(&chunk);
                        None
                    };
                    let (written, next) =
                        futures::join!(writer.write(chunk.clone()), read_chunk(&mut reader));
                    if let Some(task) = hashing {
                        hasher = match task.await {
                            Ok(h) => h,
                            // The hashing thread panicked: nothing is
                            // published (the caller's `?` aborts the write).
                            Err(e) => {
                                return Err(Error::engine(
                                    "blake3",
                                    format!("the hashing task of a streaming put failed: {e}"),
                                ));
                            }
                        };
                    }
                    written?;
                    let buf = next.map_err(input)?;
                    if buf.is_empty() {
                        return Ok(());
                    }
                    chunk = buf.freeze();
                }
            }
            .await;
            if let Err(e) = streamed {
                let _ = writer.abort().await;
                return Err(e);
            }
            let (key, ob) = hasher.finish();
            let size = writer.written();
            self.publish_staged(writer, key, expected, size, ob.into())
                .await
        }
        .instrument(span)
        .await
    }

    /// Stores a file's content, streamed (see [`Store::put_reader`]).
    pub async fn put_file(&self, path: impl AsRef<Path>) -> Result<Put> {
        let path = path.as_ref();
        let file = tokio::fs::File::open(path)
            .await
            .map_err(|source| Error::Input {
                what: path.display().to_string(),
                source,
            })?;
        self.put_reader(tokio::io::BufReader::with_capacity(CHUNK, file))
            .await
            .map_err(|e| match e {
                Error::Input { source, .. } => Error::Input {
                    what: path.display().to_string(),
                    source,
                },
                other => other,
            })
    }
}
