//! A shared large tier under the fleet — files on shared media (`local`)
//! or objects under an S3 prefix (`s3`), one protocol for both media: a
//! put's pin row and file record before its bytes are published
//! (`alkblobs_pin_new`), staging the tier's objects through the
//! extension, and the two-phase claim that deletes them.

use std::time::Duration;

use futures::TryStreamExt;
use tokio_postgres::types::Type;

use super::{Pool, SweepOptions, SweepPhase, SweepReport};
use crate::pg::{InTx, db_err, finish};
use crate::{Key, Result};

use super::{CLAIM_BATCH, FleetArbiter, STAGE_BATCH, TOMBSTONE_WAIT, key_of};

impl FleetArbiter {
    /// The keys `alkblobs_pin_new` pinned and recorded (a shared tier),
    /// with the object generation each was handed noted for the engine.
    pub(super) async fn pin_new(&self, keys: &[Key]) -> Result<()> {
        let s = &self.shared;
        for k in keys {
            let kb = k.as_bytes().to_vec();
            // A key whose file a sweep is deleting (a tombstone, 55006)
            // is recorded afresh once the delete is done: wait a bounded
            // while for that.
            let mut wait = Duration::from_millis(50);
            loop {
                let r = s
                    .control
                    .rows(
                        &s.control,
                        Some(*k),
                        "SELECT alkblobs_pin_new($1, $2, $3)",
                        &[
                            (&s.info.name, Type::TEXT),
                            (&kb, Type::BYTEA),
                            (&s.owner, Type::TEXT),
                        ],
                    )
                    .await;
                match r {
                    Ok(rows) => {
                        let generation = rows.first().and_then(|r| r.get::<_, Option<i64>>(0));
                        s.generations.set(*k, generation.unwrap_or(0).max(0) as u64);
                        break;
                    }
                    Err(e) if e.is_retryable() && wait < TOMBSTONE_WAIT => {
                        tokio::time::sleep(wait).await;
                        wait *= 2;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Lists the shared tier and stages what it holds when the pool says a
    /// listing is due (`tier_listing_due`: since a mark sealed, which in
    /// a `queue` pool is an audit), then says it is done. A node without
    /// the tier lists nothing. Listing is the only way to find a file
    /// nobody recorded (a put records its file before writing it), so it
    /// follows the audits and not every sweep.
    pub(super) async fn list_tier_if_due(&self, pool: &Pool) -> Result<u64> {
        let s = &self.shared;
        if pool.large().is_none() {
            return Ok(0);
        }
        let rows =
            s.pg.rows(
                &s.pg,
                None,
                "SELECT p.tier_listing_due IS NOT NULL, clock_timestamp() \
                 FROM alkblobs_pools p WHERE p.pool = $1",
                &[(&s.info.name, Type::TEXT)],
            )
            .await?;
        let Some(r) = rows.first() else {
            return Ok(0);
        };
        if !r.get::<_, bool>(0) {
            return Ok(0);
        }
        let from: std::time::SystemTime = r.get(1);
        let staged = self.stage_local_files(pool).await?;
        s.pg.rows(
            &s.pg,
            None,
            "SELECT alkblobs_tier_listed($1, $2)",
            &[(&s.info.name, Type::TEXT), (&from, Type::TIMESTAMPTZ)],
        )
        .await?;
        Ok(staged)
    }

    /// Stages the local tier's files through the extension (it stages only
    /// keys that are not entries, pinned, staged or live).
    async fn stage_local_files(&self, pool: &Pool) -> Result<u64> {
        let s = &self.shared;
        let Some(large) = pool.large() else {
            return Ok(0);
        };
        let mut staged = 0u64;
        // The blobs, and the keys of outboards whose blob is gone (a
        // writer stopped between the two): staged, claimed and deleted like
        // a blob, the deletion removes the outboard.
        let mut keys = crate::tier::merge_sorted(large.list(), large.orphan_outboards());
        let mut batch: Vec<Vec<u8>> = Vec::new();
        loop {
            let next = keys.try_next().await?;
            if let Some(k) = next {
                batch.push(k.as_bytes().to_vec());
            }
            if (next.is_none() && !batch.is_empty()) || batch.len() == STAGE_BATCH {
                let rows =
                    s.pg.rows(
                        &s.pg,
                        None,
                        "SELECT alkblobs_stage($1, $2)",
                        &[(&s.info.name, Type::TEXT), (&batch, Type::BYTEA_ARRAY)],
                    )
                    .await?;
                staged += rows.first().map(|r| r.get::<_, i64>(0)).unwrap_or(0).max(0) as u64;
                batch.clear();
            }
            if next.is_none() {
                return Ok(staged);
            }
        }
    }

    /// Deletes the due, dead files of a local tier in two phases: a claim
    /// commits tombstones for the dead keys (from then on nothing can
    /// reference or re-record them), the files are unlinked, and the
    /// tombstones are removed. A sweeper that dies between the phases
    /// leaves tombstones, which the next claim hands out again.
    pub(super) async fn claim_local(
        &self,
        pool: &Pool,
        opts: &SweepOptions,
        report: &mut SweepReport,
    ) -> Result<()> {
        let s = &self.shared;
        let Some(large) = pool.large() else {
            return Ok(());
        };
        loop {
            let rows =
                s.pg.rows(
                    &s.pg,
                    None,
                    "SELECT k FROM alkblobs_claim_local($1, $2) k",
                    &[(&s.info.name, Type::TEXT), (&CLAIM_BATCH, Type::INT4)],
                )
                .await?;
            if rows.is_empty() {
                return Ok(());
            }
            // (Test support: the tombstones are committed, nothing locked.)
            opts.run_hook(SweepPhase::Tombstoned).await;
            // Phase 2, one transaction: lock the tombstones (a claimer
            // handed the same ones waits, then finds them gone), delete
            // exactly the files still tombstoned — the generations each
            // tombstone names, never a later one a re-put since holds —
            // and remove their tombstones.
            let claimed: Vec<Vec<u8>> = rows.iter().map(|r| r.get(0)).collect();
            let c = s.pg.conn().await?;
            let t = InTx::begin(c, "BEGIN ISOLATION LEVEL READ COMMITTED")
                .await
                .map_err(|e| db_err(&s.pg, None, e))?;
            let mine = t
                .query_typed(
                    "SELECT key, generation FROM alkblobs_local_deleting_generations($1, $2)",
                    &[(&s.info.name, Type::TEXT), (&claimed, Type::BYTEA_ARRAY)],
                )
                .await
                .map_err(|e| db_err(&s.pg, None, e))?;
            let mut done: Vec<Vec<u8>> = Vec::with_capacity(mine.len());
            for r in &mine {
                let kb: Vec<u8> = r.get(0);
                let k = key_of(&kb)?;
                let generation = r.get::<_, i64>(1).max(0) as u64;
                report.executed += 1;
                // (Test support: a claimer stopped here, its delete not yet
                // sent, is the stalled claimer of docs/design.md.)
                opts.run_hook(SweepPhase::Deleting).await;
                match large.delete_through(&k, generation).await {
                    Ok(freed) => {
                        if let Some(size) = freed {
                            report.deleted += 1;
                            report.bytes_freed += size;
                        }
                        done.push(kb);
                    }
                    // Its tombstone stays; the next sweep tries again.
                    Err(e) => {
                        tracing::warn!(pool = %s.name(), key = %k, error = %e, "deleting a claimed file failed")
                    }
                }
            }
            // (Test support: a sweeper that dies here leaves tombstones.)
            opts.run_hook(SweepPhase::Claimed).await;
            t.query_typed(
                "SELECT alkblobs_local_deleted($1, $2)",
                &[(&s.info.name, Type::TEXT), (&done, Type::BYTEA_ARRAY)],
            )
            .await
            .map_err(|e| db_err(&s.pg, None, e))?;
            finish(t, "COMMIT")
                .await
                .map_err(|e| db_err(&s.pg, None, e))?;
            if rows.len() < CLAIM_BATCH as usize || done.len() < rows.len() {
                return Ok(());
            }
        }
    }
}
