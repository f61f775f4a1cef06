//! The extension's sweep scheduler, sweep history and health (issue 12),
//! against the test cluster, which `scripts/pg-cluster.sh` starts with
//! `shared_preload_libraries = 'alkblobs'` and the test database in
//! `alkblobs.scheduler_databases` (naptime 250 ms).
//!
//! Tests that only need the scheduler running share `SCHEDULER` for
//! reading; the ones that pause or terminate it take it for writing, so no
//! other test of this binary runs meanwhile.

#![cfg(feature = "pg")]

use std::time::{Duration, Instant};

use alkblobs_tests::pg::{
    connect, garbage, key, pool, put, scheduler_pid_now, sqlstate, table_name, url,
};
use tokio::sync::RwLock;
use tokio_postgres::Client;

static SCHEDULER: RwLock<()> = RwLock::const_new(());

/// The scheduler's backend pid in this database, waiting up to 60 s for it
/// (on a fresh cluster it starts before the test database exists and
/// retries after its restart interval).
async fn scheduler_pid(c: &Client) -> i32 {
    for _ in 0..600 {
        if let Some(pid) = scheduler_pid_now(c, "alkblobs_test").await {
            return pid;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "no alkblobs scheduler serves the test database after 60 s: is the cluster started \
         with shared_preload_libraries = 'alkblobs' (scripts/pg-cluster.sh)?"
    );
}

/// Polls `cond` every 100 ms for up to `secs` seconds.
async fn within<F, Fut>(secs: u64, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("not within {secs} s: {what}");
}

async fn schedule(c: &Client, pool: &str, every: &str) {
    c.execute(
        "SELECT alkblobs_alter_pool($1, sweep_every => $2::text::interval)",
        &[&pool, &every],
    )
    .await
    .expect("alkblobs_alter_pool(sweep_every)");
}

async fn count(c: &Client, sql: &str, pool: &str) -> i64 {
    c.query_one(sql, &[&pool]).await.unwrap().get(0)
}

async fn present(c: &Client, pool: &str, k: &[u8]) -> bool {
    alkblobs_tests::pg::exists(c, pool, k).await
}

/// A large object entry of `pool` holding `value`, pinned for `owner`.
/// Returns its key and large object id.
async fn put_lo(c: &mut Client, pool: &str, value: &[u8], owner: &str) -> (Vec<u8>, u32) {
    let tx = c.transaction().await.unwrap();
    let loid: u32 = tx
        .query_one("SELECT alkblobs_lo_create($1)", &[&pool])
        .await
        .unwrap()
        .get(0);
    tx.execute("SELECT alkblobs_lo_write($1, 0, $2)", &[&loid, &value])
        .await
        .unwrap();
    tx.execute(
        "SELECT alkblobs_lo_commit($1, $2, $3, $4)",
        &[&pool, &key(value), &loid, &owner],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    (key(value), loid)
}

async fn lo_exists(c: &Client, loid: u32) -> bool {
    c.query_one(
        "SELECT EXISTS (SELECT 1 FROM pg_largeobject_metadata WHERE oid = $1)",
        &[&loid],
    )
    .await
    .unwrap()
    .get(0)
}

/// One column of a pool's `alkblobs_health` row.
async fn health_col<T>(c: &Client, pool: &str, column: &str) -> T
where
    T: for<'a> tokio_postgres::types::FromSql<'a>,
{
    c.query_one(
        &format!("SELECT {column} FROM alkblobs_health WHERE pool = $1"),
        &[&pool],
    )
    .await
    .unwrap()
    .get(0)
}

async fn health(c: &Client, pool: &str) -> (String, Vec<String>) {
    let r = c
        .query_one(
            "SELECT status, reasons FROM alkblobs_health WHERE pool = $1",
            &[&pool],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_pool_is_swept_with_nobody_calling_it() {
    let _s = SCHEDULER.read().await;
    let mut c = connect().await;
    let pool = pool(&c, "sched", "0 seconds", "1 second").await;
    scheduler_pid(&c).await;
    // A live entry (in a registered liveness table), a dead kv entry, a
    // dead large object, and an entry whose only pin expires.
    let live = b"referenced by a liveness table".to_vec();
    put(&c, &pool, &live, "writer").await;
    let table = table_name(&pool, "refs");
    c.batch_execute(&format!("CREATE TABLE {table} (key bytea NOT NULL)"))
        .await
        .unwrap();
    c.execute(
        "SELECT alkblobs_register_liveness($1, $2::text::regclass)",
        &[&pool, &table],
    )
    .await
    .unwrap();
    c.execute(&format!("INSERT INTO {table} VALUES ($1)"), &[&key(&live)])
        .await
        .unwrap();
    let dead = garbage(&c, &pool, b"dead kv entry").await;
    let (dead_lo, loid) = put_lo(&mut c, &pool, &vec![7u8; 200_000], "setup").await;
    c.execute("SELECT alkblobs_unpin($1, $2, 'setup')", &[&pool, &dead_lo])
        .await
        .unwrap();
    let expiring = b"pinned by a node that died".to_vec();
    put(&c, &pool, &expiring, "died").await;
    // Nothing is swept before the schedule is set.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(present(&c, &pool, &dead).await);
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM alkblobs_sweeps WHERE pool = $1",
            &pool
        )
        .await,
        0
    );

    schedule(&c, &pool, "1 second").await;
    within(
        30,
        "the dead entries, the dead large object and the expired pin go",
        || async {
            !present(&c, &pool, &dead).await
                && !present(&c, &pool, &dead_lo).await
                && !present(&c, &pool, &key(&expiring)).await
        },
    )
    .await;
    assert!(
        !lo_exists(&c, loid).await,
        "the dead large object was not unlinked"
    );
    assert!(
        present(&c, &pool, &key(&live)).await,
        "a live entry was deleted"
    );
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM alkblobs_pins WHERE pool = $1 AND owner = 'died'",
            &pool
        )
        .await,
        0,
        "the expired pin was not reaped"
    );
    // Every call is in the history, as the scheduler's.
    let r = c
        .query_one(
            "SELECT count(*), bool_and(scheduled), bool_and(application_name = 'alkblobs scheduler'), \
                    sum(deleted)::bigint, sum(pins_reaped)::bigint, bool_and(outcome = 'ok') \
               FROM alkblobs_sweeps WHERE pool = $1",
            &[&pool],
        )
        .await
        .unwrap();
    assert!(r.get::<_, i64>(0) >= 2, "fewer than two recorded calls");
    assert!(r.get::<_, bool>(1), "a call not marked scheduled");
    assert!(r.get::<_, bool>(2), "a call under another application_name");
    assert_eq!(r.get::<_, i64>(3), 3, "deleted counts in the history");
    assert!(
        r.get::<_, i64>(4) >= 1,
        "the reaped pin is not in the history"
    );
    assert!(r.get::<_, bool>(5), "a scheduled call did not complete");
    let (status, reasons) = health(&c, &pool).await;
    assert_eq!(status, "ok", "{reasons:?}");
    let sched: String = health_col(&c, &pool, "scheduler").await;
    assert_eq!(sched, "on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_holding_the_sweeper_lock_makes_the_scheduler_skip_never_wait() {
    let _s = SCHEDULER.read().await;
    let c = connect().await;
    let pool = pool(&c, "schedlock", "0 seconds", "60 seconds").await;
    scheduler_pid(&c).await;
    let dead = garbage(&c, &pool, b"waits for the node").await;
    let id: i32 = c
        .query_one(
            "SELECT pool_id FROM alkblobs_pools WHERE pool = $1",
            &[&pool],
        )
        .await
        .unwrap()
        .get(0);
    // A node in the middle of its sweep holds the pool's sweeper lock.
    let mut node = connect().await;
    let tx = node.transaction().await.unwrap();
    tx.execute("SELECT alkblobs.take_lock($1, false)", &[&id])
        .await
        .unwrap();
    schedule(&c, &pool, "1 second").await;
    // Skips are recorded while the lock is held: the worker never waits
    // for it (a waiting worker would record nothing until it is released).
    within(20, "two skips recorded while the node holds the lock", || async {
        count(
            &c,
            "SELECT count(*) FROM alkblobs_sweeps WHERE pool = $1 AND scheduled AND aborted = 'sweeper_lock'",
            &pool,
        )
        .await
            >= 2
    })
    .await;
    assert!(present(&c, &pool, &dead).await, "swept under a node's lock");
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM alkblobs_sweeps WHERE pool = $1 AND outcome <> 'aborted'",
            &pool
        )
        .await,
        0
    );
    // A skip is not a failure: the pool is healthy meanwhile.
    let (status, reasons) = health(&c, &pool).await;
    assert_eq!(status, "ok", "{reasons:?}");
    let outcome: String = health_col(&c, &pool, "last_outcome").await;
    assert_eq!(outcome, "aborted: sweeper_lock");
    tx.commit().await.unwrap();
    within(20, "the pool is swept once the node is done", || async {
        !present(&c, &pool, &dead).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_sweep_is_recorded_and_the_worker_goes_on() {
    let _s = SCHEDULER.read().await;
    let mut c = connect().await;
    let pid = scheduler_pid(&c).await;
    // Pool `broken`: a dead entry whose large object someone handed to
    // another role by hand, so the executor's lo_unlink raises (42501: not
    // its owner) in every sweep. (One unlinked by hand no longer does: the
    // entry of a lost object is collected like any other.)
    let broken = pool(&c, "schedbroken", "0 seconds", "60 seconds").await;
    let (k, loid) = put_lo(&mut c, &broken, &vec![1u8; 5000], "setup").await;
    c.execute("SELECT alkblobs_unpin($1, $2, 'setup')", &[&broken, &k])
        .await
        .unwrap();
    c.batch_execute(&format!("ALTER LARGE OBJECT {loid} OWNER TO postgres"))
        .await
        .unwrap();
    // Pool `invalid`: a liveness table that fails validation (row-level
    // security turned on after registration): its sweeps abort.
    let invalid = pool(&c, "schedinvalid", "0 seconds", "60 seconds").await;
    let table = table_name(&invalid, "refs");
    c.batch_execute(&format!("CREATE TABLE {table} (key bytea NOT NULL)"))
        .await
        .unwrap();
    c.execute(
        "SELECT alkblobs_register_liveness($1, $2::text::regclass)",
        &[&invalid, &table],
    )
    .await
    .unwrap();
    c.batch_execute(&format!("ALTER TABLE {table} ENABLE ROW LEVEL SECURITY"))
        .await
        .unwrap();
    let kept = garbage(&c, &invalid, b"an aborted sweep deletes nothing").await;
    // Pool `fine`: an ordinary pool the same worker serves.
    let fine = pool(&c, "schedfine", "0 seconds", "60 seconds").await;
    let dead = garbage(&c, &fine, b"swept despite the others").await;
    for p in [&broken, &invalid, &fine] {
        schedule(&c, p, "1 second").await;
    }
    within(30, "the healthy pool is swept", || async {
        !present(&c, &fine, &dead).await
    })
    .await;
    within(30, "two failed sweeps of the broken pool recorded", || async {
        count(
            &c,
            "SELECT count(*) FROM alkblobs_sweeps WHERE pool = $1 AND outcome = 'error' AND error LIKE '42501:%'",
            &broken,
        )
        .await
            >= 2
    })
    .await;
    within(30, "an aborted sweep of the invalid pool recorded", || async {
        count(
            &c,
            "SELECT count(*) FROM alkblobs_sweeps WHERE pool = $1 AND aborted = 'liveness_table_invalid'",
            &invalid,
        )
        .await
            >= 1
    })
    .await;
    assert!(present(&c, &invalid, &kept).await);
    // Retried every sweep_every, not in a loop: no two failed calls of the
    // broken pool start less than ~sweep_every apart.
    let gap: f64 = c
        .query_one(
            "SELECT coalesce(min(extract(epoch FROM d)), 1)::float8 FROM ( \
               SELECT started - lag(started) OVER (ORDER BY started) AS d \
                 FROM alkblobs_sweeps WHERE pool = $1) x WHERE d IS NOT NULL",
            &[&broken],
        )
        .await
        .unwrap()
        .get(0);
    assert!(gap >= 0.5, "failed sweeps retried {gap} s apart");
    // The same worker process throughout: an error never took it down.
    assert_eq!(scheduler_pid(&c).await, pid, "the scheduler restarted");
    let (status, reasons) = health(&c, &broken).await;
    assert_eq!(status, "warn", "{reasons:?}");
    assert!(
        reasons.iter().any(|r| r.contains("error: 42501")),
        "{reasons:?}"
    );
    let (status, reasons) = health(&c, &invalid).await;
    assert_eq!(status, "critical", "{reasons:?}");
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("row-level security") || r.contains(&table)),
        "{reasons:?}"
    );
    let n: i64 = health_col(&c, &invalid, "invalid_sources").await;
    assert_eq!(n, 1);
    for p in [&broken, &invalid, &fine] {
        schedule(&c, p, "0").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_turns_critical_when_the_last_sweep_is_too_old() {
    let _s = SCHEDULER.read().await;
    let c = connect().await;
    let pool = pool(&c, "schedold", "0 seconds", "60 seconds").await;
    scheduler_pid(&c).await;
    c.execute(
        "SELECT alkblobs_alter_pool($1, sweep_every => '1 hour', warn_after => '2 seconds', \
                critical_after => '4 seconds')",
        &[&pool],
    )
    .await
    .unwrap();
    // Swept at once (never swept before), then not for an hour.
    within(20, "the first scheduled sweep", || async {
        count(
            &c,
            "SELECT count(*) FROM alkblobs_sweeps WHERE pool = $1 AND scheduled AND outcome = 'ok'",
            &pool,
        )
        .await
            == 1
    })
    .await;
    within(20, "critical once the last sweep is 4 s old", || async {
        health(&c, &pool).await.0 == "critical"
    })
    .await;
    let (_, reasons) = health(&c, &pool).await;
    assert!(
        reasons.iter().any(|r| r.contains("no completed sweep for")),
        "{reasons:?}"
    );
    // The scheduler did not sweep it again (its hour is not up) ...
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM alkblobs_sweeps WHERE pool = $1 AND scheduled",
            &pool
        )
        .await,
        1
    );
    // ... and a sweep from psql counts: healthy again, recorded as a
    // psql user's.
    c.batch_execute("SET application_name = 'ops-console'")
        .await
        .unwrap();
    c.execute("SELECT * FROM alkblobs_sweep($1)", &[&pool])
        .await
        .unwrap();
    assert_eq!(health(&c, &pool).await.0, "ok");
    let r = c
        .query_one(
            "SELECT role::text, application_name, scheduled FROM alkblobs_sweeps \
              WHERE pool = $1 ORDER BY id DESC LIMIT 1",
            &[&pool],
        )
        .await
        .unwrap();
    assert_eq!(r.get::<_, String>(0), "postgres");
    assert_eq!(r.get::<_, String>(1), "ops-console");
    assert!(!r.get::<_, bool>(2));
    schedule(&c, &pool, "0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_rows_older_than_history_keep_are_deleted_by_later_sweeps() {
    let _s = SCHEDULER.read().await;
    let c = connect().await;
    let pool = pool(&c, "schedkeep", "0 seconds", "60 seconds").await;
    c.execute(
        "SELECT alkblobs_alter_pool($1, history_keep => '1 second')",
        &[&pool],
    )
    .await
    .unwrap();
    for _ in 0..3 {
        c.execute("SELECT * FROM alkblobs_sweep($1)", &[&pool])
            .await
            .unwrap();
    }
    c.execute(
        "SELECT * FROM alkblobs_sweep($1, dry_run => true)",
        &[&pool],
    )
    .await
    .unwrap();
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM alkblobs_sweeps WHERE pool = $1",
            &pool
        )
        .await,
        4
    );
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM alkblobs_sweeps WHERE pool = $1 AND dry_run",
            &pool
        )
        .await,
        1
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    c.execute("SELECT * FROM alkblobs_sweep($1)", &[&pool])
        .await
        .unwrap();
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM alkblobs_sweeps WHERE pool = $1",
            &pool
        )
        .await,
        1,
        "rows older than history_keep survived a sweep"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_settings_are_validated_and_refused_for_single_instance_pools() {
    let _s = SCHEDULER.read().await;
    let c = connect().await;
    let p = pool(&c, "schedbad", "0 seconds", "60 seconds").await;
    for (sql, what) in [
        (
            "SELECT alkblobs_alter_pool($1, sweep_every => '1 month')",
            "a month",
        ),
        (
            "SELECT alkblobs_alter_pool($1, sweep_every => '-1 second')",
            "negative",
        ),
        (
            "SELECT alkblobs_alter_pool($1, sweep_every => '10 milliseconds')",
            "under 1 s",
        ),
        (
            "SELECT alkblobs_alter_pool($1, history_keep => '0')",
            "keep nothing",
        ),
        (
            "SELECT alkblobs_alter_pool($1, critical_after => '4000 days')",
            "too long",
        ),
    ] {
        let e = c.execute(sql, &[&p]).await.expect_err(what);
        assert_eq!(sqlstate(&e), "22023", "{what}: {e}");
    }
    let single =
        alkblobs_tests::pg::pool_with(&c, "schedsingle", "0 seconds", "60 seconds", "pg-lo", true)
            .await;
    let e = c
        .execute(
            "SELECT alkblobs_alter_pool($1, sweep_every => '1 minute')",
            &[&single],
        )
        .await
        .expect_err("a schedule on a single-instance pool");
    assert_eq!(sqlstate(&e), "22023", "{e}");
    // Single-instance pools are swept by their owner: health does not
    // judge their age.
    let (status, reasons) = health(&c, &single).await;
    assert_eq!(status, "ok", "{reasons:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_sees_history_and_health_of_its_pools_only() {
    let _s = SCHEDULER.read().await;
    let c = connect().await;
    let mine = pool(&c, "schedmine", "0 seconds", "60 seconds").await;
    let other = pool(&c, "schedother", "0 seconds", "60 seconds").await;
    for p in [&mine, &other] {
        c.execute("SELECT * FROM alkblobs_sweep($1)", &[p])
            .await
            .unwrap();
    }
    let role = alkblobs_tests::pg::login_role(&c, "schedreader", "alkblobs_reader").await;
    alkblobs_tests::pg::grant_pool(&c, &mine, &role, "read").await;
    let r = alkblobs_tests::pg::connect_as(&role).await;
    let seen: Vec<String> = r
        .query(
            "SELECT DISTINCT pool FROM alkblobs_sweeps WHERE pool IN ($1, $2)",
            &[&mine, &other],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(seen, vec![mine.clone()]);
    let seen: Vec<String> = r
        .query(
            "SELECT pool FROM alkblobs_health WHERE pool IN ($1, $2)",
            &[&mine, &other],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(seen, vec![mine.clone()]);
    // The internals stay closed, even to an admin (who has USAGE on the
    // internal schema).
    let admin = alkblobs_tests::pg::login_role(&c, "schedadmin", "alkblobs_admin").await;
    let a = alkblobs_tests::pg::connect_as(&admin).await;
    for sql in [
        "SELECT count(*) FROM alkblobs.sweeps",
        "SELECT count(*) FROM alkblobs.sweep_state",
        "SELECT count(*) FROM alkblobs.schedule",
        "SELECT alkblobs.scheduled_sweep(1, true)",
        "SELECT alkblobs.scheduler_claim(1)",
        "SELECT * FROM alkblobs.scheduler_due()",
        "SELECT * FROM alkblobs.sweep_core('x')",
    ] {
        let e = a.query(sql, &[]).await.expect_err(sql);
        assert_eq!(sqlstate(&e), "42501", "{sql}: {e}");
    }
}

/// A database the scheduler does not serve, with the extension.
async fn unserved_database(c: &Client) -> Client {
    let name = format!("alkblobs_unserved_{}", std::process::id());
    c.batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
        .await
        .unwrap();
    c.batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    let u = url();
    let base = u.rsplit_once('/').unwrap().0;
    let (client, rx) = alkblobs_tests::pg::connect_collecting(&format!("{base}/{name}")).await;
    NOTICES.lock().unwrap().replace(rx);
    client
        .batch_execute("CREATE EXTENSION alkblobs")
        .await
        .unwrap();
    client
}

static NOTICES: std::sync::Mutex<Option<std::sync::mpsc::Receiver<String>>> =
    std::sync::Mutex::new(None);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_without_a_scheduler_says_scheduling_is_off() {
    let _s = SCHEDULER.read().await;
    let c = connect().await;
    let db = unserved_database(&c).await;
    db.execute(
        "SELECT alkblobs_create_pool('unserved', delete_window => '0', sweep_every => '1 second')",
        &[],
    )
    .await
    .unwrap();
    let notices: Vec<String> = {
        let guard = NOTICES.lock().unwrap();
        let rx = guard.as_ref().unwrap();
        std::iter::from_fn(|| rx.recv_timeout(Duration::from_secs(2)).ok())
            .take(1)
            .collect()
    };
    assert!(
        notices
            .iter()
            .any(|n| n.contains("scheduling is off") && n.contains("nothing sweeps it")),
        "{notices:?}"
    );
    db.execute(
        "SELECT alkblobs_put('unserved', alkblobs_key('x'), 'x', 'o')",
        &[],
    )
    .await
    .unwrap();
    db.execute(
        "SELECT alkblobs_unpin('unserved', alkblobs_key('x'), 'o')",
        &[],
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let n: i64 = db
        .query_one("SELECT count(*) FROM alkblobs_sweeps", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        n, 0,
        "something swept a database the scheduler does not serve"
    );
    let r = db
        .query_one(
            "SELECT scheduler, status, reasons FROM alkblobs_health WHERE pool = 'unserved'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(r.get::<_, String>(0), "off");
    assert_eq!(r.get::<_, String>(1), "warn");
    let reasons: Vec<String> = r.get(2);
    assert!(
        reasons.iter().any(|x| x.contains("scheduling is off")
            && x.contains("is not in alkblobs.scheduler_databases")),
        "{reasons:?}"
    );
    // Everything else works there: a sweep from psql collects.
    db.execute("SELECT * FROM alkblobs_sweep('unserved')", &[])
        .await
        .unwrap();
    let n: i64 = db
        .query_one("SELECT count(*) FROM alkblobs_list('unserved')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
    drop(db);
    let name = format!("alkblobs_unserved_{}", std::process::id());
    c.batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)"))
        .await
        .unwrap();
}

/// Resets the test database's defaults even if the test fails.
struct ResetDefaults;
impl Drop for ResetDefaults {
    fn drop(&mut self) {
        let out = std::process::Command::new("psql")
            .args([
                "-X",
                "-q",
                &url(),
                "-c",
                "SET default_transaction_read_only = off",
                "-c",
                "ALTER DATABASE alkblobs_test RESET default_transaction_isolation",
                "-c",
                "ALTER DATABASE alkblobs_test RESET default_transaction_read_only",
            ])
            .output();
        if let Ok(o) = out {
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        }
    }
}

/// Restores `alkblobs.scheduler_enabled` even if the test fails.
struct Unpause;
impl Drop for Unpause {
    fn drop(&mut self) {
        let out = std::process::Command::new("psql")
            .args([
                "-X",
                "-q",
                &url(),
                "-c",
                "ALTER SYSTEM RESET alkblobs.scheduler_enabled",
                "-c",
                "SELECT pg_reload_conf()",
            ])
            .output();
        if let Ok(o) = out {
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_and_terminating_the_scheduler() {
    let _s = SCHEDULER.write().await;
    let c = connect().await;
    let first = scheduler_pid(&c).await;
    let pool = pool(&c, "schedpause", "0 seconds", "60 seconds").await;
    // Paused: nothing is swept, and health says why.
    let _unpause = Unpause;
    c.batch_execute("ALTER SYSTEM SET alkblobs.scheduler_enabled = off")
        .await
        .unwrap();
    c.batch_execute("SELECT pg_reload_conf()").await.unwrap();
    within(10, "the reload reaches this session", || async {
        let v: String = c
            .query_one("SHOW alkblobs.scheduler_enabled", &[])
            .await
            .unwrap()
            .get(0);
        v == "off"
    })
    .await;
    // Let the worker finish a tick in progress and see the reload.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let dead = garbage(&c, &pool, b"not while paused").await;
    schedule(&c, &pool, "1 second").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(present(&c, &pool, &dead).await, "swept while paused");
    let r = c
        .query_one(
            "SELECT scheduler, reasons FROM alkblobs_health WHERE pool = $1",
            &[&pool],
        )
        .await
        .unwrap();
    assert_eq!(r.get::<_, String>(0), "paused");
    c.batch_execute("ALTER SYSTEM RESET alkblobs.scheduler_enabled")
        .await
        .unwrap();
    c.batch_execute("SELECT pg_reload_conf()").await.unwrap();
    within(20, "swept once resumed", || async {
        !present(&c, &pool, &dead).await
    })
    .await;

    // Database defaults a sweep cannot run under (it needs READ COMMITTED
    // and writes): the worker's session overrides them. They apply to the
    // next worker, the one started after the SIGTERM below.
    let _defaults = ResetDefaults;
    c.batch_execute(
        "ALTER DATABASE alkblobs_test SET default_transaction_isolation = 'serializable'; \
         ALTER DATABASE alkblobs_test SET default_transaction_read_only = on",
    )
    .await
    .unwrap();
    // SIGTERM: the worker stops (logging it) and the postmaster starts a
    // new one after its restart interval.
    let ok: bool = c
        .query_one("SELECT pg_terminate_backend($1)", &[&first])
        .await
        .unwrap()
        .get(0);
    assert!(ok);
    within(5, "the terminated worker exits", || async {
        c.query_opt("SELECT 1 FROM pg_stat_activity WHERE pid = $1", &[&first])
            .await
            .unwrap()
            .is_none()
    })
    .await;
    let second = scheduler_pid(&c).await;
    assert_ne!(second, first);
    let dead = garbage(&c, &pool, b"swept by the new worker").await;
    within(
        20,
        "the new worker sweeps despite the database's defaults",
        || async { !present(&c, &pool, &dead).await },
    )
    .await;
    let n = count(
        &c,
        "SELECT count(*) FROM alkblobs_sweeps WHERE pool = $1 AND outcome = 'error'",
        &pool,
    )
    .await;
    assert_eq!(
        n, 0,
        "scheduled sweeps failed under the database's defaults"
    );
    schedule(&c, &pool, "0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_sweep_transaction_does_not_stall_the_scheduler() {
    let _s = SCHEDULER.read().await;
    let c = connect().await;
    let pid = scheduler_pid(&c).await;
    // Pool `held`: history kept 1 s, three rows older than that.
    let held = pool(&c, "schedheld", "0 seconds", "60 seconds").await;
    c.execute(
        "SELECT alkblobs_alter_pool($1, history_keep => '1 second')",
        &[&held],
    )
    .await
    .unwrap();
    for _ in 0..3 {
        c.execute("SELECT * FROM alkblobs_sweep($1)", &[&held])
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // A sweeper sweeps it (executor only: it leaves the pool row alone),
    // deleting those rows — the ones the scheduler's calls would delete
    // too — and sits in its open transaction.
    let mut node = connect().await;
    let tx = node.transaction().await.unwrap();
    tx.query("SELECT * FROM alkblobs_sweep($1, mark => false)", &[&held])
        .await
        .unwrap();
    let since: std::time::SystemTime = c
        .query_one("SELECT clock_timestamp()", &[])
        .await
        .unwrap()
        .get(0);
    schedule(&c, &held, "1 second").await;
    // Pool `next`, after it in line.
    let next = pool(&c, "schednext", "0 seconds", "60 seconds").await;
    let dead = garbage(&c, &next, b"swept while another pool is held").await;
    schedule(&c, &next, "1 second").await;
    within(20, "the other pool is swept", || async {
        !present(&c, &next, &dead).await
    })
    .await;
    // (History is kept 1 s, so at most a row or two is there at a time:
    // look for skips recorded one after the other.)
    let skip = "SELECT coalesce(max(id), 0) FROM alkblobs_sweeps WHERE pool = $1 AND scheduled \
                AND aborted = 'sweeper_lock' AND started > $2";
    let mut last = 0i64;
    for n in 0..2 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let id: i64 = c.query_one(skip, &[&held, &since]).await.unwrap().get(0);
            if id > last {
                last = id;
                break;
            }
            assert!(
                Instant::now() < deadline,
                "skip {n} of the held pool not recorded within 20 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert_eq!(scheduler_pid(&c).await, pid, "the scheduler restarted");
    tx.rollback().await.unwrap();
    for p in [&held, &next] {
        schedule(&c, p, "0").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schedule_does_not_depend_on_the_history() {
    let _s = SCHEDULER.read().await;
    let c = connect().await;
    scheduler_pid(&c).await;
    let p = pool(&c, "schedrecent", "0 seconds", "60 seconds").await;
    c.execute(
        "SELECT alkblobs_alter_pool($1, sweep_every => '1 hour', history_keep => '1 second')",
        &[&p],
    )
    .await
    .unwrap();
    let scheduled = "SELECT count(*) FROM alkblobs_sweeps WHERE pool = $1 AND scheduled";
    within(20, "the first scheduled sweep", || async {
        count(&c, scheduled, &p).await == 1
    })
    .await;
    // Later sweeps delete that row (history_keep), and still the hour is
    // not up.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        c.execute("SELECT * FROM alkblobs_sweep($1)", &[&p])
            .await
            .unwrap();
    }
    assert_eq!(
        count(&c, scheduled, &p).await,
        0,
        "retention kept the scheduled row"
    );
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        count(&c, scheduled, &p).await,
        0,
        "swept again before its hour was up"
    );
    schedule(&c, &p, "0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scheduler_never_calls_an_alkblobs_schema_it_did_not_install() {
    let _s = SCHEDULER.read().await;
    // The cluster serves alkblobs_noext, a database without the extension,
    // where a role allowed to create schemas plants `alkblobs.*` functions
    // with the names the worker calls.
    let c = connect().await;
    let mut noext_pid = None;
    for _ in 0..600 {
        noext_pid = scheduler_pid_now(&c, "alkblobs_noext").await;
        if noext_pid.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let noext_pid = noext_pid.expect("no scheduler serves alkblobs_noext");
    let role = alkblobs_tests::pg::login_role(&c, "planter", "alkblobs_reader").await;
    let u = url();
    let base = u.rsplit_once('/').unwrap().0;
    let (admin, conn) =
        tokio_postgres::connect(&format!("{base}/alkblobs_noext"), tokio_postgres::NoTls)
            .await
            .unwrap();
    tokio::spawn(conn);
    admin
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS alkblobs CASCADE; DROP TABLE IF EXISTS planted_calls; \
             GRANT CREATE ON DATABASE alkblobs_noext TO {role}; \
             CREATE TABLE planted_calls (who text, session text, at timestamptz DEFAULT now()); \
             GRANT INSERT ON planted_calls TO PUBLIC"
        ))
        .await
        .unwrap();
    let planter_url =
        format!("{base}/alkblobs_noext").replacen("postgres@", &format!("{role}@"), 1);
    let (planter, conn) = tokio_postgres::connect(&planter_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    planter
        .batch_execute(
            "CREATE SCHEMA alkblobs;
             CREATE FUNCTION alkblobs.scheduler_due() RETURNS SETOF integer LANGUAGE plpgsql AS
               $$ BEGIN INSERT INTO public.planted_calls (who, session) VALUES (current_user, session_user); RETURN NEXT 1; END $$;
             CREATE FUNCTION alkblobs.scheduler_claim(p integer) RETURNS boolean LANGUAGE plpgsql AS
               $$ BEGIN INSERT INTO public.planted_calls (who, session) VALUES (current_user, session_user); RETURN true; END $$;
             CREATE FUNCTION alkblobs.scheduled_sweep(p integer, m boolean) RETURNS boolean LANGUAGE plpgsql AS
               $$ BEGIN INSERT INTO public.planted_calls (who, session) VALUES (current_user, session_user); RETURN NULL; END $$;
             GRANT USAGE ON SCHEMA alkblobs TO PUBLIC;
             GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA alkblobs TO PUBLIC;",
        )
        .await
        .unwrap();
    // Twelve naptimes, with scheduling on (the pausing test cannot run
    // meanwhile: it takes SCHEDULER for writing).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let enabled: String = c
        .query_one("SHOW alkblobs.scheduler_enabled", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(enabled, "on");
    let calls: Vec<(String, String)> = admin
        .query("SELECT who, session FROM planted_calls", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    drop(planter);
    admin
        .batch_execute(&format!(
            "DROP SCHEMA alkblobs CASCADE; DROP TABLE planted_calls; \
             REVOKE CREATE ON DATABASE alkblobs_noext FROM {role}"
        ))
        .await
        .unwrap();
    assert!(
        calls.is_empty(),
        "the scheduler called planted functions: {calls:?}"
    );
    // And the worker is still there, waiting for a real extension.
    let still: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
            &[&noext_pid],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(still, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_counts_what_a_sweep_should_have_removed() {
    let _s = SCHEDULER.read().await;
    // A manual pool nobody sweeps after its first sweep: a staged row
    // overdue, a pin expired long ago, an abandoned upload.
    let mut c = connect().await;
    let p = pool(&c, "schedpiles", "1 second", "60 seconds").await;
    c.execute(
        "SELECT alkblobs_alter_pool($1, warn_after => '2 seconds')",
        &[&p],
    )
    .await
    .unwrap();
    garbage(&c, &p, b"staged and then left").await;
    put(&c, &p, b"pinned by a node that vanished", "gone").await;
    // Stages the dead entry (the expired pin is not expired yet).
    c.execute("SELECT * FROM alkblobs_sweep($1)", &[&p])
        .await
        .unwrap();
    let (status, reasons) = health(&c, &p).await;
    assert_eq!(status, "ok", "{reasons:?}");
    // After that sweep, which would have reclaimed it:
    {
        let tx = c.transaction().await.unwrap();
        let loid: u32 = tx
            .query_one("SELECT alkblobs_lo_create($1)", &[&p])
            .await
            .unwrap()
            .get(0);
        tx.execute(
            "SELECT alkblobs_lo_write($1, 0, $2)",
            &[&loid, &vec![9u8; 12_345]],
        )
        .await
        .unwrap();
        // Committed without alkblobs_lo_commit: abandoned.
        tx.commit().await.unwrap();
    }
    // The node holding the pin vanished long ago.
    c.execute(
        "UPDATE alkblobs.pins SET expires_at = now() - interval '10 seconds' \
          WHERE owner = 'gone' AND pool = (SELECT pool_id FROM alkblobs_pools WHERE pool = $1)",
        &[&p],
    )
    .await
    .unwrap();
    // The staged row is due after 1 s and overdue 2 s later; the upload is
    // then over 2 s old.
    tokio::time::sleep(Duration::from_millis(3600)).await;
    let r = c
        .query_one(
            "SELECT status, reasons, overdue_staged, expired_pins, abandoned_uploads, \
                    abandoned_upload_bytes, invalid_sources \
               FROM alkblobs_health WHERE pool = $1",
            &[&p],
        )
        .await
        .unwrap();
    let reasons: Vec<String> = r.get(1);
    assert_eq!(r.get::<_, String>(0), "warn", "{reasons:?}");
    assert_eq!(r.get::<_, i64>(2), 1, "overdue staged");
    assert_eq!(r.get::<_, i64>(3), 1, "expired pins");
    assert_eq!(r.get::<_, i64>(4), 1, "abandoned uploads");
    assert_eq!(r.get::<_, i64>(5), 12_345, "abandoned upload bytes");
    assert_eq!(r.get::<_, i64>(6), 0);
    for what in [
        "staged rows due",
        "pins expired",
        "uploads abandoned",
        "no completed sweep",
    ] {
        assert!(
            reasons.iter().any(|x| x.contains(what)),
            "{what}: {reasons:?}"
        );
    }
    // A sweep clears all of it.
    for _ in 0..3 {
        c.execute("SELECT * FROM alkblobs_sweep($1)", &[&p])
            .await
            .unwrap();
    }
    let r = c
        .query_one(
            "SELECT status, reasons, overdue_staged, expired_pins, abandoned_uploads \
               FROM alkblobs_health WHERE pool = $1",
            &[&p],
        )
        .await
        .unwrap();
    let reasons: Vec<String> = r.get(1);
    assert_eq!(r.get::<_, String>(0), "ok", "{reasons:?}");
    assert_eq!(
        (r.get::<_, i64>(2), r.get::<_, i64>(3), r.get::<_, i64>(4)),
        (0, 0, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_the_worker_runs_cannot_become_the_superuser() {
    // Someone who can run code as alkblobs_owner (here: a superuser acting
    // as it) adds a trigger to the scheduler's own table that tries to
    // switch back to the worker's session role and records who it runs as.
    let _s = SCHEDULER.write().await;
    let c = connect().await;
    scheduler_pid(&c).await;
    let p = pool(&c, "schedrole", "0 seconds", "60 seconds").await;
    c.batch_execute(
        "SET ROLE alkblobs_owner;
         CREATE TABLE alkblobs.review_seen (who text, reset_error text);
         CREATE FUNCTION alkblobs.review_escape() RETURNS trigger LANGUAGE plpgsql AS $$
         DECLARE e text;
         BEGIN
             BEGIN
                 PERFORM pg_catalog.set_config('role', 'none', true);
             EXCEPTION WHEN OTHERS THEN e := SQLERRM;
             END;
             INSERT INTO alkblobs.review_seen VALUES (current_user, e);
             RETURN NEW;
         END $$;
         CREATE TRIGGER review_escape AFTER INSERT OR UPDATE ON alkblobs.schedule
             FOR EACH ROW EXECUTE FUNCTION alkblobs.review_escape();
         RESET ROLE;",
    )
    .await
    .unwrap();
    schedule(&c, &p, "1 second").await;
    let mut seen = Vec::new();
    for _ in 0..200 {
        seen = c
            .query(
                "SELECT who, coalesce(reset_error, '') FROM alkblobs.review_seen",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
            .collect();
        if !seen.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.batch_execute(
        "DROP TRIGGER review_escape ON alkblobs.schedule;
         DROP FUNCTION alkblobs.review_escape();
         DROP TABLE alkblobs.review_seen;",
    )
    .await
    .unwrap();
    schedule(&c, &p, "0").await;
    assert!(!seen.is_empty(), "the scheduler never claimed the pool");
    for (who, err) in &seen {
        assert_eq!(who, "alkblobs_owner", "the worker's code ran as {who}");
        assert!(!err.is_empty(), "RESET ROLE was allowed");
    }
}

/// What code the worker runs as alkblobs_owner leaves in the worker's
/// session dies with its call: a session-level setting it makes (here
/// application_name, which the sweep history records; search_path or
/// lock_timeout would be the harmful ones) is rolled back before the
/// worker's next transaction; and it cannot queue a deferred trigger, which
/// would fire at commit as the worker's superuser (PostgreSQL refuses it
/// in a security-restricted operation: the worker's transaction aborts and
/// the worker restarts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_workers_code_leaves_behind_dies_with_its_call() {
    let _s = SCHEDULER.write().await;
    let c = connect().await;
    let pid = scheduler_pid(&c).await;
    let p = pool(&c, "schedleft", "0 seconds", "60 seconds").await;
    c.batch_execute(
        "SET ROLE alkblobs_owner;
         CREATE TABLE alkblobs.review_left (who text);
         CREATE FUNCTION alkblobs.review_plant() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             PERFORM pg_catalog.set_config('application_name', 'planted', false);
             PERFORM pg_catalog.set_config('search_path', 'public, pg_catalog', false);
             RETURN NEW;
         END $$;
         CREATE FUNCTION alkblobs.review_deferred() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             INSERT INTO alkblobs.review_left VALUES (current_user);
             RETURN NEW;
         END $$;
         CREATE TRIGGER review_plant AFTER INSERT OR UPDATE ON alkblobs.schedule
             FOR EACH ROW EXECUTE FUNCTION alkblobs.review_plant();
         RESET ROLE;",
    )
    .await
    .unwrap();
    schedule(&c, &p, "1 second").await;
    let mut apps = Vec::<String>::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline && apps.len() < 2 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        apps = c
            .query(
                "SELECT coalesce(application_name, '') FROM alkblobs_sweeps \
                  WHERE pool = $1 AND scheduled",
                &[&p],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
    }
    // Then a deferred trigger: it must never fire as the superuser.
    c.batch_execute(
        "SET ROLE alkblobs_owner;
         CREATE CONSTRAINT TRIGGER review_deferred AFTER INSERT OR UPDATE ON alkblobs.schedule
             DEFERRABLE INITIALLY DEFERRED
             FOR EACH ROW EXECUTE FUNCTION alkblobs.review_deferred();
         RESET ROLE;",
    )
    .await
    .unwrap();
    let mut who = Vec::<String>::new();
    let mut restarted = false;
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline && who.is_empty() && !restarted {
        tokio::time::sleep(Duration::from_millis(100)).await;
        who = c
            .query("SELECT who FROM alkblobs.review_left", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        restarted = scheduler_pid_now(&c, "alkblobs_test").await != Some(pid);
    }
    c.batch_execute(
        "DROP TRIGGER review_plant ON alkblobs.schedule;
         DROP TRIGGER review_deferred ON alkblobs.schedule;
         DROP FUNCTION alkblobs.review_plant();
         DROP FUNCTION alkblobs.review_deferred();
         DROP TABLE alkblobs.review_left;",
    )
    .await
    .unwrap();
    schedule(&c, &p, "0").await;
    assert!(
        apps.len() >= 2,
        "the scheduler did not sweep twice: {apps:?}"
    );
    for a in &apps {
        assert_eq!(a, "alkblobs scheduler", "a setting outlived its call");
    }
    assert!(
        who.is_empty(),
        "a deferred trigger queued by the worker's code fired as {who:?}"
    );
    assert!(restarted, "the scheduler never claimed the pool again");
    // The worker is back (the next test needs it).
    scheduler_pid(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_and_health_at_every_isolation_level() {
    let _s = SCHEDULER.read().await;
    let mut c = connect().await;
    let p = pool(&c, "schediso", "0 seconds", "60 seconds").await;
    // A sweep outside READ COMMITTED is refused before it does anything,
    // and leaves no history row (nor a "completed" sweep for health).
    for level in ["REPEATABLE READ", "SERIALIZABLE"] {
        let tx = c.transaction().await.unwrap();
        tx.batch_execute(&format!("SET TRANSACTION ISOLATION LEVEL {level}"))
            .await
            .unwrap();
        let e = tx
            .query("SELECT * FROM alkblobs_sweep($1)", &[&p])
            .await
            .expect_err(level);
        assert_eq!(sqlstate(&e), "AB003", "{level}: {e}");
        tx.rollback().await.unwrap();
    }
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM alkblobs_sweeps WHERE pool = $1",
            &p
        )
        .await,
        0
    );
    // Settings, history and health work at every level.
    for level in ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"] {
        let tx = c.transaction().await.unwrap();
        tx.batch_execute(&format!("SET TRANSACTION ISOLATION LEVEL {level}"))
            .await
            .unwrap();
        tx.execute(
            "SELECT alkblobs_alter_pool($1, history_keep => '2 days', warn_after => '1 hour')",
            &[&p],
        )
        .await
        .unwrap();
        let status: String = tx
            .query_one("SELECT status FROM alkblobs_health WHERE pool = $1", &[&p])
            .await
            .unwrap()
            .get(0);
        assert_eq!(status, "ok", "{level}");
        tx.query("SELECT * FROM alkblobs_sweeps WHERE pool = $1", &[&p])
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
}

/// The worker and a pg_cron job of the same pool claim its runs with one
/// statement each that re-checks the period, so one period is never run
/// twice, and the pool's schedule row says who ran it last (health reads
/// it). All in one transaction that is rolled back: the running worker
/// never sees the pool.
#[tokio::test]
async fn the_worker_and_a_pg_cron_job_never_both_claim_one_period() {
    let c = connect().await;
    alkblobs_tests::pg::ensure_extension(&c).await;
    c.batch_execute("BEGIN").await.unwrap();
    let name = format!("claims_{}", std::process::id());
    c.execute(
        "SELECT alkblobs_create_pool($1, sweep_every => '1 hour')",
        &[&name],
    )
    .await
    .unwrap();
    let id: i32 = c
        .query_one("SELECT id FROM alkblobs.pools WHERE name = $1", &[&name])
        .await
        .unwrap()
        .get(0);
    let runner_sql = "SELECT runner FROM alkblobs.schedule WHERE pool = $1";
    let runner =
        async |c: &Client| -> String { c.query_one(runner_sql, &[&id]).await.unwrap().get(0) };
    let claim_cron = "SELECT alkblobs_cron_claim($1)";
    let claim_worker = "SELECT alkblobs.scheduler_claim($1)";
    let got: bool = c.query_one(claim_cron, &[&name]).await.unwrap().get(0);
    assert!(got, "a pool never run is due");
    let got: bool = c.query_one(claim_worker, &[&id]).await.unwrap().get(0);
    assert!(!got, "the worker claimed a period pg_cron had started");
    assert_eq!(runner(&c).await, "pg_cron");
    c.execute(
        "UPDATE alkblobs.schedule SET last_scheduled = clock_timestamp() - interval '2 hours' WHERE pool = $1",
        &[&id],
    )
    .await
    .unwrap();
    let got: bool = c.query_one(claim_worker, &[&id]).await.unwrap().get(0);
    assert!(got, "a due pool is the worker's to claim");
    assert_eq!(runner(&c).await, "worker");
    let got: bool = c.query_one(claim_cron, &[&name]).await.unwrap().get(0);
    assert!(!got, "pg_cron claimed a period the worker had started");
    c.batch_execute("ROLLBACK").await.unwrap();
}
