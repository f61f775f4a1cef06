//! The store builder: engines, the kv threshold, and the arbiter, with the
//! configuration rules checked once at `build`.

use std::sync::Arc;
use std::time::Duration;

use super::{Store, StoreInner};
use crate::arbiter::single::SingleNodeArbiter;
use crate::arbiter::{Arbiter, DEFAULT_WINDOW, Pool, Scope};
use crate::backend::sqlite::SqliteBackend;
use crate::backend::{Backend, LargeBackend, Sharing};
use crate::record::PoolRecord;
use crate::{Error, Result};

/// The default kv threshold: blobs up to this size live in the kv engine.
///
/// Chosen from `benches/benches/threshold.rs` on this project's reference
/// machine (see `docs/benchmarks.md`): sqlite reads stay ahead of `local`
/// file reads up to about this size, and the per-file cost of the large tier
/// (a staging file, two fsyncs, a directory entry) dominates below it.
pub const DEFAULT_THRESHOLD: u64 = 64 * 1024;

/// The largest threshold a store accepts: kv values are loaded whole.
pub const MAX_THRESHOLD: u64 = 64 * 1024 * 1024;

/// Which arbiter `build` makes when none is given.
#[derive(Debug)]
enum ArbiterChoice {
    /// The single-node arbiter with in-process tables.
    InMemory,
    /// The single-node arbiter with durable tables in the kv engine's own
    /// SQLite database (set by [`StoreBuilder::sqlite`]).
    Sqlite(SqliteBackend),
    /// The embedder's own.
    Given(Arc<dyn Arbiter>),
}

/// Builds a [`Store`] from engines.
///
/// ```no_run
/// # async fn f() -> alkblobs::Result<()> {
/// use alkblobs::backend::mem::MemBackend;
/// let store = alkblobs::Store::builder()
///     .kv(MemBackend::new())
///     .large(MemBackend::new())
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct StoreBuilder {
    kv: Option<Arc<dyn Backend>>,
    large: Option<Arc<dyn LargeBackend>>,
    kv_only: bool,
    threshold: u64,
    window: Duration,
    arbiter: ArbiterChoice,
    single_instance: bool,
    record: Option<Arc<dyn PoolRecord>>,
}

impl Default for StoreBuilder {
    fn default() -> Self {
        StoreBuilder {
            kv: None,
            large: None,
            kv_only: false,
            threshold: DEFAULT_THRESHOLD,
            window: DEFAULT_WINDOW,
            arbiter: ArbiterChoice::InMemory,
            single_instance: false,
            record: None,
        }
    }
}

impl StoreBuilder {
    /// The kv engine (required). Pass an `Arc` to share an engine value.
    ///
    /// An engine with a SQLite database ([`Backend::sqlite_database`]: a
    /// [`SqliteBackend`], also behind `Arc` or `Box`) is paired with its
    /// database's durable tables exactly as [`StoreBuilder::sqlite`] does;
    /// any other engine leaves the single-node arbiter's staged candidates
    /// and roots in process (or in the tables of an arbiter given with
    /// [`StoreBuilder::arbiter`]).
    pub fn kv(mut self, engine: impl Backend + 'static) -> Self {
        if let Some(db) = engine.sqlite_database() {
            let db = db.clone();
            self.kv = Some(Arc::new(engine));
            self.arbiter = ArbiterChoice::Sqlite(db);
            return self;
        }
        self.kv = Some(Arc::new(engine));
        if matches!(self.arbiter, ArbiterChoice::Sqlite(_)) {
            self.arbiter = ArbiterChoice::InMemory;
        }
        self
    }

    /// A SQLite kv engine whose database also hosts the single-node
    /// arbiter's durable tables (staged candidates survive a restart; a put
    /// clears its key's staged row in its own transaction). The pairing the
    /// embedded default uses.
    pub fn sqlite(mut self, engine: SqliteBackend) -> Self {
        self.kv = Some(Arc::new(engine.clone()));
        self.arbiter = ArbiterChoice::Sqlite(engine);
        self
    }

