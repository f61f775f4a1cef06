//! Bad input and hostile environments: each gets a clear typed error, never
//! a panic, and nothing already stored is lost.

use std::time::Duration;

use alkblobs::backend::local::{LocalBackend, LocalOptions};
use alkblobs::backend::sqlite::{SqliteBackend, SqliteOptions};
use alkblobs::backend::{Backend, LargeBackend};
use alkblobs::{Error, Key, OpenMode, Store, Tier};
use alkblobs_tests::data;
use alkblobs_tests::proc::Helper;
use bytes::Bytes;
use futures::TryStreamExt;
use tokio::io::AsyncReadExt;

const HELPER: &str = env!("CARGO_BIN_EXE_alkblobs-test-helper");

fn message(e: &Error) -> String {
    use std::error::Error as _;
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        s.push_str(": ");
        s.push_str(&x.to_string());
        src = x.source();
    }
    s
}

#[test]
fn malformed_keys_are_typed_errors() {
    for bad in [
        "",
        "abc",
        "../../etc/passwd",
        &"g".repeat(64),
        &"A".repeat(64),
        &"0".repeat(65),
    ] {
        let e: Error = bad.parse::<Key>().unwrap_err().into();
        assert!(matches!(e, Error::InvalidKey(_)), "{bad:?}");
        assert!(e.to_string().starts_with("invalid key: a key is"), "{e}");
    }
}

#[tokio::test]
async fn unwritable_data_directory_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    // A data directory under a regular file cannot be created (even by root).
    let e = Store::open_dir(file.join("store")).await.unwrap_err();
    assert!(matches!(e, Error::Engine { .. }), "{e:?}");
    assert!(
        message(&e).contains("unable to create directory"),
        "{}",
        message(&e)
    );
    // /proc refuses new directories too.
    let e = Store::open_dir("/proc/alkblobs-no-such-store")
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Engine { .. }), "{e:?}");
    assert_eq!(
        std::fs::read(&file).unwrap(),
        b"not a directory",
        "nothing clobbered"
    );
}

struct Opened {
    store: Store,
    kv: SqliteBackend,
    large: LocalBackend,
    _dir: tempfile::TempDir,
}

async fn open() -> Opened {
    let dir = tempfile::tempdir().unwrap();
    let kv = SqliteBackend::open(dir.path().join("index.sqlite"), SqliteOptions::default())
        .await
        .unwrap();
    let large = LocalBackend::open(dir.path().join("large"), LocalOptions::default())
        .await
        .unwrap();
    let store = Store::builder()
        .sqlite(kv.clone())
        .large(large.clone())
        .build()
        .unwrap();
    Opened {
        store,
        kv,
        large,
        _dir: dir,
    }
}

#[tokio::test]
async fn corrupted_entries_are_detected_and_reported() {
    let o = open().await;
    let t = o.store.threshold() as usize;
    let small = data(1, 1000);
    let big = data(2, t + 500_000);
    let short = data(3, t + 100_000);
    let intact = data(4, t + 10);
    let ks = o.store.put(small.clone()).await.unwrap().key;
    let kb = o.store.put(big.clone()).await.unwrap().key;
    let kt = o.store.put(short.clone()).await.unwrap().key;
    let ki = o.store.put(intact.clone()).await.unwrap().key;

    // Bit rot in sqlite, a flipped byte and a truncation on disk.
    let mut rotten = small.clone();
    rotten[500] ^= 0xff;
    o.kv.corrupt_for_test(&ks, rotten).await.unwrap();
    let path = o.large.path_of(&kb);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[123_456] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    let tpath = o.large.path_of(&kt);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&tpath)
        .unwrap()
        .set_len(1000)
        .unwrap();

    for (k, tier) in [(ks, Tier::Kv), (kb, Tier::Large), (kt, Tier::Large)] {
        match o.store.get_verified(&k).await {
            Err(Error::Corrupt { key, engine, .. }) => {
                assert_eq!(key, k);
                assert!(
                    engine.starts_with(if tier == Tier::Kv {
                        "sqlite("
                    } else {
                        "local("
                    }),
                    "{engine}"
                );
            }
            other => panic!("expected Corrupt for {k}, got {other:?}"),
        }
    }
    let mut r = o.store.open_read_verified(&kb).await.unwrap().unwrap();
    let mut sink = Vec::new();
    let err = r.read_to_end(&mut sink).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);

    let report = o.store.verify().await.unwrap();
    let mut found: Vec<(Key, Tier)> = report.corrupt.iter().map(|c| (c.key, c.tier)).collect();
    found.sort();
    let mut want = vec![(ks, Tier::Kv), (kb, Tier::Large), (kt, Tier::Large)];
    want.sort();
    assert_eq!(found, want);
    assert_eq!(report.checked, 4);
    // The intact entry is untouched and still verifies.
    assert_eq!(o.store.get_verified(&ki).await.unwrap().unwrap(), intact);
    // A verified put of the original bytes cannot repair an immutable entry
    // in place, but delete-then-put restores it.
    o.large.delete(&kb).await.unwrap();
    let _ = o.store.put_verified(&kb, big.clone()).await.unwrap();
    assert_eq!(o.store.get_verified(&kb).await.unwrap().unwrap(), big);
}

