//! Group commit of sqlite puts (durable and relaxed): concurrent puts share
//! transactions, and each caller returns only after the commit that holds
//! its row.

use std::sync::Arc;
use std::time::Duration;

use alkblobs::backend::sqlite::{SqliteBackend, SqliteOptions};
use alkblobs::{Backend, BackendExt, Key, PutOutcome};
use alkblobs_tests::data;
use bytes::Bytes;

/// 16 tasks × 25 durable puts of distinct keys, and 16 concurrent puts of
/// one key: every put is answered with its own outcome, and the moment a
/// put returns its row is visible to an independent connection (it was
/// committed, not merely queued).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_caller_returns_after_the_commit_that_holds_its_row() {
    each_caller_case(SqliteOptions::default()).await;
}

/// The same with relaxed commits, which group too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_relaxed_caller_returns_after_the_commit_that_holds_its_row() {
    each_caller_case(SqliteOptions::default().durability(alkblobs::Durability::Relaxed)).await;
}

async fn each_caller_case(opts: SqliteOptions) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("index.sqlite");
    let engine = Arc::new(SqliteBackend::open(&path, opts).await.unwrap());
    let tasks: Vec<_> = (0..16u64)
        .map(|t| {
            let (e, path) = (engine.clone(), path.clone());
            tokio::spawn(async move {
                let probe = rusqlite::Connection::open_with_flags(
                    &path,
                    rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
                )
                .unwrap();
                for i in 0..25u64 {
                    let v = data(t * 1000 + i, 4096);
                    let k = Key::of(&v);
                    assert_eq!(
                        e.put(&k, Bytes::from(v)).await.unwrap(),
                        PutOutcome::Created
                    );
                    let n: i64 = probe
                        .query_row(
                            "SELECT count(*) FROM entries WHERE key = ?1",
                            [k.as_bytes().as_slice()],
                            |r| r.get(0),
                        )
                        .unwrap();
                    assert_eq!(n, 1, "a put returned before its row was committed");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        engine.count_and_bytes().await.unwrap(),
        (400, 400 * 4096),
        "every row is there once"
    );

    let v = Bytes::from(data(99_999, 4096));
    let k = Key::of(&v);
    let same: Vec<_> = (0..16)
        .map(|_| {
            let (e, v) = (engine.clone(), v.clone());
            tokio::spawn(async move { e.put(&k, v).await.unwrap() })
        })
        .collect();
    let mut created = 0;
    for t in same {
        if t.await.unwrap() == PutOutcome::Created {
            created += 1;
        }
    }
    assert_eq!(
        created, 1,
        "exactly one of the grouped puts creates the key"
    );
    assert_eq!(engine.get(&k).await.unwrap().unwrap(), v);

    // Reopened, everything committed is there.
    drop(engine);
    let again = SqliteBackend::open(&path, SqliteOptions::default())
        .await
        .unwrap();
    assert_eq!(again.count_and_bytes().await.unwrap().0, 401);
}

/// Relaxed commits leave checkpoints to the engine's checkpointer thread:
/// the database file (which only a checkpoint writes once the WAL is in
/// use) fills while nobody else checkpoints, no put pays for it, and a
/// close still leaves no `-wal` behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relaxed_commits_are_checkpointed_in_the_background() {
    use alkblobs::Durability;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("index.sqlite");
    let engine = SqliteBackend::open(
        &path,
        SqliteOptions::default().durability(Durability::Relaxed),
    )
    .await
    .unwrap();
    let start = std::fs::metadata(&path).unwrap().len();
    // ~3 MB of values: about 7,500 WAL pages, under the writer's own
    // backstop (16,000), over the checkpointer's threshold several times.
    for i in 0..3000u32 {
        let mut v = vec![7u8; 1024];
        v[..4].copy_from_slice(&i.to_le_bytes());
        let v = Bytes::from(v);
        engine.put(&Key::of(&v), v).await.unwrap();
    }
    let mut grown = 0;
    for _ in 0..100 {
        grown = std::fs::metadata(&path).unwrap().len() - start;
        if grown >= 2 << 20 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        grown >= 2 << 20,
        "the database file grew by {grown} bytes: nothing checkpointed the WAL"
    );
    let n = engine.list_all().await.unwrap().len();
    assert_eq!(n, 3000);
    engine.close().await.unwrap();
    assert!(!dir.path().join("index.sqlite-wal").exists());
}

/// Readers keep their read transaction between reads while nothing is
/// written (engine docs, "Concurrency"). No reader may hold back the WAL's
/// checkpoint and restart for long: (1) puts each followed by reads, with
/// readers looping beside them (a reader parked with a snapshot taken during
/// a commit would block that commit's checkpoint), and (2) then puts alone,
/// after a burst of reads left idle readers in the pool with snapshots (they
/// would hold the WAL forever if the writes did not end them), both keep the
/// WAL near its checkpoint size instead of growing with everything written.
/// Durable commits checkpoint inline at 1,000 pages (~4 MiB); relaxed ones
/// in the background, with the writer's own backstop at 16,000 pages
/// (~66 MB); each phase writes well past its bound (~2–3 pages a put).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_between_writes_do_not_stop_the_wal_restarting() {
    use alkblobs::Durability;
    // (mode, puts per phase, largest WAL allowed in bytes).
    for (durability, puts, bound) in [
        (Durability::Durable, 3000u32, 12u64 << 20),
        (Durability::Relaxed, 12_000, 75_000_000),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.sqlite");
        let engine = SqliteBackend::open(&path, SqliteOptions::default().durability(durability))
            .await
            .unwrap();
        let wal = dir.path().join("index.sqlite-wal");
        let wal_size = || std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
        let put = |i: u32| {
            let engine = engine.clone();
            async move {
                let mut v = vec![9u8; 1024];
                v[..4].copy_from_slice(&i.to_le_bytes());
                let v = Bytes::from(v);
                let k = Key::of(&v);
                engine.put(&k, v).await.unwrap();
                k
            }
        };

        // (1) Reads between and beside the writes.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let first = put(u32::MAX).await;
        let loopers: Vec<_> = (0..2)
            .map(|_| {
                let (engine, stop) = (engine.clone(), stop.clone());
                tokio::spawn(async move {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        assert!(engine.get(&first).await.unwrap().is_some());
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        let mut largest = 0;
        let mut keys = Vec::new();
        for i in 0..puts {
            let k = put(i).await;
            keys.push(k);
            let (a, b) = tokio::join!(engine.get(&k), engine.get(&keys[i as usize / 2]));
            assert!(a.unwrap().is_some() && b.unwrap().is_some());
            largest = largest.max(wal_size());
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for l in loopers {
            l.await.unwrap();
        }
        assert!(
            largest < bound,
            "{durability:?}, reads between writes: the WAL grew to {largest} bytes (bound {bound})"
        );

        // (2) A burst of reads, then writes alone.
        let reads: Vec<_> = (0..8)
            .map(|i| {
                let (engine, k) = (engine.clone(), keys[i]);
                tokio::spawn(async move { engine.get(&k).await.unwrap().is_some() })
            })
            .collect();
        for r in reads {
            assert!(r.await.unwrap());
        }
        let mut largest = 0;
        for i in puts..2 * puts {
            put(i).await;
            largest = largest.max(wal_size());
        }
        assert!(
            largest < bound,
            "{durability:?}, writes after reads: the WAL grew to {largest} bytes (bound {bound})"
        );
        engine.close().await.unwrap();
    }
}

/// A put whose future is polled once and then neither polled nor dropped
/// (a `select!` on `&mut fut` whose other branch won) must not stall every
/// other put: whenever leading would suspend the caller's future (callers
/// arrive together, so the leader gathers them; or a current-thread runtime,
/// where the commit is awaited on the blocking pool) the commit is led on a
/// task of its own. Fails if the leader's work stays in the caller's future.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpolled_put_does_not_stall_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let engine = SqliteBackend::open(dir.path().join("kv.sqlite"), SqliteOptions::default())
        .await
        .unwrap();
    let mut held = None;
    for attempt in 0..50u32 {
        // Concurrent callers, so that the next commit gathers; then time
        // for their background leader to release the lead, so that the
        // held put leads rather than follows.
        concurrent_puts(&engine, attempt * 100).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (key, mut put) = held_put(&engine, format!("polled once, then held ({attempt})"));
        match futures::poll!(&mut put) {
            // The last group held one row: led inline, already committed.
            std::task::Poll::Ready(r) => drop(r.unwrap()),
            std::task::Poll::Pending => {
                held = Some((key, put));
                break;
            }
        }
    }
    let (key, held) = held.expect("no put was left pending behind a gathering leader");
    tokio::time::timeout(Duration::from_secs(20), concurrent_puts(&engine, 10_000))
        .await
        .expect("puts stalled behind a leader whose future is not polled");
    held.await.unwrap();
    assert!(engine.has(&key).await.unwrap());
}

/// The same on a current-thread runtime, with a lone caller.
#[tokio::test(flavor = "current_thread")]
async fn an_unpolled_put_does_not_stall_the_others_on_one_thread() {
    let dir = tempfile::tempdir().unwrap();
    let engine = SqliteBackend::open(dir.path().join("kv.sqlite"), SqliteOptions::default())
        .await
        .unwrap();
    let (key, mut held) = held_put(&engine, "polled once, then held".into());
    let first = futures::poll!(&mut held);
    tokio::time::timeout(Duration::from_secs(20), async {
        for i in 0..20u32 {
            let v = Bytes::from(i.to_le_bytes().repeat(8));
            engine.put(&Key::of(&v), v).await.unwrap();
        }
    })
    .await
    .expect("puts stalled behind a leader whose future is not polled");
    match first {
        std::task::Poll::Ready(r) => drop(r.unwrap()),
        std::task::Poll::Pending => drop(held.await.unwrap()),
    }
    assert!(engine.has(&key).await.unwrap());
}

/// A put of `value` not yet polled, and its key.
fn held_put(
    engine: &SqliteBackend,
    value: String,
) -> (
    Key,
    std::pin::Pin<Box<impl std::future::Future<Output = alkblobs::Result<PutOutcome>> + use<>>>,
) {
    let v = Bytes::from(value);
    let key = Key::of(&v);
    let engine = engine.clone();
    (key, Box::pin(async move { engine.put(&key, v).await }))
}

/// 16 concurrent puts of distinct values derived from `base`.
async fn concurrent_puts(engine: &SqliteBackend, base: u32) {
    let puts: Vec<_> = (0..16u32)
        .map(|i| {
            let engine = engine.clone();
            tokio::spawn(async move {
                let v = Bytes::from((base + i).to_le_bytes().repeat(64));
                engine.put(&Key::of(&v), v).await.unwrap();
            })
        })
        .collect();
    for p in puts {
        p.await.unwrap();
    }
}
