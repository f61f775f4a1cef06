//! A fleet sweep: `alkblobs_sweep` calls under the pool's lease until the
//! mark is done and nothing due is left, then the local tier's claim.

use tokio_postgres::types::Type;

use super::{GcAbortCause, Pool, SweepOptions, SweepPhase, SweepProgress, SweepReport};
use crate::{Error, Result};

use super::{FleetArbiter, Lease, SWEEP_KEYS, abort_cause};

impl FleetArbiter {
    /// The sweep under the lease; see [`Arbiter::sweep`](crate::Arbiter::sweep).
    pub(super) async fn sweep_leased(
        &self,
        pool: &Pool,
        opts: &SweepOptions,
        lease: &Lease,
    ) -> Result<SweepReport> {
        let s = &self.shared;
        let mut report = SweepReport {
            window: s.info.delete_window,
            dry_run: opts.dry_run,
            ..SweepReport::default()
        };
        if !opts.dry_run {
            // Staging files of killed writers (a local tier) and abandoned
            // large-object uploads (pg-lo: `alkblobs_lo_reap`; what is left
            // the extension's sweep reaps, `uploads_reclaimed`).
            for engine in pool.engines() {
                report.reclaimed += engine.reclaim_abandoned().await?;
            }
            if self.shared_tier() {
                report.staged += self.list_tier_if_due(pool).await?;
            }
        }
        let mut marking = true;
        loop {
            if lease.lost() {
                // Expired (a stall past the TTL) and taken by another
                // instance, which sweeps on.
                report.aborted = Some(GcAbortCause::SweeperLock);
                return Ok(report);
            }
            let rows = s
                .pg
                .rows(
                    &s.pg,
                    None,
                    "SELECT examined, live, pinned, staged, executed, deleted, kept, bytes_freed, \
                     pins_reaped, remaining, local_due, skipped, uploads_reaped, mark_done, aborted, \
                     reviewed, audit, missed \
                     FROM alkblobs_sweep($1, $2, 1000, $3, $4)",
                    &[
                        (&s.info.name, Type::TEXT),
                        (&opts.dry_run, Type::BOOL),
                        (&marking, Type::BOOL),
                        (&SWEEP_KEYS, Type::INT4),
                    ],
                )
                .await?;
            let r = rows
                .first()
                .ok_or_else(|| Error::engine(&s.pg, "alkblobs_sweep returned no row"))?;
            // By name: the columns are the SELECT's above.
            let n = |c: &str| r.get::<_, i64>(c).max(0) as u64;
            if let Some(cause) = r.get::<_, Option<String>>("aborted") {
                report.aborted = Some(abort_cause(&s.info.name, &cause)?);
                return Ok(report);
            }
            report.examined += n("examined");
            report.live += n("live");
            report.pinned += n("pinned");
            report.staged += n("staged");
            report.executed += n("executed");
            report.deleted += n("deleted");
            report.kept += n("kept");
            report.bytes_freed += n("bytes_freed");
            report.pins_reaped += n("pins_reaped");
            report.remaining = n("remaining");
            report.skipped += n("skipped");
            report.uploads_reclaimed += n("uploads_reaped");
            let local_due = n("local_due");
            let mark_done: bool = r.get("mark_done");
            let reviewed = n("reviewed");
            report.reviewed += reviewed;
            if let Some(why) = r.get::<_, Option<String>>("audit") {
                report.audit = Some(why);
                report.missed += r.get::<_, Option<i64>>("missed").unwrap_or(0).max(0) as u64;
            }
            opts.report_progress(&SweepProgress {
                phase: if marking {
                    SweepPhase::Mark
                } else {
                    SweepPhase::Execute
                },
                examined: report.examined,
                executed: report.executed,
                deleted: report.deleted,
            });
            if marking && mark_done {
                opts.run_hook(SweepPhase::Sealed).await;
            }
            marking = marking && !mark_done;
            // A dry run changes nothing, its mark cursor included: one
            // call (one slice of at most SWEEP_KEYS entries) is its answer.
            if opts.dry_run {
                break;
            }
            // (A full batch of the review queue: more of it may be due.)
            if !marking
                && reviewed < SWEEP_KEYS as u64
                && (report.remaining == 0 || n("executed") == 0)
            {
                if self.shared_tier() && pool.large().is_none() {
                    // A kv-only node does not see the shared files: their
                    // due rows wait for a node that does (said, not hidden).
                    if local_due > 0 {
                        tracing::warn!(pool = %s.name(), local_due, "due files left for a sweep by a node with the shared local tier");
                        report.remaining += local_due;
                    }
                } else if local_due > 0 || self.shared_tier() {
                    self.claim_local(pool, opts, &mut report).await?;
                }
                break;
            }
        }
        opts.run_hook(SweepPhase::Checked).await;
        Ok(report)
    }
}
