//! The alkblobs PostgreSQL extension: fleet garbage collection inside the
//! database.
//!
//! The SQL API and the protocol live in `sql/` (loaded in order:
//! `bootstrap.sql`, these Rust functions, `api/*.sql` by file name,
//! `finalize.sql`). Rust
//! supplies what SQL cannot do well: BLAKE3 over values and over large
//! objects streamed in bounded windows; and the sweep scheduler, a
//! background worker (`scheduler.rs`).

use pgrx::prelude::*;

mod scheduler;

::pgrx::pg_module_magic!();

/// Loading the library: the scheduler's settings, and its workers when
/// loaded through `shared_preload_libraries` (see `scheduler.rs`).
#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    scheduler::init();
}

pgrx::extension_sql_file!("../../sql/bootstrap.sql", name = "bootstrap", bootstrap);
// The SQL API, by concern, in file-name order (each file requires the one
// before it; scripts/gen-upgrade.py checks that this list is sql/api/*.sql).
pgrx::extension_sql_file!(
    "../../sql/api/10-helpers.sql",
    name = "api_10_helpers",
    requires = [
        "bootstrap",
        alkblobs::blake3,
        alkblobs::first_bad,
        alkblobs::lo_blake3,
        alkblobs::lock_for_sweep,
        alkblobs::scheduler_preloaded
    ]
);
pgrx::extension_sql_file!(
    "../../sql/api/20-pools.sql",
    name = "api_20_pools",
    requires = ["api_10_helpers"]
);
pgrx::extension_sql_file!(
    "../../sql/api/30-puts-and-pins.sql",
    name = "api_30_puts_and_pins",
    requires = ["api_20_pools"]
);
pgrx::extension_sql_file!(
    "../../sql/api/40-reads.sql",
    name = "api_40_reads",
    requires = ["api_30_puts_and_pins"]
);
pgrx::extension_sql_file!(
    "../../sql/api/50-single-instance.sql",
    name = "api_50_single_instance",
    requires = ["api_40_reads"]
);
pgrx::extension_sql_file!(
    "../../sql/api/60-large-objects.sql",
    name = "api_60_large_objects",
    requires = ["api_50_single_instance"]
);
pgrx::extension_sql_file!(
    "../../sql/api/70-liveness.sql",
    name = "api_70_liveness",
    requires = ["api_60_large_objects"]
);
pgrx::extension_sql_file!(
    "../../sql/api/80-local-tier.sql",
    name = "api_80_local_tier",
    requires = ["api_70_liveness"]
);
pgrx::extension_sql_file!(
    "../../sql/api/85-review.sql",
    name = "api_85_review",
    requires = ["api_80_local_tier"]
);
pgrx::extension_sql_file!(
    "../../sql/api/90-sweep.sql",
    name = "api_90_sweep",
    requires = ["api_85_review"]
);
pgrx::extension_sql_file!(
    "../../sql/api/91-scheduler.sql",
    name = "api_91_scheduler",
    requires = ["api_90_sweep"]
);
pgrx::extension_sql_file!(
    "../../sql/api/92-health.sql",
    name = "api_92_health",
    requires = ["api_91_scheduler"]
);
pgrx::extension_sql_file!(
    "../../sql/api/93-explain.sql",
    name = "api_93_explain",
    requires = ["api_92_health"]
);
pgrx::extension_sql_file!(
    "../../sql/api/94-verify.sql",
    name = "api_94_verify",
    requires = ["api_93_explain"]
);
pgrx::extension_sql_file!("../../sql/finalize.sql", name = "finalize", finalize);

/// The key of a value: its BLAKE3 hash (32 bytes). Public and harmless, for
/// operators in psql: `SELECT alkblobs_key('hello')`.
#[pg_extern(immutable, parallel_safe, strict)]
fn alkblobs_key(value: &[u8]) -> Vec<u8> {
    ::blake3::hash(value).as_bytes().to_vec()
}

