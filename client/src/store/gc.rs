//! Single-node garbage collection: liveness sources, the sweep, its report.
//!
//! The invariant: **a visible pool entry is never deleted while liveness
//! protects it, and an in-flight put is never deleted by a sweep that started
//! before it committed.** A sweep runs in three steps:
//!
//! 1. **Mark.** Enumerate the pool (both tiers, keys only). A key that is
//!    pinned, touched since the sweep began, or live in any source is kept;
//!    the rest are candidates.
//! 2. **Stage.** Candidates are written to the staged table, unsealed; when
//!    the mark ends they are sealed with `visible_after = mark_end + window`.
//! 3. **Execute.** Every staged row due by the end of the mark (or, with an
//!    inline window, by the end of the window) is re-arbitrated *now*:
//!    against pins, against keys touched during this sweep, and against a
//!    snapshot of every liveness source taken when execution starts; then
//!    the survivors of that check are claimed under the arbitration lock and
//!    deleted.
//!
//! `docs/design.md` argues why each step is needed and what race each guard
//! closes.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use futures::future::BoxFuture;
use futures::{StreamExt, TryStreamExt};

use super::StoreInner;
use super::pins::PinMap;
use crate::backend::{Backend, GcTables};
use crate::{BoxError, Key, Result};

/// Keys arbitrated per batch during the mark.
const BATCH: usize = 4096;

/// Staged rows executed per batch: one claim and one delete transaction.
/// Large, because a SQL engine's delete cost is dominated by the pages each
/// transaction rewrites; a pin of a claimed key waits for one batch.
const EXEC_BATCH: usize = 16384;

/// The default delete window.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(5 * 60);

/// The name of the built-in liveness source backed by the store's roots.
pub const ROOTS_SOURCE: &str = "roots";

/// A source of liveness: the embedder's answer to "which keys are live".
///
/// # Contract
/// A snapshot must reflect every liveness record the embedder made before
/// [`LivenessSource::snapshot`] was called. It may be newer. A failure (or a
/// timeout, see [`SweepOptions::source_timeout`]) aborts the sweep with
/// nothing deleted from that point on, reported as
/// [`GcAbortCause::ProtectionSource`].
#[async_trait]
pub trait LivenessSource: Send + Sync + 'static {
    /// Opens a view of the live set for one phase of a sweep.
    async fn snapshot(&self) -> Result<Box<dyn LiveSnapshot>, BoxError>;
}

/// One phase's view of a liveness source.
#[async_trait]
pub trait LiveSnapshot: Send + Sync {
    /// For each key, whether it is live.
    async fn contains(&self, keys: &[Key]) -> Result<Vec<bool>, BoxError>;
}

/// A liveness source given as "the set of live keys": the closure is called
/// once per sweep phase.
pub struct LiveSet<F> {
    f: F,
}

impl<F, Fut> LiveSet<F>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<HashSet<Key>, BoxError>> + Send + 'static,
{
    /// Wraps a closure returning the live set.
    pub fn new(f: F) -> LiveSet<F> {
        LiveSet { f }
    }
}

struct SetSnapshot(HashSet<Key>);

#[async_trait]
impl LiveSnapshot for SetSnapshot {
    async fn contains(&self, keys: &[Key]) -> Result<Vec<bool>, BoxError> {
        Ok(keys.iter().map(|k| self.0.contains(k)).collect())
    }
}

#[async_trait]
impl<F, Fut> LivenessSource for LiveSet<F>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<HashSet<Key>, BoxError>> + Send + 'static,
{
    async fn snapshot(&self) -> Result<Box<dyn LiveSnapshot>, BoxError> {
        Ok(Box::new(SetSnapshot((self.f)().await?)))
    }
}

/// A liveness source given as "is this key live?": called per key (up to 16
/// at a time).
pub struct LiveCheck<F> {
    f: Arc<F>,
}

impl<F, Fut> LiveCheck<F>
where
    F: Fn(Key) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<bool, BoxError>> + Send + 'static,
{
    /// Wraps a per-key predicate.
    pub fn new(f: F) -> LiveCheck<F> {
        LiveCheck { f: Arc::new(f) }
    }
}

struct CheckSnapshot<F>(Arc<F>);

