//! The audit follow-ups of issue 8 (extension 0.4.0), each a test over real
//! connections that fails on the 0.3.0 SQL: user code reached through a
//! registered table's indexes or statistics, invoker routines a definer
//! role could redefine, a table's definition changing under a sweep,
//! references to content a local-tier pool does not hold, rows that
//! reached a registered table without its guard, a registration that
//! deadlocks with a sweep, and unbounded or unchecked arguments.
//! docs/design.md §4 lists the guard each one covers.

#![cfg(feature = "pg")]

use std::time::Duration;

use alkblobs_tests::pg::{
    connect, connect_as, garbage, key, login_role, pid, pool, publish_file, put, sqlstate,
    table_name, waits_on_lock,
};
use tokio_postgres::Client;

/// (deleted, aborted) of one sweep call, or its SQLSTATE and message.
async fn try_sweep(c: &Client, pool: &str) -> Result<(i64, Option<String>), String> {
    c.query_one("SELECT deleted, aborted FROM alkblobs_sweep($1)", &[&pool])
        .await
        .map(|r| (r.get(0), r.get(1)))
        .map_err(|e| format!("{} {e:?}", sqlstate(&e)))
}

async fn register(c: &Client, pool: &str, table: &str) -> Result<(), String> {
    c.execute(
        "SELECT alkblobs_register_liveness($1, $2::text::regclass)",
        &[&pool, &table],
    )
    .await
    .map(|_| ())
    .map_err(|e| sqlstate(&e))
}

async fn local_pool(c: &Client, tag: &str) -> String {
    let p = pool(c, tag, "0 seconds", "60 seconds").await;
    c.execute(
        "UPDATE alkblobs.pools SET large_tier = 'local' WHERE name = $1",
        &[&p],
    )
    .await
    .unwrap();
    p
}

/// `INSERT INTO table VALUES (k)`: Ok, or the SQLSTATE.
async fn reference(c: &Client, table: &str, k: &[u8]) -> Result<(), String> {
    c.execute(&format!("INSERT INTO {table} VALUES ($1)"), &[&k])
        .await
        .map(|_| ())
        .map_err(|e| sqlstate(&e))
}

// User code in a registered table's definition ----------------------------------

/// A registered table's owner puts an IMMUTABLE function of their own in an
/// index expression and in an extended-statistics expression; the planner
/// folds such calls while it plans a query of the table, as whoever plans
/// it — for a sweep, the definer alkblobs_owner (which can read and delete
/// every pool). The function fails loudly when it runs as alkblobs_owner.
/// Every use must refuse the table without planning a query of it, and
/// registration must refuse such a table.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn user_code_in_a_tables_indexes_or_statistics_never_runs_as_the_extension() {
    let su = connect().await;
    let evil = login_role(&su, "idxevil", "alkblobs_admin").await;
    let e = connect_as(&evil).await;
    let pool = pool(&e, "idx-evil", "0 seconds", "60 seconds").await;
    let f = table_name(&pool, "f");
    e.batch_execute(&format!(
        "CREATE FUNCTION {f}() RETURNS bytea LANGUAGE plpgsql IMMUTABLE AS $x$
         BEGIN
             IF current_user = 'alkblobs_owner' THEN
                 RAISE EXCEPTION 'evil ran as %', current_user;
             END IF;
             RETURN '\\x'::bytea;
         END $x$;"
    ))
    .await
    .unwrap();
    for (i, shape) in [
        "CREATE INDEX ON {t} ((key || {f}()))",
        "CREATE STATISTICS {t}_s ON (key || {f}()), (length(key)) FROM {t}; ANALYZE {t}",
    ]
    .into_iter()
    .enumerate()
    {
        let t = table_name(&pool, &format!("live{i}"));
        e.batch_execute(&format!("CREATE TABLE {t} (key bytea PRIMARY KEY)"))
            .await
            .unwrap();
        register(&e, &pool, &t).await.unwrap();
        let k = garbage(&e, &pool, format!("bait {i}").as_bytes()).await;
        reference(&e, &t, &k).await.unwrap();
        e.batch_execute(&shape.replace("{t}", &t).replace("{f}", &f))
            .await
            .unwrap();
        // A fresh session: nothing of the table is cached yet.
        let sweeper = connect().await;
        let got = try_sweep(&sweeper, &pool).await;
        assert!(
            !format!("{got:?}").contains("evil ran"),
            "{shape}: the sweep ran the table owner's function as alkblobs_owner: {got:?}"
        );
        assert_eq!(
            got,
            Ok((0, Some("liveness_table_invalid".into()))),
            "{shape}"
        );
        let verdict: Vec<String> = connect()
            .await
            .query("SELECT detail FROM alkblobs_explain($1, $2)", &[&pool, &k])
            .await
            .map_err(|e| format!("{e:?}"))
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert!(
            verdict.iter().any(|d| d.contains("REFUSED")),
            "{shape}: explain did not refuse the table: {verdict:?}"
        );
        // Registration refuses such a table outright.
        let fresh = table_name(&pool, &format!("fresh{i}"));
        e.batch_execute(&format!("CREATE TABLE {fresh} (key bytea PRIMARY KEY)"))
            .await
            .unwrap();
        e.batch_execute(
            &shape
                .replace("{t}", &fresh)
                .replace("{f}", &f)
                .replace("_s ON", "_s2 ON"),
        )
        .await
        .unwrap();
        assert_eq!(
            register(&e, &pool, &fresh).await,
            Err("42809".into()),
            "{shape}"
        );
        // A registered table is read through a view bound to it: dropping
        // it takes CASCADE (or unregistering first).
        let e2 = e
            .batch_execute(&format!("DROP TABLE {t}"))
            .await
            .unwrap_err();
        assert_eq!(sqlstate(&e2), "2BP01", "{e2}");
        e.batch_execute(&format!("DROP TABLE {t}, {fresh} CASCADE"))
            .await
            .unwrap();
    }
}

