//! The server restarted under a single-instance PostgreSQL store, in the
//! middle of a put and of a sweep (issue 9). Restarts the test cluster
//! (`scripts/pg-cluster.sh restart`), so scripts/test.sh runs this binary
//! alone, after the other PostgreSQL suites.

#![cfg(feature = "pg")]

use std::time::Duration;

use alkblobs::store::postgres::PostgresOptions;
use alkblobs::{Key, Store, SweepOptions};
use alkblobs_tests::pg::{cluster, connect, eventually, url};

/// One restart at a time (the tests of this binary run in parallel).
static RESTARTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Stops the server (fast: every session, and the scheduler, told to
/// exit; pg_ctl waits at most 60 s for them) and starts it again.
fn restart() {
    cluster("restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_restart_mid_put_and_mid_sweep_loses_nothing() {
    let _one = RESTARTS.lock().await;
    let c = connect().await;
    let pool =
        alkblobs_tests::pg::pool_with(&c, "restart", "0 seconds", "60 seconds", "pg-lo", true)
            .await;
    drop(c);
    let store = Store::open_postgres(PostgresOptions::new(url(), &pool).threshold(1024))
        .await
        .unwrap();
    let kept = store.put(vec![3u8; 100_000]).await.unwrap();
    store.add_roots(&[kept.key]).await.unwrap();
    drop(kept.pin);

    // Mid-put: a 64 MiB streaming put while the server goes down.
    let big: Vec<u8> = (0..64u32 << 20).map(|i| (i % 241) as u8).collect();
    let big_key = Key::of(&big);
    let writer = {
        let (store, big) = (store.clone(), big.clone());
        tokio::spawn(async move { store.put_reader(std::io::Cursor::new(big)).await })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    tokio::task::spawn_blocking(restart).await.unwrap();
    // (64 MiB take over a second to upload here: the restart lands mid-put.)
    match writer.await.unwrap() {
        Ok(_) => panic!("the put finished before the restart: the test did not exercise it"),
        Err(e) => assert!(e.is_retryable(), "not retryable: {e}"),
    }
    // The pool reconnects; nothing protected was lost, nothing is torn.
    let got = eventually(|| store.get(&kept.key)).await;
    assert_eq!(got.as_deref(), Some(&[3u8; 100_000][..]));
    if eventually(|| store.has(&big_key)).await {
        let back = store.get(&big_key).await.unwrap().unwrap();
        assert!(back == big, "a torn entry is visible");
    }
    let again = eventually(|| store.put_reader(std::io::Cursor::new(big.clone()))).await;
    assert_eq!(again.key, big_key);
    drop(again.pin);

    // Mid-sweep: many dead entries, the server restarted while the sweep
    // deletes them; the next sweep completes and the root survives.
    let dead: Vec<Vec<u8>> = (0..20_000u32)
        .map(|i| format!("dead {i}").into_bytes())
        .collect();
    let batch = store.put_many(dead.clone()).await.unwrap();
    drop(batch);
    let sweeper = {
        let store = store.clone();
        tokio::spawn(async move { store.sweep(SweepOptions::new()).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    tokio::task::spawn_blocking(restart).await.unwrap();
    // (Listing, staging and deleting 20,000 entries in batches takes longer
    // than 50 ms: the restart lands mid-sweep.)
    match sweeper.await.unwrap() {
        Ok(r) => {
            panic!("the sweep finished before the restart ({r:?}): the test did not exercise it")
        }
        Err(e) => assert!(e.is_retryable(), "not retryable: {e}"),
    }
    let report = eventually(|| store.sweep(SweepOptions::new())).await;
    assert!(report.aborted.is_none(), "{report:?}");
    let report = eventually(|| store.sweep(SweepOptions::new())).await;
    assert!(report.aborted.is_none(), "{report:?}");
    assert!(store.has(&kept.key).await.unwrap(), "the root was lost");
    for v in dead.iter().take(50) {
        assert!(
            !store.has(&Key::of(v)).await.unwrap(),
            "a dead entry survived two sweeps"
        );
    }
}

/// The scheduler's pid in the test database, waiting up to 60 s.
async fn scheduler_pid() -> i32 {
    for _ in 0..600 {
        if let Ok(c) = tokio::time::timeout(Duration::from_secs(2), connect()).await
            && let Some(pid) = alkblobs_tests::pg::scheduler_pid_now(&c, "alkblobs_test").await
        {
            return pid;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no alkblobs scheduler in the test database after 60 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scheduler_stops_with_the_server_and_starts_with_it() {
    let _one = RESTARTS.lock().await;
    let before = scheduler_pid().await;
    let c = connect().await;
    let pool = alkblobs_tests::pg::pool(&c, "restartsched", "0 seconds", "60 seconds").await;
    c.execute(
        "SELECT alkblobs_alter_pool($1, sweep_every => '1 second')",
        &[&pool],
    )
    .await
    .unwrap();
    drop(c);
    // Busy when the server stops: it sweeps the pool every second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    restart();
    // It stopped on its own, seeing the shutdown (not killed when the
    // server gave up on it: pg_ctl would have failed after 60 s).
    let log = std::fs::read_to_string(cluster("log")).expect("the server log");
    assert!(
        log.lines().any(|l| l
            .contains(&format!("[{before}] LOG:  alkblobs scheduler for database"))
            && l.ends_with("stopping")),
        "no clean stop of scheduler {before} in the server log"
    );
    // A new worker serves the restarted server, and sweeps on schedule.
    let after = scheduler_pid().await;
    assert_ne!(after, before);
    let c = connect().await;
    let dead = alkblobs_tests::pg::garbage(&c, &pool, b"swept after the restart").await;
    let mut gone = false;
    for _ in 0..200 {
        if !alkblobs_tests::pg::exists(&c, &pool, &dead).await {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "the restarted scheduler did not sweep the pool");
    c.execute(
        "SELECT alkblobs_alter_pool($1, sweep_every => '0')",
        &[&pool],
    )
    .await
    .unwrap();
}

/// An outage longer than the pin TTL: no instance could renew its pins
/// while the server was down, so they all lapsed by the clock. The pool's
/// first use after the start gives every pin a fresh TTL and every mark a
/// fresh window (`alkblobs.adopt`): the first sweep keeps the pinned entry
/// and the staged one in its window, the instance's next renewal renews
/// its pin, and a pin nobody renews lapses one TTL later and its entry goes.
/// Until 0.8.0 the first sweep reaped the pin and staged the entry, and the
/// renewal found nothing to renew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_longer_than_the_pin_ttl_loses_no_pin() {
    let _one = RESTARTS.lock().await;
    let c = connect().await;
    let pool = alkblobs_tests::pg::pool(&c, "outage", "3 seconds", "2 seconds").await;
    alkblobs_tests::pg::put(&c, &pool, b"pinned across an outage", "alive").await;
    alkblobs_tests::pg::put(&c, &pool, b"pinned by the dead", "dead").await;
    let staged = alkblobs_tests::pg::garbage(&c, &pool, b"in its window across an outage").await;
    let r = c
        .query_one("SELECT staged FROM alkblobs_sweep($1)", &[&pool])
        .await
        .unwrap();
    assert_eq!(r.get::<_, i64>(0), 1);
    drop(c);
    // Down for longer than the TTL (2 s) and the window (3 s).
    cluster("down-for 4");
    let mut c = None;
    for _ in 0..100 {
        if let Ok((client, conn)) = tokio_postgres::connect(&url(), tokio_postgres::NoTls).await {
            tokio::spawn(conn);
            c = Some(client);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let c = c.expect("the server is back");
    let r = c
        .query_one(
            "SELECT deleted, pins_reaped FROM alkblobs_sweep($1)",
            &[&pool],
        )
        .await
        .unwrap();
    assert_eq!(
        (r.get::<_, i64>(0), r.get::<_, i64>(1)),
        (0, 0),
        "the first sweep after the outage deletes and reaps nothing"
    );
    for v in [&b"pinned across an outage"[..], b"pinned by the dead"] {
        assert!(alkblobs_tests::pg::exists(&c, &pool, &alkblobs_tests::pg::key(v)).await);
    }
    assert!(alkblobs_tests::pg::exists(&c, &pool, &staged).await);
    let renewed: i64 = c
        .query_one("SELECT alkblobs_renew($1, 'alive')", &[&pool])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        renewed, 1,
        "the live instance's pin renews after the outage"
    );
    // One TTL later the dead instance's pin has lapsed (the live one
    // keeps renewing), and its entry goes like any garbage.
    let dead = alkblobs_tests::pg::key(b"pinned by the dead");
    let mut gone = false;
    for _ in 0..100 {
        c.query_one("SELECT alkblobs_renew($1, 'alive')", &[&pool])
            .await
            .unwrap();
        c.batch_execute(&format!("CALL alkblobs_sweep_all('{pool}')"))
            .await
            .unwrap();
        if !alkblobs_tests::pg::exists(&c, &pool, &dead).await {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(gone, "the dead instance's entry was never collected");
    assert!(
        alkblobs_tests::pg::exists(
            &c,
            &pool,
            &alkblobs_tests::pg::key(b"pinned across an outage")
        )
        .await
    );
}

/// What a store's calls return while the server restarts, by the driver's
/// error kinds (connection closed, I/O, connect, TLS): every failure of a
/// put, a get or a sweep during a fast and an immediate restart, and every
/// call to a port where nothing listens, is `Error::Unavailable` —
/// retryable, as docs/design.md promises. Until the classification went by
/// the driver's kinds, "error communicating with the server" and "error
/// connecting to server" came back as `Engine` (not retryable).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restart_and_a_refused_connection_fail_calls_as_unavailable() {
    let _one = RESTARTS.lock().await;
    // Nothing listens on port 1.
    let e = Store::open_postgres(PostgresOptions::new(
        "postgresql://postgres@127.0.0.1:1/alkblobs_test",
        "x",
    ))
    .await
    .expect_err("nothing listens there");
    assert!(
        matches!(e, alkblobs::Error::Unavailable { .. }),
        "a refused connection: {e:?}"
    );
    let c = connect().await;
    let pool =
        alkblobs_tests::pg::pool_with(&c, "kinds", "0 seconds", "60 seconds", "pg-lo", true).await;
    drop(c);
    let store = Store::open_postgres(PostgresOptions::new(url(), &pool).threshold(1024))
        .await
        .unwrap();
    for mode in ["restart", "restart-immediate"] {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let workers: Vec<_> = (0..3u32)
            .map(|w| {
                let (store, stop) = (store.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut errors = Vec::new();
                    let mut i = 0u32;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        i += 1;
                        let r = match w {
                            0 => store
                                .put(format!("kinds {mode} {i}").into_bytes())
                                .await
                                .map(drop),
                            1 => store.get(&Key::of(b"absent")).await.map(drop),
                            _ => store.sweep(SweepOptions::new()).await.map(drop),
                        };
                        if let Err(e) = r {
                            errors.push(e);
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    errors
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        tokio::task::spawn_blocking(move || cluster(mode))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut all = Vec::new();
        for w in workers {
            all.extend(w.await.unwrap());
        }
        assert!(
            !all.is_empty(),
            "{mode}: no call failed: the test did not exercise it"
        );
        for e in &all {
            assert!(
                matches!(e, alkblobs::Error::Unavailable { .. }),
                "{mode}: not Unavailable: {e:?}"
            );
        }
        // And the store works again.
        let absent = Key::of(b"absent");
        eventually(|| store.get(&absent)).await;
    }
}