#[async_trait]
impl<F, Fut> LiveSnapshot for CheckSnapshot<F>
where
    F: Fn(Key) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<bool, BoxError>> + Send + 'static,
{
    async fn contains(&self, keys: &[Key]) -> Result<Vec<bool>, BoxError> {
        let f = &self.0;
        // Owned keys: a closure over `&Key` would need a higher-ranked
        // lifetime the async-trait future cannot name.
        let owned: Vec<Key> = keys.to_vec();
        futures::stream::iter(owned.into_iter().map(|k| (**f)(k)))
            .buffered(16)
            .try_collect()
            .await
    }
}

#[async_trait]
impl<F, Fut> LivenessSource for LiveCheck<F>
where
    F: Fn(Key) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<bool, BoxError>> + Send + 'static,
{
    async fn snapshot(&self) -> Result<Box<dyn LiveSnapshot>, BoxError> {
        Ok(Box::new(CheckSnapshot(self.f.clone())))
    }
}

/// The store's persistent roots as a liveness source.
struct RootsSource(Arc<dyn GcTables>);

struct RootsSnapshot(Arc<dyn GcTables>);

#[async_trait]
impl LivenessSource for RootsSource {
    async fn snapshot(&self) -> Result<Box<dyn LiveSnapshot>, BoxError> {
        Ok(Box::new(RootsSnapshot(self.0.clone())))
    }
}

#[async_trait]
impl LiveSnapshot for RootsSnapshot {
    async fn contains(&self, keys: &[Key]) -> Result<Vec<bool>, BoxError> {
        Ok(self.0.roots_contain(keys).await?)
    }
}

/// Why a sweep stopped without finishing. Report data, not an `Err`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum GcAbortCause {
    /// A liveness source (or the protect callback, named `protect`) failed
    /// or timed out. Nothing was deleted after the failure.
    ProtectionSource {
        /// The source's registered name.
        source: String,
        /// What it reported.
        error: String,
    },
    /// Another sweep holds the sweeper lock; this one did nothing.
    SweeperLock,
}

impl fmt::Display for GcAbortCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GcAbortCause::ProtectionSource { source, error } => {
                write!(f, "liveness source {source:?} failed: {error}")
            }
            GcAbortCause::SweeperLock => {
                f.write_str("another sweep is running (sweeper lock held)")
            }
        }
    }
}

/// Where a sweep is; passed to progress callbacks and test hooks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SweepPhase {
    /// Enumerating the pool and staging candidates.
    Mark,
    /// The mark ended and its rows are sealed.
    Sealed,
    /// Waiting out the window inline.
    Window,
    /// Re-arbitrating and deleting due rows.
    Execute,
    /// A batch's liveness re-check is done; the claim comes next.
    Checked,
    /// A batch's deletions are claimed, about to be deleted.
    Claimed,
}

/// A progress update.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct SweepProgress {
    /// The phase.
    pub phase: SweepPhase,
    /// Keys examined by the mark so far.
    pub examined: u64,
    /// Staged rows executed so far.
    pub executed: u64,
    /// Entries deleted so far.
    pub deleted: u64,
}

type ProgressFn = Arc<dyn Fn(&SweepProgress) + Send + Sync>;
type HookFn = Arc<dyn Fn(SweepPhase) -> BoxFuture<'static, ()> + Send + Sync>;

/// Per-sweep options.
#[derive(Clone, Default)]
pub struct SweepOptions {
    /// The delete window for rows this sweep stages; default: the store's.
    pub window: Option<Duration>,
    /// Mark and report only: stage nothing, delete nothing.
    pub dry_run: bool,
    /// Wait out the window inside this call and execute the rows it staged.
    /// Default: only when the GC tables are in process (not durable), since
    /// those rows would otherwise die with the process.
    pub inline_window: Option<bool>,
    /// Abort if a liveness source takes longer than this for one call.
    pub source_timeout: Option<Duration>,
    protect: Option<Arc<dyn LivenessSource>>,
    progress: Option<ProgressFn>,
    hook: Option<HookFn>,
}

impl fmt::Debug for SweepOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SweepOptions")
            .field("window", &self.window)
            .field("dry_run", &self.dry_run)
            .field("inline_window", &self.inline_window)
            .field("source_timeout", &self.source_timeout)
            .field("protect", &self.protect.is_some())
            .finish()
    }
}

impl SweepOptions {
    /// Default options.
    pub fn new() -> SweepOptions {
        SweepOptions::default()
    }

    /// Sets the delete window for this sweep.
    pub fn window(mut self, w: Duration) -> Self {
        self.window = Some(w);
        self
    }

    /// Marks and reports only.
    pub fn dry_run(mut self, yes: bool) -> Self {
        self.dry_run = yes;
        self
    }