/// Functions that run as their caller (alkblobs_sweep_all, registration,
/// the helpers they call) and the views must not belong to alkblobs_owner:
/// code running as that role (any bug in a definer function) could
/// otherwise redefine them and so run as the superuser who calls them next.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn alkblobs_owner_cannot_redefine_what_its_callers_run() {
    let su = connect().await;
    alkblobs_tests::pg::ensure_extension(&su).await;
    let wrong: Vec<String> = su
        .query(
            "SELECT p.oid::regprocedure::text || ' owned by ' || r.rolname
               FROM pg_depend d JOIN pg_extension x ON x.oid = d.refobjid AND x.extname = 'alkblobs'
               JOIN pg_proc p ON d.classid = 'pg_proc'::regclass AND p.oid = d.objid
               JOIN pg_roles r ON r.oid = p.proowner
              WHERE d.deptype = 'e'
                AND (p.prosecdef <> (r.rolname = 'alkblobs_owner') OR (NOT p.prosecdef AND NOT r.rolsuper))
             UNION ALL
             SELECT c.oid::regclass::text || ' owned by ' || r.rolname
               FROM pg_depend d JOIN pg_extension x ON x.oid = d.refobjid AND x.extname = 'alkblobs'
               JOIN pg_class c ON d.classid = 'pg_class'::regclass AND c.oid = d.objid AND c.relkind = 'v'
               JOIN pg_roles r ON r.oid = c.relowner
              WHERE NOT r.rolsuper",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(wrong.is_empty(), "wrongly owned: {wrong:?}");
    su.batch_execute("BEGIN; SET LOCAL ROLE alkblobs_owner")
        .await
        .unwrap();
    let e = su
        .batch_execute("ALTER PROCEDURE alkblobs_sweep_all(text, integer) SET search_path = public")
        .await
        .unwrap_err();
    su.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(sqlstate(&e), "42501", "{e}");
}

// A table's definition is frozen while a sweep relies on it ------------------------

/// While a sweep's transaction relies on a registered table, its owner
/// cannot disable the guard, add an index or attach anything: those wait
/// for the sweep (SHARE UPDATE EXCLUSIVE), writers do not. DDL that holds
/// the table makes a sweep give up after a bounded wait, as report data.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sweep_freezes_its_tables_definition_and_gives_up_on_ddl_in_progress() {
    let obs = connect().await;
    let pool = pool(&obs, "frozen", "0 seconds", "60 seconds").await;
    let t = table_name(&pool, "live");
    obs.batch_execute(&format!("CREATE TABLE {t} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    register(&obs, &pool, &t).await.unwrap();
    let k = garbage(&obs, &pool, b"frozen live").await;
    let live = key(b"frozen other");
    put(&obs, &pool, b"frozen other", "w").await;
    let sweeper = connect().await;
    sweeper.batch_execute("BEGIN").await.unwrap();
    assert_eq!(try_sweep(&sweeper, &pool).await, Ok((1, None)));
    // A writer is not held up by the sweep…
    let w = connect().await;
    tokio::time::timeout(Duration::from_secs(10), reference(&w, &t, &live))
        .await
        .expect("a writer waited for the sweep")
        .unwrap();
    // …DDL on the table is.
    for ddl in [
        format!("ALTER TABLE {t} DISABLE TRIGGER alkblobs_liveness_guard"),
        format!("CREATE INDEX ON {t} (length(key))"),
    ] {
        let ddl_conn = connect().await;
        let ddl_pid = pid(&ddl_conn).await;
        let task = tokio::spawn(async move { ddl_conn.batch_execute(&ddl).await });
        assert!(
            waits_on_lock(&obs, ddl_pid).await,
            "DDL went ahead under a sweep that relies on the table"
        );
        obs.query_one("SELECT pg_cancel_backend($1)", &[&ddl_pid])
            .await
            .unwrap();
        let _ = task.await.unwrap();
    }
    sweeper.batch_execute("COMMIT").await.unwrap();
    assert!(!alkblobs_tests::pg::exists(&obs, &pool, &k).await);

    // DDL in progress: the sweep waits a bounded time and reports it.
    let ddl = connect().await;
    ddl.batch_execute(&format!("BEGIN; LOCK TABLE {t} IN SHARE MODE"))
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let got = tokio::time::timeout(Duration::from_secs(60), try_sweep(&sweeper, &pool))
        .await
        .expect("the sweep hung behind DDL");
    ddl.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(got, Ok((0, Some("liveness_table_busy".into()))));
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "no wait at all"
    );
}

