//! The `postgres` kv engine and the `pg-lo` large engine (feature
//! `postgres`): a pool's entries in the `alkblobs` extension's tables,
//! reached only through the extension's SQL functions, over tokio-postgres
//! and a deadpool connection pool.
//!
//! Both engines are views of one pool: `postgres` holds the entries of tier
//! `kv` (values inline), `pg-lo` those of tier `lo` (large objects, the
//! `entries` row being the companion-table authority). Every statement is
//! sent with `query_typed` (explicit parameter types, an unnamed statement,
//! one round trip): no named prepared statement outlives its transaction, so
//! the engines also work through a transaction-mode connection pooler.
//!
//! Engines store and delete what they are told. In a single-instance pool
//! (`alkblobs_create_pool(…, single_instance => true)`) puts carry no pin
//! (`owner => NULL`): the store's in-process arbiter pins and sweeps. In a
//! fleet pool every put carries the pin of its store instance
//! ([`PgPool::pinning_for`]), so the entry row and the pin row commit in
//! one transaction; the fleet arbiter renews and releases those rows and
//! the extension sweeps.

mod kv;
mod pg_lo;
mod queries;
mod writer;

// The connection layer is the crate's `pg` module (shared with the fleet
// arbiter); its public types are re-exported here, where they always were.
pub use crate::pg::{
    EXTENSION_VERSION, Flavour, PgOptions, PgPool, PoolHealth, PoolInfo, PoolLargeTier, PoolMode,
    PoolSettings,
};
pub use kv::PostgresBackend;
pub use pg_lo::PgLoBackend;

/// Bytes per `alkblobs_lo_write` / `alkblobs_lo_read` call (the server
/// reads and writes a large object in 2 KiB pages either way; bigger
/// windows only save round trips and per-call overhead).
const WINDOW: usize = 4 << 20;