#[tokio::test]
async fn over_threshold_put_in_kv_only_mode_names_the_sizes() {
    let store = Store::builder()
        .kv(alkblobs::backend::mem::MemBackend::new())
        .kv_only()
        .threshold(1000)
        .build()
        .unwrap();
    let e = store.put(data(5, 1001)).await.unwrap_err();
    assert!(
        matches!(
            e,
            Error::TooLarge {
                size: 1001,
                threshold: 1000
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("kv-only"), "{e}");
    assert_eq!(store.list().try_collect::<Vec<_>>().await.unwrap(), vec![]);
}

/// The files process `pid` holds open whose names were `dir/…` and are now
/// gone: how `/proc` shows an `O_TMPFILE` file (`dir/#123 (deleted)`).
fn unnamed_files_held(pid: u32, dir: &std::path::Path) -> usize {
    let prefix = format!("{}/#", dir.display());
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter(|t| {
            let t = t.to_string_lossy();
            t.starts_with(&prefix) && t.ends_with(" (deleted)")
        })
        .count()
}

#[tokio::test]
async fn a_killed_put_into_an_unnamed_staging_file_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = Helper::spawn(HELPER, &["slow-put", dir.path().to_str().unwrap()]);
    h.wait_for("writing");
    let staging = dir.path().join("large/staging");
    let parts = || std::fs::read_dir(&staging).unwrap().count();
    // The write in progress has no name anywhere: staging/ is empty, and
    // the writer holds the unnamed file it is writing.
    assert_eq!(parts(), 0, "the writer's file has no name");
    assert_eq!(unnamed_files_held(h.child.id(), &staging), 1);
    h.kill();

    // Nothing visible, nothing to reclaim, even with no grace.
    let store = Store::open_dir(dir.path()).await.unwrap();
    assert_eq!(store.list().try_collect::<Vec<_>>().await.unwrap(), vec![]);
    assert_eq!(store.usage().await.unwrap().large.unwrap().entries, 0);
    drop(store);
    let opts = LocalOptions::default().staging_grace(Duration::ZERO);
    let large = LocalBackend::open(dir.path().join("large"), opts)
        .await
        .unwrap();
    assert_eq!(large.reclaim_abandoned().await.unwrap(), 0);
    assert_eq!(parts(), 0);
}

#[tokio::test]
async fn killed_put_is_never_visible_and_its_staging_file_is_reclaimed_only_when_abandoned() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = Helper::spawn(HELPER, &["slow-put-named", dir.path().to_str().unwrap()]);
    h.wait_for("writing");
    let staging = dir.path().join("large/staging");
    let parts = || std::fs::read_dir(&staging).unwrap().count();
    assert_eq!(parts(), 1, "the writer's staging file exists");
    h.kill();

    // Reopened with the default grace: nothing visible, the young staging
    // file is not provably abandoned yet and stays.
    let store = Store::open_dir(dir.path()).await.unwrap();
    assert_eq!(store.list().try_collect::<Vec<_>>().await.unwrap(), vec![]);
    assert_eq!(store.usage().await.unwrap().large.unwrap().entries, 0);
    assert_eq!(parts(), 1);
    drop(store);

    // With no grace and nobody holding its lock, it is reclaimed (by an
    // open that stages unnamed files too: leftovers of either kind go).
    let opts = LocalOptions::default().staging_grace(Duration::ZERO);
    let large = LocalBackend::open(dir.path().join("large"), opts)
        .await
        .unwrap();
    assert_eq!(parts(), 0);
    assert!(
        large
            .list()
            .try_collect::<Vec<_>>()
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn a_live_writers_staging_file_is_never_reclaimed() {
    let dir = tempfile::tempdir().unwrap();
    let opts = LocalOptions::default()
        .staging_grace(Duration::ZERO)
        .named_staging(true);
    let large = LocalBackend::open(dir.path(), opts).await.unwrap();
    let value = data(6, 2_000_000);
    let mut w = large.begin_write().await.unwrap();
    w.write(Bytes::copy_from_slice(&value[..1_000_000]))
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_dir(dir.path().join("staging"))
            .unwrap()
            .count(),
        1,
        "a named staging file"
    );
    assert_eq!(
        large.reclaim_abandoned().await.unwrap(),
        0,
        "locked by its writer"
    );
    w.write(Bytes::copy_from_slice(&value[1_000_000..]))
        .await
        .unwrap();
    let (key, outboard) = alkblobs::outboard::of(&value);
    w.commit(&key, outboard.into()).await.unwrap();
    assert_eq!(large.get(&key).await.unwrap().unwrap(), value);
}

#[tokio::test]
async fn a_sqlite_file_locked_by_another_process_is_a_clear_error_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("index.sqlite");
    let opts = SqliteOptions::default().busy_timeout(Duration::from_millis(200));
    let kv = SqliteBackend::open(&db, opts).await.unwrap();
    let a = data(7, 100);
    let ka = Key::of(&a);
    kv.put(&ka, Bytes::from(a.clone())).await.unwrap();

    let mut h = Helper::spawn(HELPER, &["hold-sqlite-lock", db.to_str().unwrap()]);
    h.wait_for("locked");
    let b = data(8, 100);
    let kb = Key::of(&b);
    let e = kv.put(&kb, Bytes::from(b.clone())).await.unwrap_err();
    assert!(
        matches!(&e, Error::Engine { engine, .. } if engine.starts_with("sqlite(")),
        "{e:?}"
    );
    assert!(
        message(&e).contains("locked by another connection or process"),
        "{}",
        message(&e)
    );
    // WAL readers are not blocked, and nothing was lost.
    assert_eq!(kv.get(&ka).await.unwrap().unwrap(), a);
    drop(h.child.stdin.take());
    let _ = h.child.wait();
    kv.put(&kb, Bytes::from(b.clone())).await.unwrap();
    assert_eq!(kv.get(&kb).await.unwrap().unwrap(), b);
    assert_eq!(kv.get(&ka).await.unwrap().unwrap(), a);
}