// The local tier: what the pool holds -----------------------------------------------

/// In a local-tier pool a key that is neither an entry nor a recorded file
/// is not in the pool: a reference to a never-put key, to a kv entry the
/// executor deleted, or to a file a claim handed out fails with AB002; a
/// file recorded by `alkblobs_pin_new` can be referenced. `pin_new` is for
/// local-tier pools only.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_local_pool_refuses_references_to_content_it_does_not_hold() {
    let c = connect().await;
    let pool = local_pool(&c, "local-absent").await;
    let t = table_name(&pool, "live");
    c.batch_execute(&format!("CREATE TABLE {t} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    register(&c, &pool, &t).await.unwrap();
    // Never put.
    assert_eq!(
        reference(&c, &t, &key(b"never put anywhere")).await,
        Err("AB002".into())
    );
    // A kv entry the executor deleted.
    let kv = garbage(&c, &pool, b"small and collected").await;
    assert_eq!(try_sweep(&c, &pool).await, Ok((1, None)));
    assert_eq!(reference(&c, &t, &kv).await, Err("AB002".into()));
    // A file recorded but not (yet) published: its content may never come.
    let file = key(b"a big file on shared media");
    c.execute("SELECT alkblobs_pin_new($1, $2, 'node-a')", &[&pool, &file])
        .await
        .unwrap();
    assert_eq!(reference(&c, &t, &file).await, Err("AB002".into()));
    // Published.
    publish_file(&c, &pool, &file, "node-a").await;
    reference(&c, &t, &file).await.unwrap();
    // A file the claim handed out (and whose deletion committed).
    let gone = key(b"a big file nobody needs");
    publish_file(&c, &pool, &gone, "node-a").await;
    c.execute("SELECT alkblobs_unpin($1, $2, 'node-a')", &[&pool, &gone])
        .await
        .unwrap();
    c.execute("SELECT alkblobs_unpin($1, $2, 'node-a')", &[&pool, &file])
        .await
        .unwrap();
    let s: (i64, Option<String>) = try_sweep(&c, &pool).await.unwrap();
    assert_eq!(s, (0, None), "files are the client's to delete");
    let claimed: Vec<Vec<u8>> = c
        .query("SELECT * FROM alkblobs_claim_local($1)", &[&pool])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(claimed, vec![gone.clone()], "the referenced file stays");
    assert_eq!(reference(&c, &t, &gone).await, Err("AB002".into()));
    let confirmed = c
        .query(
            "SELECT * FROM alkblobs_local_published($1, ARRAY[$2::bytea], 'node-a')",
            &[&pool, &gone],
        )
        .await
        .unwrap();
    assert!(confirmed.is_empty(), "a collected file was confirmed");
    // Its tombstone refuses a new record until the claimer confirms the
    // delete (55006), then the key can be published again.
    let e = c
        .execute("SELECT alkblobs_pin_new($1, $2, 'node-b')", &[&pool, &gone])
        .await
        .unwrap_err();
    assert_eq!(
        sqlstate(&e),
        "55006",
        "a tombstoned key was recorded afresh"
    );
    let removed: i64 = c
        .query_one(
            "SELECT alkblobs_local_deleted($1, ARRAY[$2::bytea])",
            &[&pool, &gone],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(removed, 1);
    // Published again: referencable again.
    publish_file(&c, &pool, &gone, "node-b").await;
    reference(&c, &t, &gone).await.unwrap();

    let lo_pool = alkblobs_tests::pg::pool(&c, "not-local", "0 seconds", "60 seconds").await;
    let e = c
        .execute("SELECT alkblobs_pin_new($1, $2, 'x')", &[&lo_pool, &file])
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "22023", "{e}");
}

/// A claim that is deciding a file holds its row: a liveness write for it
/// waits and then fails with AB002 (the claim committed the deletion), at
/// every isolation level (40001 at REPEATABLE READ and SERIALIZABLE).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_liveness_write_racing_a_claim_fails_at_every_isolation_level() {
    let obs = connect().await;
    for iso in ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"] {
        let pool = local_pool(&obs, "claim-race").await;
        let t = table_name(&pool, "live");
        obs.batch_execute(&format!("CREATE TABLE {t} (key bytea PRIMARY KEY)"))
            .await
            .unwrap();
        register(&obs, &pool, &t).await.unwrap();
        let k = key(format!("racing a claim at {iso}").as_bytes());
        publish_file(&obs, &pool, &k, "n").await;
        obs.execute("SELECT alkblobs_unpin($1, $2, 'n')", &[&pool, &k])
            .await
            .unwrap();
        try_sweep(&obs, &pool).await.unwrap();
        let w = connect().await;
        // The writer's snapshot predates the claim.
        w.batch_execute(&format!(
            "BEGIN ISOLATION LEVEL {iso}; SELECT count(*) FROM {t}"
        ))
        .await
        .unwrap();
        let claimer = connect().await;
        claimer.batch_execute("BEGIN").await.unwrap();
        let claimed = claimer
            .query("SELECT * FROM alkblobs_claim_local($1)", &[&pool])
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1);
        let w_pid = pid(&w).await;
        let table = t.clone();
        let kk = k.clone();
        let write = tokio::spawn(async move {
            let r = reference(&w, &table, &kk).await;
            let c = w.batch_execute("COMMIT").await.map_err(|e| sqlstate(&e));
            (r, c)
        });
        assert!(waits_on_lock(&obs, w_pid).await, "{iso}: no wait");
        claimer.batch_execute("COMMIT").await.unwrap();
        let (r, _) = write.await.unwrap();
        let want = if iso == "READ COMMITTED" {
            "AB002"
        } else {
            "40001"
        };
        assert_eq!(r, Err(want.into()), "{iso}");
        let n: i64 = obs
            .query_one(&format!("SELECT count(*) FROM {t}"), &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 0, "{iso}: a row names a file that was deleted");
    }
}

