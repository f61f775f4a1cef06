//! The races the extension's SQL must close, each driven across real
//! connections to the test server. Where the protocol makes one session
//! wait on another's lock, the test checks that it really waited (in
//! pg_stat_activity, so the interleaving is real); where the executor must
//! not wait (it passes over a key someone is locking, SKIP LOCKED), the test
//! checks that it returned with the key skipped and still staged. See
//! docs/design.md for which guard each test covers and the mutation runs
//! that show it fails without that guard.

#![cfg(feature = "pg")]

use std::time::Duration;

use alkblobs_tests::pg::{
    connect, exists, garbage, key, pid, pool, put, sqlstate, table_name, try_register, try_sweep,
    try_sweep_detailed, waits_on_lock,
};
use tokio_postgres::Client;

/// (deleted, kept, aborted) of one sweep call.
async fn sweep(c: &Client, pool: &str) -> (i64, i64, Option<String>) {
    let r = c
        .query_one(
            "SELECT deleted, kept, aborted FROM alkblobs_sweep($1)",
            &[&pool],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2))
}

/// (deleted, kept, skipped, aborted) of one sweep call.
async fn sweep_skipping(c: &Client, pool: &str) -> (i64, i64, i64, Option<String>) {
    let r = c
        .query_one(
            "SELECT deleted, kept, skipped, aborted FROM alkblobs_sweep($1)",
            &[&pool],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2), r.get(3))
}

/// Whether `key` is staged in `pool`.
async fn is_staged(c: &Client, pool: &str, key: &[u8]) -> bool {
    c.query_one(
        "SELECT count(*) FROM alkblobs_staged WHERE pool = $1 AND key = encode($2, 'hex')",
        &[&pool, &key],
    )
    .await
    .unwrap()
    .get::<_, i64>(0)
        == 1
}

