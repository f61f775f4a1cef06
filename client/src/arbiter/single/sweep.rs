//! The single-node sweep: mark, stage, execute with re-arbitration.
//!
//! 1. **Mark.** Enumerate the pool (both tiers, keys only). A key that is
//!    pinned, touched since the sweep began, or live in any source is kept;
//!    the rest are candidates.
//! 2. **Stage.** Candidates are written to the staged table, unsealed; when
//!    the mark ends they are sealed with `visible_after = mark_end + window`.
//!    A sweep given an explicit window also moves rows already staged with a
//!    later `visible_after` to its own: the window asked for applies to
//!    everything staged.
//! 3. **Execute.** Every staged row due by the end of the mark (or, with an
//!    inline window, by the end of the window) is re-arbitrated *now*:
//!    against pins, against keys touched during this sweep, and against a
//!    snapshot of every liveness source taken when execution starts; then
//!    the survivors of that check are claimed under the arbitration lock and
//!    deleted.
//!
//! `docs/design.md` argues why each step is needed and what race each guard
//! closes.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;

use super::SingleNodeArbiter;
use super::pins::PinMap;
use super::sources::Snapshots;
use crate::arbiter::{GcAbortCause, Pool, SweepOptions, SweepPhase, SweepProgress, SweepReport};
use crate::backend::Backend;
use crate::{Key, Result};

/// Keys arbitrated per batch during the mark.
const BATCH: usize = 4096;

/// Staged rows executed per batch: one claim and one delete transaction.
/// Large, because a SQL engine's delete cost is dominated by the pages each
/// transaction rewrites; a pin of a claimed key waits for one batch.
const EXEC_BATCH: usize = 16384;

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
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

/// Runs one sweep. See the module docs for the protocol.
pub(crate) async fn sweep(
    arb: &SingleNodeArbiter,
    pool: &Pool,
    opts: SweepOptions,
) -> Result<SweepReport> {
    let started = Instant::now();
    let window = opts.window.unwrap_or(arb.window);
    let mut report = SweepReport {
        dry_run: opts.dry_run,
        window,
        ..SweepReport::default()
    };
    let Ok(_sweeper) = arb.sweeper.try_lock() else {
        report.aborted = Some(GcAbortCause::SweeperLock);
        return Ok(report);
    };
    // From here on, every pin acquired or released is recorded as touched
    // and this sweep will not delete that key.
    arb.pins.begin_sweep();
    let _tracking = Tracking(&arb.pins);
    let result = run(arb, pool, &opts, window, &mut report).await;
    report.duration = started.elapsed();
    result.map(|()| report)
}

/// The keys of `batch` that are neither pinned (or touched) nor live in any
/// source; counts the pinned ones into `pinned` and the live ones into `live`.
async fn unprotected(
    arb: &SingleNodeArbiter,
    snaps: &Snapshots,
    batch: &[Key],
    pinned: &mut u64,
    live: &mut u64,
) -> Result<Vec<Key>, GcAbortCause> {
    let protected = arb.pins.protected(batch);
    let mut candidates: Vec<Key> = batch
        .iter()
        .zip(&protected)
        .filter(|(_, p)| !**p)
        .map(|(k, _)| *k)
        .collect();
    *pinned += (batch.len() - candidates.len()) as u64;
    *live += snaps.drop_live(&mut candidates).await?;
    Ok(candidates)
}

async fn run(
    arb: &SingleNodeArbiter,
    pool: &Pool,
    opts: &SweepOptions,
    window: Duration,
    report: &mut SweepReport,
) -> Result<()> {
    let tables = &arb.tables;
    let progress = |report: &SweepReport, phase| {
        opts.report_progress(&SweepProgress {
            phase,
            examined: report.examined,
            executed: report.executed,
            deleted: report.deleted,
        });
    };

    if !opts.dry_run {
        // Rows a dead sweep staged but never sealed carry no window; drop
        // them rather than guess one.
        tables.discard_unsealed().await?;
        for engine in pool.engines() {
            report.reclaimed += engine.reclaim_abandoned().await?;
        }
    }
    let sources = arb.sources.for_sweep(opts.protect_source());

    // 1. Mark.
    let snaps = match Snapshots::take(&sources, opts.source_timeout).await {
        Ok(s) => s,
        Err(cause) => {
            report.aborted = Some(cause);
            return Ok(());
        }
    };
    opts.run_hook(SweepPhase::Mark).await;
    let mut keys = pool.list().chunks(BATCH);
    while let Some(chunk) = keys.next().await {
        let batch: Vec<Key> = chunk.into_iter().collect::<Result<_>>()?;
        report.examined += batch.len() as u64;
        let candidates =
            match unprotected(arb, &snaps, &batch, &mut report.pinned, &mut report.live).await {
                Ok(c) => c,
                Err(cause) => {
                    report.aborted = Some(cause);
                    if !opts.dry_run {
                        tables.discard_unsealed().await?;
                    }
                    return Ok(());
                }
            };
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

    // 2. Seal: the window is measured from the end of the mark. An explicit
    // window applies to rows staged earlier too (never lengthening one).
    let mark_end = now_ms();
    let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX / 2);
    let visible_after = mark_end.saturating_add(window_ms);
    tables.seal(visible_after).await?;
    if opts.window.is_some() {
        tables.reseal(visible_after).await?;
    }
    opts.run_hook(SweepPhase::Sealed).await;
    progress(report, SweepPhase::Sealed);

    let inline = opts.inline_window.unwrap_or(!tables.durable());
    let mut due_at = mark_end;
    if inline && !window.is_zero() {
        progress(report, SweepPhase::Window);
        tokio::time::sleep(window).await;
        due_at = visible_after;
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
        opts.run_hook(SweepPhase::Execute).await;
        let batch: Vec<Key> = rows.iter().map(|r| r.key).collect();
        report.executed += batch.len() as u64;

        // Re-check counts are not mark figures: keep them out of the report.
        let (mut pinned, mut live) = (0, 0);
        let candidates = match unprotected(arb, &snaps, &batch, &mut pinned, &mut live).await {
            Ok(c) => c,
            Err(cause) => {
                report.aborted = Some(cause);
                return Ok(());
            }
        };
        opts.run_hook(SweepPhase::Checked).await;
        // The decisive check: under the arbitration lock, claim only keys
        // still neither pinned nor touched; pins of claimed keys now wait.
        let claimed = arb.pins.claim_for_delete(&candidates);
        report.kept += (batch.len() - claimed.len()) as u64;
        let claim = Claim {
            pins: arb.pins.clone(),
            keys: claimed,
        };
        opts.run_hook(SweepPhase::Claimed).await;
        let (deleted, freed) = delete_claimed(pool.engines(), claim).await?;
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