// Rows that reached a table without its guard ----------------------------------------

/// Rows already in a table when it is registered (AB002 from the
/// registration), rows a partition brings in by ATTACH and rows written
/// while the guard was disabled (the next sweep aborts until they are gone)
/// and rows written under session_replication_role = replica (AB002) must
/// all name content the pool holds, and an unlogged table (emptied by a
/// crash) is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rows_that_bypassed_the_guard_are_checked_too() {
    let c = connect().await;
    let pool = pool(&c, "bypass", "0 seconds", "60 seconds").await;
    let absent = key(b"content nobody put");
    // Rows before registration.
    let pre = table_name(&pool, "pre");
    c.batch_execute(&format!("CREATE TABLE {pre} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    reference(&c, &pre, &absent).await.unwrap();
    assert_eq!(register(&c, &pool, &pre).await, Err("AB002".into()));
    // ATTACH PARTITION of a table with rows.
    let parted = table_name(&pool, "parted");
    let part = table_name(&pool, "part");
    c.batch_execute(&format!(
        "CREATE TABLE {parted} (key bytea NOT NULL) PARTITION BY HASH (key);
         CREATE TABLE {part} (key bytea NOT NULL);
         INSERT INTO {part} VALUES ('\\x{}'::bytea)",
        hex(&absent)
    ))
    .await
    .unwrap();
    register(&c, &pool, &parted).await.unwrap();
    // The DDL goes through (an event trigger reads no user table); the next
    // sweep checks the rows under its lock and refuses until they are gone.
    c.batch_execute(&format!(
        "ALTER TABLE {parted} ATTACH PARTITION {part} FOR VALUES WITH (MODULUS 1, REMAINDER 0)"
    ))
    .await
    .unwrap();
    assert_eq!(
        try_sweep(&c, &pool).await,
        Ok((0, Some("liveness_table_invalid".into())))
    );
    c.batch_execute(&format!("DELETE FROM {part}"))
        .await
        .unwrap();
    assert_eq!(try_sweep(&c, &pool).await, Ok((0, None)));
    // Written while the guard was disabled, found once it is back.
    let t = table_name(&pool, "live");
    c.batch_execute(&format!("CREATE TABLE {t} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    register(&c, &pool, &t).await.unwrap();
    c.batch_execute(&format!(
        "ALTER TABLE {t} DISABLE TRIGGER alkblobs_liveness_guard"
    ))
    .await
    .unwrap();
    reference(&c, &t, &absent).await.unwrap();
    c.batch_execute(&format!(
        "ALTER TABLE {t} ENABLE ALWAYS TRIGGER alkblobs_liveness_guard"
    ))
    .await
    .unwrap();
    assert_eq!(
        try_sweep(&c, &pool).await,
        Ok((0, Some("liveness_table_invalid".into())))
    );
    c.batch_execute(&format!("DELETE FROM {t}")).await.unwrap();
    assert_eq!(try_sweep(&c, &pool).await, Ok((0, None)));
    // session_replication_role = replica (a superuser's setting).
    c.batch_execute("SET session_replication_role = replica")
        .await
        .unwrap();
    let r = reference(&c, &t, &absent).await;
    c.batch_execute("RESET session_replication_role")
        .await
        .unwrap();
    assert_eq!(r, Err("AB002".into()));
    // Unlogged.
    let unlogged = table_name(&pool, "unlogged");
    c.batch_execute(&format!(
        "CREATE UNLOGGED TABLE {unlogged} (key bytea PRIMARY KEY)"
    ))
    .await
    .unwrap();
    assert_eq!(register(&c, &pool, &unlogged).await, Err("42809".into()));
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

// Lock order ---------------------------------------------------------------------------

/// Registration takes the pool's sweeper lock before it locks the table,
/// the order a sweep takes them: re-registering a table while a sweep
/// holds the pool waits for the sweep and neither deadlocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn registering_during_a_sweep_does_not_deadlock() {
    let obs = connect().await;
    let pool = pool(&obs, "reg-order", "0 seconds", "60 seconds").await;
    let t = table_name(&pool, "live");
    obs.batch_execute(&format!("CREATE TABLE {t} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    register(&obs, &pool, &t).await.unwrap();
    let id: i32 = obs
        .query_one("SELECT id FROM alkblobs.pools WHERE name = $1", &[&pool])
        .await
        .unwrap()
        .get(0);
    // A sweep that has taken the pool and not yet its tables.
    let sweeper = connect().await;
    sweeper
        .batch_execute(&format!("BEGIN; SELECT alkblobs.take_lock({id}, false)"))
        .await
        .unwrap();
    let admin = connect().await;
    let admin_pid = pid(&admin).await;
    let (p2, t2) = (pool.clone(), t.clone());
    let reg = tokio::spawn(async move { register(&admin, &p2, &t2).await });
    assert!(waits_on_lock(&obs, admin_pid).await);
    let swept = try_sweep(&sweeper, &pool).await;
    sweeper.batch_execute("COMMIT").await.unwrap();
    assert_eq!(swept, Ok((0, None)));
    assert_eq!(reg.await.unwrap(), Ok(()));
}

// Bounded and checked arguments ---------------------------------------------------------

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
    assert_eq!(examined, 10);

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

// Names, views and locks held by readers ------------------------------------------------

/// The extension reads a registered table through a view bound to its OID:
/// once schemas are swapped so that the table's old name means a decoy
/// whose rows come from the attacker's function, sweeps still read the
/// real table (and the protected key stays); and if the view itself were
/// made to read something else, every use refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renaming_schemas_cannot_swap_a_registered_table() {
    let su = connect().await;
    let m = login_role(&su, "swapper", "alkblobs_admin").await;
    su.batch_execute(&format!(
        "GRANT CREATE ON DATABASE {} TO {m}",
        db_name(&su).await
    ))
    .await
    .unwrap();
    let c = connect_as(&m).await;
    let pool = pool(&c, "swap", "0 seconds", "60 seconds").await;
    let app = table_name(&pool, "app");
    let decoy = table_name(&pool, "decoy");
    c.batch_execute(&format!(
        "CREATE SCHEMA {app}; CREATE TABLE {app}.refs (key bytea PRIMARY KEY);
         GRANT USAGE ON SCHEMA {app} TO alkblobs_owner;
         CREATE SCHEMA {decoy};
         CREATE FUNCTION {decoy}.pwn() RETURNS bytea LANGUAGE plpgsql AS $x$
         BEGIN
             IF current_user = 'alkblobs_owner' THEN RAISE EXCEPTION 'evil ran as %', current_user; END IF;
             RETURN NULL;
         END $x$;
         CREATE VIEW {decoy}.refs AS SELECT {decoy}.pwn() AS key;
         GRANT USAGE ON SCHEMA {decoy} TO alkblobs_owner;
         GRANT SELECT ON {decoy}.refs TO alkblobs_owner;"
    ))
    .await
    .unwrap();
    register(&c, &pool, &format!("{app}.refs")).await.unwrap();
    let k = garbage(&c, &pool, b"kept by the real table").await;
    reference(&c, &format!("{app}.refs"), &k).await.unwrap();
    c.batch_execute(&format!(
        "ALTER SCHEMA {app} RENAME TO {app}_real; ALTER SCHEMA {decoy} RENAME TO {app};"
    ))
    .await
    .unwrap();
    let got = try_sweep(&connect().await, &pool).await;
    assert_eq!(got, Ok((0, None)), "the sweep read the decoy");
    assert!(alkblobs_tests::pg::exists(&su, &pool, &k).await);
    // The view made to read something else: refused, nothing deleted.
    su.batch_execute(&format!(
        "DO $$ BEGIN EXECUTE format('CREATE OR REPLACE VIEW alkblobs.%I AS SELECT key FROM {app}.refs',
                                    'src_' || '{app}_real.refs'::regclass::oid); END $$"
    ))
    .await
    .unwrap();
    c.batch_execute(&format!("ALTER SCHEMA {app} RENAME TO {decoy}"))
        .await
        .unwrap();
    let got = try_sweep(&connect().await, &pool).await;
    assert!(!format!("{got:?}").contains("evil ran"), "{got:?}");
    assert_eq!(got, Ok((0, Some("liveness_table_invalid".into()))));
    // The next use re-creates a view bound to the table.
    let got = try_sweep(&connect().await, &pool).await;
    assert_eq!(got, Ok((0, None)));
    assert!(alkblobs_tests::pg::exists(&su, &pool, &k).await);
}

async fn db_name(c: &Client) -> String {
    c.query_one("SELECT current_database()", &[])
        .await
        .unwrap()
        .get(0)
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
    register(&c, &pool, &t).await.unwrap();
    let k = garbage(&c, &pool, b"explained").await;
    let reader = connect().await;
    reader.batch_execute("BEGIN").await.unwrap();
    reader
        .query("SELECT * FROM alkblobs_explain($1, $2)", &[&pool, &k])
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(30), try_sweep(&c, &pool))
        .await
        .unwrap();
    reader.batch_execute("COMMIT").await.unwrap();
    assert_eq!(got, Ok((1, None)));
}

/// Rows that reached a table while its guard was off and that could not be
/// checked when it came back (the table failed validation at that moment)
/// make the next sweeps abort until they are gone; and registration, which
/// checks the rows already there, needs READ COMMITTED to see them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rows_that_could_not_be_checked_at_once_stop_the_sweep_until_fixed() {
    let c = connect().await;
    let pool = pool(&c, "recheck", "0 seconds", "60 seconds").await;
    let t = table_name(&pool, "live");
    c.batch_execute(&format!("CREATE TABLE {t} (key bytea PRIMARY KEY, n int)"))
        .await
        .unwrap();
    register(&c, &pool, &t).await.unwrap();
    let absent = key(b"never put, recorded behind the guard's back");
    c.batch_execute(&format!(
        "ALTER TABLE {t} DISABLE TRIGGER alkblobs_liveness_guard;
         INSERT INTO {t} VALUES ('\\x{}'::bytea, 1);
         CREATE RULE {t}_r AS ON UPDATE TO {t} DO ALSO NOTHING;
         ALTER TABLE {t} ENABLE ALWAYS TRIGGER alkblobs_liveness_guard;
         DROP RULE {t}_r ON {t};",
        hex(&absent)
    ))
    .await
    .unwrap();
    assert_eq!(
        try_sweep(&c, &pool).await,
        Ok((0, Some("liveness_table_invalid".into())))
    );
    c.batch_execute(&format!("DELETE FROM {t}")).await.unwrap();
    assert_eq!(try_sweep(&c, &pool).await, Ok((0, None)));

    let t2 = table_name(&pool, "rr");
    c.batch_execute(&format!("CREATE TABLE {t2} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .await
        .unwrap();
    let r = register(&c, &pool, &t2).await;
    c.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(r, Err("AB003".into()));
}

// Audit, second round ------------------------------------------------------------------

/// `alkblobs_registration.add_source` (granted to admins) locks the table before it
/// validates and reads it: an index with a user function created by a
/// transaction that held the table while the registration checked it is
/// seen, and the table refused, instead of planned as the extension.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_registration_racing_an_index_creation_sees_the_index() {
    let su = connect().await;
    let evil = login_role(&su, "racer", "alkblobs_admin").await;
    let e = connect_as(&evil).await;
    let pool = pool(&e, "reg-race", "0 seconds", "60 seconds").await;
    let t = table_name(&pool, "live");
    let f = table_name(&pool, "f");
    // (What registration grants alkblobs_owner: in the SQL-only flavour
    // also UPDATE, which its LOCK TABLE needs.)
    let grant = if alkblobs_tests::pg::sql_only() {
        "SELECT, UPDATE"
    } else {
        "SELECT"
    };
    e.batch_execute(&format!(
        "CREATE TABLE {t} (key bytea PRIMARY KEY);
         GRANT {grant} ON {t} TO alkblobs_owner;
         CREATE FUNCTION {f}() RETURNS bytea LANGUAGE plpgsql IMMUTABLE AS $x$
         BEGIN
             IF current_user = 'alkblobs_owner' THEN RAISE EXCEPTION 'evil ran as %', current_user; END IF;
             RETURN '\\x'::bytea;
         END $x$;"
    ))
    .await
    .unwrap();
    let holder = connect_as(&evil).await;
    holder
        .batch_execute(&format!(
            "BEGIN; LOCK TABLE {t} IN ACCESS EXCLUSIVE MODE; CREATE INDEX ON {t} ((key || {f}()))"
        ))
        .await
        .unwrap();
    let reg = connect_as(&evil).await;
    let reg_pid = pid(&reg).await;
    let (p2, t2) = (pool.clone(), t.clone());
    let task = tokio::spawn(async move {
        reg.execute(
            "SELECT alkblobs_registration.add_source($1, $2::text::regclass, false)",
            &[&p2, &t2],
        )
        .await
        .map_err(|e| format!("{} {e:?}", sqlstate(&e)))
    });
    assert!(waits_on_lock(&su, reg_pid).await);
    holder.batch_execute("COMMIT").await.unwrap();
    let got = task.await.unwrap();
    assert!(!format!("{got:?}").contains("evil ran"), "{got:?}");
    assert!(matches!(&got, Err(s) if s.starts_with("42809")), "{got:?}");
}

/// Renaming the key column and adding a new one: the view the extension
/// reads through follows the column now called `key`, as the guard does,
/// so a row the guard let through is the row a sweep sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_extension_reads_the_column_the_guard_checks() {
    let c = connect().await;
    let pool = pool(&c, "key-rename", "0 seconds", "60 seconds").await;
    let t = table_name(&pool, "live");
    c.batch_execute(&format!("CREATE TABLE {t} (key bytea)"))
        .await
        .unwrap();
    register(&c, &pool, &t).await.unwrap();
    let old = garbage(&c, &pool, b"named by the old column").await;
    let new = garbage(&c, &pool, b"named by the new column").await;
    reference(&c, &t, &old).await.unwrap();
    c.batch_execute(&format!(
        "ALTER TABLE {t} RENAME key TO k2; ALTER TABLE {t} ADD key bytea"
    ))
    .await
    .unwrap();
    let pending: Option<String> = c
        .query_one(
            "SELECT l.pending FROM alkblobs.liveness l WHERE l.relid = $1::text::regclass",
            &[&t],
        )
        .await
        .unwrap()
        .get(0);
    // The library flavour's event trigger marks the table at once (the
    // SQL-only flavour has none; the rebinding below is what matters).
    if !alkblobs_tests::pg::sql_only() {
        assert_eq!(
            pending.as_deref(),
            Some("recheck"),
            "RENAME COLUMN went unnoticed"
        );
    }
    c.execute(&format!("INSERT INTO {t} (key) VALUES ($1)"), &[&new])
        .await
        .unwrap();
    // The sweep protects what the column called key names, and deletes
    // what only the renamed column names.
    assert_eq!(try_sweep(&c, &pool).await, Ok((1, None)));
    assert!(alkblobs_tests::pg::exists(&c, &pool, &new).await);
    assert!(!alkblobs_tests::pg::exists(&c, &pool, &old).await);
}

/// Explain on a local-tier pool tells a published file from one being
/// published (an earlier version failed with 42703 on any file).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_knows_the_local_tiers_files() {
    let c = connect().await;
    let pool = local_pool(&c, "explain-files").await;
    let published = key(b"a published file");
    let pending = key(b"a file on its way");
    publish_file(&c, &pool, &published, "n").await;
    c.execute("SELECT alkblobs_pin_new($1, $2, 'n')", &[&pool, &pending])
        .await
        .unwrap();
    let entry = |k: Vec<u8>| {
        let c = &c;
        let pool = pool.clone();
        async move {
            let r = c
                .query_one(
                    "SELECT detail FROM alkblobs_explain($1, $2) WHERE aspect = 'entry'",
                    &[&pool, &k],
                )
                .await
                .unwrap();
            r.get::<_, String>(0)
        }
    };
    assert!(
        entry(published.clone())
            .await
            .starts_with("present: a published file")
    );
    assert!(
        entry(pending.clone())
            .await
            .starts_with("absent: a file is being published")
    );
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

/// Two claimers handed the same tombstone (the second claim re-hands
/// tombstones whose claimer looks dead): the first locks it, unlinks and
/// removes it; the key is published afresh; the second then locks nothing
/// and so unlinks nothing (0.5.0 review: without the lock-and-check phase
/// it would have unlinked the republished file). The claim and a pin_new
/// of a staged key with no record take their locks in the same order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_handed_tombstone_never_unlinks_a_republished_file() {
    let c = connect().await;
    let pool = local_pool(&c, "tomb-twice").await;
    let k = key(b"claimed by two");
    publish_file(&c, &pool, &k, "node-a").await;
    c.execute("SELECT alkblobs_unpin($1, $2, 'node-a')", &[&pool, &k])
        .await
        .unwrap();
    try_sweep(&c, &pool).await.unwrap();
    // A's claim commits the tombstone; B's claim is handed it again.
    let a = connect().await;
    let b = connect().await;
    assert_eq!(claim_keys(&a, &pool).await, vec![k.clone()]);
    assert_eq!(
        claim_keys(&b, &pool).await,
        vec![k.clone()],
        "a tombstone is handed out again"
    );
    // A: lock, "unlink", remove, commit.
    a.batch_execute("BEGIN").await.unwrap();
    let mine = a
        .query(
            "SELECT * FROM alkblobs_local_deleting($1, ARRAY[$2::bytea])",
            &[&pool, &k],
        )
        .await
        .unwrap();
    assert_eq!(mine.len(), 1);
    // B's phase 2 waits for A's.
    b.batch_execute("BEGIN").await.unwrap();
    let b_pid = pid(&b).await;
    let (p2, k2) = (pool.clone(), k.clone());
    let b_turn = tokio::spawn(async move {
        let r = b
            .query(
                "SELECT * FROM alkblobs_local_deleting($1, ARRAY[$2::bytea])",
                &[&p2, &k2],
            )
            .await
            .unwrap()
            .len();
        (b, r)
    });
    assert!(waits_on_lock(&c, b_pid).await, "B did not wait for A");
    a.query(
        "SELECT alkblobs_local_deleted($1, ARRAY[$2::bytea])",
        &[&pool, &k],
    )
    .await
    .unwrap();
    a.batch_execute("COMMIT").await.unwrap();
    let (b, b_may_unlink) = b_turn.await.unwrap();
    assert_eq!(b_may_unlink, 0, "B would unlink a file it no longer owns");
    b.batch_execute("COMMIT").await.unwrap();
    // The same, with the key published afresh before the late claimer's
    // phase 2: it must not take the live record for its tombstone.
    assert_eq!(claim_keys(&a, &pool).await, Vec::<Vec<u8>>::new());
    publish_file(&c, &pool, &k, "node-w").await;
    let late = c
        .query(
            "SELECT * FROM alkblobs_local_deleting($1, ARRAY[$2::bytea])",
            &[&pool, &k],
        )
        .await
        .unwrap();
    assert!(
        late.is_empty(),
        "a late claimer would unlink a republished file"
    );
    // Republished: referencable.
    let t = table_name(&pool, "tomb_refs");
    c.batch_execute(&format!("CREATE TABLE {t} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    register(&c, &pool, &t).await.unwrap();
    reference(&c, &t, &k).await.unwrap();
}

async fn claim_keys(c: &Client, pool: &str) -> Vec<Vec<u8>> {
    c.query("SELECT * FROM alkblobs_claim_local($1)", &[&pool])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<_, Vec<u8>>(0))
        .collect()
}

/// A file is marked published only under the caller's own un-expired pin
/// (0.5.0 review: a holder that stalled past its TTL could otherwise mark
/// a record another node made after its own file was claimed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_published_needs_the_callers_own_pin() {
    let c = connect().await;
    let pool = local_pool(&c, "pub-own").await;
    let k = key(b"published under whose pin");
    c.execute("SELECT alkblobs_pin_new($1, $2, 'node-a')", &[&pool, &k])
        .await
        .unwrap();
    let mark = |owner: &'static str| {
        let (c, pool, k) = (&c, pool.clone(), k.clone());
        async move {
            c.query(
                "SELECT * FROM alkblobs_local_published($1, ARRAY[$2::bytea], $3)",
                &[&pool, &k, &owner],
            )
            .await
            .unwrap()
            .len()
        }
    };
    assert_eq!(
        mark("node-b").await,
        0,
        "published under someone else's pin"
    );
    c.execute("SELECT alkblobs_unpin($1, $2, 'node-a')", &[&pool, &k])
        .await
        .unwrap();
    assert_eq!(mark("node-a").await, 0, "published without a pin");
    c.execute("SELECT alkblobs_pin_new($1, $2, 'node-a')", &[&pool, &k])
        .await
        .unwrap();
    assert_eq!(mark("node-a").await, 1);
}