    /// Waits out the window inline (or not).
    pub fn inline_window(mut self, yes: bool) -> Self {
        self.inline_window = Some(yes);
        self
    }

    /// Aborts when one liveness call takes longer than `t`.
    pub fn source_timeout(mut self, t: Duration) -> Self {
        self.source_timeout = Some(t);
        self
    }

    /// The protect callback for this sweep: keys it returns are live. Its
    /// failure aborts the sweep (cause source `protect`).
    pub fn protect<S: LivenessSource>(mut self, source: S) -> Self {
        self.protect = Some(Arc::new(source));
        self
    }

    /// Calls `f` as the sweep makes progress.
    pub fn on_progress(mut self, f: impl Fn(&SweepProgress) + Send + Sync + 'static) -> Self {
        self.progress = Some(Arc::new(f));
        self
    }

    /// Test support: awaited at each phase boundary so a test can interleave
    /// puts and pins at exact points of the protocol.
    #[doc(hidden)]
    pub fn hook(
        mut self,
        f: impl Fn(SweepPhase) -> BoxFuture<'static, ()> + Send + Sync + 'static,
    ) -> Self {
        self.hook = Some(Arc::new(f));
        self
    }
}

/// What a sweep did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SweepReport {
    /// Keys the mark enumerated.
    pub examined: u64,
    /// Examined keys found live in a source.
    pub live: u64,
    /// Examined keys that were pinned (or touched during the sweep).
    pub pinned: u64,
    /// Rows newly staged (in a dry run: candidates found).
    pub staged: u64,
    /// Due rows re-arbitrated.
    pub executed: u64,
    /// Entries deleted.
    pub deleted: u64,
    /// Due rows kept because the re-check found them pinned or live.
    pub kept: u64,
    /// Bytes the deletions freed.
    pub bytes_freed: u64,
    /// Abandoned staging files removed.
    pub reclaimed: u64,
    /// Wall time of the sweep.
    #[serde(serialize_with = "secs")]
    pub duration: Duration,
    /// The window the staged rows got.
    #[serde(serialize_with = "secs")]
    pub window: Duration,
    /// Whether this was a dry run.
    pub dry_run: bool,
    /// Why the sweep stopped early, if it did.
    pub aborted: Option<GcAbortCause>,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// The store's GC state.
pub(crate) struct Gc {
    pub(crate) tables: Arc<dyn GcTables>,
    sources: RwLock<BTreeMap<String, Arc<dyn LivenessSource>>>,
    sweeper: tokio::sync::Mutex<()>,
    pub(crate) window: Duration,
}

impl fmt::Debug for Gc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gc")
            .field("tables", &self.tables)
            .field("sources", &self.source_names())
            .field("window", &self.window)
            .finish()
    }
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl Gc {
    pub(crate) fn new(tables: Arc<dyn GcTables>, window: Duration) -> Gc {
        let mut sources: BTreeMap<String, Arc<dyn LivenessSource>> = BTreeMap::new();
        sources.insert(ROOTS_SOURCE.into(), Arc::new(RootsSource(tables.clone())));
        Gc {
            tables,
            sources: RwLock::new(sources),
            sweeper: tokio::sync::Mutex::new(()),
            window,
        }
    }

    pub(crate) fn register(&self, name: &str, source: Arc<dyn LivenessSource>) -> Result<()> {
        if name == ROOTS_SOURCE || name == "protect" {
            return Err(crate::Error::Config(format!(
                "the liveness source name {name:?} is reserved; pick another"
            )));
        }
        self.sources
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_owned(), source);
        Ok(())
    }

    pub(crate) fn unregister(&self, name: &str) -> bool {
        name != ROOTS_SOURCE
            && self
                .sources
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .remove(name)
                .is_some()
    }

    pub(crate) fn source_names(&self) -> Vec<String> {
        self.sources
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    fn sources(
        &self,
        protect: &Option<Arc<dyn LivenessSource>>,
    ) -> Vec<(String, Arc<dyn LivenessSource>)> {
        let mut v: Vec<_> = self
            .sources
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(n, s)| (n.clone(), s.clone()))
            .collect();
        if let Some(p) = protect {
            v.push(("protect".into(), p.clone()));
        }
        v
    }
}

/// Ends the sweep's touched-key tracking on every exit path.
struct Tracking<'a>(&'a PinMap);

impl Drop for Tracking<'_> {
    fn drop(&mut self) {
        self.0.end_sweep();
    }
}

