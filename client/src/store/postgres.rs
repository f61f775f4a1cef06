//! The single-instance PostgreSQL preset (REQ-3, feature `postgres`): one
//! store instance owns a pool in a PostgreSQL database and collects it with
//! the single-node arbiter, whose staged rows and roots are durable rows in
//! the extension's tables. Fleet pools (many instances) need the fleet
//! arbiter instead; this preset refuses them.

use std::path::PathBuf;
use std::sync::Arc;

use super::{DEFAULT_THRESHOLD, Store};
use crate::arbiter::single::{PgGcTables, SingleNodeArbiter};
use crate::backend::local::{LocalBackend, LocalOptions};
use crate::backend::postgres::{
    PgLoBackend, PgOptions, PgPool, PoolLargeTier, PoolMode, PostgresBackend,
};
use crate::pg::PgRecord;
use crate::{Error, Result};

/// Where the large tier of a single-instance PostgreSQL store lives. It
/// must match the pool's own declaration (`alkblobs_pools.large_tier`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PgLarge {
    /// Whatever the pool declares: `pg-lo`, or `none` (kv-only); a pool
    /// that declares `local` needs [`PgLarge::Local`] for the directory.
    FromPool,
    /// Large objects in the same database.
    PgLo,
    /// Files under this directory.
    Local(PathBuf),
    /// No large tier: puts over the threshold are refused.
    None,
    /// Objects on S3 (feature `s3`): these options, whose location must be
    /// the pool's (`alkblobs_pools.large_location`). [`PgLarge::FromPool`]
    /// opens an `s3` pool's location with the AWS environment's endpoint
    /// and credentials.
    #[cfg(feature = "s3")]
    S3(crate::backend::s3::S3Options),
    /// A storage node's tier through its `alkblobs serve` (feature
    /// `serve`): a fleet topology only ([`crate::store::fleet::FleetLarge::Routed`]);
    /// a single-instance store refuses it (its in-process sweep would
    /// delete through a tier that cannot).
    #[cfg(feature = "serve")]
    Routed(crate::backend::routed::RoutedOptions),
}

/// The S3 options for a pool whose large tier is `s3`: the declared ones,
/// if their location is the pool's, or the pool's location with the AWS
/// environment's settings.
#[cfg(feature = "s3")]
pub(super) fn pool_s3(
    info: &crate::backend::postgres::PoolInfo,
    declared: Option<&crate::backend::s3::S3Options>,
) -> Result<crate::backend::s3::S3Options> {
    let Some(loc) = info.large_location.as_deref() else {
        return Err(Error::Config(format!(
            "pool {:?} is an s3 pool without a location: the database is damaged",
            info.name
        )));
    };
    let pool_loc: crate::backend::s3::S3Location = loc.parse()?;
    // The prefix is the pool's (recorded in it at the first writable open).
    let owner = match info.mode {
        crate::backend::postgres::PoolMode::Fleet => format!("fleet pool {}", info.name),
        crate::backend::postgres::PoolMode::Single => {
            format!("single-instance pool {}", info.name)
        }
    };
    match declared {
        Some(o) if o.location != pool_loc => Err(Error::Config(format!(
            "pool {:?} keeps large content under {pool_loc}, not {}: every store of a pool uses the pool's bucket and prefix",
            info.name, o.location
        ))),
        Some(o) => Ok(o.clone().owner(owner)),
        None => Ok(crate::backend::s3::S3Options::new(pool_loc).owner(owner)),
    }
}

/// An `s3` pool opened by a build without the s3 engine.
#[cfg(not(feature = "s3"))]
pub(super) fn no_s3(info: &crate::backend::postgres::PoolInfo) -> Error {
    Error::Config(format!(
        "pool {:?} keeps large content on S3 ({}): this build of alkblobs lacks the s3 engine (the crate's feature `s3`)",
        info.name,
        info.large_location.as_deref().unwrap_or("?")
    ))
}

/// Options for [`Store::open_postgres`]: a builder.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PostgresOptions {
    /// The connection and the pool.
    pub pg: PgOptions,
    /// The large tier.
    pub large: PgLarge,
    /// The kv threshold.
    pub threshold: u64,
}

impl PostgresOptions {
    /// Pool `pool` in the database at `url`, its large tier as the pool
    /// declares it, the default threshold.
    pub fn new(url: impl Into<String>, pool: impl Into<String>) -> PostgresOptions {
        PostgresOptions {
            pg: PgOptions::new(url, pool),
            large: PgLarge::FromPool,
            threshold: DEFAULT_THRESHOLD,
        }
    }

