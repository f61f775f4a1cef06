//! What the database says about a pool (`alkblobs_pools`): its mode,
//! large tier, window, TTL and schedule, read at open and by
//! administration alike.

use std::time::Duration;

use tokio_postgres::Row;

use crate::{Error, Result};

/// Who collects a pool (`alkblobs_pools.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum PoolMode {
    /// Many store instances share it; pins are rows, the extension sweeps.
    Fleet,
    /// One store instance owns it and sweeps it with its in-process arbiter.
    Single,
}

impl PoolMode {
    /// The database's name for it (`fleet`, `single`).
    pub fn as_str(self) -> &'static str {
        match self {
            PoolMode::Fleet => "fleet",
            PoolMode::Single => "single",
        }
    }
}

/// Where a pool keeps content over the kv threshold
/// (`alkblobs_pools.large_tier`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum PoolLargeTier {
    /// Large objects in the same database (`pg-lo`).
    PgLo,
    /// Files on media every node shares (`local`).
    Local,
    /// Objects under the pool's bucket and prefix on S3 (`s3`,
    /// [`PoolInfo::large_location`]).
    S3,
    /// Nowhere: a kv-only pool (`none`).
    None,
}

impl PoolLargeTier {
    /// The database's name for it (`pg-lo`, `local`, `s3`, `none`).
    pub fn as_str(self) -> &'static str {
        match self {
            PoolLargeTier::PgLo => "pg-lo",
            PoolLargeTier::Local => "local",
            PoolLargeTier::S3 => "s3",
            PoolLargeTier::None => "none",
        }
    }

    /// A tier every node of a fleet shares (`local`, `s3`): a put's pin row
    /// and file record commit before its bytes are published, and a sweep
    /// deletes its objects by a two-phase claim.
    pub fn is_shared(self) -> bool {
        matches!(self, PoolLargeTier::Local | PoolLargeTier::S3)
    }

    /// The tier the database names `text`, if it is one.
    pub fn parse(text: &str) -> Option<PoolLargeTier> {
        match text {
            "pg-lo" => Some(PoolLargeTier::PgLo),
            "local" => Some(PoolLargeTier::Local),
            "s3" => Some(PoolLargeTier::S3),
            "none" => Some(PoolLargeTier::None),
            _ => None,
        }
    }
}

/// Which install of alkblobs a database has (`alkblobs_flavour()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Flavour {
    /// `CREATE EXTENSION alkblobs`: the Rust library, which verifies every
    /// key it is given and can run the background sweep scheduler.
    Library,
    /// The SQL-only install script (`scripts/package.sh sql-only`), for
    /// servers that load no custom library: the server trusts writers'
    /// keys (every read verifies them here) and pg_cron schedules sweeps.
    SqlOnly,
}

impl Flavour {
    /// Its name (`library`, `sql-only`).
    pub fn as_str(self) -> &'static str {
        match self {
            Flavour::Library => "library",
            Flavour::SqlOnly => "sql-only",
        }
    }
}

impl std::fmt::Display for Flavour {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

impl std::fmt::Display for PoolMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

impl std::fmt::Display for PoolLargeTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// What the database says about a pool (`alkblobs_pools`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolInfo {
    /// The pool's name.
    pub name: String,
    /// Who collects it.
    pub mode: PoolMode,
    /// Where its large content goes.
    pub large_tier: PoolLargeTier,
    /// An `s3` pool's bucket and prefix (`s3://bucket/prefix`).
    pub large_location: Option<String>,
    /// The pool's delete window.
    pub delete_window: Duration,
    /// The pool's pin TTL.
    pub pin_ttl: Duration,
    /// How often the extension's scheduler sweeps the pool (`None`: only
    /// when a node or an operator does).
    pub sweep_every: Option<Duration>,
    /// Which install of alkblobs the database has.
    pub flavour: Flavour,
}

pub(super) fn pool_info(row: &Row, flavour: Flavour) -> Result<PoolInfo> {
    let mode: String = row.get(1);
    let tier: String = row.get(2);
    let unknown = |what: &str, v: &str| {
        Error::Config(format!(
            "pool {:?} has {what} {v:?}, which this client does not know: upgrade the client with the extension",
            row.get::<_, String>(0)
        ))
    };
    Ok(PoolInfo {
        name: row.get(0),
        mode: match mode.as_str() {
            "fleet" => PoolMode::Fleet,
            "single" => PoolMode::Single,
            other => return Err(unknown("mode", other)),
        },
        large_tier: PoolLargeTier::parse(&tier).ok_or_else(|| unknown("large tier", &tier))?,
        large_location: row.get(6),
        delete_window: interval_secs(row.get::<_, String>(3).as_str()),
        pin_ttl: interval_secs(row.get::<_, String>(4).as_str()),
        sweep_every: row
            .get::<_, Option<String>>(5)
            .map(|s| interval_secs(s.as_str())),
        flavour,
    })
}

fn interval_secs(text: &str) -> Duration {
    // `alkblobs_pools` intervals as text with extract(epoch): seconds.
    Duration::from_secs_f64(text.parse::<f64>().unwrap_or(0.0).max(0.0))
}
