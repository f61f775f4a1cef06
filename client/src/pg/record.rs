//! A PostgreSQL pool's record of what must exist, read from the extension
//! (`alkblobs_verify_records`, `alkblobs_verify_lookup`,
//! `alkblobs_verify_sources`), and where a verify's outcome is kept
//! (`alkblobs_verify_finished`, which `alkblobs_health` reads).

use async_trait::async_trait;
use tokio_postgres::Row;
use tokio_postgres::types::Type;

use super::{PgPool, PoolInfo, PoolLargeTier, PoolMode};
use crate::record::{AbandonedUpload, Held, PoolRecord, Record, VerifyOutcome};
use crate::{Error, Result};

/// The record of one PostgreSQL pool.
#[derive(Debug, Clone)]
pub struct PgRecord {
    pg: PgPool,
    tier_recorded: bool,
    large_indexed: bool,
    /// Sources a page or look-up skipped while it read them (a liveness
    /// table that failed validation, or the caller could no longer read,
    /// mid-run): `(source, problem)`.
    skipped: std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>,
}

impl PgRecord {
    /// The record of the pool `pg` is connected to.
    pub fn new(pg: PgPool, info: &PoolInfo) -> PgRecord {
        // A fleet's shared tier records each object (alkblobs.files); a
        // single-instance pool's local or s3 tier is its own index.
        let tier_recorded = info.mode == PoolMode::Fleet
            && matches!(info.large_tier, PoolLargeTier::Local | PoolLargeTier::S3);
        let large_indexed =
            tier_recorded || matches!(info.large_tier, PoolLargeTier::PgLo | PoolLargeTier::None);
        PgRecord {
            pg,
            tier_recorded,
            large_indexed,
            skipped: Default::default(),
        }
    }

    /// The rows of a page or look-up: the records, after setting aside
    /// the rows that name a source skipped (key NULL, record 'unchecked').
    fn records(&self, rows: &[Row], engine: &str) -> Result<Vec<Record>> {
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            if r.get::<_, Option<&str>>(1) == Some("unchecked") {
                let what: Vec<String> = r.get(4);
                let mut skipped = self.skipped.lock().unwrap_or_else(|p| p.into_inner());
                if let [source, problem] = &what[..]
                    && !skipped.iter().any(|(s, _)| s == source)
                {
                    skipped.push((source.clone(), problem.clone()));
                }
                continue;
            }
            out.push(record_of(r, engine)?);
        }
        Ok(out)
    }

    fn engine(&self) -> String {
        format!("the record of pool {}", self.pg.name())
    }
}

fn record_of(r: &Row, engine: &str) -> Result<Record> {
    let held = match r.get::<_, Option<&str>>(1) {
        None => None,
        Some("kv") => Some(Held::Kv),
        Some("lo") => Some(Held::LargeObject),
        Some("lo_lost") => Some(Held::LargeObjectLost),
        Some("file") => Some(Held::File {
            generation: r.get::<_, Option<i64>>(3).unwrap_or(0).max(0) as u64,
        }),
        Some("in_flight") => Some(Held::InFlight),
        Some("deleting") => Some(Held::Deleting),
        Some(other) => {
            return Err(Error::engine(
                engine,
                format!(
                    "the extension recorded {other:?}, which this client does not know: update the client"
                ),
            ));
        }
    };
    Ok(Record {
        key: r.get(0),
        held,
        size: r.get::<_, Option<i64>>(2).map(|s| s.max(0) as u64),
        refs: r.get(4),
    })
}

#[async_trait]
impl PoolRecord for PgRecord {
    async fn page(&self, after: Option<&[u8]>, limit: usize) -> Result<Vec<Record>> {
        let engine = self.engine();
        let after = after.map(<[u8]>::to_vec);
        let lim = limit.clamp(1, 10_000) as i32;
        let rows = self
            .pg
            .rows(
                &engine,
                None,
                "SELECT key, record, size, generation, refs FROM alkblobs_verify_records($1, $2, $3)",
                &[
                    (&self.pg.name(), Type::TEXT),
                    (&after, Type::BYTEA),
                    (&lim, Type::INT4),
                ],
            )
            .await?;
        self.records(&rows, &engine)
    }

    async fn lookup(&self, keys: &[Vec<u8>], refs: bool) -> Result<Vec<Record>> {
        let engine = self.engine();
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(10_000) {
            let chunk = chunk.to_vec();
            let rows = self
                .pg
                .rows(
                    &engine,
                    None,
                    "SELECT key, record, size, generation, refs FROM alkblobs_verify_lookup($1, $2, $3)",
                    &[
                        (&self.pg.name(), Type::TEXT),
                        (&chunk, Type::BYTEA_ARRAY),
                        (&refs, Type::BOOL),
                    ],
                )
                .await?;
            out.extend(self.records(&rows, &engine)?);
        }
        Ok(out)
    }

    async fn unchecked_sources(&self) -> Result<Vec<(String, String)>> {
        let rows = self
            .pg
            .rows(
                &self.engine(),
                None,
                "SELECT source, problem FROM alkblobs_verify_sources($1)",
                &[(&self.pg.name(), Type::TEXT)],
            )
            .await?;
        let mut out: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        for (source, problem) in self
            .skipped
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            if !out.iter().any(|(s, _)| s == source) {
                out.push((source.clone(), problem.clone()));
            }
        }
        Ok(out)
    }

    async fn clock(&self) -> Result<std::time::SystemTime> {
        let rows = self
            .pg
            .rows(&self.engine(), None, "SELECT clock_timestamp()", &[])
            .await?;
        Ok(rows
            .first()
            .map_or_else(std::time::SystemTime::now, |r| r.get(0)))
    }

    async fn abandoned_uploads(&self) -> Result<Vec<AbandonedUpload>> {
        let rows = self
            .pg
            .rows(
                &self.engine(),
                None,
                "SELECT loid, bytes FROM alkblobs_verify_abandoned($1)",
                &[(&self.pg.name(), Type::TEXT)],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| AbandonedUpload {
                loid: r.get(0),
                bytes: r.get::<_, Option<i64>>(1).unwrap_or(0).max(0) as u64,
            })
            .collect())
    }

    fn tier_recorded(&self) -> bool {
        self.tier_recorded
    }

    fn large_indexed(&self) -> bool {
        self.large_indexed
    }

    async fn finished(&self, o: &VerifyOutcome) -> Result<bool> {
        let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let r = self
            .pg
            .rows(
                &self.engine(),
                None,
                "SELECT alkblobs_verify_finished($1, $2, $3, $4, $5, $6, $7, $8)",
                &[
                    (&self.pg.name(), Type::TEXT),
                    (&o.started, Type::TIMESTAMPTZ),
                    (&o.whole, Type::BOOL),
                    (&n(o.checked), Type::INT8),
                    (&n(o.bytes), Type::INT8),
                    (&n(o.missing), Type::INT8),
                    (&n(o.corrupt), Type::INT8),
                    (&n(o.unrecorded), Type::INT8),
                ],
            )
            .await;
        match r {
            Ok(_) => Ok(true),
            // A role without sweep access verifies, but does not record
            // (nor clear) the pool's verify state.
            Err(Error::Database { sqlstate, .. }) if sqlstate == "42501" => Ok(false),
            Err(e) => Err(e),
        }
    }
}
