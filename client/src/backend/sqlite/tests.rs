//! The engine's own unit tests (the shared suites run in tests/).

use super::*;

fn tables(path: &Path) -> Vec<String> {
    let c = Connection::open(path).unwrap();
    let mut s = c
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap();
    s.query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

/// The engine is storage: it creates its own two tables and nothing of
/// garbage collection. A companion's tables and its put statement come
/// from the companion, and the statement runs in each put's
/// transaction only while the companion says it is active.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_creates_only_its_own_tables_and_runs_a_companions_hook() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.sqlite");
    let db = SqliteBackend::open(&path, SqliteOptions::default())
        .await
        .unwrap();
    assert_eq!(tables(&path), ["entries", "vals"]);
    db.install_put_hook(
        "CREATE TABLE IF NOT EXISTS seen (key BLOB PRIMARY KEY);",
        PutHook {
            on_put: "INSERT INTO seen VALUES (?1) ON CONFLICT DO NOTHING",
        },
        |_| Ok(false),
    )
    .unwrap();
    assert_eq!(tables(&path), ["entries", "seen", "vals"]);
    async fn count(db: &SqliteBackend) -> Result<i64> {
        db.companion_read("count", |c| {
            c.query_row("SELECT count(*) FROM seen", [], |r| r.get::<_, i64>(0))
        })
        .await
    }
    db.put(&Key::of(b"a"), Bytes::from_static(b"a"))
        .await
        .unwrap();
    assert_eq!(count(&db).await.unwrap(), 0, "inactive: not run");
    db.companion_write("activate", |c| {
        c.set_hook_active(true);
        Ok(())
    })
    .await
    .unwrap();
    db.put(&Key::of(b"b"), Bytes::from_static(b"b"))
        .await
        .unwrap();
    db.put_many(&[(Key::of(b"c"), Bytes::from_static(b"c"))])
        .await
        .unwrap();
    assert_eq!(count(&db).await.unwrap(), 2, "active: run in each put");
    // A second companion's hook is refused: it would replace the first's
    // statement and share its flag.
    let e = db
        .install_put_hook(
            "",
            PutHook {
                on_put: "DELETE FROM seen WHERE key = ?1",
            },
            |_| Ok(true),
        )
        .expect_err("a second, different hook");
    assert!(matches!(e, Error::Config(_)), "{e:?}");
}

/// Values on both sides of the inline limit (over it, `get` reads again
/// on a blocking thread) come back whole and in ranges, the empty value
/// included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_over_the_inline_limit_are_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let db = SqliteBackend::open(dir.path().join("kv.sqlite"), SqliteOptions::default())
        .await
        .unwrap();
    for len in [
        0usize,
        1,
        INLINE_VALUE_MAX as usize,
        INLINE_VALUE_MAX as usize + 1,
        1 << 20,
    ] {
        let v = Bytes::from((0..len).map(|i| (i % 251) as u8).collect::<Vec<_>>());
        let k = Key::of(&v);
        db.put(&k, v.clone()).await.unwrap();
        assert_eq!(db.get(&k).await.unwrap(), Some(v.clone()), "len {len}");
        let whole = db.get_range(&k, 0, len as u64).await.unwrap();
        assert_eq!(whole, Some(v.clone()), "range of len {len}");
        if len > 2 {
            let tail = db.get_range(&k, 1, u64::MAX).await.unwrap().unwrap();
            assert_eq!(tail, v.slice(1..), "tail of len {len}");
        }
    }
    db.close().await.unwrap();
}
/// Starts a read that takes its snapshot and then waits: returns once
/// the snapshot is taken, with the read's task (which answers the
/// number of entries it saw) and the sender that lets it finish.
async fn hold_snapshot(
    db: &SqliteBackend,
) -> (
    tokio::task::JoinHandle<Result<i64>>,
    std::sync::mpsc::Sender<()>,
) {
    let (taken_tx, taken) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel::<()>();
    let busy = db.clone();
    let reading = tokio::spawn(async move {
        busy.read("hold a snapshot", move |c| {
            let n: i64 = c.query_row("SELECT count(*) FROM entries", [], |r| r.get(0))?;
            taken_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            Ok(n)
        })
        .await
    });
    tokio::task::spawn_blocking(move || taken.recv().unwrap())
        .await
        .unwrap();
    (reading, go)
}

/// A reader busy in a read while a put (then a delete) commits must not
/// keep its old snapshot: the next read on that reader (the pool hands
/// back the last reader returned) sees the write. Fails if writes stop
/// moving the generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_older_than_an_answered_put_is_never_reused() {
    for durability in [Durability::Durable, Durability::Relaxed] {
        let dir = tempfile::tempdir().unwrap();
        let db = SqliteBackend::open(
            dir.path().join("kv.sqlite"),
            SqliteOptions::default().durability(durability),
        )
        .await
        .unwrap();
        let first = Bytes::from_static(b"first");
        db.put(&Key::of(&first), first.clone()).await.unwrap();

        // A put answered while a snapshot is open.
        let (reading, go) = hold_snapshot(&db).await;
        let second = Bytes::from_static(b"second");
        let key = Key::of(&second);
        db.put(&key, second.clone()).await.unwrap();
        go.send(()).unwrap();
        assert_eq!(reading.await.unwrap().unwrap(), 1, "{durability:?}");
        assert_eq!(
            db.get(&key).await.unwrap(),
            Some(second),
            "{durability:?}: a read after an answered put missed it"
        );
        assert!(db.has(&key).await.unwrap(), "{durability:?}");

        // The same for a delete.
        let (reading, go) = hold_snapshot(&db).await;
        assert!(db.delete(&key).await.unwrap().is_some());
        go.send(()).unwrap();
        assert_eq!(reading.await.unwrap().unwrap(), 2, "{durability:?}");
        assert_eq!(
            db.get(&key).await.unwrap(),
            None,
            "{durability:?}: a read after an answered delete still saw the value"
        );
        db.close().await.unwrap();
    }
}
