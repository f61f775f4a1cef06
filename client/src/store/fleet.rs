//! The fleet preset (REQ-2, feature `postgres`): many store instances on
//! many nodes share one pool in PostgreSQL. Turned on only by calling
//! [`Store::open_fleet`] — never inferred from the engine — with the
//! fleet arbiter ([`crate::arbiter::fleet`]): pin rows renewed by the
//! store, sweeps inside the extension.
//!
//! **The fleet-validity rule** (ADR-008 §3): a fleet's large tier over pool
//! content is declared, and must be one of
//! - [`FleetLarge::PgLo`]: large objects in the same database — the same
//!   PostgreSQL instance as the kv engine by construction (both engines use
//!   one connection pool);
//! - [`FleetLarge::SharedLocal`]: files under a directory that is the same
//!   fleet-shared media on every node (the operator's assertion: atomic
//!   rename, close-to-open consistency); pin rows commit before a file is
//!   renamed into place, and the sweep deletes a file only under the
//!   database's arbitration;
//! - [`FleetLarge::S3`] (feature `s3`): objects under the pool's bucket
//!   and prefix (`alkblobs_pools.large_location`), which every node names
//!   alike. S3 has the shared media's qualities (an object appears whole
//!   or not at all, reads after writes see it, no locks), so it runs the
//!   shared tier's protocol of `SharedLocal` — pin row and object record
//!   first, upload, publish; tombstones before deletion — with another
//!   medium;
//! - [`FleetLarge::KvOnly`]: no large tier on this node: puts over the
//!   threshold are refused with [`Error::TooLarge`];
//! - `FleetLarge::Routed` (feature `serve`): no large tier on this node
//!   either, but large content goes through a storage node — a fleet store
//!   of the same pool declaring its large tier, running `alkblobs serve` —
//!   by verified uploads, and every byte read back is checked against its
//!   key. Accepted over any pool that has a large tier.
//!
//! A `PgLo`, `SharedLocal` or `S3` declaration must match the pool's own
//! (`alkblobs_pools.large_tier`: `pg-lo`, `local`, `s3`, and for `s3` the
//! same location): every node that stores
//! large content uses the same tier. `KvOnly` is sound over any pool.
//! Anything else is refused naming the rule.

use std::path::PathBuf;
use std::sync::Arc;

use super::{DEFAULT_THRESHOLD, Store};
use crate::arbiter::fleet::{FleetArbiter, instance_id};
use crate::backend::local::{LocalBackend, LocalOptions};
use crate::backend::postgres::{
    PgLoBackend, PgOptions, PgPool, PoolLargeTier, PoolMode, PostgresBackend,
};
use crate::pg::PgRecord;
use crate::{Error, Result};

/// The large tier a fleet store declares (the fleet-validity rule).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FleetLarge {
    /// Large objects in the pool's database.
    PgLo,
    /// Files under this directory, which is the same fleet-shared media on
    /// every node: the operator asserts it by choosing this variant.
    SharedLocal(PathBuf),
    /// Objects under the pool's S3 location (feature `s3`); the options'
    /// location must be the pool's. The engine is opened fleet-shared (no
    /// prefix lease: the database arbitrates).
    #[cfg(feature = "s3")]
    S3(crate::backend::s3::S3Options),
    /// No large tier on this node (routed): puts over the threshold are
    /// refused with [`Error::TooLarge`].
    KvOnly,
    /// The pool's large tier through a storage node's `alkblobs serve`
    /// (feature `serve`): a kv-only node that still puts and reads large
    /// content, every byte it receives checked against its key
    /// ([`crate::backend::routed::RoutedBackend`]). The storage node is a
    /// fleet instance of the same pool declaring the pool's tier, so the
    /// content lands where the rule says; its deletions are the storage
    /// node's (sweep there).
    #[cfg(feature = "serve")]
    Routed(crate::backend::routed::RoutedOptions),
}

impl FleetLarge {
    /// The pool's `large_tier` this declaration matches.
    fn pool_tier(&self) -> PoolLargeTier {
        match self {
            FleetLarge::PgLo => PoolLargeTier::PgLo,
            FleetLarge::SharedLocal(_) => PoolLargeTier::Local,
            #[cfg(feature = "s3")]
            FleetLarge::S3(_) => PoolLargeTier::S3,
            FleetLarge::KvOnly => PoolLargeTier::None,
            #[cfg(feature = "serve")]
            FleetLarge::Routed(_) => PoolLargeTier::None,
        }
    }
}

/// Options for [`Store::open_fleet`]: a builder.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct FleetOptions {
    /// The connection and the pool.
    pub pg: PgOptions,
    /// The declared large tier.
    pub large: FleetLarge,
    /// The kv threshold.
    pub threshold: u64,
    /// This store instance's id (the owner of its pin rows); a fresh one
    /// (host, process, random) when not given. Two live instances must not
    /// share one.
    pub instance: Option<String>,
    /// On a shared `local` tier: how long an unlocked staging file must be
    /// untouched before a sweep reclaims it as abandoned (the local
    /// engine's default when not given).
    pub staging_grace: Option<std::time::Duration>,
}