/// Releases a delete claim even if the task holding it is cancelled.
struct Claim {
    pins: Arc<PinMap>,
    keys: Vec<Key>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.pins.finish_delete(&self.keys);
    }
}

/// Liveness snapshots for one phase.
struct Snapshots {
    views: Vec<(String, Box<dyn LiveSnapshot>)>,
    timeout: Option<Duration>,
}

async fn with_timeout<T>(
    timeout: Option<Duration>,
    name: &str,
    fut: impl Future<Output = Result<T, BoxError>>,
) -> Result<T, GcAbortCause> {
    let r = match timeout {
        Some(t) => match tokio::time::timeout(t, fut).await {
            Ok(r) => r,
            Err(_) => Err(format!("did not answer within {t:?}").into()),
        },
        None => fut.await,
    };
    r.map_err(|e| GcAbortCause::ProtectionSource {
        source: name.to_owned(),
        error: e.to_string(),
    })
}

impl Snapshots {
    async fn take(
        sources: &[(String, Arc<dyn LivenessSource>)],
        timeout: Option<Duration>,
    ) -> Result<Snapshots, GcAbortCause> {
        let mut views = Vec::with_capacity(sources.len());
        for (name, src) in sources {
            let view = with_timeout(timeout, name, src.snapshot()).await?;
            views.push((name.clone(), view));
        }
        Ok(Snapshots { views, timeout })
    }

    /// Removes live keys from `keys`; returns how many were live.
    async fn drop_live(&self, keys: &mut Vec<Key>) -> Result<u64, GcAbortCause> {
        let mut live = 0;
        for (name, view) in &self.views {
            if keys.is_empty() {
                break;
            }
            let answer = with_timeout(self.timeout, name, view.contains(keys)).await?;
            if answer.len() != keys.len() {
                return Err(GcAbortCause::ProtectionSource {
                    source: name.clone(),
                    error: format!("answered {} of {} keys", answer.len(), keys.len()),
                });
            }
            let mut it = answer.into_iter();
            let before = keys.len();
            keys.retain(|_| !it.next().unwrap_or(true));
            live += (before - keys.len()) as u64;
        }
        Ok(live)
    }
}

/// Runs one sweep. See the module docs for the protocol.
pub(crate) async fn sweep(store: &StoreInner, opts: SweepOptions) -> Result<SweepReport> {
    let started = Instant::now();
    let gc = &store.gc;
    let window = opts.window.unwrap_or(gc.window);
    let mut report = SweepReport {
        dry_run: opts.dry_run,
        window,
        ..SweepReport::default()
    };
    let Ok(_sweeper) = gc.sweeper.try_lock() else {
        report.aborted = Some(GcAbortCause::SweeperLock);
        return Ok(report);
    };
    // From here on, every pin acquired or released is recorded as touched
    // and this sweep will not delete that key.
    store.pins.begin_sweep();
    let _tracking = Tracking(&store.pins);
    let result = run(store, &opts, window, &mut report).await;
    report.duration = started.elapsed();
    result.map(|()| report)
}

