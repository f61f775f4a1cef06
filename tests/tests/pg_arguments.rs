//! What the extension's calls accept: bad arguments get SQLSTATEs, every
//! call is bounded, and the calls that need READ COMMITTED refuse other
//! isolation levels, each over real connections to the test server.
//! docs/design.md §4 lists which guard each test covers and the mutation
//! runs against it.

#![cfg(feature = "pg")]

use std::time::Duration;

use alkblobs_tests::pg::{connect, exists, garbage, hex, key, pool, sqlstate, try_sweep};
use tokio_postgres::Client;

/// Starts an upload (the pool-less form is the one from before the
/// hardening, so that these tests also run against it).
async fn lo_create(c: &Client, pool: &str) -> u32 {
    let with_pool: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_proc WHERE proname = 'alkblobs_lo_create' AND pronargs = 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let row = if with_pool == 1 {
        c.query_one("SELECT alkblobs_lo_create($1)", &[&pool]).await
    } else {
        c.query_one("SELECT alkblobs_lo_create()", &[]).await
    };
    row.unwrap().get(0)
}

/// A sweeper at REPEATABLE READ or SERIALIZABLE (set per session here; the
/// same happens through ALTER ROLE/DATABASE) must not delete a key whose
/// pin committed while it waited: it refuses outright.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sweep_outside_read_committed_never_deletes_a_pinned_key() {
    for level in ["repeatable read", "serializable"] {
        let obs = connect().await;
        let p = connect().await;
        let s = connect().await;
        let pool = pool(&obs, "iso-sweep", "0 seconds", "60 seconds").await;
        let k = garbage(&obs, &pool, format!("isolation {level}").as_bytes()).await;
        s.batch_execute(&format!("SET default_transaction_isolation = '{level}'"))
            .await
            .unwrap();
        p.batch_execute("BEGIN").await.unwrap();
        p.query_one("SELECT alkblobs_pin($1, $2, 'reader')", &[&pool, &k])
            .await
            .unwrap();
        let pool2 = pool.clone();
        let sweeper = tokio::spawn(async move { try_sweep(&s, &pool2).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        p.batch_execute("COMMIT").await.unwrap();
        let r = sweeper.await.unwrap();
        assert!(
            exists(&obs, &pool, &k).await,
            "{level}: the sweep deleted a pinned key ({r:?})"
        );
        assert_eq!(r, Err("AB003".into()), "{level}: the sweep must refuse");
    }
}

/// The local tier's stage and claim refuse too, and so does explain (it
/// reads registered tables; its validation needs a fresh catalog view).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stage_claim_and_explain_refuse_outside_read_committed() {
    let c = connect().await;
    let pool = pool(&c, "iso-local", "0 seconds", "60 seconds").await;
    let k = key(b"a file");
    for level in ["REPEATABLE READ", "SERIALIZABLE"] {
        c.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}"))
            .await
            .unwrap();
        let e = c
            .query_one("SELECT alkblobs_stage($1, ARRAY[$2::bytea])", &[&pool, &k])
            .await
            .map(|_| ())
            .map_err(|e| sqlstate(&e));
        c.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(e, Err("AB003".into()), "stage at {level}");
        c.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}"))
            .await
            .unwrap();
        let e = c
            .query("SELECT * FROM alkblobs_claim_local($1)", &[&pool])
            .await
            .map(|_| ())
            .map_err(|e| sqlstate(&e));
        c.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(e, Err("AB003".into()), "claim_local at {level}");
        c.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}"))
            .await
            .unwrap();
        let e = c
            .query("SELECT * FROM alkblobs_explain($1, $2)", &[&pool, &k])
            .await
            .map(|_| ())
            .map_err(|e| sqlstate(&e));
        c.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(e, Err("AB003".into()), "explain at {level}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_belongs_to_its_transaction_and_is_bounded_and_reaped() {
    let a = connect().await;
    let b = connect().await;
    let pool = pool(&a, "uploads", "0 seconds", "60 seconds").await;
    // An upload started in autocommit is abandoned the moment it returns.
    let oid: u32 = lo_create(&a, &pool).await;
    // Nobody else may write into it...
    let evil = b
        .execute("SELECT alkblobs_lo_write($1, 0, 'EVIL!!!'::bytea)", &[&oid])
        .await;
    assert!(evil.is_err(), "another session wrote into an upload");
    // ...nor its creator from a later transaction.
    let later = a
        .execute("SELECT alkblobs_lo_write($1, 0, 'genuine'::bytea)", &[&oid])
        .await;
    assert!(later.is_err(), "an upload outlived its transaction");
    // It shows in usage until a sweep reaps it.
    let n: i64 = a
        .query_one(
            "SELECT uploads FROM alkblobs_usage WHERE pool = $1",
            &[&pool],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    let reaped: i64 = a
        .query_one("SELECT uploads_reaped FROM alkblobs_sweep($1)", &[&pool])
        .await
        .unwrap()
        .get(0);
    assert_eq!(reaped, 1);
    let left: i64 = a
        .query_one(
            "SELECT count(*) FROM pg_largeobject_metadata WHERE oid = $1",
            &[&oid],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "the abandoned large object is unlinked");

    // In one transaction the upload works, within the pool's size bound.
    a.batch_execute("BEGIN").await.unwrap();
    let oid: u32 = a
        .query_one("SELECT alkblobs_lo_create($1)", &[&pool])
        .await
        .unwrap()
        .get(0);
    let e = a
        .execute(
            "SELECT alkblobs_lo_write($1, 4398046511104, 'x'::bytea)",
            &[&oid],
        )
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "54000", "{e}");
    a.batch_execute("ROLLBACK; BEGIN").await.unwrap();
    let oid: u32 = a
        .query_one("SELECT alkblobs_lo_create($1)", &[&pool])
        .await
        .unwrap()
        .get(0);
    a.execute("SELECT alkblobs_lo_write($1, 0, 'genuine'::bytea)", &[&oid])
        .await
        .unwrap();
    let evil = b
        .execute("SELECT alkblobs_lo_write($1, 0, 'EVIL!!!'::bytea)", &[&oid])
        .await;
    assert!(evil.is_err());
    a.execute(
        "SELECT alkblobs_lo_commit($1, $2, $3, 'w')",
        &[&pool, &key(b"genuine"), &oid],
    )
    .await
    .unwrap();
    a.batch_execute("COMMIT").await.unwrap();
    let back: Vec<u8> = a
        .query_one(
            "SELECT alkblobs_lo_read($1, $2, 0, 100)",
            &[&pool, &key(b"genuine")],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(back, b"genuine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_all_with_no_unlink_budget_returns() {
    let c = connect().await;
    let pool = pool(&c, "budget0", "0 seconds", "60 seconds").await;
    c.batch_execute("BEGIN").await.unwrap();
    let oid: u32 = lo_create(&c, &pool).await;
    c.execute("SELECT alkblobs_lo_write($1, 0, 'dead lo'::bytea)", &[&oid])
        .await
        .unwrap();
    c.execute(
        "SELECT alkblobs_lo_commit($1, $2, $3, 'w')",
        &[&pool, &key(b"dead lo"), &oid],
    )
    .await
    .unwrap();
    c.batch_execute("COMMIT").await.unwrap();
    c.query_one("SELECT alkblobs_unpin_all($1, 'w')", &[&pool])
        .await
        .unwrap();
    c.batch_execute("SET statement_timeout = '20s'")
        .await
        .unwrap();
    let r = c
        .batch_execute(&format!("CALL alkblobs_sweep_all('{pool}', 0)"))
        .await
        .map_err(|e| sqlstate(&e));
    assert!(
        r.is_ok() || r == Err("22023".into()),
        "sweep_all(pool, 0) must return or refuse: {r:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_windows_and_null_arguments_get_sqlstates() {
    let c = connect().await;
    let pool = pool(&c, "bad-args", "0 seconds", "60 seconds").await;
    let k = key(b"k");
    let cases: Vec<(&str, String)> = vec![
        (
            "22023",
            format!("SELECT alkblobs_create_pool('{pool}-x', '300000 years')"),
        ),
        (
            "22023",
            format!("SELECT alkblobs_create_pool('{pool}-y', '1 minute', '300000 years')"),
        ),
        (
            "22023",
            format!("SELECT alkblobs_alter_pool('{pool}', '300000 years')"),
        ),
        (
            "22023",
            format!("SELECT alkblobs_alter_pool('{pool}', NULL, '1000 years')"),
        ),
        // Over the 366-day maximum in days alone (no year part for the
        // mixed-unit check to refuse first).
        (
            "22023",
            format!("SELECT alkblobs_create_pool('{pool}-d', '400 days')"),
        ),
        (
            "22023",
            format!("SELECT alkblobs_alter_pool('{pool}', '367 days')"),
        ),
        // Mixed-unit intervals compare as small (a month folds to 30 days)
        // but overflow or go negative when added to a timestamp.
        (
            "22023",
            format!("SELECT alkblobs_create_pool('{pool}-m', '3600000 months -107999700 days')"),
        ),
        (
            "22023",
            format!("SELECT alkblobs_alter_pool('{pool}', '-1 month 30 days 1 second')"),
        ),
        (
            "22023",
            format!("SELECT alkblobs_alter_pool('{pool}', NULL, '1 day -23 hours')"),
        ),
        (
            "22004",
            format!(
                "SELECT alkblobs_unpin('{pool}', '\\x{}'::bytea, NULL)",
                hex(&k)
            ),
        ),
        (
            "22004",
            format!("SELECT alkblobs_unpin_all('{pool}', NULL)"),
        ),
        (
            "22004",
            format!("SELECT * FROM alkblobs_claim_local('{pool}', NULL)"),
        ),
        ("22004", format!("SELECT alkblobs_stage('{pool}', NULL)")),
        (
            "22004",
            format!("SELECT * FROM alkblobs_pins_held('{pool}', 'o', NULL)"),
        ),
        (
            "22004",
            format!(
                "SELECT alkblobs_lo_read('{pool}', '\\x{}'::bytea, NULL, 10)",
                hex(&k)
            ),
        ),
        (
            "22004",
            format!(
                "SELECT alkblobs_lo_read('{pool}', '\\x{}'::bytea, 0, NULL)",
                hex(&k)
            ),
        ),
        (
            "22004",
            format!("SELECT * FROM alkblobs_sweep('{pool}', NULL)"),
        ),
        (
            "22004",
            format!("SELECT * FROM alkblobs_sweep('{pool}', false, NULL)"),
        ),
    ];
    for (want, sql) in &cases {
        let got = c.batch_execute(sql).await.map_err(|e| sqlstate(&e));
        assert_eq!(got, Err(want.to_string()), "{sql}");
    }
    // lo_write with a NULL offset or chunk, inside a real upload.
    c.batch_execute("BEGIN").await.unwrap();
    let oid: u32 = lo_create(&c, &pool).await;
    for sql in [
        "SELECT alkblobs_lo_write($1, NULL, 'x'::bytea)",
        "SELECT alkblobs_lo_write($1, 0, NULL)",
    ] {
        c.batch_execute("SAVEPOINT s").await.unwrap();
        let got = c.execute(sql, &[&oid]).await.map_err(|e| sqlstate(&e));
        c.batch_execute("ROLLBACK TO SAVEPOINT s").await.unwrap();
        assert_eq!(got, Err("22004".into()), "{sql}");
    }
    c.batch_execute("ROLLBACK").await.unwrap();
    // And the pool still sweeps.
    assert_eq!(try_sweep(&c, &pool).await, Ok((0, None)));
}

/// A dry run examines one bounded slice like a real mark; max_object_bytes
/// is a pool setting (create and alter) that uploads obey; NULLs give
/// 22004 everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dry_runs_are_bounded_and_pool_settings_are_checked() {
    let c = connect().await;
    let pool = pool(&c, "bounded", "0 seconds", "60 seconds").await;
    for i in 0..50u32 {
        garbage(&c, &pool, format!("dry {i}").as_bytes()).await;
    }
    let examined: i64 = c
        .query_one(
            "SELECT examined FROM alkblobs_sweep($1, dry_run => true, max_keys => 10)",
            &[&pool],
        )
        .await
        .unwrap()
        .get(0);
    // A mark's slice is 10 entries; a queue pool's review, the keys of 10
    // queue rows (each garbage key has two: its put's and its release's).
    assert!((5..=10).contains(&examined), "examined {examined}");

    let e = c
        .batch_execute(&format!("CALL alkblobs_sweep_all('{pool}', NULL)"))
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "22004", "{e}");

    let small = format!("{pool}-small");
    c.execute(
        "SELECT alkblobs_create_pool($1, max_object_bytes => 4)",
        &[&small],
    )
    .await
    .unwrap();
    for (sql, want) in [
        (
            "SELECT alkblobs_create_pool($1 || 'x', max_object_bytes => 0)",
            "22023",
        ),
        (
            "SELECT alkblobs_create_pool($1 || 'y', max_object_bytes => NULL)",
            "22004",
        ),
        (
            "SELECT alkblobs_alter_pool($1, max_object_bytes => -1)",
            "22023",
        ),
    ] {
        let e = c.execute(sql, &[&small]).await.unwrap_err();
        assert_eq!(sqlstate(&e), want, "{sql}: {e}");
    }
    c.batch_execute("BEGIN").await.unwrap();
    let o: u32 = c
        .query_one("SELECT alkblobs_lo_create($1)", &[&small])
        .await
        .unwrap()
        .get(0);
    let e = c
        .execute(
            "SELECT alkblobs_lo_write($1, 0, '\\x0102030405'::bytea)",
            &[&o],
        )
        .await
        .unwrap_err();
    c.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(sqlstate(&e), "54000", "{e}");
    c.execute(
        "SELECT alkblobs_alter_pool($1, max_object_bytes => 8)",
        &[&small],
    )
    .await
    .unwrap();
    c.batch_execute("BEGIN").await.unwrap();
    let o: u32 = c
        .query_one("SELECT alkblobs_lo_create($1)", &[&small])
        .await
        .unwrap()
        .get(0);
    c.execute(
        "SELECT alkblobs_lo_write($1, 0, '\\x0102030405'::bytea)",
        &[&o],
    )
    .await
    .unwrap();
    c.batch_execute("ROLLBACK").await.unwrap();
}

/// A pg-lo entry's outboard: refused at commit or repair when its length
/// is not the blob's (22023, nothing stored), read back by window, NULL
/// for an absent key, empty for a blob of one chunk group; NULL and
/// negative arguments get their SQLSTATEs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outboards_are_length_checked_and_read_by_window() {
    let c = connect().await;
    let pool = pool(&c, "outboards", "60 seconds", "60 seconds").await;
    let value: Vec<u8> = (0..40_000u32).map(|i| (i % 253) as u8).collect();
    let (k, ob) = alkblobs::outboard::of(&value);
    assert_eq!(ob.len(), 128, "three 16 KiB groups: two parents");
    let k = k.as_bytes().to_vec();
    let commit = async |outboard: Option<&[u8]>| {
        c.batch_execute("BEGIN").await.unwrap();
        let oid: u32 = lo_create(&c, &pool).await;
        c.execute("SELECT alkblobs_lo_write($1, 0, $2)", &[&oid, &value])
            .await
            .unwrap();
        let r = c
            .execute(
                "SELECT alkblobs_lo_commit($1, $2, $3, 'w', $4)",
                &[&pool, &k, &oid, &outboard],
            )
            .await
            .map_err(|e| sqlstate(&e));
        c.batch_execute(if r.is_ok() { "COMMIT" } else { "ROLLBACK" })
            .await
            .unwrap();
        r.map(|_| ())
    };
    assert_eq!(commit(Some(&ob[..64])).await, Err("22023".into()));
    assert!(!exists(&c, &pool, &k).await, "nothing stored");
    commit(Some(&ob)).await.unwrap();
    let window = async |off: i64, len: i32| -> Option<Vec<u8>> {
        c.query_one(
            "SELECT alkblobs_lo_outboard($1, $2, $3, $4)",
            &[&pool, &k, &off, &len],
        )
        .await
        .unwrap()
        .get(0)
    };
    assert_eq!(window(0, 1000).await.unwrap(), ob);
    assert_eq!(window(64, 10).await.unwrap(), ob[64..74]);
    assert_eq!(window(500, 10).await.unwrap(), b"");
    let absent = key(b"no such outboard");
    let none: Option<Vec<u8>> = c
        .query_one(
            "SELECT alkblobs_lo_outboard($1, $2, 0, 64)",
            &[&pool, &absent],
        )
        .await
        .unwrap()
        .get(0);
    assert!(none.is_none());
    let call = async |sql: &str, outboard: Option<&[u8]>| {
        c.query_one(sql, &[&pool, &k, &outboard])
            .await
            .map(|r| r.get::<_, bool>(0))
            .map_err(|e| sqlstate(&e))
    };
    let put = "SELECT alkblobs_lo_put_outboard($1, $2, $3)";
    assert_eq!(call(put, Some(&ob[..100])).await, Err("22023".into()));
    assert_eq!(call(put, None).await, Err("22004".into()));
    assert_eq!(call(put, Some(&ob)).await, Ok(true));
    assert_eq!(
        window(0, 1000).await.unwrap(),
        ob,
        "unchanged by the refusals"
    );
    let absent_put = c
        .query_one(put, &[&pool, &absent, &Some(&ob[..])])
        .await
        .unwrap()
        .get::<_, bool>(0);
    assert!(!absent_put, "false for an absent key");
    for (want, sql) in [
        ("22004", "SELECT alkblobs_lo_outboard($1, $2, NULL, 10)"),
        ("22004", "SELECT alkblobs_lo_outboard($1, $2, 0, NULL)"),
        ("22023", "SELECT alkblobs_lo_outboard($1, $2, -1, 10)"),
        ("22023", "SELECT alkblobs_lo_outboard($1, $2, 0, -10)"),
    ] {
        let got = c.execute(sql, &[&pool, &k]).await.map_err(|e| sqlstate(&e));
        assert_eq!(got, Err(want.to_owned()), "{sql}");
    }
}