    /// The large engine.
    pub fn large(mut self, engine: impl LargeBackend + 'static) -> Self {
        self.large = Some(Arc::new(engine));
        self
    }

    /// Declares kv-only mode: no large tier; over-threshold puts are refused
    /// with [`Error::TooLarge`].
    pub fn kv_only(mut self) -> Self {
        self.kv_only = true;
        self
    }

    /// The kv threshold in bytes (default [`DEFAULT_THRESHOLD`]).
    pub fn threshold(mut self, bytes: u64) -> Self {
        self.threshold = bytes;
        self
    }

    /// The delete window of the single-node arbiter (default 5 minutes).
    /// An arbiter given with [`StoreBuilder::arbiter`] has its own.
    pub fn delete_window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Decides who may delete what with `arbiter` instead of the
    /// single-node one (the fleet preset passes the fleet arbiter here).
    pub fn arbiter(mut self, arbiter: Arc<dyn Arbiter>) -> Self {
        self.arbiter = ArbiterChoice::Given(arbiter);
        self
    }

    /// Declares that this store is the only instance writing and sweeping
    /// its pool, even though an engine is reachable by others (REQ-3: one
    /// instance with PostgreSQL as its database). Without it, the builder
    /// refuses to sweep a shared engine with an in-process arbiter.
    pub fn single_instance(mut self) -> Self {
        self.single_instance = true;
        self
    }

    /// The pool's record of what must exist, which `verify` walks instead
    /// of the tiers' listings and reads consult before calling a missing
    /// key absent (a PostgreSQL pool's presets pass it; an embedded store
    /// has none).
    pub fn record(mut self, record: Arc<dyn PoolRecord>) -> Self {
        self.record = Some(record);
        self
    }

    /// Checks the configuration and builds the store.
    pub fn build(self) -> Result<Store> {
        let kv = self
            .kv
            .ok_or_else(|| Error::Config("a store needs a kv engine: call .kv(engine)".into()))?;
        match (&self.large, self.kv_only) {
            (None, false) => {
                return Err(Error::Config(
                    "no large tier configured: call .large(engine), or .kv_only() to refuse blobs over the threshold".into(),
                ));
            }
            (Some(_), true) => {
                return Err(Error::Config(
                    "kv-only mode was declared but a large engine was also given; pick one".into(),
                ));
            }
            _ => {}
        }
        if self.threshold > MAX_THRESHOLD {
            return Err(Error::Config(format!(
                "threshold {} is over the maximum of {MAX_THRESHOLD} bytes: kv values are loaded whole",
                self.threshold
            )));
        }
        let arbiter: Arc<dyn Arbiter> = match self.arbiter {
            ArbiterChoice::InMemory => Arc::new(SingleNodeArbiter::in_memory(self.window)),
            ArbiterChoice::Sqlite(db) => Arc::new(SingleNodeArbiter::sqlite(&db, self.window)?),
            ArbiterChoice::Given(a) => a,
        };
        let pool = Pool::new(kv, self.large);
        check_scope(&pool, arbiter.as_ref(), self.single_instance)?;
        Ok(Store {
            inner: Arc::new(StoreInner {
                pool,
                threshold: self.threshold,
                arbiter,
                record: self.record,
                closed: std::sync::atomic::AtomicBool::new(false),
            }),
        })
    }
}

/// The rule of ADR-008 §2: an in-process arbiter sees only this process's
/// pins, so it may sweep an engine other instances can reach only when the
/// embedder declared this store the single instance of its pool.
fn check_scope(pool: &Pool, arbiter: &dyn Arbiter, single_instance: bool) -> Result<()> {
    if arbiter.scope() == Scope::Pool || single_instance {
        return Ok(());
    }
    if let Some(shared) = pool
        .engines()
        .into_iter()
        .find(|e| e.sharing() == Sharing::Shared)
    {
        return Err(Error::UnsafeTopology {
            engine: shared.to_string(),
            arbiter: arbiter.name().to_owned(),
        });
    }
    Ok(())
}