async fn run(
    store: &StoreInner,
    opts: &SweepOptions,
    window: Duration,
    report: &mut SweepReport,
) -> Result<()> {
    let gc = &store.gc;
    let tables = &gc.tables;
    let progress = |report: &SweepReport, phase| {
        if let Some(p) = &opts.progress {
            p(&SweepProgress {
                phase,
                examined: report.examined,
                executed: report.executed,
                deleted: report.deleted,
            });
        }
    };
    let hook = |phase| async move {
        if let Some(h) = &opts.hook {
            h(phase).await;
        }
    };

    if !opts.dry_run {
        // Rows a dead sweep staged but never sealed carry no window; drop
        // them rather than guess one.
        tables.discard_unsealed().await?;
        for engine in store.engines() {
            report.reclaimed += engine.reclaim_abandoned().await?;
        }
    }
    let sources = gc.sources(&opts.protect);

    // 1. Mark.
    let snaps = match Snapshots::take(&sources, opts.source_timeout).await {
        Ok(s) => s,
        Err(cause) => {
            report.aborted = Some(cause);
            return Ok(());
        }
    };
    hook(SweepPhase::Mark).await;
    let mut keys = store.list_pool().chunks(BATCH);
    while let Some(chunk) = keys.next().await {
        let batch: Vec<Key> = chunk.into_iter().collect::<Result<_>>()?;
        report.examined += batch.len() as u64;
        let protected = store.pins.protected(&batch);
        let mut candidates: Vec<Key> = batch
            .iter()
            .zip(&protected)
            .filter(|(_, p)| !**p)
            .map(|(k, _)| *k)
            .collect();
        report.pinned += (batch.len() - candidates.len()) as u64;
        match snaps.drop_live(&mut candidates).await {
            Ok(live) => report.live += live,
            Err(cause) => {
                report.aborted = Some(cause);
                if !opts.dry_run {
                    tables.discard_unsealed().await?;
                }
                return Ok(());
            }
        }
        if opts.dry_run {
            report.staged += candidates.len() as u64;
        } else if !candidates.is_empty() {
            report.staged += tables.stage(&candidates, now_ms()).await?;
        }
        progress(report, SweepPhase::Mark);
    }
    drop(snaps);
    if opts.dry_run {
        return Ok(());
    }

    // 2. Seal: the window is measured from the end of the mark.
    let mark_end = now_ms();
    let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX / 2);
    tables.seal(mark_end.saturating_add(window_ms)).await?;
    hook(SweepPhase::Sealed).await;
    progress(report, SweepPhase::Sealed);

    let inline = opts.inline_window.unwrap_or(!tables.durable());
    let mut due_at = mark_end;
    if inline && !window.is_zero() {
        progress(report, SweepPhase::Window);
        tokio::time::sleep(window).await;
        due_at = mark_end.saturating_add(window_ms);
    }

    // 3. Execute every row due by `due_at`, re-arbitrated now. One fresh
    // snapshot per source serves the whole phase: liveness recorded before
    // this point (during the window, say) is in it, and any pin activity
    // after the sweep began is in the touched set, which the claim checks.
    let snaps = match Snapshots::take(&sources, opts.source_timeout).await {
        Ok(s) => s,
        Err(cause) => {
            report.aborted = Some(cause);
            return Ok(());
        }
    };
    let mut after = None;
    loop {
        let rows = tables.due(due_at, after, EXEC_BATCH).await?;
        let Some(last) = rows.last() else { break };
        after = Some(last.key);
        hook(SweepPhase::Execute).await;
        let batch: Vec<Key> = rows.iter().map(|r| r.key).collect();
        report.executed += batch.len() as u64;

        let protected = store.pins.protected(&batch);
        let mut candidates: Vec<Key> = batch
            .iter()
            .zip(&protected)
            .filter(|(_, p)| !**p)
            .map(|(k, _)| *k)
            .collect();
        if let Err(cause) = snaps.drop_live(&mut candidates).await {
            report.aborted = Some(cause);
            return Ok(());
        }
        hook(SweepPhase::Checked).await;
        // The decisive check: under the arbitration lock, claim only keys
        // still neither pinned nor touched; pins of claimed keys now wait.
        let claimed = store.pins.claim_for_delete(&candidates);
        report.kept += (batch.len() - claimed.len()) as u64;
        let claim = Claim {
            pins: store.pins.clone(),
            keys: claimed,
        };
        hook(SweepPhase::Claimed).await;
        let (deleted, freed) = delete_claimed(store.engines_owned(), claim).await?;
        report.deleted += deleted;
        report.bytes_freed += freed;
        tables.unstage(&batch).await?;
        progress(report, SweepPhase::Execute);
    }
    Ok(())
}

/// Deletes claimed keys from every engine on a task of its own, so that the
/// claim is held until the deletes have finished even if the sweep's future
/// is dropped halfway.
async fn delete_claimed(engines: Vec<Arc<dyn Backend>>, claim: Claim) -> Result<(u64, u64)> {
    if claim.keys.is_empty() {
        return Ok((0, 0));
    }
    let task = tokio::spawn(async move {
        let mut freed_by_key = vec![None::<u64>; claim.keys.len()];
        for engine in &engines {
            let sizes = engine.delete_many(&claim.keys).await?;
            for (slot, size) in freed_by_key.iter_mut().zip(sizes) {
                if let Some(s) = size {
                    *slot = Some(slot.unwrap_or(0) + s);
                }
            }
        }
        drop(claim);
        let deleted = freed_by_key.iter().filter(|s| s.is_some()).count() as u64;
        let freed = freed_by_key.iter().flatten().sum();
        Ok::<_, crate::Error>((deleted, freed))
    });
    task.await
        .map_err(|e| crate::Error::engine("gc executor", format!("delete task failed: {e}")))?
}