/// The 0.5.0 tombstone protocol at each isolation level a caller may run:
/// `pin_new` of a tombstoned key is refused (55006) at all three; phase 2
/// (`alkblobs_local_deleting`) runs only at READ COMMITTED (AB003
/// otherwise); and a writer whose snapshot predates the claim cannot mark
/// the claimed file published — at READ COMMITTED it finds the tombstone
/// and marks nothing, at REPEATABLE READ and SERIALIZABLE it gets 40001.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tombstones_hold_at_every_isolation_level() {
    let c = connect().await;
    for iso in ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"] {
        let pool = local_pool(&c, "tomb-iso").await;
        let k = key(format!("tombstone at {iso}").as_bytes());
        publish_file(&c, &pool, &k, "node-a").await;
        // A writer that will publish again, its snapshot taken now.
        let w = connect().await;
        w.batch_execute(&format!("BEGIN ISOLATION LEVEL {iso}; SELECT 1"))
            .await
            .unwrap();
        c.execute("SELECT alkblobs_unpin($1, $2, 'node-a')", &[&pool, &k])
            .await
            .unwrap();
        try_sweep(&c, &pool).await.unwrap();
        assert_eq!(claim_keys(&c, &pool).await, vec![k.clone()], "{iso}");
        let marked = w
            .query(
                "SELECT * FROM alkblobs_local_published($1, ARRAY[$2::bytea], 'node-a')",
                &[&pool, &k],
            )
            .await
            .map(|r| r.len())
            .map_err(|e| sqlstate(&e));
        let want = if iso == "READ COMMITTED" {
            Ok(0)
        } else {
            Err("40001".to_string())
        };
        assert_eq!(marked, want, "{iso}: a claimed file was marked published");
        let _ = w.batch_execute("ROLLBACK").await;
        // pin_new of the tombstoned key, in a transaction at this level.
        let p = connect().await;
        p.batch_execute(&format!("BEGIN ISOLATION LEVEL {iso}"))
            .await
            .unwrap();
        let e = p
            .execute("SELECT alkblobs_pin_new($1, $2, 'node-b')", &[&pool, &k])
            .await
            .unwrap_err();
        assert_eq!(
            sqlstate(&e),
            "55006",
            "{iso}: a tombstoned key was recorded"
        );
        let _ = p.batch_execute("ROLLBACK").await;
        // Phase 2 only at READ COMMITTED.
        let d = connect().await;
        d.batch_execute(&format!("BEGIN ISOLATION LEVEL {iso}"))
            .await
            .unwrap();
        let r = d
            .query(
                "SELECT * FROM alkblobs_local_deleting($1, ARRAY[$2::bytea])",
                &[&pool, &k],
            )
            .await
            .map(|r| r.len())
            .map_err(|e| sqlstate(&e));
        let want = if iso == "READ COMMITTED" {
            Ok(1)
        } else {
            Err("AB003".to_string())
        };
        assert_eq!(r, want, "{iso}");
        let _ = d.batch_execute("ROLLBACK").await;
    }
}