/// A new table registered as a liveness source of `pool`; returns its name.
async fn liveness_table(c: &Client, pool: &str) -> String {
    let table = format!("live_{}", pool.replace(['-', '.'], "_"));
    c.batch_execute(&format!("CREATE TABLE {table} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    c.execute(
        "SELECT alkblobs_register_liveness($1, $2::text::regclass)",
        &[&pool, &table],
    )
    .await
    .unwrap();
    table
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pin_committing_while_the_executor_decides_keeps_the_key() {
    let obs = connect().await;
    let p = connect().await;
    let s = connect().await;
    let pool = pool(&obs, "race-pin", "0 seconds", "60 seconds").await;
    let k = garbage(&obs, &pool, b"pin while deciding").await;

    // A reader pins inside an open transaction: it holds FOR KEY SHARE.
    p.batch_execute("BEGIN").await.unwrap();
    let pinned: bool = p
        .query_one("SELECT alkblobs_pin($1, $2, 'reader')", &[&pool, &k])
        .await
        .unwrap()
        .get(0);
    assert!(pinned);
    // The sweep marks the key (the pin is not committed, so invisible); its
    // executor must pass over the locked key, not wait and not delete it.
    assert_eq!(sweep_skipping(&s, &pool).await, (0, 0, 1, None));
    assert!(
        is_staged(&obs, &pool, &k).await,
        "the skipped key stays staged"
    );
    p.batch_execute("COMMIT").await.unwrap();
    // The next sweep sees the committed pin.
    assert_eq!(sweep_skipping(&s, &pool).await, (0, 1, 0, None));
    assert!(
        exists(&obs, &pool, &k).await,
        "a committed pin lost its key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_put_committing_while_the_executor_decides_keeps_the_key() {
    let obs = connect().await;
    let p = connect().await;
    let s = connect().await;
    let pool = pool(&obs, "race-put", "0 seconds", "60 seconds").await;
    let value = b"put while deciding";
    let k = garbage(&obs, &pool, value).await;

    p.batch_execute("BEGIN").await.unwrap();
    assert!(
        !put(&p, &pool, value, "writer").await,
        "a dedup put is not new"
    );
    // The put holds the entry and is removing its staged row: passed over.
    let (deleted, _, skipped, aborted) = sweep_skipping(&s, &pool).await;
    assert_eq!((deleted, skipped, aborted), (0, 1, None));
    p.batch_execute("COMMIT").await.unwrap();
    assert_eq!(
        sweep(&s, &pool).await,
        (0, 1, None),
        "the committed pin keeps it"
    );
    assert!(
        exists(&obs, &pool, &k).await,
        "a committed put lost its key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_put_racing_an_executor_that_already_decided_recreates_the_entry() {
    let obs = connect().await;
    let p = connect().await;
    let s = connect().await;
    let pool = pool(&obs, "race-put-after", "0 seconds", "60 seconds").await;
    let value = b"put after the decision";
    let k = garbage(&obs, &pool, value).await;

    // The executor deletes the key and holds its locks until commit.
    s.batch_execute("BEGIN").await.unwrap();
    assert_eq!(sweep(&s, &pool).await.0, 1);
    // A put of the same content must wait, then find the entry gone and
    // insert it afresh (ON CONFLICT DO NOTHING would return at once and
    // report an entry that is about to vanish).
    let p_pid = pid(&p).await;
    let pool2 = pool.clone();
    let putter = tokio::spawn(async move { put(&p, &pool2, value, "writer").await });
    assert!(
        waits_on_lock(&obs, p_pid).await,
        "the put did not wait for the executor"
    );
    s.batch_execute("COMMIT").await.unwrap();
    assert!(putter.await.unwrap(), "the put must report a new entry");
    assert!(exists(&obs, &pool, &k).await, "the put's entry was lost");
    let pins = obs
        .query_one(
            "SELECT count(*) FROM alkblobs_pins WHERE pool = $1 AND NOT expired",
            &[&pool],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(pins, 1, "the put's pin committed with its entry");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pin_racing_an_executor_that_already_decided_reports_the_key_gone() {
    let obs = connect().await;
    let p = connect().await;
    let s = connect().await;
    let pool = pool(&obs, "race-pin-after", "0 seconds", "60 seconds").await;
    let k = garbage(&obs, &pool, b"pin after the decision").await;
    s.batch_execute("BEGIN").await.unwrap();
    assert_eq!(sweep(&s, &pool).await.0, 1);
    let p_pid = pid(&p).await;
    let (pool2, k2) = (pool.clone(), k.clone());
    let pinner = tokio::spawn(async move {
        p.query_one("SELECT alkblobs_pin($1, $2, 'reader')", &[&pool2, &k2])
            .await
            .unwrap()
            .get::<_, bool>(0)
    });
    assert!(
        waits_on_lock(&obs, p_pid).await,
        "the pin did not wait for the executor"
    );
    s.batch_execute("COMMIT").await.unwrap();
    assert!(!pinner.await.unwrap(), "a pin of a collected key must fail");
    assert!(!exists(&obs, &pool, &k).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_liveness_row_written_while_the_executor_deletes_fails_with_ab002() {
    let obs = connect().await;
    let l = connect().await;
    let s = connect().await;
    let pool = pool(&obs, "race-live-after", "0 seconds", "60 seconds").await;
    let table = liveness_table(&obs, &pool).await;
    let k = garbage(&obs, &pool, b"live after the decision").await;

    s.batch_execute("BEGIN").await.unwrap();
    assert_eq!(sweep(&s, &pool).await.0, 1);
    let l_pid = pid(&l).await;
    let (t2, k2) = (table.clone(), k.clone());
    let writer = tokio::spawn(async move {
        l.execute(&format!("INSERT INTO {t2} (key) VALUES ($1)"), &[&k2])
            .await
    });
    assert!(
        waits_on_lock(&obs, l_pid).await,
        "the liveness write did not wait"
    );
    s.batch_execute("COMMIT").await.unwrap();
    let err = writer
        .await
        .unwrap()
        .expect_err("a liveness row for a collected key must fail");
    assert_eq!(sqlstate(&err), "AB002", "{err}");
    let rows: i64 = obs
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0, "nothing recorded for gone content");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_liveness_row_written_before_the_executor_decides_keeps_the_key() {
    let obs = connect().await;
    let l = connect().await;
    let s = connect().await;
    let pool = pool(&obs, "race-live-before", "0 seconds", "60 seconds").await;
    let table = liveness_table(&obs, &pool).await;
    let k = garbage(&obs, &pool, b"live before the decision").await;

    // The embedder records the key in an open transaction: the guard
    // trigger holds the entry FOR KEY SHARE. The sweep's mark cannot see
    // the uncommitted row and stages the key; its executor passes over it.
    l.batch_execute("BEGIN").await.unwrap();
    l.execute(&format!("INSERT INTO {table} (key) VALUES ($1)"), &[&k])
        .await
        .unwrap();
    assert_eq!(sweep_skipping(&s, &pool).await, (0, 0, 1, None));
    assert!(is_staged(&obs, &pool, &k).await);
    l.batch_execute("COMMIT").await.unwrap();
    assert_eq!(sweep_skipping(&s, &pool).await, (0, 1, 0, None));
    assert!(
        exists(&obs, &pool, &k).await,
        "a committed liveness row lost its key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_sweeper_gets_the_sweeper_lock_abort_and_deletes_nothing() {
    let obs = connect().await;
    let s1 = connect().await;
    let s2 = connect().await;
    let pool = pool(&obs, "race-sweepers", "0 seconds", "60 seconds").await;
    let other =
        alkblobs_tests::pg::pool(&obs, "race-sweepers-other", "0 seconds", "60 seconds").await;
    let k = garbage(&obs, &pool, b"two sweepers").await;
    let k_other = garbage(&obs, &other, b"two sweepers, other pool").await;

    s1.batch_execute("BEGIN").await.unwrap();
    let r = s1
        .query_one(
            "SELECT deleted FROM alkblobs_sweep($1, dry_run => true)",
            &[&pool],
        )
        .await
        .unwrap();
    assert_eq!(r.get::<_, i64>(0), 0);
    let row = s2
        .query_one(
            "SELECT examined, deleted, aborted FROM alkblobs_sweep($1)",
            &[&pool],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            row.get::<_, i64>(0),
            row.get::<_, i64>(1),
            row.get::<_, Option<String>>(2)
        ),
        (0, 0, Some("sweeper_lock".into()))
    );
    assert!(exists(&obs, &pool, &k).await);
    // Pools are independent: each has its own lock.
    assert_eq!(sweep(&s2, &other).await, (1, 0, None));
    assert!(!exists(&obs, &other, &k_other).await);
    s1.batch_execute("COMMIT").await.unwrap();
    assert_eq!(sweep(&s2, &pool).await, (1, 0, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_expired_pin_protects_nothing_and_is_not_revived_by_renewal() {
    let obs = connect().await;
    let pool = pool(&obs, "race-expiry", "0 seconds", "1 second").await;
    let renewed = b"renewed in time";
    let expired = b"left to expire";
    put(&obs, &pool, renewed, "node-a").await;
    put(&obs, &pool, expired, "node-b").await;
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    let n: i64 = obs
        .query_one("SELECT alkblobs_renew($1, 'node-a')", &[&pool])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    // node-b's pin expired: renewing it now revives nothing.
    let n: i64 = obs
        .query_one("SELECT alkblobs_renew($1, 'node-b')", &[&pool])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "an expired pin must not be revived");
    let held = obs
        .query(
            "SELECT * FROM alkblobs_pins_held($1, 'node-b', $2)",
            &[&pool, &vec![key(expired)]],
        )
        .await
        .unwrap();
    assert!(
        held.is_empty(),
        "node-b must learn its pin is gone before publishing"
    );
    let row = obs
        .query_one(
            "SELECT deleted, pins_reaped FROM alkblobs_sweep($1)",
            &[&pool],
        )
        .await
        .unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (1, 1));
    assert!(exists(&obs, &pool, &key(renewed)).await);
    assert!(!exists(&obs, &pool, &key(expired)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_renewal_racing_the_reaper_at_expiry_keeps_the_pin() {
    let obs = connect().await;
    let r = connect().await;
    let s = connect().await;
    let pool = pool(&obs, "race-renew-reap", "0 seconds", "2 seconds").await;
    let value = b"renewed at the edge";
    put(&obs, &pool, value, "node-a").await;
    // A second owner's pin, released at once: under the review queue this
    // queues the key, so under either collector the first sweep below
    // stages it while node-a's renewal is open, and only the executor's
    // `busy` (the pin row someone is changing) keeps it.
    for f in ["alkblobs_pin", "alkblobs_unpin"] {
        obs.query_one(
            &format!("SELECT {f}($1, $2, 'node-b')"),
            &[&pool, &key(value)],
        )
        .await
        .unwrap();
    }
    // (A TTL of 2 s leaves the renewal below 1.3 s to run before the pin
    // expires: with 1 s, a loaded CI machine once renewed too late.)
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    // The owner renews (the pin is still valid) in a transaction that stays
    // open past the pin's original expiry.
    r.batch_execute("BEGIN").await.unwrap();
    let n: i64 = r
        .query_one("SELECT alkblobs_renew($1, 'node-a')", &[&pool])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1, "the pin expired before the renewal ran");
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    // The reaper sees the committed (expired) version of a row someone is
    // renewing: it passes over it (SKIP LOCKED) rather than wait. The mark,
    // or the review of the key node-b's release queued, stages the key (the
    // committed pin is expired), and the executor finds the pin row locked
    // and keeps the key staged.
    let skipped = 1;
    let row = s
        .query_one(
            "SELECT deleted, pins_reaped, skipped, aborted FROM alkblobs_sweep($1)",
            &[&pool],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            row.get::<_, i64>(0),
            row.get::<_, i64>(1),
            row.get::<_, i64>(2),
            row.get::<_, Option<String>>(3)
        ),
        (0, 0, skipped, None)
    );
    r.batch_execute("COMMIT").await.unwrap();
    // (The executor keeps the staged key: kept 1.)
    assert_eq!(
        sweep(&s, &pool).await,
        (0, skipped, None),
        "the renewed pin keeps it"
    );
    assert!(
        exists(&obs, &pool, &key(value)).await,
        "a renewed pin lost its key"
    );
    let held = obs
        .query(
            "SELECT * FROM alkblobs_pins_held($1, 'node-a', $2)",
            &[&pool, &vec![key(value)]],
        )
        .await
        .unwrap();
    assert_eq!(held.len(), 1, "the renewal kept the pin");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropping_a_liveness_table_waits_for_the_sweep_and_then_unregisters_it() {
    let obs = connect().await;
    let s = connect().await;
    let d = connect().await;
    let pool = pool(&obs, "race-drop", "0 seconds", "60 seconds").await;
    let table = liveness_table(&obs, &pool).await;
    let k = garbage(&obs, &pool, b"live in a dropped table").await;
    obs.execute(&format!("INSERT INTO {table} (key) VALUES ($1)"), &[&k])
        .await
        .unwrap();

    s.batch_execute("BEGIN").await.unwrap();
    assert_eq!(sweep(&s, &pool).await, (0, 0, None));
    let d_pid = pid(&d).await;
    let t2 = table.clone();
    // CASCADE: the extension reads a registered table through a view of
    // its own (alkblobs.src_<oid>), which goes with it.
    let dropper =
        tokio::spawn(async move { d.batch_execute(&format!("DROP TABLE {t2} CASCADE")).await });
    assert!(
        waits_on_lock(&obs, d_pid).await,
        "DROP TABLE did not wait for the sweep"
    );
    s.batch_execute("COMMIT").await.unwrap();
    dropper.await.unwrap().unwrap();
    let tables: i64 = obs
        .query_one(
            "SELECT liveness_tables FROM alkblobs_usage WHERE pool = $1",
            &[&pool],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables, 0, "the dropped table is unregistered");
    // The next sweep neither fails on the missing table nor keeps its keys.
    assert_eq!(sweep(&obs, &pool).await, (1, 0, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn registering_a_liveness_table_waits_for_a_running_sweep() {
    let obs = connect().await;
    let s = connect().await;
    let g = connect().await;
    let pool = pool(&obs, "race-register", "0 seconds", "60 seconds").await;
    let table = format!("live_{}", pool.replace(['-', '.'], "_"));
    obs.batch_execute(&format!("CREATE TABLE {table} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    let k = garbage(&obs, &pool, b"registered mid-sweep").await;
    s.batch_execute("BEGIN").await.unwrap();
    s.query_one(
        "SELECT * FROM alkblobs_sweep($1, dry_run => true)",
        &[&pool],
    )
    .await
    .unwrap();
    let g_pid = pid(&g).await;
    let (p2, t2) = (pool.clone(), table.clone());
    let registrar = tokio::spawn(async move {
        g.execute(
            "SELECT alkblobs_register_liveness($1, $2::text::regclass)",
            &[&p2, &t2],
        )
        .await
    });
    assert!(
        waits_on_lock(&obs, g_pid).await,
        "registration did not wait for the sweep"
    );
    s.batch_execute("COMMIT").await.unwrap();
    registrar.await.unwrap().unwrap();
    obs.execute(&format!("INSERT INTO {table} (key) VALUES ($1)"), &[&k])
        .await
        .unwrap();
    assert_eq!(
        sweep(&obs, &pool).await,
        (0, 0, None),
        "the new table protects"
    );
    assert!(exists(&obs, &pool, &k).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sweeper_killed_mid_sweep_deletes_nothing_and_frees_the_lock() {
    let obs = connect().await;
    let s = connect().await;
    let pool = pool(&obs, "race-killed", "0 seconds", "60 seconds").await;
    let k = garbage(&obs, &pool, b"killed sweeper").await;
    s.batch_execute("BEGIN").await.unwrap();
    assert_eq!(sweep(&s, &pool).await.0, 1);
    let s_pid = pid(&s).await;
    obs.execute("SELECT pg_terminate_backend($1)", &[&s_pid])
        .await
        .unwrap();
    // Its transaction died with it: the delete is undone, the lock gone.
    for _ in 0..100 {
        let alive: i64 = obs
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
                &[&s_pid],
            )
            .await
            .unwrap()
            .get(0);
        if alive == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(
        exists(&obs, &pool, &k).await,
        "a killed sweep's delete must roll back"
    );
    assert!(
        s.batch_execute("SELECT 1").await.is_err(),
        "the killed connection reports an error"
    );
    assert_eq!(
        sweep(&obs, &pool).await,
        (1, 0, None),
        "the lock is free at once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_local_tier_claim_holds_its_keys_until_the_files_are_deleted() {
    let obs = connect().await;
    let c = connect().await;
    let w = connect().await;
    let pool = alkblobs_tests::pg::pool(&obs, "race-local", "0 seconds", "60 seconds").await;
    obs.execute(
        "UPDATE alkblobs.pools SET large_tier = 'local' WHERE name = $1",
        &[&pool],
    )
    .await
    .unwrap();
    let dead = key(b"file nobody wants");
    let wanted = key(b"file a writer is about to re-publish");
    let pinned = key(b"file with a pin");
    obs.execute(
        "SELECT alkblobs_pin_new($1, $2, 'holder')",
        &[&pool, &pinned],
    )
    .await
    .unwrap();
    let staged: i64 = obs
        .query_one(
            "SELECT alkblobs_stage($1, $2)",
            &[&pool, &vec![dead.clone(), wanted.clone(), pinned.clone()]],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(staged, 2, "the pinned file is not staged");

    // The client claims due files inside its transaction...
    c.batch_execute("BEGIN").await.unwrap();
    let claimed: Vec<Vec<u8>> = c
        .query("SELECT * FROM alkblobs_claim_local($1)", &[&pool])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut want = vec![dead.clone(), wanted.clone()];
    want.sort();
    assert_eq!(claimed, want);
    // ...and while it deletes them, a writer re-pinning one must wait.
    let w_pid = pid(&w).await;
    let (p2, k2) = (pool.clone(), wanted.clone());
    let writer = tokio::spawn(async move {
        w.execute("SELECT alkblobs_pin_new($1, $2, 'writer')", &[&p2, &k2])
            .await
    });
    assert!(
        waits_on_lock(&obs, w_pid).await,
        "pin_new did not wait for the claim"
    );
    c.batch_execute("COMMIT").await.unwrap();
    // The claim committed tombstones: the writer is refused until the
    // claimer has unlinked the files and said so.
    let e = writer.await.unwrap().unwrap_err();
    assert_eq!(
        sqlstate(&e),
        "55006",
        "pin_new recorded a file being deleted"
    );
    let tombs: i64 = c
        .query_one("SELECT alkblobs_local_deleted($1, $2)", &[&pool, &claimed])
        .await
        .unwrap()
        .get(0);
    assert_eq!(tombs, 2);
    let w = connect().await;
    w.execute(
        "SELECT alkblobs_pin_new($1, $2, 'writer')",
        &[&pool, &wanted],
    )
    .await
    .unwrap();
    // The writer now holds a pin and republishes the file; nothing is staged.
    let left: i64 = obs
        .query_one(
            "SELECT count(*) FROM alkblobs_staged WHERE pool = $1",
            &[&pool],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
    let held = obs
        .query(
            "SELECT * FROM alkblobs_pins_held($1, 'writer', $2)",
            &[&pool, &vec![wanted.clone()]],
        )
        .await
        .unwrap();
    assert_eq!(held.len(), 1);
}

/// Two `alkblobs_put_many` batches over the same 200 present keys, in
/// opposite orders, both waiting (FOR KEY SHARE) on an executor that holds
/// every key and then deletes them all: each batch must put every key
/// afresh, each key is created by exactly one of them, and neither may
/// deadlock (40P01) with the other. Until 0.8.0 a batch re-put its keys
/// deleted under it one by one in batch order after its other locks, so the
/// two ran into each other here almost every round; now a batch that finds
/// a key gone rolls its pass back and runs it again, in key order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn put_many_batches_whose_keys_are_deleted_under_them_do_not_deadlock() {
    let c = connect().await;
    let pool = pool(&c, "pmdl", "0s", "60s").await;
    let pool_id: i32 = c
        .query_one("SELECT id FROM alkblobs.pools WHERE name = $1", &[&pool])
        .await
        .unwrap()
        .get(0);
    let vals: Vec<Vec<u8>> = (0..200u32)
        .map(|i| format!("put_many deadlock {i}").into_bytes())
        .collect();
    let mut pairs: Vec<(Vec<u8>, Vec<u8>)> = vals.iter().map(|v| (key(v), v.clone())).collect();
    pairs.sort();
    let (asc_k, asc_v): (Vec<Vec<u8>>, Vec<Vec<u8>>) = pairs.iter().cloned().unzip();
    let (desc_k, desc_v): (Vec<Vec<u8>>, Vec<Vec<u8>>) = pairs.iter().rev().cloned().unzip();
    let a = connect().await;
    let b = connect().await;
    let executor = connect().await;
    let (a_pid, b_pid) = (pid(&a).await, pid(&b).await);
    for round in 0..3 {
        c.execute(
            "SELECT alkblobs_put_many($1, $2, $3, 'seed')",
            &[&pool, &asc_k, &asc_v],
        )
        .await
        .unwrap();
        // The executor deciding every key: locked FOR UPDATE, as
        // alkblobs_sweep's executor locks what it is about to delete.
        executor.batch_execute("BEGIN").await.unwrap();
        let locked = executor
            .query(
                "SELECT key FROM alkblobs.entries WHERE pool = $1 AND key = ANY($2) ORDER BY key FOR UPDATE",
                &[&pool_id, &asc_k],
            )
            .await
            .unwrap();
        assert_eq!(locked.len(), 200);
        let (ra, rb) = {
            let fa = put_many(&a, &pool, &asc_k, &asc_v, "a");
            let fb = put_many(&b, &pool, &desc_k, &desc_v, "b");
            let observer = &c;
            let release = async {
                assert!(
                    waits_on_lock(observer, a_pid).await,
                    "batch a waits for the executor"
                );
                assert!(
                    waits_on_lock(observer, b_pid).await,
                    "batch b waits for the executor"
                );
                executor
                    .execute(
                        "DELETE FROM alkblobs.entries WHERE pool = $1 AND key = ANY($2)",
                        &[&pool_id, &asc_k],
                    )
                    .await
                    .unwrap();
                executor.batch_execute("COMMIT").await.unwrap();
            };
            let (ra, rb, ()) = tokio::join!(fa, fb, release);
            (ra, rb)
        };
        let ra = ra.unwrap_or_else(|e| panic!("round {round}: batch a: {} {e}", sqlstate(&e)));
        let rb = rb.unwrap_or_else(|e| panic!("round {round}: batch b: {} {e}", sqlstate(&e)));
        // b's answers are in its (descending) order.
        for (i, k) in asc_k.iter().enumerate() {
            let by_a = ra[i];
            let by_b = rb[199 - i];
            assert!(
                by_a != by_b,
                "round {round}: key {i} created by a: {by_a}, by b: {by_b} (exactly one creates it)"
            );
            assert!(
                exists(&c, &pool, k).await,
                "round {round}: key {i} is there"
            );
        }
    }
}

async fn put_many(
    c: &Client,
    pool: &str,
    keys: &[Vec<u8>],
    vals: &[Vec<u8>],
    owner: &str,
) -> Result<Vec<bool>, tokio_postgres::Error> {
    c.query_one(
        "SELECT alkblobs_put_many($1, $2, $3, $4)",
        &[&pool, &keys, &vals, &owner],
    )
    .await
    .map(|r| r.get(0))
}

/// The same race with both batches at REPEATABLE READ and at SERIALIZABLE:
/// there a key deleted under a batch's `FOR KEY SHARE` is a serialization
/// failure (40001, retryable: nothing of the call stays), never a deadlock
/// (40P01) and never a call that answers while a key is missing; a batch
/// retried after 40001 puts every key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn put_many_batches_whose_keys_are_deleted_under_them_at_every_isolation_level() {
    for level in ["repeatable read", "serializable"] {
        let c = connect().await;
        let pool = pool(&c, "pmiso", "0s", "60s").await;
        let pool_id: i32 = c
            .query_one("SELECT id FROM alkblobs.pools WHERE name = $1", &[&pool])
            .await
            .unwrap()
            .get(0);
        let mut pairs: Vec<(Vec<u8>, Vec<u8>)> = (0..100u32)
            .map(|i| {
                let v = format!("put_many {level} {i}").into_bytes();
                (key(&v), v)
            })
            .collect();
        pairs.sort();
        let (asc_k, asc_v): (Vec<Vec<u8>>, Vec<Vec<u8>>) = pairs.iter().cloned().unzip();
        let (desc_k, desc_v): (Vec<Vec<u8>>, Vec<Vec<u8>>) = pairs.iter().rev().cloned().unzip();
        let (a, b, executor) = (connect().await, connect().await, connect().await);
        for s in [&a, &b] {
            s.batch_execute(&format!("SET default_transaction_isolation = '{level}'"))
                .await
                .unwrap();
        }
        let (a_pid, b_pid) = (pid(&a).await, pid(&b).await);
        c.execute(
            "SELECT alkblobs_put_many($1, $2, $3, 'seed')",
            &[&pool, &asc_k, &asc_v],
        )
        .await
        .unwrap();
        executor.batch_execute("BEGIN").await.unwrap();
        executor
            .query(
                "SELECT key FROM alkblobs.entries WHERE pool = $1 AND key = ANY($2) ORDER BY key FOR UPDATE",
                &[&pool_id, &asc_k],
            )
            .await
            .unwrap();
        let fa = put_many(&a, &pool, &asc_k, &asc_v, "a");
        let fb = put_many(&b, &pool, &desc_k, &desc_v, "b");
        let release = async {
            assert!(waits_on_lock(&c, a_pid).await, "{level}: batch a waits");
            assert!(waits_on_lock(&c, b_pid).await, "{level}: batch b waits");
            executor
                .execute(
                    "DELETE FROM alkblobs.entries WHERE pool = $1 AND key = ANY($2)",
                    &[&pool_id, &asc_k],
                )
                .await
                .unwrap();
            executor.batch_execute("COMMIT").await.unwrap();
        };
        let (ra, rb, ()) = tokio::join!(fa, fb, release);
        for (who, r, keys, vals) in [("a", ra, &asc_k, &asc_v), ("b", rb, &desc_k, &desc_v)] {
            match r {
                Ok(_) => {}
                Err(e) => {
                    assert_eq!(sqlstate(&e), "40001", "{level}: batch {who}: {e}");
                    // Retried, as the error says: it puts every key.
                    let s = if who == "a" { &a } else { &b };
                    put_many(s, &pool, keys, vals, who)
                        .await
                        .unwrap_or_else(|e| panic!("{level}: retry of {who}: {e}"));
                }
            }
        }
        for k in &asc_k {
            assert!(exists(&c, &pool, k).await, "{level}: a key is missing");
        }
    }
}

/// The executor's re-check must not treat a pin whose renewal is still
/// uncommitted as expired: otherwise the renewal commits, `pins_held`
/// confirms the pin, and the holder publishes deleted content.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_renewal_in_flight_at_expiry_is_not_overtaken_by_the_executor() {
    let obs = connect().await;
    let r = connect().await;
    let x = connect().await;
    let s = connect().await;
    let pool = pool(&obs, "renew-exec", "1 second", "2 seconds").await;
    let k = garbage(&obs, &pool, b"renewed while the executor decides").await;
    // Stage it (window 1 s), then pin it (TTL 2 s) and wait out the window.
    assert_eq!(try_sweep(&obs, &pool).await, Ok((0, None)));
    // (A pin, not a put: a put would unstage the key.)
    obs.query_one("SELECT alkblobs_pin($1, $2, 'node-a')", &[&pool, &k])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1300)).await;
    // node-a renews in a transaction that is still open at the pin's expiry.
    r.batch_execute("BEGIN").await.unwrap();
    let n: i64 = r
        .query_one("SELECT alkblobs_renew($1, 'node-a')", &[&pool])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    // Someone else touches the entry, so an executor that waits on row
    // locks is held up until after the expiry.
    x.batch_execute("BEGIN").await.unwrap();
    x.query_one("SELECT alkblobs_pin($1, $2, 'other')", &[&pool, &k])
        .await
        .unwrap();
    let pool2 = pool.clone();
    let sweeper = tokio::spawn(async move {
        s.query_one(
            "SELECT deleted FROM alkblobs_sweep($1, mark => false)",
            &[&pool2],
        )
        .await
        .map(|r| r.get::<_, i64>(0))
        .map_err(|e| sqlstate(&e))
    });
    tokio::time::sleep(Duration::from_millis(1200)).await;
    x.batch_execute("ROLLBACK").await.unwrap();
    let swept = sweeper.await.unwrap();
    r.batch_execute("COMMIT").await.unwrap();
    let held = obs
        .query(
            "SELECT * FROM alkblobs_pins_held($1, 'node-a', $2)",
            &[&pool, &vec![k.clone()]],
        )
        .await
        .unwrap();
    if !held.is_empty() {
        assert!(
            exists(&obs, &pool, &k).await,
            "pins_held confirms a pin on deleted content (sweep {swept:?})"
        );
    }
}

/// A writer pinning in descending key order while the executor locks in
/// ascending order must not deadlock; the executor passes over what is
/// locked and leaves it staged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_writer_locking_in_another_order_does_not_deadlock_the_executor() {
    let obs = connect().await;
    let w = connect().await;
    let s = connect().await;
    let pool = pool(&obs, "deadlock", "0 seconds", "60 seconds").await;
    let mut ks = [
        garbage(&obs, &pool, b"deadlock one").await,
        garbage(&obs, &pool, b"deadlock two").await,
    ];
    ks.sort();
    w.batch_execute("BEGIN").await.unwrap();
    w.query_one("SELECT alkblobs_pin($1, $2, 'w')", &[&pool, &ks[1]])
        .await
        .unwrap();
    let s_pid = pid(&s).await;
    let pool2 = pool.clone();
    let sweeper = tokio::spawn(async move { try_sweep(&s, &pool2).await });
    // Pre-hardening the executor holds ks[0] and waits for ks[1] here.
    let _ = tokio::time::timeout(Duration::from_secs(2), waits_on_lock(&obs, s_pid)).await;
    let pinned = w
        .query_one("SELECT alkblobs_pin($1, $2, 'w')", &[&pool, &ks[0]])
        .await
        .map(|r| r.get::<_, bool>(0))
        .map_err(|e| sqlstate(&e));
    let wc = w.batch_execute("COMMIT").await.map_err(|e| sqlstate(&e));
    let swept = sweeper.await.unwrap();
    assert_ne!(pinned, Err("40P01".into()), "the writer deadlocked");
    assert_ne!(swept, Err("40P01".into()), "the sweep deadlocked");
    wc.unwrap();
    assert_eq!(
        swept,
        Ok((1, None)),
        "the free key goes, the locked one waits"
    );
    assert_eq!(pinned, Ok(false), "the pin found ks[0] collected");
    assert!(exists(&obs, &pool, &ks[1]).await);
}

/// An idle-in-transaction pinner does not stall the sweep: the sweep
/// returns at once, deletes every other dead key and leaves the held one
/// staged for a later call.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_pinner_does_not_stall_the_sweep() {
    let obs = connect().await;
    let w = connect().await;
    let s = connect().await;
    let pool = pool(&obs, "idle-pinner", "0 seconds", "60 seconds").await;
    let mut ks = Vec::new();
    for i in 0..20 {
        ks.push(garbage(&obs, &pool, format!("idle pinner {i}").as_bytes()).await);
    }
    ks.sort();
    let held = ks[10].clone();
    w.batch_execute("BEGIN").await.unwrap();
    w.query_one("SELECT alkblobs_pin($1, $2, 'idle')", &[&pool, &held])
        .await
        .unwrap();
    s.batch_execute("SET statement_timeout = '5s'")
        .await
        .unwrap();
    let swept = try_sweep(&s, &pool).await;
    assert_eq!(
        swept,
        Ok((19, None)),
        "the sweep must not wait for the idle pinner"
    );
    let staged: i64 = obs
        .query_one(
            "SELECT count(*) FROM alkblobs_staged WHERE pool = $1 AND key = encode($2, 'hex')",
            &[&pool, &held],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(staged, 1, "the held key stays staged");
    w.batch_execute("COMMIT").await.unwrap();
    assert_eq!(try_sweep(&s, &pool).await, Ok((0, None)), "now pinned");
    assert!(exists(&obs, &pool, &held).await);
}

/// A reader's explain in an open transaction holds no lock a sweep or the
/// table's DDL would wait for.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_explain_in_an_open_transaction_does_not_hold_up_sweeps() {
    let c = connect().await;
    let pool = pool(&c, "explain-lock", "0 seconds", "60 seconds").await;
    let t = table_name(&pool, "live");
    c.batch_execute(&format!("CREATE TABLE {t} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    try_register(&c, &pool, &t).await.unwrap();
    let k = garbage(&c, &pool, b"explained").await;
    let reader = connect().await;
    reader.batch_execute("BEGIN").await.unwrap();
    reader
        .query("SELECT * FROM alkblobs_explain($1, $2)", &[&pool, &k])
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(30), try_sweep_detailed(&c, &pool))
        .await
        .unwrap();
    reader.batch_execute("COMMIT").await.unwrap();
    assert_eq!(got, Ok((1, None)));
}

/// `alkblobs_put_many` (set-based) racing an executor that is deleting one
/// of its keys, at every isolation level: it waits for the delete and then
/// either puts the entry afresh or fails with 40001 — it never reports the
/// key stored while the entry is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn put_many_racing_a_delete_never_reports_gone_content_stored() {
    let obs = connect().await;
    for iso in ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"] {
        let pool = pool(&obs, "pm-race", "0 seconds", "60 seconds").await;
        let k = garbage(&obs, &pool, format!("put_many at {iso}").as_bytes()).await;
        let other = key(format!("other at {iso}").as_bytes());
        let v = format!("put_many at {iso}").into_bytes();
        let ov = format!("other at {iso}").into_bytes();
        // The executor, as it works: the entry locked FOR UPDATE (decided),
        // deleted a moment later, committed after that.
        let ex = connect().await;
        ex.batch_execute("BEGIN").await.unwrap();
        ex.execute(
            "SELECT 1 FROM alkblobs.entries e JOIN alkblobs.pools p ON p.id = e.pool
              WHERE p.name = $1 AND e.key = $2 FOR UPDATE OF e",
            &[&pool, &k],
        )
        .await
        .unwrap();
        let w = connect().await;
        w.batch_execute(&format!("BEGIN ISOLATION LEVEL {iso}; SELECT 1"))
            .await
            .unwrap();
        let w_pid = pid(&w).await;
        let (p2, k2, o2, v2, ov2) = (
            pool.clone(),
            k.clone(),
            other.clone(),
            v.clone(),
            ov.clone(),
        );
        let task = tokio::spawn(async move {
            let r = w
                .query_one(
                    "SELECT alkblobs_put_many($1, ARRAY[$2::bytea, $3::bytea], ARRAY[$4::bytea, $5::bytea], 'node')",
                    &[&p2, &k2, &o2, &v2, &ov2],
                )
                .await
                .map(|r| r.get::<_, Vec<bool>>(0))
                .map_err(|e| sqlstate(&e));
            let c = w.batch_execute("COMMIT").await.map_err(|e| sqlstate(&e));
            (r, c)
        });
        assert!(
            waits_on_lock(&obs, w_pid).await,
            "{iso}: put_many did not wait for the executor"
        );
        ex.execute(
            "DELETE FROM alkblobs.entries e USING alkblobs.pools p WHERE p.id = e.pool AND p.name = $1 AND e.key = $2",
            &[&pool, &k],
        )
        .await
        .unwrap();
        ex.batch_execute("COMMIT").await.unwrap();
        let (r, c) = task.await.unwrap();
        match r {
            Ok(created) => {
                assert_eq!(c, Ok(()), "{iso}");
                assert_eq!(created, vec![true, true], "{iso}: the key was put afresh");
                assert!(
                    alkblobs_tests::pg::exists(&obs, &pool, &k).await,
                    "{iso}: reported stored, entry gone"
                );
            }
            Err(code) => assert_eq!(code, "40001", "{iso}"),
        }
    }
}
