//! Pins, sweeps, roots and liveness: the store's side of the arbiter seam.
//! Each method forwards to the store's [`Arbiter`](crate::arbiter::Arbiter).

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use super::Store;
use crate::arbiter::{
    LiveCheck, LiveSet, LivenessSource, PinGuard, StagedRow, SweepOptions, SweepReport,
};
use crate::backend::KeyStream;
use crate::{BoxError, Key, Result};

impl Store {
    /// Pins an existing key, failing with [`crate::Error::NotFound`] if it is
    /// absent or already collected. This — not [`Store::has`] — is the only
    /// safe way to start referencing content you did not just put.
    pub async fn pin(&self, key: &Key) -> Result<PinGuard> {
        self.check_open()?;
        self.inner.arbiter.pin_existing(&self.inner.pool, key).await
    }

    /// How many pins this instance holds on `key`.
    pub fn pin_count(&self, key: &Key) -> u32 {
        self.inner.arbiter.pin_count(key)
    }

    /// The pool's delete window.
    pub fn delete_window(&self) -> Duration {
        self.inner.arbiter.delete_window()
    }

    /// Registers (or replaces) a named liveness source.
    pub fn register_liveness(&self, name: &str, source: impl LivenessSource) -> Result<()> {
        self.inner.arbiter.register_liveness(name, Arc::new(source))
    }

    /// Registers a "set of live keys" source.
    pub fn register_live_set<F, Fut>(&self, name: &str, f: F) -> Result<()>
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<HashSet<Key>, BoxError>> + Send + 'static,
    {
        self.register_liveness(name, LiveSet::new(f))
    }

    /// Registers an "is this key live?" source.
    pub fn register_live_check<F, Fut>(&self, name: &str, f: F) -> Result<()>
    where
        F: Fn(Key) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<bool, BoxError>> + Send + 'static,
    {
        self.register_liveness(name, LiveCheck::new(f))
    }

    /// Removes a liveness source; true if it was registered.
    pub fn unregister_liveness(&self, name: &str) -> bool {
        self.inner.arbiter.unregister_liveness(name)
    }

    /// The registered liveness sources' names (including `roots`).
    pub fn liveness_sources(&self) -> Vec<String> {
        self.inner.arbiter.liveness_sources()
    }

    /// Runs a sweep. An abort (a failing source, another sweep running) is
    /// `Ok(report)` with [`SweepReport::aborted`] set; `Err` means the store
    /// itself failed.
    pub async fn sweep(&self, opts: SweepOptions) -> Result<SweepReport> {
        self.check_open()?;
        let span = tracing::info_span!("sweep", dry_run = opts.dry_run);
        async {
            let report = self.inner.arbiter.sweep(&self.inner.pool, opts).await?;
            tracing::info!(
                examined = report.examined,
                staged = report.staged,
                deleted = report.deleted,
                kept = report.kept,
                aborted = ?report.aborted,
                "sweep finished"
            );
            Ok(report)
        }
        .instrument(span)
        .await
    }

    /// Staged rows with key after `after`, ascending, at most `limit`.
    pub async fn staged(&self, after: Option<Key>, limit: usize) -> Result<Vec<StagedRow>> {
        self.check_open()?;
        self.inner.arbiter.staged(after, limit).await
    }

    /// Every staged candidate, ascending by key, streamed.
    pub fn staged_all(&self) -> futures::stream::BoxStream<'_, Result<StagedRow>> {
        if let Err(e) = self.check_open() {
            return Box::pin(futures::stream::once(async { Err(e) }));
        }
        let arbiter = self.inner.arbiter.clone();
        crate::pager::paged(
            4096,
            |r: &StagedRow| r.key,
            move |after| {
                let arbiter = arbiter.clone();
                async move { arbiter.staged(after, 4096).await }
            },
        )
    }

    /// Whether staged candidates survive a restart (true on sqlite).
    pub fn gc_durable(&self) -> bool {
        self.inner.arbiter.staged_durable()
    }

    /// Adds persistent roots: keys the `roots` liveness source reports
    /// live. Returns how many were new.
    pub async fn add_roots(&self, keys: &[Key]) -> Result<u64> {
        self.check_open()?;
        self.inner.arbiter.add_roots(keys).await
    }

    /// Removes roots. Returns how many were present.
    pub async fn remove_roots(&self, keys: &[Key]) -> Result<u64> {
        self.check_open()?;
        self.inner.arbiter.remove_roots(keys).await
    }

    /// Every root, ascending, streamed.
    pub fn roots(&self) -> KeyStream<'_> {
        if let Err(e) = self.check_open() {
            return Box::pin(futures::stream::once(async { Err(e) }));
        }
        let arbiter = self.inner.arbiter.clone();
        crate::pager::paged(
            4096,
            |k: &Key| *k,
            move |after| {
                let arbiter = arbiter.clone();
                async move { arbiter.roots(after, 4096).await }
            },
        )
    }
}
