//! The arbiter conformance suite over every store configuration, and the
//! builder's refusal to sweep a shared engine with an in-process arbiter.

use std::sync::Arc;

use alkblobs::backend::local::{LocalBackend, LocalOptions};
use alkblobs::backend::mem::MemBackend;
use alkblobs::backend::sqlite::{SqliteBackend, SqliteOptions};
use alkblobs::conformance::fault::FaultBackend;
use alkblobs::{Durability, Error, ErrorKind, Store, arbiter_suite};
use alkblobs_tests::gc_support::faulty_durable_tables;

async fn sqlite(dir: &std::path::Path) -> SqliteBackend {
    let opts = SqliteOptions::default().durability(Durability::Relaxed);
    SqliteBackend::open(dir.join("index.sqlite"), opts)
        .await
        .unwrap()
}

async fn local(dir: &std::path::Path) -> LocalBackend {
    let opts = LocalOptions::default().durability(Durability::Relaxed);
    LocalBackend::open(dir.join("large"), opts).await.unwrap()
}

arbiter_suite!(mem_mem, async {
    let s = Store::builder()
        .kv(MemBackend::new())
        .large(MemBackend::new())
        .threshold(1024)
        .build()
        .unwrap();
    (s, ())
});

arbiter_suite!(mem_local, async {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::builder()
        .kv(MemBackend::new())
        .large(local(dir.path()).await)
        .threshold(1024)
        .build()
        .unwrap();
    (s, dir)
});

arbiter_suite!(sqlite_local, async {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::builder()
        .sqlite(sqlite(dir.path()).await)
        .large(local(dir.path()).await)
        .threshold(1024)
        .build()
        .unwrap();
    (s, dir)
});

arbiter_suite!(sqlite_kv_only, async {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::builder()
        .sqlite(sqlite(dir.path()).await)
        .kv_only()
        .build()
        .unwrap();
    (s, dir)
});

arbiter_suite!(open_dir, async {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open_dir_with(dir.path(), alkblobs::DirOptions::new().relaxed())
        .await
        .unwrap();
    (s, dir)
});

arbiter_suite!(faulty_wrapped, async {
    let dir = tempfile::tempdir().unwrap();
    let s = faulty_durable_tables(dir.path(), Durability::Relaxed)
        .await
        .threshold(1024)
        .build()
        .unwrap();
    assert!(s.gc_durable());
    (s, dir)
});

/// A kv engine other instances can reach, swept by the in-process arbiter,
/// is the fleet data-loss shape (ADR-008 §2): the builder refuses it, naming
/// the rule, unless the embedder declares a single-instance topology.
#[tokio::test]
async fn a_shared_engine_cannot_be_swept_by_an_in_process_arbiter() {
    let kv = FaultBackend::new(Arc::new(MemBackend::new()));
    kv.declare_shared();
    let kv = Arc::new(kv);
    let err = Store::builder()
        .kv(kv.clone())
        .kv_only()
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    match &err {
        Error::UnsafeTopology { engine, arbiter } => {
            assert_eq!(
                (engine.as_str(), arbiter.as_str()),
                ("fault(mem)", "single-node")
            )
        }
        other => panic!("expected UnsafeTopology, got {other:?}"),
    }
    assert!(err.to_string().contains("single_instance()"), "{err}");

    // A shared large engine is refused the same way.
    let large = FaultBackend::new(Arc::new(MemBackend::new()));
    large.declare_shared();
    let err = Store::builder()
        .kv(MemBackend::new())
        .large(large)
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::UnsafeTopology { .. }), "{err:?}");

    // Declared single-instance (REQ-3), it builds and sweeps.
    let store = Store::builder()
        .kv(kv)
        .kv_only()
        .single_instance()
        .build()
        .unwrap();
    let report = store
        .sweep(alkblobs::SweepOptions::new().window(std::time::Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(report.aborted, None);
}

/// A SQLite kv engine handed to `StoreBuilder::kv` behind an `Arc` (or a
/// `Box`) is still paired with its database's durable tables: roots given
/// then survive a restart. (Until the engine said so itself,
/// `Backend::sqlite_database`, a type check saw only the `Arc` and kept
/// the roots in process: a restart forgot them, and the next sweep could
/// collect what they protected.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_engine_behind_a_pointer_keeps_its_roots_durable() {
    for boxed in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (db, large) = Store::dir_paths(dir.path());
        let kv = SqliteBackend::open(&db, SqliteOptions::default())
            .await
            .unwrap();
        let local = LocalBackend::open(&large, LocalOptions::default())
            .await
            .unwrap();
        let builder = if boxed {
            Store::builder().kv(Box::new(kv))
        } else {
            Store::builder().kv(Arc::new(kv))
        };
        let store = builder.large(local).build().unwrap();
        let put = store
            .put(alkblobs::conformance::data(1, 100))
            .await
            .unwrap();
        store.add_roots(&[put.key]).await.unwrap();
        drop(put);
        store.close().await.unwrap();
        drop(store);
        let store = Store::open_dir(dir.path()).await.unwrap();
        let roots: Vec<alkblobs::Key> = futures::TryStreamExt::try_collect(store.roots())
            .await
            .unwrap();
        assert_eq!(
            roots.len(),
            1,
            "boxed={boxed}: the root was kept in process only"
        );
        store.close().await.unwrap();
    }
}