/// Functions in the internal `alkblobs` schema (not granted to anyone; the
/// API's SECURITY DEFINER functions call them).
#[pg_schema]
mod alkblobs {
    use pgrx::prelude::*;

    /// Window size when hashing a large object (1 MiB).
    const WINDOW: i64 = 1 << 20;

    /// BLAKE3 of a value: its key.
    #[pg_extern(immutable, parallel_safe, strict)]
    fn blake3(value: &[u8]) -> Vec<u8> {
        ::blake3::hash(value).as_bytes().to_vec()
    }

    /// The 1-based position of the first pair of a batch that is not a
    /// valid put: a NULL key or value, a key that is not 32 bytes, or a
    /// value that does not hash to its key. NULL when every pair is valid.
    /// Extra elements of the longer array are problems too. One pass in
    /// Rust: the batch put's checks cost ~1 µs per 1 KiB value here, not
    /// three `unnest` scans.
    #[pg_extern(immutable, parallel_safe, strict)]
    fn first_bad(keys: Array<'_, &[u8]>, vals: Array<'_, &[u8]>) -> Option<i32> {
        let (mut ks, mut vs) = (keys.iter(), vals.iter());
        let mut i = 0i32;
        loop {
            i += 1;
            match (ks.next(), vs.next()) {
                (None, None) => return None,
                (Some(Some(k)), Some(Some(v)))
                    if k.len() == 32 && ::blake3::hash(v).as_bytes() == k => {}
                _ => return Some(i),
            }
        }
    }

    /// Locks relation `rel` IN SHARE UPDATE EXCLUSIVE MODE by OID, for the
    /// rest of the transaction. By OID because a name can be made to mean
    /// another relation at any moment (`ALTER SCHEMA … RENAME` takes no
    /// lock on the tables in it); without a privilege check because the
    /// extension only ever locks tables their owners registered, and that
    /// lock (which leaves writers alone) is what keeps their definition
    /// still while a sweep relies on it. Waits at most `lock_timeout`
    /// (55P03). Not granted to anyone: only the extension's functions call
    /// it.
    #[pg_extern(strict)]
    fn lock_for_sweep(rel: pg_sys::Oid) {
        // SAFETY: LockRelationOid takes any OID (an unused one locks
        // nothing that exists); errors are raised as PostgreSQL ERRORs.
        unsafe {
            pg_sys::LockRelationOid(rel, pg_sys::ShareUpdateExclusiveLock as pg_sys::LOCKMODE)
        };
    }

    /// Whether this server loads the library through
    /// `shared_preload_libraries`, which the sweep scheduler needs (its
    /// workers start with the server). False on a server nobody
    /// reconfigured: everything but scheduling works there.
    #[pg_extern(stable, parallel_safe)]
    fn scheduler_preloaded() -> bool {
        crate::scheduler::preloaded()
    }

    /// BLAKE3 and size of a large object, read in 1 MiB `lo_get` windows so
    /// that no part of it is ever one big bytea.
    #[pg_extern(strict)]
    fn lo_blake3(
        loid: pg_sys::Oid,
    ) -> TableIterator<'static, (name!(hash, Vec<u8>), name!(size, i64))> {
        let mut hasher = ::blake3::Hasher::new();
        let mut offset: i64 = 0;
        loop {
            let chunk: Option<Vec<u8>> = Spi::get_one_with_args(
                "SELECT pg_catalog.lo_get($1, $2, $3)",
                &[loid.into(), offset.into(), (WINDOW as i32).into()],
            )
            .unwrap_or_else(|e| error!("cannot read large object {}: {e}", u32::from(loid)));
            let chunk = chunk.unwrap_or_default();
            if chunk.is_empty() {
                break;
            }
            hasher.update(&chunk);
            offset += chunk.len() as i64;
            if (chunk.len() as i64) < WINDOW {
                break;
            }
        }
        TableIterator::once((hasher.finalize().as_bytes().to_vec(), offset))
    }
}

#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
