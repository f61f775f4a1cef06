//! The scrub: re-hash every entry of the pool and report what is wrong.

use std::sync::Arc;

use futures::TryStreamExt;
use tokio::io::AsyncReadExt;

use super::{Store, Tier};
use crate::backend::Backend;
use crate::{Key, Result};

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

async fn check(engine: &Arc<dyn Backend>, key: &Key) -> Result<Check> {
    let Some(recorded) = engine.size(key).await? else {
        return Ok(Check::Vanished);
    };
    let Some(mut reader) = engine.open_read(key).await? else {
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
    /// Re-hashes every entry of both tiers (streaming large ones) and checks
    /// that every root exists.
    pub async fn verify(&self) -> Result<VerifyReport> {
        self.verify_with(|_| {}).await
    }

    /// [`Store::verify`] with a progress callback.
    pub async fn verify_with(&self, progress: impl Fn(VerifyProgress)) -> Result<VerifyReport> {
        let mut report = VerifyReport::default();
        let tiers = std::iter::once((Tier::Kv, self.kv().clone()))
            .chain(self.large().map(|l| (Tier::Large, l.clone())));
        for (tier, engine) in tiers {
            let mut keys = engine.list();
            while let Some(key) = keys.try_next().await? {
                match check(&engine, &key).await? {
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
