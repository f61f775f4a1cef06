//! The extension's protocol at scale and under load, on the test server.

#![cfg(feature = "pg")]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use alkblobs_tests::pg::{connect, exists, key, pool, sqlstate};

async fn objects(c: &tokio_postgres::Client, pool: &str) -> i64 {
    c.query_one(
        "SELECT count(*) FROM alkblobs.entries e JOIN alkblobs.pools p ON p.id = e.pool
           JOIN pg_largeobject_metadata m ON m.oid = e.loid WHERE p.name = $1",
        &[&pool],
    )
    .await
    .unwrap()
    .get::<_, i64>(0)
}

/// 100,000 dead large objects: one call unlinks at most `max_unlinks` and
/// says how many remain; `CALL alkblobs_sweep_all` finishes the job across
/// transactions; a single unbounded transaction would run out of lock
/// table (which is why the bound exists).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_dead_large_objects_are_collected_in_bounded_batches() {
    let c = connect().await;
    let pool = pool(&c, "lo-100k", "0 seconds", "60 seconds").await;
    // The objects belong to alkblobs_owner, as every upload's does.
    c.batch_execute("SET ROLE alkblobs_owner").await.unwrap();
    c.execute(
        "INSERT INTO alkblobs.entries (pool, key, size, tier, loid)
         SELECT p.id, alkblobs_key(int8send(g)), 8, 'lo', lo_from_bytea(0, int8send(g))
           FROM alkblobs.pools p, generate_series(1, 100000) g WHERE p.name = $1",
        &[&pool],
    )
    .await
    .unwrap();
    c.batch_execute("RESET ROLE").await.unwrap();
    assert_eq!(objects(&c, &pool).await, 100_000);
    // Loaded by hand, without pins: nothing queued them (a 'queue' pool),
    // so an audit finds them (a 'mark' pool marks in every sweep anyway).
    c.execute("SELECT alkblobs_request_audit($1)", &[&pool])
        .await
        .unwrap();

    // One unbounded transaction cannot hold 100k lo_unlink locks.
    let err = c
        .query_one(
            "SELECT * FROM alkblobs_sweep($1, max_unlinks => 100000, max_keys => 100000)",
            &[&pool],
        )
        .await
        .expect_err("100k unlinks in one transaction must exhaust the lock table");
    assert_eq!(sqlstate(&err), "53200", "{err}");
    assert_eq!(
        objects(&c, &pool).await,
        100_000,
        "the failed call rolled back"
    );

    // A bounded call does part of the work and reports the rest.
    let row = c
        .query_one(
            "SELECT staged, deleted, remaining FROM alkblobs_sweep($1, max_unlinks => 1000, max_keys => 100000)",
            &[&pool],
        )
        .await
        .unwrap();
    let (staged, deleted, remaining): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!((staged, deleted, remaining), (100_000, 1000, 99_000));
    assert_eq!(objects(&c, &pool).await, 99_000);

    // The procedure commits between calls and finishes.
    let t = Instant::now();
    c.batch_execute(&format!("CALL alkblobs_sweep_all('{pool}', 2000)"))
        .await
        .unwrap();
    eprintln!("sweep_all of 99,000 large objects: {:.1?}", t.elapsed());
    assert_eq!(objects(&c, &pool).await, 0);
    let left: i64 = c
        .query_one(
            "SELECT lo_entries + staged FROM alkblobs_usage WHERE pool = $1",
            &[&pool],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
}

