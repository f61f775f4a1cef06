//! The store facade: tiers, verification and accounting over a pair of
//! engines, with every protection decision delegated to its
//! [`Arbiter`].
//!
//! A [`Store`] is cheap to clone (an `Arc`) and safe to share across tasks
//! and threads. Every operation carries a `tracing` span.
//!
//! The files, in the order a reader needs them:
//! - `builder.rs`: [`StoreBuilder`] and the configuration rules;
//! - `presets.rs`: whole-store constructors per topology ([`Store::open_dir`]);
//! - `put.rs`: every put path (pin before publish);
//! - `read.rs`: reads, with the one kv → large fall-through;
//! - `gc.rs`: pins, sweeps, roots and liveness, forwarded to the arbiter;
//! - `verify.rs`: verified reads and the scrub;
//! - `ranged.rs`: verified ranged reads through BLAKE3 outboards;
//! - `usage.rs`: pool accounting;
//! - the tier rule and the union listing are the foundation (`crate::tier`);
//! - `types.rs`: what operations return.

use std::sync::Arc;

use crate::arbiter::{Arbiter, Pool};
use crate::backend::{Backend, LargeBackend};
use crate::record::PoolRecord;
use crate::{Error, Result};

mod builder;
#[cfg(feature = "postgres")]
pub mod fleet;
mod gc;
#[cfg(feature = "postgres")]
pub mod postgres;
mod presets;
mod publication;
mod put;
mod ranged;
mod read;
mod types;
mod usage;
mod verify;

pub use crate::tier::Tier;
pub use builder::{DEFAULT_THRESHOLD, MAX_THRESHOLD, StoreBuilder};
pub use gc::{ExplainRow, Explanation};
pub use presets::DirOptions;
pub use ranged::RangeCheck;
pub use types::{EntryMeta, Put, PutInfo, PutMany, TierUsage, Usage};
pub use usage::Compacted;
pub use verify::{
    CorruptEntry, MalformedKey, MissingEntry, UncheckedSource, VerifyOptions, VerifyProgress,
    VerifyReport,
};

/// Chunk size of streaming puts and reads.
const CHUNK: usize = 1024 * 1024;

/// A cheap, shareable handle on a store.
#[derive(Clone, Debug)]
pub struct Store {
    inner: Arc<StoreInner>,
}

#[derive(Debug)]
struct StoreInner {
    pool: Pool,
    threshold: u64,
    arbiter: Arc<dyn Arbiter>,
    /// The pool's record of what must exist, where it keeps one.
    record: Option<Arc<dyn PoolRecord>>,
    /// Set by [`Store::close`]; every operation checks it first.
    closed: std::sync::atomic::AtomicBool,
}

impl Store {
    /// A builder.
    pub fn builder() -> StoreBuilder {
        StoreBuilder::default()
    }

    /// The kv threshold.
    pub fn threshold(&self) -> u64 {
        self.inner.threshold
    }

    /// The kv engine.
    pub fn kv(&self) -> &Arc<dyn Backend> {
        self.inner.pool.kv()
    }

    /// The large engine, if any.
    pub fn large(&self) -> Option<&Arc<dyn LargeBackend>> {
        self.inner.pool.large()
    }

    /// The engines as one pool (what the arbiter sweeps).
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// The pool's record of what must exist (a PostgreSQL pool's), if the
    /// store has one.
    pub fn record(&self) -> Option<&Arc<dyn PoolRecord>> {
        self.inner.record.as_ref()
    }

    /// Who decides what may be deleted.
    pub fn arbiter(&self) -> &Arc<dyn Arbiter> {
        &self.inner.arbiter
    }

    /// Finishes background work and closes the engines: the arbiter stops
    /// its tasks, SQLite checkpoints and removes its WAL, the instance locks
    /// are released. Operations on any clone of this store fail with
    /// [`Error::Closed`] afterwards. Dropping the last clone without closing
    /// does the same on a best-effort basis.
    pub async fn close(&self) -> Result<()> {
        self.inner
            .closed
            .store(true, std::sync::atomic::Ordering::Release);
        self.inner.arbiter.close().await?;
        for engine in self.inner.pool.engines() {
            engine.close().await?;
        }
        Ok(())
    }

    /// [`Error::Closed`] once [`Store::close`] ran.
    fn check_open(&self) -> Result<()> {
        if self.inner.closed.load(std::sync::atomic::Ordering::Acquire) {
            return Err(Error::Closed);
        }
        Ok(())
    }

    /// The tier a blob of `size` bytes goes to, or [`Error::TooLarge`] in
    /// kv-only mode.
    fn tier_checked(&self, size: u64) -> Result<Tier> {
        let tier = crate::tier::tier_for(size, self.inner.threshold);
        if tier == Tier::Large && self.inner.pool.large().is_none() {
            return Err(Error::TooLarge {
                size,
                threshold: self.inner.threshold,
            });
        }
        Ok(tier)
    }

    /// The large engine, or [`Error::TooLarge`]-style refusal when there is
    /// none (callers checked the tier first, so this is a guard, not a path).
    fn large_engine(&self) -> Result<&Arc<dyn LargeBackend>> {
        self.inner
            .pool
            .large()
            .ok_or_else(|| Error::Config("a large-tier operation on a kv-only store".into()))
    }
}

// A `Store` must stay shareable across tasks and threads.
const _: fn() = || {
    fn shareable<T: Send + Sync + Clone + 'static>() {}
    shareable::<Store>();
};