impl FleetOptions {
    /// Fleet pool `pool` in the database at `url`, its large tier declared.
    pub fn new(url: impl Into<String>, pool: impl Into<String>, large: FleetLarge) -> Self {
        FleetOptions {
            pg: PgOptions::new(url, pool),
            large,
            threshold: DEFAULT_THRESHOLD,
            instance: None,
            staging_grace: None,
        }
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

    /// How long an unlocked staging file on a shared `local` tier must be
    /// untouched before a sweep reclaims it as abandoned.
    pub fn staging_grace(mut self, grace: std::time::Duration) -> Self {
        self.staging_grace = Some(grace);
        self
    }

    /// This store instance's id (1 to 200 characters).
    pub fn instance(mut self, id: impl Into<String>) -> Self {
        self.instance = Some(id.into());
        self
    }
}

impl Store {
    /// Opens a fleet pool (REQ-2): the `postgres` kv engine and the
    /// declared large tier, every put committing a pin row of this store
    /// instance with its entry, renewed every TTL/3 by a task the store
    /// owns (stopped by [`Store::close`] or when the last clone drops), and
    /// sweeps run by the extension. The delete window and the pin TTL are
    /// the pool's, read from the database.
    ///
    /// Fails with [`Error::Config`] if the database lacks the extension,
    /// the pool does not exist or the role may not use it, the pool is a
    /// single-instance pool, or the declared large tier breaks the
    /// fleet-validity rule (see the module docs).
    pub async fn open_fleet(opts: FleetOptions) -> Result<Store> {
        if opts.pg.max_connections < 3 {
            // A sweep holds its lease on one connection and runs its calls
            // on another; a streaming read or an upload may hold a third.
            return Err(Error::Config(format!(
                "a fleet store needs at least 3 connections (a sweep's lease, its calls, and the work it races), got {}",
                opts.pg.max_connections
            )));
        }
        let (pg, info) = PgPool::connect(&opts.pg).await?;
        if info.mode != PoolMode::Fleet {
            return Err(Error::Config(format!(
                "pool {:?} is a single-instance pool: one store instance owns it and sweeps it in process (Store::open_postgres); a fleet needs a fleet pool (alkblobs_create_pool without single_instance)",
                info.name
            )));
        }
        // A kv-only node stores no large content, which is sound over any
        // pool (routed: a storage node holds the pool's large tier).
        #[cfg(feature = "serve")]
        if matches!(opts.large, FleetLarge::Routed(_)) && info.large_tier == PoolLargeTier::None {
            return Err(Error::Config(format!(
                "the fleet-validity rule: a routed node sends large content to a storage node holding the pool's large tier, and pool {:?} has none (large_tier none): declare FleetLarge::KvOnly (--large none)",
                info.name
            )));
        }
        let routed = {
            #[cfg(feature = "serve")]
            {
                matches!(opts.large, FleetLarge::Routed(_))
            }
            #[cfg(not(feature = "serve"))]
            {
                false
            }
        };
        if opts.large != FleetLarge::KvOnly && !routed && opts.large.pool_tier() != info.large_tier
        {
            return Err(Error::Config(format!(
                "the fleet-validity rule: every node of a fleet declares the pool's large tier, and pool {:?} keeps large content in {:?}, not {:?} ({}). Declare {}",
                info.name,
                info.large_tier.as_str(),
                opts.large.pool_tier().as_str(),
                "pg-lo: large objects in the same database; local: the same fleet-shared media on every node; s3: the pool's bucket and prefix; none: kv-only, large content routed to a storage node",
                match info.large_tier {
                    PoolLargeTier::PgLo => "FleetLarge::PgLo (--large pg-lo)",
                    PoolLargeTier::Local =>
                        "FleetLarge::SharedLocal(dir) (--large local=DIR --shared-media)",
                    PoolLargeTier::S3 =>
                        "FleetLarge::S3(options) (--large s3://bucket/prefix, the pool's location)",
                    PoolLargeTier::None => "FleetLarge::KvOnly (--large none)",
                }
            )));
        }
        // An s3 declaration names the pool's own location.
        #[cfg(feature = "s3")]
        let s3 = match &opts.large {
            FleetLarge::S3(o) => Some(super::postgres::pool_s3(&info, Some(o))?),
            _ => None,
        };
        let owner = opts.instance.clone().unwrap_or_else(instance_id);
        if owner.is_empty() || owner.chars().count() > 200 {
            return Err(Error::Config(format!(
                "a store-instance id is 1 to 200 characters, got {}",
                owner.chars().count()
            )));
        }
        let pg = pg.pinning_for(&owner);
        // The arbiter's own two connections (renewal, releases, pin calls).
        let (control, _) = PgPool::connect(&opts.pg.clone().max_connections(2)).await?;
        let record_info = info.clone();
        let arbiter = Arc::new(FleetArbiter::start(pg.clone(), control, info, owner).await?);
        // The object generations the database hands this instance's puts,
        // which an s3 engine names its objects by.
        #[cfg(feature = "s3")]
        let generations = arbiter.generations();
        let builder = Store::builder()
            .kv(PostgresBackend::new(pg.clone()))
            .arbiter(arbiter)
            .record(Arc::new(PgRecord::new(pg.clone(), &record_info)))
            .threshold(opts.threshold);
        let builder = match opts.large {
            FleetLarge::PgLo => builder.large(PgLoBackend::new(pg)),
            FleetLarge::KvOnly => builder.kv_only(),
            #[cfg(feature = "serve")]
            FleetLarge::Routed(o) => {
                builder.large(crate::backend::routed::RoutedBackend::open(o).await?)
            }
            FleetLarge::SharedLocal(dir) => {
                let mut lo = LocalOptions::default().shared_media(true);
                if let Some(g) = opts.staging_grace {
                    lo = lo.staging_grace(g);
                }
                builder.large(LocalBackend::open(dir, lo).await?)
            }
            #[cfg(feature = "s3")]
            FleetLarge::S3(o) => {
                let _ = o;
                let o = s3.expect("checked above");
                builder.large(crate::backend::s3::S3Backend::open_fleet(o, generations).await?)
            }
        };
        builder.build()
    }
}