/// An outboard repair racing the sweep that deletes its entry, with the
/// repairing session at every isolation level: it stores nothing (false,
/// or at REPEATABLE READ and SERIALIZABLE a retryable 40001 when its
/// snapshot still saw the entry) and never brings the entry back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outboard_repair_racing_its_entrys_deletion_never_revives_it() {
    for level in ["read committed", "repeatable read", "serializable"] {
        let c = connect().await;
        let r = connect().await;
        let pool = pool(&c, "ob-race", "0 seconds", "60 seconds").await;
        let value: Vec<u8> = (0..40_000u32)
            .map(|i| (i % 251) as u8 ^ level.len() as u8)
            .collect();
        let (k, ob) = alkblobs::outboard::of(&value);
        let k = k.as_bytes().to_vec();
        c.batch_execute("BEGIN").await.unwrap();
        let oid: u32 = lo_create(&c, &pool).await;
        c.execute("SELECT alkblobs_lo_write($1, 0, $2)", &[&oid, &value])
            .await
            .unwrap();
        c.execute(
            "SELECT alkblobs_lo_commit($1, $2, $3, 'w', $4)",
            &[&pool, &k, &oid, &ob],
        )
        .await
        .unwrap();
        c.batch_execute("COMMIT").await.unwrap();
        c.query_one("SELECT alkblobs_unpin_all($1, 'w')", &[&pool])
            .await
            .unwrap();
        // The repairing session's snapshot sees the entry...
        r.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}"))
            .await
            .unwrap();
        assert!(exists(&r, &pool, &k).await);
        // ...which a sweep then deletes.
        for _ in 0..5 {
            if !exists(&c, &pool, &k).await {
                break;
            }
            try_sweep(&c, &pool).await.unwrap();
        }
        assert!(
            !exists(&c, &pool, &k).await,
            "{level}: the sweep deleted it"
        );
        let got = r
            .query_one(
                "SELECT alkblobs_lo_put_outboard($1, $2, $3)",
                &[&pool, &k, &ob],
            )
            .await
            .map(|x| x.get::<_, bool>(0))
            .map_err(|e| sqlstate(&e));
        match &got {
            Ok(false) => {}
            Err(s) if level != "read committed" && s == "40001" => {}
            other => panic!("{level}: a repair of a deleted entry answered {other:?}"),
        }
        r.batch_execute(if got.is_ok() { "COMMIT" } else { "ROLLBACK" })
            .await
            .unwrap();
        assert!(!exists(&c, &pool, &k).await, "{level}: the entry came back");
    }
}