#[tokio::test]
async fn a_second_writer_gets_in_use_and_read_only_opens_need_no_lock() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = Helper::spawn(HELPER, &["slow-put", dir.path().to_str().unwrap()]);
    h.wait_for("writing");
    let pid = h.child.id();
    match Store::open_dir(dir.path()).await {
        Err(Error::InUse { holder, resource }) => {
            assert!(holder.contains(&format!("pid {pid}")), "{holder}");
            assert!(resource.ends_with("index.lock"), "{}", resource.display());
        }
        other => panic!("expected InUse, got {other:?}"),
    }
    let ro = alkblobs::DirOptions::new().mode(OpenMode::ReadOnly);
    let reader = Store::open_dir_with(dir.path(), ro.clone()).await.unwrap();
    assert!(
        reader
            .list()
            .try_collect::<Vec<_>>()
            .await
            .unwrap()
            .is_empty()
    );
    assert!(matches!(
        reader.put(data(9, 10)).await,
        Err(Error::ReadOnly { .. })
    ));
    h.kill();
    // The lock dies with its holder.
    let store = Store::open_dir(dir.path()).await.unwrap();
    // And within one process a second writer is refused too.
    assert!(matches!(
        Store::open_dir(dir.path()).await,
        Err(Error::InUse { .. })
    ));
    drop(store);
    Store::open_dir(dir.path()).await.unwrap();
}

#[tokio::test]
async fn a_corrupt_entry_in_a_kv_only_store_is_reported_not_a_panic() {
    use alkblobs::backend::mem::MemBackend;
    let kv = MemBackend::new();
    let store = Store::builder().kv(kv.clone()).kv_only().build().unwrap();
    let key = store.put(data(10, 100)).await.unwrap().key;
    kv.corrupt_for_test(&key, Bytes::from(data(11, 100)));
    match store.get_verified(&key).await {
        Err(Error::Corrupt { key: k, engine, .. }) => {
            assert_eq!((k, engine.as_str()), (key, "mem"))
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    let report = store.verify().await.unwrap();
    assert_eq!(report.corrupt.len(), 1);
    assert_eq!(report.corrupt[0].tier, Tier::Kv);
}
