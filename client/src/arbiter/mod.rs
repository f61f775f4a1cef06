//! Who may delete what: the one seam between storage and garbage collection.
//!
//! Engines ([`crate::backend`]) store bytes. An [`Arbiter`] owns everything
//! that decides whether a pool entry may be deleted: pins (taken before a
//! put publishes, released when the [`PinGuard`] drops), the staged delete
//! candidates and their window, persistent roots, liveness sources, and the
//! sweep that re-arbitrates candidates at execution time. The store calls
//! engines for bytes and the arbiter for every protection decision; it has
//! no `if fleet` anywhere.
//!
//! Implementations:
//! - [`single::SingleNodeArbiter`]: the in-process protocol (ADR-008 keeps
//!   it for one node and for single-instance PostgreSQL): pins in a map,
//!   staged rows durable in the embedded database when the preset provides
//!   one, sweeps under an in-process lock.
//! - A fleet arbiter (pin rows with a TTL renewed by a task, sweeps inside
//!   the PostgreSQL extension) implements the same trait; a store preset
//!   (`Store::open_fleet`, beside `Store::open_dir`) builds it.
//!
//! The invariant every implementation keeps: **a visible pool entry is never
//! deleted while liveness protects it, and an in-flight put is never
//! deleted by a sweep that started before it committed.**

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::backend::{Backend, KeyStream, LargeBackend};
use crate::tier::Tier;
use crate::{Key, Result};

#[cfg(feature = "postgres")]
pub mod fleet;
mod guard;
pub mod liveness;
pub mod report;
pub mod single;

pub use guard::{PinGuard, PinRelease};

/// The name under which an arbiter that keeps roots lists them among its
/// liveness sources ([`Registry::liveness_sources`]): part of the contract,
/// so that a store can tell the roots from the sources an embedder
/// registered.
pub const ROOTS_SOURCE: &str = "roots";
pub use liveness::{LiveCheck, LiveSet, LiveSnapshot, LivenessSource};
pub use report::{
    DEFAULT_WINDOW, GcAbortCause, SweepOptions, SweepPhase, SweepProgress, SweepReport,
};
pub use single::StagedRow;

/// How far an arbiter's decisions reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Pins and sweeps are known only to this process. Sound only when no
    /// other process writes or sweeps the pool: engines of
    /// [`crate::backend::Sharing::Process`], or an embedder's explicit
    /// single-instance declaration.
    Process,
    /// Pins and sweeps are arbitrated where every instance sharing the pool
    /// sees them (the fleet's database).
    Pool,
}

/// The pool an arbiter sweeps: the store's engines, with the union listing.
#[derive(Clone, Debug)]
pub struct Pool {
    kv: Arc<dyn Backend>,
    large: Option<Arc<dyn LargeBackend>>,
}

impl Pool {
    /// A pool over a kv engine and an optional large engine.
    pub fn new(kv: Arc<dyn Backend>, large: Option<Arc<dyn LargeBackend>>) -> Pool {
        Pool { kv, large }
    }

    /// The kv engine.
    pub fn kv(&self) -> &Arc<dyn Backend> {
        &self.kv
    }

    /// The large engine, if any.
    pub fn large(&self) -> Option<&Arc<dyn LargeBackend>> {
        self.large.as_ref()
    }

    /// Both engines (kv first) as plain backends.
    pub fn engines(&self) -> Vec<Arc<dyn Backend>> {
        let mut v = vec![self.kv.clone()];
        if let Some(l) = &self.large {
            v.push(l.clone() as Arc<dyn Backend>);
        }
        v
    }

    /// Every key of both tiers, ascending, each once, streamed.
    pub fn list(&self) -> KeyStream<'_> {
        match &self.large {
            Some(l) => crate::tier::merge_sorted(self.kv.list(), l.list()),
            None => self.kv.list(),
        }
    }
}

/// The store's pin and liveness counts for `Store::usage`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct GcUsage {
    /// Staged delete candidates.
    pub staged: u64,
    /// Persistent roots.
    pub roots: u64,
}

/// The optional ability of an arbiter that consults in-process state when
/// it sweeps: persistent roots and named liveness callbacks
/// ([`Arbiter::registry`]). Every arbiter has the protection protocol
/// ([`Arbiter`]); only some have a registry.
#[async_trait]
pub trait Registry: Send + Sync {
    /// Adds persistent roots. Returns how many were new.
    async fn add_roots(&self, keys: &[Key]) -> Result<u64>;

    /// Removes persistent roots. Returns how many were present.
    async fn remove_roots(&self, keys: &[Key]) -> Result<u64>;

    /// Roots with key after `after`, ascending, at most `limit`.
    async fn roots(&self, after: Option<Key>, limit: usize) -> Result<Vec<Key>>;

    /// Registers (or replaces) a named liveness source.
    fn register_liveness(&self, name: &str, source: Arc<dyn LivenessSource>) -> Result<()>;

    /// Removes a liveness source; true if it was registered.
    fn unregister_liveness(&self, name: &str) -> bool;

