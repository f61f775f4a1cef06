//! Pool accounting: entries and bytes per tier from aggregates or
//! `list` + `size`, never value loads; the large tier's outboards when its
//! engine can tell.

use std::sync::Arc;

use super::{Store, TierUsage, Usage};
use crate::Result;
use crate::backend::{Backend, BackendExt};

async fn tier_usage(engine: Arc<dyn Backend>, outboard_bytes: Option<u64>) -> Result<TierUsage> {
    let (entries, bytes) = engine.count_and_bytes().await?;
    Ok(TierUsage {
        engine: engine.to_string(),
        entries,
        bytes,
        outboard_bytes,
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
}