/// Several connections put, record liveness and let go while a sweeper
/// loops with a zero window; every key a worker holds pinned or recorded is
/// present whenever the worker looks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writers_racing_a_sweeper_never_lose_a_protected_key() {
    let setup = connect().await;
    let pool = pool(&setup, "stress", "0 seconds", "60 seconds").await;
    let table = format!("live_{}", pool.replace(['-', '.'], "_"));
    setup
        .batch_execute(&format!(
            "CREATE TABLE {table} (key bytea PRIMARY KEY, worker int)"
        ))
        .await
        .unwrap();
    setup
        .execute(
            "SELECT alkblobs_register_liveness($1, $2::text::regclass)",
            &[&pool, &table],
        )
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let deleted = Arc::new(AtomicU64::new(0));
    let sweeps = Arc::new(AtomicU64::new(0));
    let sweeper = {
        let (pool, stop, deleted, sweeps) =
            (pool.clone(), stop.clone(), deleted.clone(), sweeps.clone());
        tokio::spawn(async move {
            let s = connect().await;
            while !stop.load(Ordering::SeqCst) {
                let r = s
                    .query_one("SELECT deleted, aborted FROM alkblobs_sweep($1)", &[&pool])
                    .await
                    .unwrap();
                deleted.fetch_add(r.get::<_, i64>(0) as u64, Ordering::SeqCst);
                assert_eq!(r.get::<_, Option<String>>(1), None);
                sweeps.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    let workers: Vec<_> = (0..4i32)
        .map(|w| {
            let (pool, table, sweeps) = (pool.clone(), table.clone(), sweeps.clone());
            tokio::spawn(async move {
                let c = connect().await;
                let owner = format!("worker-{w}");
                for i in 0u64.. {
                    if i >= 150 && sweeps.load(Ordering::SeqCst) >= 30 {
                        break;
                    }
                    // A shared content pool: puts dedup onto dying entries.
                    let value = format!("content {}", (i * 7 + w as u64) % 40).into_bytes();
                    let k = key(&value);
                    c.query_one("SELECT alkblobs_put($1, $2, $3, $4)", &[&pool, &k, &value, &owner])
                        .await
                        .unwrap();
                    assert!(exists(&c, &pool, &k).await, "a pinned key is missing");
                    let record = i % 3 == 0;
                    if record {
                        c.execute(
                            &format!("INSERT INTO {table} (key, worker) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING"),
                            &[&k, &w],
                        )
                        .await
                        .unwrap();
                    }
                    c.query_one("SELECT alkblobs_unpin($1, $2, $3)", &[&pool, &k, &owner])
                        .await
                        .unwrap();
                    if record {
                        let held: i64 = c
                            .query_one(&format!("SELECT count(*) FROM {table} WHERE key = $1"), &[&k])
                            .await
                            .unwrap()
                            .get(0);
                        if held == 1 {
                            assert!(exists(&c, &pool, &k).await, "a recorded key was deleted");
                        }
                        if i % 2 == 0 {
                            c.execute(&format!("DELETE FROM {table} WHERE key = $1 AND worker = $2"), &[&k, &w])
                                .await
                                .unwrap();
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    sweeper.await.unwrap();
    let live: Vec<Vec<u8>> = setup
        .query(&format!("SELECT key FROM {table}"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    for k in &live {
        assert!(exists(&setup, &pool, k).await, "a live key was lost");
    }
    assert!(sweeps.load(Ordering::SeqCst) >= 30);
    assert!(
        deleted.load(Ordering::SeqCst) > 0,
        "the sweeper collected something"
    );
}

/// Renewing 10,000 pins of one owner is one statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewing_ten_thousand_pins_is_one_statement() {
    let c = connect().await;
    let pool = pool(&c, "renew-10k", "5 minutes", "60 seconds").await;
    c.execute(
        "SELECT count(alkblobs_put($1, alkblobs_key(int8send(g)), int8send(g), 'owner-1'))
           FROM generate_series(1, 10000) g",
        &[&pool],
    )
    .await
    .unwrap();
    let t = Instant::now();
    let n: i64 = c
        .query_one("SELECT alkblobs_renew($1, 'owner-1')", &[&pool])
        .await
        .unwrap()
        .get(0);
    eprintln!("renewed {n} pins in {:.1?}", t.elapsed());
    assert_eq!(n, 10_000);
    let min_left: f64 = c
        .query_one(
            "SELECT extract(epoch FROM min(expires_at) - clock_timestamp())::float8 FROM alkblobs.pins pn
               JOIN alkblobs.pools p ON p.id = pn.pool WHERE p.name = $1",
            &[&pool],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        min_left > 50.0,
        "every pin now expires a full TTL out ({min_left}s)"
    );
}

/// The upgrade path 0.1.0 -> 0.2.0 -> … -> 0.8.0 exists and applies, carrying
/// data and registrations and the install's privilege policy; DROP and
/// CREATE are clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_extension_upgrades_and_drops_cleanly() {
    let admin = connect().await;
    let db = format!("alkblobs_upgrade_{}", std::process::id());
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {db}"))
        .await
        .unwrap();
    admin
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .await
        .unwrap();
    let url = alkblobs_tests::pg::url();
    let base = url.rsplit_once('/').map(|(b, _)| b).unwrap();
    let (c, conn) = tokio_postgres::connect(&format!("{base}/{db}"), tokio_postgres::NoTls)
        .await
        .unwrap();
    let task = tokio::spawn(conn);
    c.batch_execute("CREATE EXTENSION alkblobs VERSION '0.1.0'")
        .await
        .unwrap();
    c.batch_execute("SELECT alkblobs_create_pool('u', '0 seconds')")
        .await
        .unwrap();
    // 0.1.0 state the upgrade must carry: an entry, a pin, a registered
    // liveness table naming the entry (with 0.1.0's BEFORE trigger).
    c.batch_execute(
        "SELECT alkblobs_put('u', alkblobs_key('old'), 'old', 'node-a');
         CREATE TABLE u_refs (key bytea PRIMARY KEY);
         SELECT alkblobs_register_liveness('u', 'u_refs');
         INSERT INTO u_refs VALUES (alkblobs_key('old'));",
    )
    .await
    .unwrap();
    c.batch_execute("ALTER EXTENSION alkblobs UPDATE TO '0.2.0'")
        .await
        .unwrap();
    let v: String = c
        .query_one(
            "SELECT extversion FROM pg_extension WHERE extname = 'alkblobs'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(v, "0.2.0");
    // A pool older than any health threshold, never swept.
    c.batch_execute("UPDATE alkblobs.pools SET created_at = now() - interval '30 days'")
        .await
        .unwrap();
    c.batch_execute("ALTER EXTENSION alkblobs UPDATE")
        .await
        .unwrap();
    let v: String = c
        .query_one(
            "SELECT extversion FROM pg_extension WHERE extname = 'alkblobs'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        v,
        alkblobs::backend::postgres::EXTENSION_VERSION,
        "UPDATE goes to the default version"
    );
    // The upgraded tables have the fresh install's columns (the test
    // database's extension was created at the current version).
    let columns = "SELECT string_agg(col, ', ' ORDER BY col) FROM ( \
                   SELECT a.attrelid::regclass || '.' || a.attname || ' ' \
                          || format_type(a.atttypid, a.atttypmod) || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END \
                          || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '') AS col \
                     FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum \
                    WHERE a.attrelid IN ('alkblobs.pools'::regclass, 'alkblobs.sweeps'::regclass, \
                                         'alkblobs.sweep_state'::regclass, 'alkblobs.schedule'::regclass, \
                                         'alkblobs.pool_locks'::regclass, 'alkblobs.leases'::regclass, \
                                         'alkblobs.verifies'::regclass, 'alkblobs_health'::regclass) \
                      AND a.attnum > 0 AND NOT a.attisdropped) s";
    let upgraded: String = c.query_one(columns, &[]).await.unwrap().get(0);
    let fresh: String = admin.query_one(columns, &[]).await.unwrap().get(0);
    assert_eq!(
        upgraded, fresh,
        "the upgrade's schema differs from a fresh install's"
    );
    // Its health is judged from the upgrade on, not from its creation: no
    // history does not mean a month without a sweep.
    let status: String = c
        .query_one("SELECT status FROM alkblobs_health WHERE pool = 'u'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "ok");
    let pools: i64 = c
        .query_one("SELECT count(*) FROM alkblobs_pools", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(pools, 1, "the upgrade kept the data");
    // The upgrade applies the install's policy: nothing but alkblobs_key and
    // alkblobs_flavour is executable by PUBLIC, and no SECURITY DEFINER function of the
    // extension is owned by a superuser (new ones above all), while every
    // invoker function is (alkblobs_owner must not be able to redefine
    // what its callers run).
    let public: Vec<String> = c
        .query(
            "SELECT p.oid::regprocedure::text FROM pg_proc p
               JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
               JOIN pg_extension x ON x.oid = d.refobjid AND x.extname = 'alkblobs'
              WHERE has_function_privilege('public', p.oid, 'EXECUTE') ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        public,
        vec![
            "alkblobs_flavour()".to_string(),
            "alkblobs_key(bytea)".to_string()
        ]
    );
    let superuser_owned: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_proc p
               JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
               JOIN pg_extension x ON x.oid = d.refobjid AND x.extname = 'alkblobs'
               JOIN pg_roles r ON r.oid = p.proowner WHERE r.rolsuper = p.prosecdef",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        superuser_owned, 0,
        "definer functions owned by a superuser, or invoker functions not, after the upgrade"
    );
    // The old registration still protects (its guard was replaced), and the
    // pool works under the new API.
    let row = c
        .query_one("SELECT deleted, aborted FROM alkblobs_sweep('u')", &[])
        .await
        .unwrap();
    assert_eq!(
        (row.get::<_, i64>(0), row.get::<_, Option<String>>(1)),
        (0, None)
    );
    c.batch_execute("SELECT alkblobs_unpin_all('u', 'node-a')")
        .await
        .unwrap();
    let row = c
        .query_one("SELECT deleted, kept FROM alkblobs_sweep('u')", &[])
        .await
        .unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (0, 0));
    // 0.6.0: the sweeps are in the history, and the pool has a health row.
    let n: i64 = c
        .query_one("SELECT count(*) FROM alkblobs_sweeps WHERE pool = 'u'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 2);
    // 0.8.0: the pool reviews a queue, its first sweep audited it (the
    // queue started empty), and the upgrade gave the registered table a
    // guard that sees deletions and a TRUNCATE trigger.
    let r = c
        .query_one(
            "SELECT p.collector, (SELECT s.audit FROM alkblobs_sweeps s WHERE s.pool = 'u' ORDER BY s.id LIMIT 1),
                    p.audit_every = interval '1 day'
               FROM alkblobs_pools p WHERE p.pool = 'u'",
            &[],
        )
        .await
        .unwrap();
    let (collector, audit): (String, Option<String>) = (r.get(0), r.get(1));
    assert_eq!(collector, "queue");
    assert!(
        r.get::<_, bool>(2),
        "an upgraded pool audits daily, as a new one does"
    );
    assert!(
        audit
            .as_deref()
            .is_some_and(|a| a.contains("upgrade to 0.8.0")),
        "the first sweep after the upgrade: audit {audit:?}"
    );
    let triggers: Vec<(String, i16)> = c
        .query(
            "SELECT tgname::text, tgtype FROM pg_trigger WHERE tgrelid = 'u_refs'::regclass AND tgname LIKE 'alkblobs%' ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        triggers,
        vec![
            ("alkblobs_liveness_guard".to_owned(), 29),
            ("alkblobs_liveness_truncate".to_owned(), 32)
        ]
    );
    let status: String = c
        .query_one("SELECT status FROM alkblobs_health WHERE pool = 'u'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "ok");
    // 0.7.0: the pool's sweeper lock is a row (the upgrade made it), and a
    // client's sweep lease is the extension's.
    let locks: i64 = c
        .query_one(
            "SELECT count(*) FROM alkblobs.pool_locks l JOIN alkblobs.pools p ON p.id = l.pool \
              WHERE p.name = 'u'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(locks, 1);
    let leased: bool = c
        .query_one("SELECT alkblobs_sweep_lease('u', 'node-a')", &[])
        .await
        .unwrap()
        .get(0);
    assert!(leased);
    // An admin (not a superuser) still registers and unregisters after the
    // move of registration's internals to alkblobs_registration.
    let role = format!("t_upgrade_admin_{}", std::process::id());
    c.batch_execute(&format!(
        "CREATE ROLE {role} LOGIN IN ROLE alkblobs_admin; GRANT CREATE ON SCHEMA public TO {role};
         SELECT alkblobs_grant_pool('u', '{role}', 'admin');"
    ))
    .await
    .unwrap();
    let (ac, aconn) = tokio_postgres::connect(
        &format!("{base}/{db}").replacen("postgres@", &format!("{role}@"), 1),
        tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    let atask = tokio::spawn(aconn);
    ac.batch_execute(
        "CREATE TABLE u_admin_refs (key bytea PRIMARY KEY);
         SELECT alkblobs_register_liveness('u', 'u_admin_refs');
         SELECT alkblobs_unregister_liveness('u', 'u_admin_refs');
         DROP TABLE u_admin_refs;",
    )
    .await
    .unwrap();
    let e = ac
        .batch_execute("CREATE RULE r AS ON UPDATE TO alkblobs.pools DO INSTEAD NOTHING")
        .await
        .unwrap_err();
    assert_eq!(
        alkblobs_tests::pg::sqlstate(&e),
        "42501",
        "USAGE on schema alkblobs survived the upgrade"
    );
    drop(ac);
    let _ = atask.await;
    let e = c
        .batch_execute("INSERT INTO u_refs VALUES (alkblobs_key('never put'))")
        .await
        .unwrap_err();
    assert_eq!(alkblobs_tests::pg::sqlstate(&e), "AB002");
    c.batch_execute("DROP TABLE u_refs CASCADE; DROP EXTENSION alkblobs")
        .await
        .unwrap();
    let left: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'alkblobs'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "DROP EXTENSION removes the internal schema");
    drop(c);
    let _ = task.await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {db}"))
        .await
        .unwrap();
}

/// Bad calls from a client get deliberate SQLSTATEs (the driver sees them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_from_a_client_gets_sqlstates_and_changes_nothing() {
    let c = connect().await;
    let pool = pool(&c, "bad-input", "0 seconds", "60 seconds").await;
    let short: &[u8] = b"short";
    let e = c
        .query_one(
            "SELECT alkblobs_put($1, $2, 'x'::bytea, 'o')",
            &[&pool, &short],
        )
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "22023");
    let e = c
        .query_one(
            "SELECT alkblobs_put($1, $2, 'wrong'::bytea, 'o')",
            &[&pool, &key(b"right")],
        )
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "AB001");
    let e = c
        .query_one("SELECT * FROM alkblobs_sweep('no-such-pool')", &[])
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "42704");
    let entries: i64 = c
        .query_one(
            "SELECT kv_entries + pins FROM alkblobs_usage WHERE pool = $1",
            &[&pool],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(entries, 0);
}

/// A local-tier pool of 0.3.0, whose liveness rows name files (keys no
/// entry holds), upgraded to this version without a sweep in between:
/// the upgrade records those files (the 0.4.0 migration, which the sweep
/// no longer runs), so the first sweep and claim keep them and nothing
/// aborts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_tier_pool_of_0_3_0_keeps_the_files_its_rows_name_through_the_upgrade() {
    let admin = connect().await;
    let db = format!("alkblobs_upgrade_local_{}", std::process::id());
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {db}"))
        .await
        .unwrap();
    admin
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .await
        .unwrap();
    let url = alkblobs_tests::pg::url();
    let base = url.rsplit_once('/').map(|(b, _)| b).unwrap();
    let (c, conn) = tokio_postgres::connect(&format!("{base}/{db}"), tokio_postgres::NoTls)
        .await
        .unwrap();
    let task = tokio::spawn(conn);
    let file = alkblobs_tests::pg::key(b"a file on the shared tier");
    c.batch_execute(
        "CREATE EXTENSION alkblobs VERSION '0.3.0';
         SELECT alkblobs_create_pool('l', '0 seconds', '60 seconds', 'local');
         CREATE TABLE l_refs (key bytea PRIMARY KEY);
         SELECT alkblobs_register_liveness('l', 'l_refs');",
    )
    .await
    .unwrap();
    c.execute("INSERT INTO l_refs VALUES ($1)", &[&file])
        .await
        .unwrap();
    c.batch_execute("ALTER EXTENSION alkblobs UPDATE")
        .await
        .unwrap();
    let published: Option<bool> = c
        .query_opt(
            "SELECT f.published FROM alkblobs.files f JOIN alkblobs.pools p ON p.id = f.pool \
              WHERE p.name = 'l' AND f.key = $1",
            &[&file],
        )
        .await
        .unwrap()
        .map(|r| r.get(0));
    assert_eq!(published, Some(true), "the upgrade did not record the file");
    let pending: Option<String> = c
        .query_one("SELECT pending FROM alkblobs.liveness", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(pending.as_deref(), Some("recheck"));
    for _ in 0..2 {
        let r = c
            .query_one("SELECT aborted FROM alkblobs_sweep('l')", &[])
            .await
            .unwrap();
        assert_eq!(r.get::<_, Option<String>>(0), None);
        let claimed: Vec<Vec<u8>> = c
            .query("SELECT * FROM alkblobs_claim_local('l')", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert!(!claimed.contains(&file), "a file a row names was claimed");
    }
    drop(c);
    task.abort();
    admin
        .batch_execute(&format!("DROP DATABASE {db} WITH (FORCE)"))
        .await
        .unwrap();
}