    /// The registered liveness sources' names (the roots among them, as
    /// [`ROOTS_SOURCE`]).
    fn liveness_sources(&self) -> Vec<String>;
}

/// Decides who may delete what; see the module docs.
///
/// # Contract
/// - **Pin before publish.** The store calls [`Arbiter::pin`] before an
///   engine makes content visible and [`Arbiter::published`] after; from
///   the moment `pin` returns until the guard drops, no sweep deletes the
///   key. `pin` waits (or fails) while a delete of the key is in flight —
///   it never returns a guard on an entry that is disappearing.
/// - **Deletes re-arbitrate at execution.** A sweep deletes a staged
///   candidate only after re-checking pins and liveness at that moment;
///   an abort (a failing source, another sweeper) is report data
///   ([`SweepReport::aborted`]), never a partial delete of protected keys.
/// - **The window is the arbiter's.** [`Arbiter::delete_window`] is the one
///   the store, the CLI and any operator tool apply.
/// - **Scope is declared** ([`Arbiter::scope`]); the store builder refuses an
///   in-process arbiter over engines other processes can reach.
#[async_trait]
pub trait Arbiter: Send + Sync + fmt::Debug {
    /// A short name for reports and errors, e.g. `"single-node"`.
    fn name(&self) -> &str;

    /// How far its pins and sweeps reach.
    fn scope(&self) -> Scope;

    /// Pins `keys` before an engine of `tier` publishes their content.
    /// Waits while any of them is being deleted. (The tier matters to a
    /// fleet over a shared `local` tier, whose file pins commit in the
    /// database before the file is renamed into place; kv and `pg-lo` puts
    /// commit their pin rows with their entries.)
    async fn pin(&self, tier: Tier, keys: &[Key]) -> Result<PinGuard>;

    /// Pins an existing key: [`crate::Error::NotFound`] if the pool does not
    /// hold it (or it was collected before the pin took).
    async fn pin_existing(&self, pool: &Pool, key: &Key) -> Result<PinGuard>;

    /// Checks that this instance's pins on `keys` still protect them, before
    /// the store publishes under them or a holder relies on them:
    /// [`crate::Error::PinExpired`] for a pin that lapsed (a fleet instance
    /// that stalled past the pool's pin TTL). In-process pins cannot lapse.
    async fn confirm(&self, keys: &[Key]) -> Result<()> {
        let _ = keys;
        Ok(())
    }

    /// Called right before an engine of `tier` publishes `keys` under the
    /// pins [`Arbiter::pin`] took: an arbiter whose pins can lapse fails
    /// with [`crate::Error::PinExpired`] instead of letting the store
    /// publish under a lapsed pin (a fleet's shared `local` tier, whose pin
    /// rows commit before the file is renamed into place).
    async fn before_publish(&self, tier: Tier, keys: &[Key]) -> Result<()> {
        let _ = (tier, keys);
        Ok(())
    }

    /// Called after an engine of `tier` published `keys` (new or already
    /// present): a put restarts each key's delete window.
    async fn published(&self, tier: Tier, keys: &[Key]) -> Result<()>;

    /// How many pins this store instance holds on `key`.
    fn pin_count(&self, key: &Key) -> u32;

    /// Runs one sweep of `pool`.
    async fn sweep(&self, pool: &Pool, opts: SweepOptions) -> Result<SweepReport>;

    /// Staged candidates with key after `after`, ascending, at most `limit`.
    async fn staged(&self, after: Option<Key>, limit: usize) -> Result<Vec<StagedRow>>;

    /// Whether staged candidates survive a restart.
    fn staged_durable(&self) -> bool;

    /// The pool's delete window.
    fn delete_window(&self) -> Duration;

    /// Staged and root counts.
    async fn usage(&self) -> Result<GcUsage>;

    /// The arbiter's registry of persistent roots and named liveness
    /// callbacks, if it has one (an in-process arbiter). An arbiter whose
    /// sweeps run elsewhere (a fleet's, in the database) has none: it
    /// protects through registered liveness tables instead.
    fn registry(&self) -> Option<&dyn Registry> {
        None
    }

    /// The error for a registry call (`what`: "roots" or a liveness
    /// source's name) to an arbiter that has no registry, saying what to do
    /// instead.
    fn no_registry(&self, what: &str) -> crate::Error {
        crate::Error::Config(format!(
            "the {} arbiter keeps no in-process roots or liveness sources ({what:?})",
            self.name()
        ))
    }

    /// What the arbiter's own authority says about `key` (the fleet's
    /// database: `alkblobs_explain`'s aspect/detail rows, pins by owner with
    /// their expiry, liveness tables, the verdict). Empty for an in-process
    /// arbiter, whose state `Store::explain` reads directly.
    async fn explain(&self, key: &Key) -> Result<Vec<(String, String)>> {
        let _ = key;
        Ok(Vec::new())
    }

    /// Stops background work (renewal tasks) and releases resources.
    async fn close(&self) -> Result<()>;
}
