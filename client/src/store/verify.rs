//! Verification: verified reads (whole and streaming) and the scrub that
//! re-hashes every entry of the pool.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::TryStreamExt;
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};

use super::put::hash;
use super::{Store, Tier};
use crate::backend::{Backend, BlobReader};
use crate::{Error, Key, Result};

/// One damaged entry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CorruptEntry {
    /// The entry.
    pub key: Key,
    /// Its tier.
    pub tier: Tier,
    /// What was found.
    pub detail: String,
}

/// The outcome of [`Store::verify`].
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct VerifyReport {
    /// Entries re-hashed.
    pub checked: u64,
    /// Bytes re-hashed.
    pub bytes: u64,
    /// Entries whose content or recorded size does not match their key.
    pub corrupt: Vec<CorruptEntry>,
    /// Roots (declared live) with no entry in the pool.
    pub missing: Vec<Key>,
    /// Entries listed but gone by the time they were read (a concurrent
    /// sweep); not an error.
    pub vanished: u64,
}

impl VerifyReport {
    /// True when nothing is corrupt or missing.
    pub fn is_clean(&self) -> bool {
        self.corrupt.is_empty() && self.missing.is_empty()
    }
}

/// Progress of a verify pass.
#[derive(Debug, Clone, Copy)]
pub struct VerifyProgress {
    /// Entries re-hashed so far.
    pub checked: u64,
    /// Bytes re-hashed so far.
    pub bytes: u64,
}

enum Check {
    Ok(u64),
    Vanished,
    Corrupt(String),
}

/// Re-hashes one entry of `tier`, streaming large ones.
async fn check(store: &Store, tier: Tier, key: &Key) -> Result<Check> {
    let engine: &dyn Backend = match tier {
        Tier::Kv => store.kv().as_ref(),
        Tier::Large => store.large_engine()?.as_ref(),
    };
    let Some(recorded) = engine.size(key).await? else {
        return Ok(Check::Vanished);
    };
    let reader = match tier {
        Tier::Kv => engine
            .get(key)
            .await?
            .map(|b| Box::pin(std::io::Cursor::new(b)) as BlobReader),
        Tier::Large => store.large_engine()?.open_read(key).await?,
    };
    let Some(mut reader) = reader else {
        return Ok(Check::Vanished);
    };
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; 1024 * 1024];
    let mut n = 0u64;
    loop {
        let got = match reader.read(&mut buf).await {
            Ok(g) => g,
            Err(e) => return Ok(Check::Corrupt(format!("unreadable after {n} bytes: {e}"))),
        };
        if got == 0 {
            break;
        }
        hasher.update(&buf[..got]);
        n += got as u64;
    }
    let actual = Key::from_hash(hasher.finalize());
    if actual != *key {
        return Ok(Check::Corrupt(format!(
            "content ({n} bytes) hashes to {actual}"
        )));
    }
    if n != recorded {
        return Ok(Check::Corrupt(format!(
            "recorded size is {recorded} bytes but the content has {n}"
        )));
    }
    Ok(Check::Ok(n))
}

impl Store {
    /// Like [`Store::get`], re-hashing the bytes: corruption is
    /// [`Error::Corrupt`], blaming the engine that answered.
    pub async fn get_verified(&self, key: &Key) -> Result<Option<Bytes>> {
        self.check_open()?;
        let Some((v, tier)) = self.first(self.kv().get(key), |l| l.get(key)).await? else {
            return Ok(None);
        };
        let actual = hash(&v).await;
        if actual != *key {
            let engine = match tier {
                Tier::Kv => self.kv().to_string(),
                Tier::Large => self.large_engine()?.to_string(),
            };
            return Err(Error::Corrupt {
                key: *key,
                engine,
                detail: format!("content hashes to {actual}"),
            });
        }
        Ok(Some(v))
    }

    /// A streaming reader that re-hashes as it goes: if the content does not
    /// match the key, the read that reaches the end fails with
    /// `io::ErrorKind::InvalidData` instead of returning end-of-file.
    pub async fn open_read_verified(&self, key: &Key) -> Result<Option<BlobReader>> {
        Ok(self.open_read(key).await?.map(|inner| {
            Box::pin(VerifyingReader {
                inner,
                hasher: blake3::Hasher::new(),
                expected: *key,
            }) as BlobReader
        }))
    }

    /// Re-hashes every entry of both tiers (streaming large ones) and checks
    /// that every root exists.
    pub async fn verify(&self) -> Result<VerifyReport> {
        self.verify_with(|_| {}).await
    }

    /// [`Store::verify`] with a progress callback.
    pub async fn verify_with(&self, progress: impl Fn(VerifyProgress)) -> Result<VerifyReport> {
        self.check_open()?;
        let mut report = VerifyReport::default();
        let tiers = std::iter::once(Tier::Kv).chain(self.large().map(|_| Tier::Large));
        for tier in tiers {
            let mut keys = match tier {
                Tier::Kv => self.kv().list(),
                Tier::Large => self.large_engine()?.list(),
            };
            while let Some(key) = keys.try_next().await? {
                match check(self, tier, &key).await? {
                    Check::Ok(n) => {
                        report.checked += 1;
                        report.bytes += n;
                    }
                    Check::Vanished => report.vanished += 1,
                    Check::Corrupt(detail) => {
                        report.checked += 1;
                        tracing::warn!(%key, %tier, %detail, "corrupt entry");
                        report.corrupt.push(CorruptEntry { key, tier, detail });
                    }
                }
                progress(VerifyProgress {
                    checked: report.checked,
                    bytes: report.bytes,
                });
            }
        }
        let mut roots = self.roots();
        while let Some(root) = roots.try_next().await? {
            if !self.has(&root).await? {
                report.missing.push(root);
            }
        }
        Ok(report)
    }
}

/// Re-hashes a blob as it is read; see [`Store::open_read_verified`].
struct VerifyingReader {
    inner: BlobReader,
    hasher: blake3::Hasher,
    expected: Key,
}

impl AsyncRead for VerifyingReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        match this.inner.as_mut().poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let new = &buf.filled()[before..];
                if new.is_empty() && buf.remaining() > 0 {
                    let actual = Key::from_hash(this.hasher.finalize());
                    if actual != this.expected {
                        return Poll::Ready(Err(std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            format!(
                                "blob {} is corrupt: its content hashes to {actual}",
                                this.expected
                            ),
                        )));
                    }
                } else {
                    this.hasher.update(new);
                }
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}
