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
use crate::{Error, Key, Result, outboard};

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
    /// Large blobs whose content is intact but that have no outboard
    /// (stored before outboards existed): their ranges are verified by
    /// reading them whole until [`VerifyOptions::repair_outboards`].
    pub outboards_missing: u64,
    /// Large blobs whose content is intact but whose stored outboard is
    /// not theirs (damaged): the same, until repaired.
    pub outboards_damaged: u64,
    /// Outboards stored by this pass ([`VerifyOptions::repair_outboards`]).
    pub outboards_repaired: u64,
}

/// How [`Store::verify_with_options`] runs.
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct VerifyOptions {
    /// Store the outboard of every intact large blob that has none or a
    /// damaged one (computed in the same pass that re-hashes it). Needs a
    /// writable store.
    pub repair_outboards: bool,
}

impl VerifyOptions {
    /// Repairs missing and damaged outboards.
    pub fn repair_outboards(mut self, yes: bool) -> Self {
        self.repair_outboards = yes;
        self
    }
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
    Ok(u64, Outboard),
    Vanished,
    Corrupt(String),
}

/// A large blob's stored outboard against the one its bytes give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outboard {
    /// Right (or a kv entry, which needs none).
    Good,
    Missing,
    Damaged,
}

/// Re-hashes one entry of `tier`, streaming large ones; a large one's
/// outboard is checked too, and stored if `repair` and it is missing or
/// damaged.
async fn check(store: &Store, tier: Tier, key: &Key, repair: bool) -> Result<Check> {
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
    // One pass gives the key and, for a large blob, the outboard to hold
    // the stored one against.
    let mut builder = outboard::Builder::new();
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
        builder.update(&buf[..got]);
        n += got as u64;
    }
    let (actual, computed) = builder.finish();
    if actual != *key {
        let mut detail = format!("content ({n} bytes) hashes to {actual}");
        if tier == Tier::Large
            && let Some(at) = first_bad_offset(store, key).await
        {
            detail.push_str(&format!(
                "; the first damaged 16 KiB group starts at byte {at}"
            ));
        }
        return Ok(Check::Corrupt(detail));
    }
    if n != recorded {
        return Ok(Check::Corrupt(format!(
            "recorded size is {recorded} bytes but the content has {n}"
        )));
    }
    if tier == Tier::Kv || computed.is_empty() {
        return Ok(Check::Ok(n, Outboard::Good));
    }
    let large = store.large_engine()?;
    // (Under the engine's outboard floor a blob has none, by design.)
    if n <= large.outboard_floor() {
        return Ok(Check::Ok(n, Outboard::Good));
    }
    let stored = match large.read_outboard(key, 0, computed.len() as u64).await {
        Ok(Some(b)) if b[..] == computed[..] => Outboard::Good,
        Ok(Some(_)) | Err(Error::InvalidRange { .. }) => Outboard::Damaged,
        Ok(None) => Outboard::Missing,
        Err(e) => return Err(e),
    };
    if stored != Outboard::Good && repair {
        large.put_outboard(key, computed.into()).await?;
    }
    Ok(Check::Ok(n, stored))
}

/// Where a corrupt large blob's damage starts, found through its stored
/// outboard (window by window, stopping at the first bad one); `None`
/// when it has no usable outboard.
async fn first_bad_offset(store: &Store, key: &Key) -> Option<u64> {
    let large = store.large_engine().ok()?;
    let size = large.size(key).await.ok()??;
    // Only with a stored outboard: the fallback would compute one from the
    // damaged bytes, which locates nothing.
    large
        .read_outboard(key, 0, outboard::outboard_len(size))
        .await
        .ok()??;
    let mut r = store.open_range_verified(key, 0, size).await.ok()??;
    let mut sink = vec![0u8; 1 << 20];
    loop {
        match r.read(&mut sink).await {
            Ok(0) => return None,
            Ok(_) => {}
            Err(e) => {
                return match e.into_inner()?.downcast::<Error>() {
                    Ok(err) => match *err {
                        Error::CorruptAt { offset, .. } => Some(offset),
                        _ => None,
                    },
                    Err(_) => None,
                };
            }
        }
    }
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
        self.verify_with_options(VerifyOptions::default(), progress)
            .await
    }

    /// [`Store::verify`] with options (repairing outboards) and a progress
    /// callback.
    pub async fn verify_with_options(
        &self,
        opts: VerifyOptions,
        progress: impl Fn(VerifyProgress),
    ) -> Result<VerifyReport> {
        self.check_open()?;
        let mut report = VerifyReport::default();
        let tiers = std::iter::once(Tier::Kv).chain(self.large().map(|_| Tier::Large));
        for tier in tiers {
            let mut keys = match tier {
                Tier::Kv => self.kv().list(),
                Tier::Large => self.large_engine()?.list(),
            };
            while let Some(key) = keys.try_next().await? {
                match check(self, tier, &key, opts.repair_outboards).await? {
                    Check::Ok(n, ob) => {
                        report.checked += 1;
                        report.bytes += n;
                        match ob {
                            Outboard::Good => {}
                            Outboard::Missing => report.outboards_missing += 1,
                            Outboard::Damaged => {
                                tracing::warn!(%key, "damaged outboard");
                                report.outboards_damaged += 1;
                            }
                        }
                        if ob != Outboard::Good && opts.repair_outboards {
                            report.outboards_repaired += 1;
                        }
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
