//! Pool administration: what the database says about a pool
//! (`alkblobs_pools`, `alkblobs_health`), and creating and altering pools.

use std::time::Duration;

use tokio_postgres::types::Type;

use super::connection::PgPool;
use super::info::{Flavour, PoolInfo, PoolLargeTier, pool_info};
use crate::Result;

/// One pool's row of `alkblobs_health` ([`PgPool::health`]): is its
/// collector running, and is anything piling up? docs/operations.md,
/// "Health", has the thresholds.
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct PoolHealth {
    /// The pool.
    pub pool: String,
    /// `ok`, `warn` or `critical`.
    pub status: String,
    /// Why it is not `ok`, one sentence each.
    pub reasons: Vec<String>,
    /// `fleet` or `single`.
    pub mode: String,
    /// The pool's schedule, in seconds (`None`: manual).
    pub sweep_every_secs: Option<f64>,
    /// `on`, `paused`, `off` (nothing serves this database), `manual` or
    /// `owner instance` (single-instance pools).
    pub scheduler: String,
    /// Seconds since the last completed sweep (`None`: never swept).
    pub last_sweep_age_secs: Option<f64>,
    /// `ok`, `aborted: <cause>` or `error: <SQLSTATE: message>` of the
    /// last sweep call.
    pub last_outcome: Option<String>,
    /// Staged rows due for longer than the warn threshold.
    pub overdue_staged: i64,
    /// Pins expired for longer than the warn threshold.
    pub expired_pins: i64,
    /// Uploads whose transaction ended without a commit, and their bytes.
    pub abandoned_uploads: i64,
    /// Bytes of those uploads.
    pub abandoned_upload_bytes: i64,
    /// Registered liveness tables that fail validation.
    pub invalid_sources: i64,
    /// Which install of alkblobs the pool's database has.
    pub flavour: Flavour,
}

/// A duration as an interval literal PostgreSQL parses exactly.
fn secs_text(d: Duration) -> String {
    format!("{}.{:06} seconds", d.as_secs(), d.subsec_micros())
}

/// Settings of a new pool ([`PgPool::create_pool`]); `None` takes the
/// extension's defaults (5 minutes, 60 seconds, `pg-lo`).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct PoolSettings {
    /// The delete window.
    pub delete_window: Option<Duration>,
    /// The pin TTL.
    pub pin_ttl: Option<Duration>,
    /// `pg-lo`, `local`, `s3` or `none`.
    pub large_tier: Option<PoolLargeTier>,
    /// An `s3` pool's bucket and prefix (`s3://bucket/prefix`).
    pub large_location: Option<String>,
    /// One instance owns the pool (its in-process arbiter sweeps it).
    pub single_instance: bool,
    /// How often the extension's scheduler sweeps the pool (fleet pools;
    /// `None`: manual).
    pub sweep_every: Option<Duration>,
}

impl PoolSettings {
    /// The defaults.
    pub fn new() -> PoolSettings {
        PoolSettings::default()
    }

    /// The delete window.
    pub fn delete_window(mut self, d: Duration) -> Self {
        self.delete_window = Some(d);
        self
    }

    /// The pin TTL.
    pub fn pin_ttl(mut self, d: Duration) -> Self {
        self.pin_ttl = Some(d);
        self
    }

    /// The large tier.
    pub fn large_tier(mut self, tier: PoolLargeTier) -> Self {
        self.large_tier = Some(tier);
        self
    }

    /// Large content on S3 under `location` (`s3://bucket/prefix`): the
    /// `s3` tier.
    pub fn s3(mut self, location: impl Into<String>) -> Self {
        self.large_tier = Some(PoolLargeTier::S3);
        self.large_location = Some(location.into());
        self
    }

    /// A single-instance pool.
    pub fn single_instance(mut self, yes: bool) -> Self {
        self.single_instance = yes;
        self
    }

    /// Swept by the extension's scheduler every `every` (fleet pools).
    pub fn sweep_every(mut self, every: Duration) -> Self {
        self.sweep_every = Some(every);
        self
    }
}

