//! The store conformance suite over every store configuration.

use alkblobs::backend::local::{LocalBackend, LocalOptions};
use alkblobs::backend::mem::MemBackend;
use alkblobs::backend::sqlite::{SqliteBackend, SqliteOptions};
use alkblobs::conformance::store::Config;
use alkblobs::store_suite;
use alkblobs::{Durability, Store};
use alkblobs_tests::gc_support::faulty_durable_tables;

const MIB: usize = 1 << 20;
const TIERED: Config = Config {
    kv_only: false,
    big: 100 * MIB,
    list_keys: 100_000,
};
const KV_ONLY: Config = Config {
    kv_only: true,
    big: 0,
    list_keys: 100_000,
};

async fn sqlite(dir: &std::path::Path) -> SqliteBackend {
    SqliteBackend::open(dir.join("index.sqlite"), SqliteOptions::default())
        .await
        .unwrap()
}

async fn local(dir: &std::path::Path) -> LocalBackend {
    LocalBackend::open(dir.join("large"), LocalOptions::default())
        .await
        .unwrap()
}

store_suite!(mem_mem, TIERED, async {
    let s = Store::builder()
        .kv(MemBackend::new())
        .large(MemBackend::new())
        .build()
        .unwrap();
    (s, ())
});

store_suite!(mem_kv_only, KV_ONLY, async {
    let s = Store::builder()
        .kv(MemBackend::new())
        .kv_only()
        .build()
        .unwrap();
    (s, ())
});

store_suite!(sqlite_local, TIERED, async {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::builder()
        .sqlite(sqlite(dir.path()).await)
        .large(local(dir.path()).await)
        .build()
        .unwrap();
    (s, dir)
});

store_suite!(sqlite_kv_only, KV_ONLY, async {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::builder()
        .sqlite(sqlite(dir.path()).await)
        .kv_only()
        .build()
        .unwrap();
    (s, dir)
});

store_suite!(mem_local, TIERED, async {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::builder()
        .kv(MemBackend::new())
        .large(local(dir.path()).await)
        .build()
        .unwrap();
    (s, dir)
});

// A small threshold moves most traffic to the large tier.
store_suite!(sqlite_local_small_threshold, TIERED, async {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::builder()
        .sqlite(sqlite(dir.path()).await)
        .large(local(dir.path()).await)
        .threshold(1024)
        .build()
        .unwrap();
    (s, dir)
});

// The embedded default as `open_dir` builds it, relaxed for speed.
store_suite!(open_dir_relaxed, TIERED, async {
    let dir = tempfile::tempdir().unwrap();
    let opts = alkblobs::DirOptions::new().durability(Durability::Relaxed);
    let s = Store::open_dir_with(dir.path(), opts).await.unwrap();
    (s, dir)
});

// Engines behind the fault wrapper (disarmed) behave exactly the same.
store_suite!(faulty_wrapped, TIERED, async {
    let dir = tempfile::tempdir().unwrap();
    let s = faulty_durable_tables(dir.path(), Durability::Durable)
        .await
        .build()
        .unwrap();
    (s, dir)
});

// `Box<T>` of an engine is an engine (every method forwarded).
store_suite!(boxed_engines, TIERED, async {
    let kv: Box<MemBackend> = Box::new(MemBackend::new());
    let large: Box<MemBackend> = Box::new(MemBackend::new());
    let s = Store::builder().kv(kv).large(large).build().unwrap();
    (s, ())
});
