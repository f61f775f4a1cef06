//! Pool accounting: entries and bytes per tier from aggregates or
//! `list` + `size`, never value loads.

use std::sync::Arc;

use super::{Store, TierUsage, Usage};
use crate::Result;
use crate::backend::{Backend, BackendExt};

async fn tier_usage(engine: Arc<dyn Backend>) -> Result<TierUsage> {
    let (entries, bytes) = engine.count_and_bytes().await?;
    Ok(TierUsage {
        engine: engine.to_string(),
        entries,
        bytes,
    })
}

impl Store {
    /// Entries and bytes per tier, and the arbiter's staged and root counts.
    pub async fn usage(&self) -> Result<Usage> {
        self.check_open()?;
        let kv = tier_usage(self.kv().clone()).await?;
        let large = match self.large() {
            Some(l) => Some(tier_usage(l.clone() as Arc<dyn Backend>).await?),
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
