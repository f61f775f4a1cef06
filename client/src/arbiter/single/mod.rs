//! The single-node arbiter: the in-process protocol for one writing
//! instance of a pool (ADR-008 keeps it for embedded stores and for
//! single-instance PostgreSQL).
//!
//! - [`pins`](self): reference-counted pins, the touched set and delete
//!   claims behind one mutex — every decision that can delete a key is taken
//!   holding it.
//! - [`GcTables`]: staged candidates and roots; durable rows in the embedded
//!   database ([`SqliteTables`]) or in process ([`MemGcTables`]).
//! - the sweep: mark, stage, execute with re-arbitration.
//! - the liveness registry (`roots` plus the embedder's sources).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{
    Arbiter, GcUsage, LivenessSource, PinGuard, Pool, Registry, Scope, SweepOptions, SweepReport,
};
use crate::tier::Tier;
use crate::{Error, Key, Result};

#[cfg(feature = "postgres")]
mod pg_tables;
mod pins;
mod sources;
mod sqlite_tables;
mod sweep;
mod tables;

#[cfg(feature = "postgres")]
pub use pg_tables::PgGcTables;
pub use sources::ROOTS_SOURCE;
pub use sqlite_tables::SqliteTables;
pub use tables::{GcTables, MemGcTables, StagedRow};

use pins::PinMap;
use sources::Sources;

/// The in-process arbiter; see the module docs.
pub struct SingleNodeArbiter {
    pins: Arc<PinMap>,
    tables: Arc<dyn GcTables>,
    sources: Sources,
    sweeper: tokio::sync::Mutex<()>,
    window: Duration,
    /// Whether the kv engine deletes a key's staged row inside its own put
    /// transaction (the preset attached [`SqliteTables`] of the kv engine's
    /// database); otherwise [`Arbiter::published`] unstages.
    kv_clears_staged: bool,
}

impl fmt::Debug for SingleNodeArbiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SingleNodeArbiter")
            .field("tables", &self.tables)
            .field("sources", &self.sources.source_names())
            .field("window", &self.window)
            .finish()
    }
}

impl SingleNodeArbiter {
    /// Staged rows and roots in process: a sweep waits its window out inline
    /// and a restart forgets both.
    pub fn in_memory(window: Duration) -> SingleNodeArbiter {
        SingleNodeArbiter::with_tables(Arc::new(MemGcTables::default()), window)
    }

    /// Staged rows and roots in `tables`, which the kv engine does not
    /// clear on put (the arbiter unstages re-put keys itself).
    pub fn with_tables(tables: Arc<dyn GcTables>, window: Duration) -> SingleNodeArbiter {
        SingleNodeArbiter {
            pins: Arc::new(PinMap::default()),
            sources: Sources::new(tables.clone()),
            tables,
            sweeper: tokio::sync::Mutex::new(()),
            window,
            kv_clears_staged: false,
        }
    }

    /// Staged rows and roots durable in the kv engine's own SQLite database:
    /// the engine clears a re-put key's staged row in its put transaction,
    /// so [`Arbiter::published`] skips kv keys. Sound only when `kv_engine`
    /// *is* the store's kv engine, which is why only the builder (its
    /// `sqlite` pairing) may call it. [`SingleNodeArbiter::with_tables`] over
    /// [`SqliteTables`] is the public form: durable, and it unstages itself.
    pub(crate) fn sqlite(
        kv_engine: &crate::backend::sqlite::SqliteBackend,
        window: Duration,
    ) -> crate::Result<Self> {
        let mut arb =
            SingleNodeArbiter::with_tables(Arc::new(SqliteTables::attach(kv_engine)?), window);
        arb.kv_clears_staged = true;
        Ok(arb)
    }
}

#[async_trait]
impl Arbiter for SingleNodeArbiter {
    fn name(&self) -> &str {
        "single-node"
    }

    fn scope(&self) -> Scope {
        Scope::Process
    }

    async fn pin(&self, _tier: Tier, keys: &[Key]) -> Result<PinGuard> {
        Ok(self.pins.acquire(keys).await)
    }

    async fn pin_existing(&self, pool: &Pool, key: &Key) -> Result<PinGuard> {
        let guard = self.pins.acquire(&[*key]).await;
        // The pin is held, so from here the key cannot be deleted; a delete
        // that was in flight finished before `acquire` returned.
        for engine in pool.engines() {
            if engine.has(key).await? {
                return Ok(guard);
            }
        }
        Err(Error::NotFound { key: *key })
    }

    async fn published(&self, tier: Tier, keys: &[Key]) -> Result<()> {
        if tier == Tier::Kv && self.kv_clears_staged {
            return Ok(());
        }
        self.tables.unstage(keys).await.map(|_| ())
    }

    fn pin_count(&self, key: &Key) -> u32 {
        self.pins.count(key)
    }

    async fn sweep(&self, pool: &Pool, opts: SweepOptions) -> Result<SweepReport> {
        sweep::sweep(self, pool, opts).await
    }

    async fn staged(&self, after: Option<Key>, limit: usize) -> Result<Vec<StagedRow>> {
        self.tables.staged(after, limit).await
    }

    fn staged_durable(&self) -> bool {
        self.tables.durable()
    }

    fn delete_window(&self) -> Duration {
        self.window
    }

    async fn usage(&self) -> Result<GcUsage> {
        use futures::TryStreamExt;
        let tables = self.tables.clone();
        let staged = crate::pager::paged(
            4096,
            |r: &StagedRow| r.key,
            move |after| {
                let tables = tables.clone();
                async move { tables.staged(after, 4096).await }
            },
        )
        .try_fold(0u64, |n, _| async move { Ok(n + 1) })
        .await?;
        let tables = self.tables.clone();
        let roots = crate::pager::paged(
            4096,
            |k: &Key| *k,
            move |after| {
                let tables = tables.clone();
                async move { tables.roots(after, 4096).await }
            },
        )
        .try_fold(0u64, |n, _| async move { Ok(n + 1) })
        .await?;
        Ok(GcUsage { staged, roots })
    }

    fn registry(&self) -> Option<&dyn Registry> {
        Some(self)
    }

    async fn close(&self) -> Result<()> {
        Ok(())
    }
}

#[async_trait]
impl Registry for SingleNodeArbiter {
    async fn add_roots(&self, keys: &[Key]) -> Result<u64> {
        self.tables.add_roots(keys).await
    }

    async fn remove_roots(&self, keys: &[Key]) -> Result<u64> {
        self.tables.remove_roots(keys).await
    }

    async fn roots(&self, after: Option<Key>, limit: usize) -> Result<Vec<Key>> {
        self.tables.roots(after, limit).await
    }

    fn register_liveness(&self, name: &str, source: Arc<dyn LivenessSource>) -> Result<()> {
        self.sources.register(name, source)
    }

    fn unregister_liveness(&self, name: &str) -> bool {
        self.sources.unregister(name)
    }

    fn liveness_sources(&self) -> Vec<String> {
        self.sources.source_names()
    }
}