impl PgPool {
    /// Every pool the connecting role may read.
    pub async fn pools(&self) -> Result<Vec<PoolInfo>> {
        let flavour = self.flavour().await?;
        let rows = self
            .rows(
                self,
                None,
                "SELECT p.pool, p.mode, p.large_tier, extract(epoch FROM p.delete_window)::text,
                        extract(epoch FROM p.pin_ttl)::text, extract(epoch FROM p.sweep_every)::text,
                        p.large_location
                   FROM alkblobs_pools p ORDER BY p.pool",
                &[],
            )
            .await?;
        rows.iter().map(|r| pool_info(r, flavour)).collect()
    }

    /// Creates pool `name` (the connecting role needs `alkblobs_admin`).
    pub async fn create_pool(&self, name: &str, settings: &PoolSettings) -> Result<()> {
        let window = settings.delete_window.unwrap_or(Duration::from_secs(300));
        let ttl = settings.pin_ttl.unwrap_or(Duration::from_secs(60));
        let (w, t) = (secs_text(window), secs_text(ttl));
        let large = settings.large_tier.unwrap_or(PoolLargeTier::PgLo).as_str();
        self.rows(
            self,
            None,
            "SELECT alkblobs_create_pool($1, $2::interval, $3::interval, $4, single_instance => $5,
                                         sweep_every => $6::interval, large_location => $7)",
            &[
                (&name, Type::TEXT),
                (&w, Type::TEXT),
                (&t, Type::TEXT),
                (&large, Type::TEXT),
                (&settings.single_instance, Type::BOOL),
                (&settings.sweep_every.map(secs_text), Type::TEXT),
                (&settings.large_location, Type::TEXT),
            ],
        )
        .await?;
        Ok(())
    }

    /// Changes pool `name`'s window or TTL (`None` keeps it).
    pub async fn alter_pool(
        &self,
        name: &str,
        window: Option<Duration>,
        ttl: Option<Duration>,
    ) -> Result<()> {
        let (w, t) = (window.map(secs_text), ttl.map(secs_text));
        self.rows(
            self,
            None,
            "SELECT alkblobs_alter_pool($1, $2::interval, $3::interval)",
            &[(&name, Type::TEXT), (&w, Type::TEXT), (&t, Type::TEXT)],
        )
        .await?;
        Ok(())
    }

    /// Sets pool `name`'s schedule: swept by the extension's scheduler
    /// every `every`, or (`None`) only when someone sweeps it.
    pub async fn set_sweep_every(&self, name: &str, every: Option<Duration>) -> Result<()> {
        let e = secs_text(every.unwrap_or(Duration::ZERO));
        self.rows(
            self,
            None,
            "SELECT alkblobs_alter_pool($1, sweep_every => $2::interval)",
            &[(&name, Type::TEXT), (&e, Type::TEXT)],
        )
        .await?;
        Ok(())
    }

    /// `alkblobs_health`: one row per pool this role may read (or just
    /// `pool`), in name order.
    pub async fn health(&self, pool: Option<&str>) -> Result<Vec<PoolHealth>> {
        let flavour = self.flavour().await?;
        let rows = self
            .rows(
                self,
                None,
                "SELECT pool, status, reasons, mode, extract(epoch FROM sweep_every)::float8, scheduler,
                        extract(epoch FROM last_sweep_age)::float8, last_outcome, overdue_staged,
                        expired_pins, abandoned_uploads, abandoned_upload_bytes, invalid_sources
                   FROM alkblobs_health WHERE $1::text IS NULL OR pool = $1 ORDER BY pool",
                &[(&pool, Type::TEXT)],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| PoolHealth {
                pool: r.get(0),
                status: r.get(1),
                reasons: r.get(2),
                mode: r.get(3),
                sweep_every_secs: r.get(4),
                scheduler: r.get(5),
                last_sweep_age_secs: r.get(6),
                last_outcome: r.get(7),
                overdue_staged: r.get(8),
                expired_pins: r.get(9),
                abandoned_uploads: r.get(10),
                abandoned_upload_bytes: r.get(11),
                invalid_sources: r.get(12),
                flavour,
            })
            .collect())
    }
}
