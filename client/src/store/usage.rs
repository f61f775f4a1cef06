//! Pool accounting: entries and bytes per tier from aggregates or
//! `list` + `size`, never value loads; the large tier's outboards when its
//! engine can tell.

use std::sync::Arc;

use super::{Store, TierUsage, Usage};
use crate::Result;
use crate::backend::{Backend, BackendExt, DiskSpace};

async fn tier_usage(engine: Arc<dyn Backend>, outboard_bytes: Option<u64>) -> Result<TierUsage> {
    let (entries, bytes) = engine.count_and_bytes().await?;
    let disk = engine.disk_space().await?;
    Ok(TierUsage {
        engine: engine.to_string(),
        entries,
        bytes,
        outboard_bytes,
        disk,
    })
}

impl Store {
    /// Entries and bytes per tier, and the arbiter's staged and root counts.
    pub async fn usage(&self) -> Result<Usage> {
        self.check_open()?;
        let kv = tier_usage(self.kv().clone(), None).await?;
        let large = match self.large() {
            Some(l) => {
                let ob = l.outboard_usage().await?;
                Some(tier_usage(l.clone() as Arc<dyn Backend>, ob).await?)
            }
            None => None,
        };
        let gc = self.inner.arbiter.usage().await?;
        Ok(Usage {
            kv,
            large,
            staged: gc.staged,
            roots: gc.roots,
        })
    }

    /// Gives the space deleted entries left back to the filesystem, in
    /// every engine that keeps files of its own ([`Backend::compact`]: the
    /// embedded store's SQLite database); returns each compacted engine
    /// with its space before and after. Writes wait meanwhile.
    pub async fn compact(&self) -> Result<Vec<Compacted>> {
        self.check_open()?;
        let mut engines: Vec<Arc<dyn Backend>> = vec![self.kv().clone()];
        if let Some(l) = self.large() {
            engines.push(l.clone() as Arc<dyn Backend>);
        }
        let mut out = Vec::new();
        for e in engines {
            if let Some((before, after)) = e.compact().await? {
                out.push(Compacted {
                    engine: e.to_string(),
                    before,
                    after,
                });
            }
        }
        Ok(out)
    }
}

/// One engine compacted by [`Store::compact`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Compacted {
    /// The engine's display name.
    pub engine: String,
    /// Its space before.
    pub before: DiskSpace,
    /// And after.
    pub after: DiskSpace,
}
