//! Pins, sweeps, roots and liveness: the store's side of the arbiter seam.
//! Each method forwards to the store's [`Arbiter`](crate::arbiter::Arbiter).

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use super::EntryMeta;
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

    /// Checks that `guard`'s pins still protect their keys. Always true for
    /// in-process pins; a fleet instance that stalled past the pool's pin
    /// TTL (its renewal could not run) gets [`crate::Error::PinExpired`]
    /// for a lapsed pin: nothing protected the key since, so put the
    /// content again before referencing it. Costs a round trip only when
    /// the last renewal is older than half the TTL.
    pub async fn confirm(&self, guard: &PinGuard) -> Result<()> {
        self.check_open()?;
        self.inner.arbiter.confirm(guard.keys()).await
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
        self.registry(name)?
            .register_liveness(name, Arc::new(source))
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
        self.inner
            .arbiter
            .registry()
            .is_some_and(|r| r.unregister_liveness(name))
    }

    /// The registered liveness sources' names (including `roots`).
    pub fn liveness_sources(&self) -> Vec<String> {
        self.inner
            .arbiter
            .registry()
            .map(|r| r.liveness_sources())
            .unwrap_or_default()
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
        self.registry("roots")?.add_roots(keys).await
    }

    /// Removes roots. Returns how many were present.
    pub async fn remove_roots(&self, keys: &[Key]) -> Result<u64> {
        self.check_open()?;
        self.registry("roots")?.remove_roots(keys).await
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
                async move {
                    match arbiter.registry() {
                        Some(r) => r.roots(after, 4096).await,
                        None => Ok(Vec::new()),
                    }
                }
            },
        )
    }
}

/// Why a key is or is not live, as far as this store can tell
/// ([`Store::explain`]).
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct Explanation {
    /// The key.
    pub key: Key,
    /// The entry, if the pool holds it.
    pub entry: Option<EntryMeta>,
    /// Pins this process holds on it (other processes' pins are not seen
    /// by a single-node store).
    pub pins_here: u32,
    /// Whether it is a persistent root.
    pub root: bool,
    /// Its staged row, if a sweep staged it.
    pub staged: Option<StagedRow>,
    /// Liveness sources registered in this process, other than the roots
    /// (each may protect it; they answer during a sweep).
    pub liveness_sources: Vec<String>,
    /// The delete window this store applies.
    pub window_secs: f64,
    /// What the fleet's database says (`alkblobs_explain`: the entry, each
    /// pin by owner with its expiry, liveness tables, staging, verdict);
    /// empty for a single-node store.
    pub database: Vec<ExplainRow>,
    /// One line: live and why, or what a sweep will do.
    pub verdict: String,
    /// Set when the pool records the key but its content is gone (what
    /// [`crate::Error::Lost`] says): an integrity failure.
    pub lost: Option<String>,
}

/// One line of the database's explanation of a key.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ExplainRow {
    /// What it is about: `entry`, `pin`, `liveness`, `staged`, `verdict`, …
    pub aspect: String,
    /// What the database says.
    pub detail: String,
}

/// The largest key before `key`, for "first row at or after `key`" lookups.
fn predecessor(key: &Key) -> Option<Key> {
    let mut b = *key.as_bytes();
    for i in (0..b.len()).rev() {
        if b[i] > 0 {
            b[i] -= 1;
            for x in b.iter_mut().skip(i + 1) {
                *x = 0xff;
            }
            return Some(Key::from_bytes(b));
        }
    }
    None
}

impl Store {
    /// Why `key` is or is not live: the entry, pins held here, roots,
    /// staged row and window, the registered liveness sources, and a
    /// verdict. Like `has`, a snapshot that may change the moment it
    /// returns.
    pub async fn explain(&self, key: &Key) -> Result<Explanation> {
        self.check_open()?;
        let arbiter = &self.inner.arbiter;
        // A lost key (recorded, content gone) is explained, not an error.
        let (entry, lost) = match self.stat(key).await {
            Ok(e) => (e, None),
            Err(e @ crate::Error::Lost { .. }) => (None, Some(e.to_string())),
            Err(e) => return Err(e),
        };
        let pins_here = arbiter.pin_count(key);
        let after = predecessor(key);
        let root = match arbiter.registry() {
            Some(r) => r.roots(after, 1).await?.first() == Some(key),
            None => false,
        };
        let staged = arbiter
            .staged(after, 1)
            .await?
            .into_iter()
            .find(|r| r.key == *key);
        let liveness_sources: Vec<String> = arbiter
            .registry()
            .map(|r| r.liveness_sources())
            .unwrap_or_default()
            .into_iter()
            .filter(|s| s != crate::arbiter::ROOTS_SOURCE)
            .collect();
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        let database = arbiter.explain(key).await?;
        let db_verdict = database
            .iter()
            .find(|(aspect, _)| aspect == "verdict")
            .map(|(_, d)| d.clone());
        let verdict = match (&entry, pins_here > 0, root, &staged) {
            _ if lost.is_some() => format!(
                "LOST: the pool records it but its content is gone{}; put the original bytes again to restore it",
                match (&db_verdict, root) {
                    (Some(v), _) if v.starts_with("live") => format!(" ({v})"),
                    (_, true) => " (a root)".to_owned(),
                    _ => String::new(),
                }
            ),
            _ if db_verdict.is_some() => db_verdict.unwrap_or_default(),
            (None, _, _, _) => "not in the pool: put the content to (re)create it".to_string(),
            (Some(_), true, _, _) => format!("live: pinned by this process ({pins_here} pin(s))"),
            (Some(_), false, true, _) => "live: a root".to_string(),
            (Some(_), false, false, Some(r)) => match r.visible_after_ms {
                None => "not live unless a liveness source says so: staged by a sweep still marking".into(),
                Some(v) if v <= now_ms => "not live unless a liveness source says so: staged and due; the next sweep deletes it".into(),
                Some(v) => format!(
                    "not live unless a liveness source says so: staged, due in {}s",
                    (v - now_ms + 999) / 1000
                ),
            },
            (Some(_), false, false, None) if !liveness_sources.is_empty() => format!(
                "live only if a liveness source ({}) holds it; otherwise the next sweep stages it",
                liveness_sources.join(", ")
            ),
            (Some(_), false, false, None) => "not live: the next sweep stages it for deletion".into(),
        };
        Ok(Explanation {
            key: *key,
            entry,
            pins_here,
            root,
            staged,
            liveness_sources,
            window_secs: arbiter.delete_window().as_secs_f64(),
            database: database
                .into_iter()
                .map(|(aspect, detail)| ExplainRow { aspect, detail })
                .collect(),
            verdict,
            lost,
        })
    }
}

impl Store {
    /// The arbiter's registry (roots, liveness callbacks), or the error
    /// its arbiter gives for `what` when it has none.
    fn registry(&self, what: &str) -> Result<&dyn crate::arbiter::Registry> {
        self.inner
            .arbiter
            .registry()
            .ok_or_else(|| self.inner.arbiter.no_registry(what))
    }
}