    /// The large tier.
    pub fn large(mut self, large: PgLarge) -> Self {
        self.large = large;
        self
    }

    /// The kv threshold.
    pub fn threshold(mut self, bytes: u64) -> Self {
        self.threshold = bytes;
        self
    }

    /// Connections kept open.
    pub fn max_connections(mut self, n: usize) -> Self {
        self.pg = self.pg.max_connections(n);
        self
    }
}

impl Store {
    /// Opens a single-instance pool in PostgreSQL (REQ-3): the `postgres`
    /// kv engine, the large tier the pool declares, and the single-node
    /// arbiter with its staged rows and roots durable in the database. The
    /// delete window is the pool's (`alkblobs_pools.delete_window`), never
    /// a client default.
    ///
    /// Fails with [`Error::Config`] if the database lacks the extension or
    /// speaks another version of it, if the pool does not exist or the role
    /// may not use it, if the pool is a fleet pool (many instances: the
    /// fleet arbiter, not an in-process one, may sweep it), or if the large
    /// tier asked for is not the one the pool declares.
    pub async fn open_postgres(opts: PostgresOptions) -> Result<Store> {
        let (pg, info) = PgPool::connect(&opts.pg).await?;
        if info.mode != PoolMode::Single {
            return Err(Error::Config(format!(
                "pool {:?} is a fleet pool: several instances may use it, so an in-process arbiter must not sweep it; use a single-instance pool (alkblobs_create_pool(…, single_instance => true)) for one instance",
                info.name
            )));
        }
        let tables = Arc::new(PgGcTables::new(pg.clone()));
        let arbiter = Arc::new(SingleNodeArbiter::with_tables(tables, info.delete_window));
        let builder = Store::builder()
            .kv(PostgresBackend::new(pg.clone()))
            .arbiter(arbiter)
            .record(Arc::new(PgRecord::new(pg.clone(), &info)))
            .threshold(opts.threshold)
            .single_instance();
        let mismatch = |asked: &str| {
            Error::Config(format!(
                "pool {:?} keeps large content in tier {:?}, not {asked}; open it with that large tier",
                info.name,
                info.large_tier.as_str()
            ))
        };
        let builder = match (&opts.large, info.large_tier) {
            (PgLarge::FromPool | PgLarge::PgLo, PoolLargeTier::PgLo) => {
                builder.large(PgLoBackend::new(pg))
            }
            (PgLarge::FromPool | PgLarge::None, PoolLargeTier::None) => builder.kv_only(),
            (PgLarge::Local(dir), PoolLargeTier::Local) => {
                builder.large(LocalBackend::open(dir, LocalOptions::default()).await?)
            }
            #[cfg(feature = "s3")]
            (PgLarge::FromPool, PoolLargeTier::S3) => {
                let o = pool_s3(&info, None)?;
                builder.large(crate::backend::s3::S3Backend::open(o).await?)
            }
            #[cfg(feature = "s3")]
            (PgLarge::S3(o), PoolLargeTier::S3) => {
                let o = pool_s3(&info, Some(o))?.shared(false);
                builder.large(crate::backend::s3::S3Backend::open(o).await?)
            }
            #[cfg(feature = "s3")]
            (PgLarge::S3(_), _) => return Err(mismatch("s3")),
            #[cfg(not(feature = "s3"))]
            (PgLarge::FromPool, PoolLargeTier::S3) => return Err(no_s3(&info)),
            (PgLarge::FromPool, PoolLargeTier::Local) => {
                return Err(Error::Config(format!(
                    "pool {:?} keeps large content in files on a local tier: give its directory (PgLarge::Local)",
                    info.name
                )));
            }
            #[cfg(feature = "serve")]
            (PgLarge::Routed(_), _) => {
                return Err(Error::Config(
                    "a routed large tier is a fleet's (FleetLarge::Routed, --fleet --large routed=URL): a single-instance store sweeps in process and would delete through it".into(),
                ));
            }
            (PgLarge::PgLo, _) => return Err(mismatch("pg-lo")),
            (PgLarge::None, _) => return Err(mismatch("none")),
            (PgLarge::Local(_), _) => return Err(mismatch("local")),
        };
        builder.build()
    }
}
