//! Closing a store, and the error classes a caller branches on.

use alkblobs::{DirOptions, Error, ErrorKind, Store, sqlstate_kind};
use alkblobs_tests::data;

fn wal_files(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with("-wal") || n.ends_with("-shm"))
        .collect()
}

/// A relaxed embedded store holding 200 blobs of 4 KiB.
async fn store_with_blobs() -> (tempfile::TempDir, Store, Vec<alkblobs::Key>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_dir_with(dir.path(), DirOptions::new().relaxed())
        .await
        .unwrap();
    let mut keys = Vec::new();
    for i in 0..200 {
        keys.push(store.put(data(i, 4096)).await.unwrap().key);
    }
    (dir, store, keys)
}

/// `close` checkpoints and removes the WAL, and later calls fail with an
/// error (no panic, nothing lost: reopening finds every blob).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_checkpoints_and_removes_the_wal() {
    let (dir, store, keys) = store_with_blobs().await;
    assert!(
        !wal_files(dir.path()).is_empty(),
        "a WAL exists while the store is open"
    );
    store.close().await.unwrap();
    assert_eq!(wal_files(dir.path()), Vec::<String>::new());
    for result in [
        store.put(data(999, 10)).await.map(|_| ()),
        store.put(data(998, 1 << 20)).await.map(|_| ()),
        store.get(&keys[0]).await.map(|_| ()),
        store.sweep(alkblobs::SweepOptions::new()).await.map(|_| ()),
    ] {
        assert_eq!(result.unwrap_err().kind(), ErrorKind::Closed);
    }

    // The instance locks were released: the store opens again while the
    // closed handle is still alive.
    let again = Store::open_dir(dir.path()).await.unwrap();
    drop(store);
    for k in &keys {
        assert!(again.has(k).await.unwrap(), "a blob was lost by close");
    }
}

/// Dropping the last handle without `close` leaves no WAL either: the
/// readers close before the writer, so the writer's close checkpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_last_handle_removes_the_wal() {
    let (dir, store, keys) = store_with_blobs().await;
    // Reads put connections into the reader pool.
    for k in &keys {
        assert!(store.get(k).await.unwrap().is_some());
    }
    let clone = store.clone();
    drop(store);
    assert!(!wal_files(dir.path()).is_empty(), "a clone keeps it open");
    drop(clone);
    assert_eq!(wal_files(dir.path()), Vec::<String>::new());
}

/// Every error says its class, and only conflicts and lost connections are
/// retryable.
#[tokio::test]
async fn errors_classify() {
    let store = Store::builder()
        .kv(alkblobs::backend::mem::MemBackend::new())
        .kv_only()
        .threshold(10)
        .build()
        .unwrap();
    let too_large = store.put(vec![0u8; 11]).await.unwrap_err();
    assert_eq!(too_large.kind(), ErrorKind::TooLarge);
    let missing = store
        .pin(&alkblobs_tests::absent_key("x"))
        .await
        .unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NotFound);
    let bad: alkblobs::Result<alkblobs::Key> = "zz".parse::<alkblobs::Key>().map_err(Error::from);
    assert_eq!(bad.unwrap_err().kind(), ErrorKind::InvalidInput);
    let k = alkblobs::Key::of(b"a");
    let mismatch = store.put_verified(&k, b"b".to_vec()).await.unwrap_err();
    assert_eq!(mismatch.kind(), ErrorKind::Corrupt);
    for e in [&too_large, &missing, &mismatch] {
        assert!(!e.is_retryable(), "{e}");
    }

    // The one SQLSTATE mapping.
    for (code, kind) in [
        ("40001", ErrorKind::Conflict),
        ("40P01", ErrorKind::Conflict),
        ("08006", ErrorKind::Unavailable),
        ("57P01", ErrorKind::Unavailable),
        ("AB002", ErrorKind::Collected),
        ("42501", ErrorKind::Config),
        ("22004", ErrorKind::InvalidInput),
        ("XX000", ErrorKind::Engine),
    ] {
        assert_eq!(sqlstate_kind(code), kind, "{code}");
    }
    // …and the same classes through the constructor engines use.
    for (code, kind) in [
        ("40001", ErrorKind::Conflict),
        ("08006", ErrorKind::Unavailable),
        ("AB002", ErrorKind::Collected),
        ("AB001", ErrorKind::Corrupt),
        ("42501", ErrorKind::Config),
        ("22004", ErrorKind::InvalidInput),
        ("XX000", ErrorKind::Engine),
    ] {
        let e = Error::from_sqlstate("postgres(db)", code, None, "reported");
        assert_eq!(e.kind(), kind, "{code}: {e}");
        assert_eq!(
            e.is_retryable(),
            matches!(kind, ErrorKind::Conflict | ErrorKind::Unavailable),
            "{code}"
        );
        assert!(e.to_string().starts_with("postgres(db)"), "{e}");
    }
    let k = alkblobs::Key::of(b"gone");
    match Error::from_sqlstate("postgres(db)", "AB002", Some(k), "not present") {
        Error::Collected { key } => assert_eq!(key, k),
        other => panic!("expected Collected, got {other:?}"),
    }
    // Library messages carry no CLI vocabulary.
    let in_use = Error::InUse {
        resource: "/x/index.lock".into(),
        holder: "pid 1".into(),
    };
    assert!(!in_use.to_string().contains("--"), "{in_use}");
}
