//! What a sweep is asked to do and what it reports: the same shapes for
//! every arbiter, so an embedder reads a fleet sweep and a single-node sweep
//! the same way.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use super::LivenessSource;

/// The default delete window.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(5 * 60);

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
    /// A fleet's shared tier: a batch's tombstones are committed (nothing
    /// may record or reference those keys now) and no delete has started;
    /// the claimer holds no lock (tests).
    Tombstoned,
    /// A claimed file of a fleet's shared tier is about to be deleted (its
    /// tombstone locked, the delete not yet sent): where a stopped claimer
    /// would stop (tests).
    Deleting,
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
#[non_exhaustive]
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

    /// The protect callback, for an arbiter running the sweep.
    pub fn protect_source(&self) -> Option<&Arc<dyn LivenessSource>> {
        self.protect.as_ref()
    }

    /// Calls the progress callback, if any (for an arbiter running the
    /// sweep).
    pub fn report_progress(&self, progress: &SweepProgress) {
        if let Some(p) = &self.progress {
            p(progress);
        }
    }

    /// Awaits the test hook at `phase`, if any (for an arbiter running the
    /// sweep).
    #[doc(hidden)]
    pub async fn run_hook(&self, phase: SweepPhase) {
        if let Some(h) = &self.hook {
            h(phase).await;
        }
    }
}

/// What a sweep did.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[non_exhaustive]
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
    /// Expired pin rows reaped (fleet sweeps).
    pub pins_reaped: u64,
    /// Abandoned large-object uploads reclaimed (fleet sweeps).
    pub uploads_reclaimed: u64,
    /// Due rows passed over because someone held a lock on them; they stay
    /// staged for the next sweep (fleet sweeps).
    pub skipped: u64,
    /// Due rows left for the next sweep (fleet sweeps stop after a bounded
    /// number of calls' worth of work).
    pub remaining: u64,
    /// Review-queue rows reviewed (fleet pools with the `queue` collector).
    pub reviewed: u64,
    /// Why this sweep ran (a slice of) an audit, the full mark of a
    /// `queue` pool; `None` when it ran none.
    pub audit: Option<String>,
    /// Keys the audit staged that no queue row, staged row or pin accounted
    /// for: events the review queue missed (a bug to report).
    pub missed: u64,
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
