//! Who may do what: roles, definer code, search_path and per-pool grants.
//! Each test runs over real connections as real LOGIN roles (the test
//! cluster trusts loopback), so the identity the extension sees is the one
//! an attacker would have; docs/design.md §4 lists which guard each test
//! covers and the mutation runs against it.

#![cfg(feature = "pg")]

use std::time::Duration;

use alkblobs_tests::pg::{
    connect, connect_as, exists, garbage, grant_pool, hex, key, login_role, pool, put, reference,
    register, server_major, sql_keys, sqlstate, table_name, try_register, try_sweep,
    try_sweep_detailed,
};
use tokio_postgres::Client;

/// Drops the view through which the extension reads registered `table`
/// (as a superuser could), to test the validation behind it.
async fn drop_source_view(su: &Client, table: &str) {
    su.batch_execute(&format!(
        "DO $$ BEGIN EXECUTE format('DROP VIEW alkblobs.%I', 'src_' || '{table}'::regclass::oid); END $$"
    ))
    .await
    .unwrap();
}

async fn is_superuser(c: &Client, role: &str) -> bool {
    c.query_one("SELECT rolsuper FROM pg_roles WHERE rolname = $1", &[&role])
        .await
        .unwrap()
        .get(0)
}

/// A pool's id (the object id its locks were keyed by up to 0.6.0).
async fn pool_id(c: &Client, pool: &str) -> i32 {
    c.query_one("SELECT id FROM alkblobs.pools WHERE name = $1", &[&pool])
        .await
        .unwrap()
        .get(0)
}

/// A sweep lease call's result.
async fn lease(c: &Client, pool: &str, holder: &str, ttl: &str) -> Result<bool, String> {
    c.query_one(
        "SELECT alkblobs_sweep_lease($1, $2, $3::text::interval)",
        &[&pool, &holder, &ttl],
    )
    .await
    .map(|r| r.get(0))
    .map_err(|e| sqlstate(&e))
}

/// Rows in the planted schema's table of hits.
async fn hits(c: &Client, schema: &str) -> i64 {
    c.query_one(&format!("SELECT count(*) FROM {schema}.hits"), &[])
        .await
        .unwrap()
        .get(0)
}

/// The owner of a registered table drops the guard, retypes `key` to a type
/// with an implicit cast to bytea whose function makes its caller's target
/// a superuser, and asks the extension to read the table. Then the same
/// with the table turned into a view over a function. Nothing may run as a
/// superuser, and every use refuses the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registered_tables_owner_cannot_become_superuser() {
    let su = connect().await;
    let evil = login_role(&su, "evil", "alkblobs_admin").await;
    let e = connect_as(&evil).await;
    let pool = pool(&e, "escalate", "0 seconds", "60 seconds").await;
    let table = table_name(&pool, "live");
    e.batch_execute(&format!("CREATE TABLE {table} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    register(&e, &pool, &table).await;
    let k = garbage(&e, &pool, b"escalation bait").await;
    e.execute(&format!("INSERT INTO {table} VALUES ($1)"), &[&k])
        .await
        .unwrap();
    // The attack: a composite type with an implicit cast whose function
    // grants SUPERUSER to the attacker when run by a superuser.
    let ty = format!("{table}_t");
    // First line of defence (0.4.0): the extension reads a registered
    // table through a view bound to it, so its key column cannot be
    // retyped at all…
    let blocked = e
        .batch_execute(&format!(
            "CREATE TYPE {ty}_probe AS (b bytea);
             ALTER TABLE {table} ALTER COLUMN key TYPE {ty}_probe USING ROW(key)::{ty}_probe"
        ))
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&blocked), "0A000", "{blocked}");
    // …nor dropped (PostgreSQL's own refusal: the view depends on it).
    let dropped = e
        .batch_execute(&format!("ALTER TABLE {table} DROP COLUMN key"))
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&dropped), "2BP01", "{dropped}");
    // …second line: with that view gone (a superuser dropped it), every
    // use re-validates the table and refuses it.
    drop_source_view(&su, &table).await;
    e.batch_execute(&format!(
        "DROP TRIGGER IF EXISTS alkblobs_liveness_guard ON {table};
         CREATE TYPE {ty} AS (b bytea);
         CREATE FUNCTION {ty}_cast({ty}) RETURNS bytea LANGUAGE plpgsql AS $f$
         BEGIN
             BEGIN EXECUTE 'ALTER ROLE {evil} SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;
             RETURN $1.b;
         END $f$;
         CREATE CAST ({ty} AS bytea) WITH FUNCTION {ty}_cast({ty}) AS IMPLICIT;
         ALTER TABLE {table} ALTER COLUMN key TYPE {ty} USING ROW(key)::{ty};"
    ))
    .await
    .unwrap();
    // With the guard left in place, a write must not run the cast either
    // (as alkblobs_owner, through the trigger).
    let t3 = table_name(&pool, "kept_guard");
    e.batch_execute(&format!("CREATE TABLE {t3} (key bytea)"))
        .await
        .unwrap();
    register(&e, &pool, &t3).await;
    drop_source_view(&su, &t3).await;
    e.batch_execute(&format!(
        "CREATE FUNCTION {ty}_spy({ty}) RETURNS bytea LANGUAGE plpgsql AS $f$
         BEGIN PERFORM set_config('alkblobs_test.cast_ran_as', current_user, false); RETURN $1.b; END $f$;
         DROP CAST ({ty} AS bytea);
         CREATE CAST ({ty} AS bytea) WITH FUNCTION {ty}_spy({ty}) AS IMPLICIT;
         ALTER TABLE {t3} ALTER COLUMN key TYPE {ty} USING ROW(key)::{ty};"
    ))
    .await
    .unwrap();
    let wrote = e
        .execute(&format!("INSERT INTO {t3} VALUES (ROW($1::bytea))"), &[&k])
        .await
        .map_err(|e| sqlstate(&e));
    let ran_as: String = e
        .query_one(
            "SELECT coalesce(current_setting('alkblobs_test.cast_ran_as', true), '')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_ne!(
        ran_as, "alkblobs_owner",
        "the guard ran the table owner's cast"
    );
    assert_eq!(
        wrote,
        Err("AB004".into()),
        "the guard must refuse a retyped key"
    );
    e.batch_execute(&format!(
        "DROP TABLE {t3}; DROP CAST ({ty} AS bytea);
         CREATE CAST ({ty} AS bytea) WITH FUNCTION {ty}_cast({ty}) AS IMPLICIT;"
    ))
    .await
    .unwrap();
    let swept = try_sweep(&e, &pool).await;
    assert!(
        !is_superuser(&su, &evil).await,
        "the sweep ran the cast as a superuser"
    );
    assert_eq!(
        swept,
        Ok((0, Some("liveness_table_invalid".into()))),
        "the sweep must refuse the retyped table"
    );
    let explained = e
        .query(
            "SELECT detail FROM alkblobs_explain($1, $2) WHERE aspect = 'liveness'",
            &[&pool, &k],
        )
        .await;
    assert!(
        !is_superuser(&su, &evil).await,
        "explain ran the cast as a superuser"
    );
    let detail: String = explained.unwrap()[0].get(0);
    assert!(detail.contains("REFUSED"), "{detail}");
    let staged = e
        .query_one("SELECT alkblobs_stage($1, ARRAY[$2::bytea])", &[&pool, &k])
        .await;
    assert!(
        !is_superuser(&su, &evil).await,
        "stage ran the cast as a superuser"
    );
    assert_eq!(
        staged.map(|_| ()).map_err(|e| sqlstate(&e)),
        Err("AB004".into())
    );
    assert!(exists(&su, &pool, &k).await);

    // The same table turned into a view whose key column calls the function.
    let t2 = table_name(&pool, "view");
    e.batch_execute(&format!(
        "CREATE TABLE {t2} (key bytea PRIMARY KEY);
         CREATE FUNCTION {t2}_f() RETURNS bytea LANGUAGE plpgsql AS $f$
         BEGIN
             BEGIN EXECUTE 'ALTER ROLE {evil} SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;
             RETURN NULL;
         END $f$;"
    ))
    .await
    .unwrap();
    register(&e, &pool, &t2).await;
    drop_source_view(&su, &t2).await;
    e.batch_execute(&format!(
        "ALTER TABLE {table} ALTER COLUMN key TYPE bytea USING (key).b;
         DROP TRIGGER IF EXISTS alkblobs_liveness_guard ON {t2};
         DROP TRIGGER IF EXISTS alkblobs_liveness_truncate ON {t2};
         ALTER TABLE {t2} DROP CONSTRAINT {t2}_pkey;"
    ))
    .await
    .unwrap();
    // (VACUUM clears relhastriggers, which CREATE RULE "_RETURN" checks.)
    e.batch_execute(&format!("VACUUM {t2}")).await.unwrap();
    let rule = e
        .batch_execute(&format!(
            "CREATE RULE \"_RETURN\" AS ON SELECT TO {t2} DO INSTEAD SELECT {t2}_f() AS key;"
        ))
        .await;
    if server_major(&su).await >= 16 {
        // PostgreSQL 16 no longer turns a table into a view this way: on
        // those majors the server itself closes this door.
        assert_eq!(rule.map_err(|e| sqlstate(&e)), Err("42809".into()));
    } else {
        rule.unwrap();
        let swept = try_sweep(&e, &pool).await;
        assert!(
            !is_superuser(&su, &evil).await,
            "the sweep ran the view's function as a superuser"
        );
        assert_eq!(swept, Ok((0, Some("liveness_table_invalid".into()))));
        let _ = e
            .query("SELECT * FROM alkblobs_explain($1, $2)", &[&pool, &k])
            .await;
        assert!(
            !is_superuser(&su, &evil).await,
            "explain ran the view's function as a superuser"
        );
    }
    assert!(exists(&su, &pool, &k).await);

    // And no function of the extension runs as a superuser at all.
    let su_definers: i64 = su
        .query_one(
            "SELECT count(*) FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
               JOIN pg_extension x ON x.oid = d.refobjid AND x.extname = 'alkblobs'
               JOIN pg_roles r ON r.oid = p.proowner
              WHERE p.prosecdef AND r.rolsuper",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        su_definers, 0,
        "SECURITY DEFINER functions owned by a superuser"
    );
}

/// A reader's explain reports only what the reader may read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_reports_only_what_the_caller_may_read() {
    let su = connect().await;
    let reader = login_role(&su, "reader", "alkblobs_reader").await;
    let pool = pool(&su, "explain-priv", "0 seconds", "60 seconds").await;
    grant_pool(&su, &pool, &reader, "read").await;
    let table = table_name(&pool, "secret");
    su.batch_execute(&format!("CREATE TABLE {table} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    register(&su, &pool, &table).await;
    let k = key(b"secret membership");
    put(&su, &pool, b"secret membership", "o").await;
    su.execute(&format!("INSERT INTO {table} VALUES ($1)"), &[&k])
        .await
        .unwrap();
    let r = connect_as(&reader).await;
    assert!(
        r.query(&format!("SELECT * FROM {table}"), &[])
            .await
            .is_err(),
        "the reader cannot read the table itself"
    );
    let rows = r
        .query(
            "SELECT detail FROM alkblobs_explain($1, $2) WHERE aspect = 'liveness'",
            &[&pool, &k],
        )
        .await
        .unwrap();
    for row in rows {
        let d: String = row.get(0);
        assert!(
            !d.contains("holds the key"),
            "explain leaked membership: {d}"
        );
    }
}

/// Pins belong to the role that made them: another writer role cannot
/// release or renew them by naming the same owner string.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_cannot_release_or_renew_another_roles_pins() {
    let su = connect().await;
    let wa = login_role(&su, "writer_a", "alkblobs_writer").await;
    let wb = login_role(&su, "writer_b", "alkblobs_writer").await;
    let pool = pool(&su, "pin-roles", "0 seconds", "60 seconds").await;
    grant_pool(&su, &pool, &wa, "write").await;
    grant_pool(&su, &pool, &wb, "write").await;
    let a = connect_as(&wa).await;
    let b = connect_as(&wb).await;
    put(&a, &pool, b"a's fresh put", "node-1").await;
    let n: i64 = b
        .query_one("SELECT alkblobs_unpin_all($1, 'node-1')", &[&pool])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "writer b released writer a's pins");
    let unpinned: bool = b
        .query_one(
            "SELECT alkblobs_unpin($1, $2, 'node-1')",
            &[&pool, &key(b"a's fresh put")],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!unpinned);
    let n: i64 = b
        .query_one("SELECT alkblobs_renew($1, 'node-1')", &[&pool])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "writer b renewed writer a's pins");
    assert_eq!(try_sweep(&su, &pool).await, Ok((0, None)));
    assert!(exists(&su, &pool, &key(b"a's fresh put")).await);
}

/// Pools are granted per role: an application's roles neither see nor use
/// nor sweep another application's pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_are_granted_per_role() {
    let su = connect().await;
    let admin = login_role(&su, "app_admin", "alkblobs_admin").await;
    let stranger = login_role(&su, "stranger", "alkblobs_admin").await;
    let ad = connect_as(&admin).await;
    let pool = pool(&ad, "app-pool", "0 seconds", "60 seconds").await;
    put(&ad, &pool, b"app content", "node").await;
    let st = connect_as(&stranger).await;
    let seen: i64 = st
        .query_one(
            "SELECT count(*) FROM alkblobs_pools WHERE pool = $1",
            &[&pool],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(seen, 0, "a stranger sees the pool");
    let e = st
        .query_one(
            "SELECT alkblobs_get($1, $2)",
            &[&pool, &key(b"app content")],
        )
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "42501");
    assert_eq!(try_sweep(&st, &pool).await, Err("42501".into()));
    let e = st
        .query_one(
            "SELECT alkblobs_put($1, $2, 'x'::bytea, 'n')",
            &[&pool, &key(b"x")],
        )
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "42501");
    // Granted, it works.
    grant_pool(&ad, &pool, &stranger, "read").await;
    let v: Option<Vec<u8>> = st
        .query_one(
            "SELECT alkblobs_get($1, $2)",
            &[&pool, &key(b"app content")],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(v.as_deref(), Some(&b"app content"[..]));
}

/// Pools and grants name their roles (so a restore into another cluster
/// maps them by name) but follow the role itself once it exists: a role
/// created later under a dropped owner's or grantee's name gains nothing,
/// and a renamed owner keeps its pool. A grant to a role that does not
/// exist is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_reusing_a_dropped_roles_name_gains_nothing() {
    let su = connect().await;
    let owner = login_role(&su, "own_drop", "alkblobs_admin").await;
    let reader = login_role(&su, "rd_drop", "alkblobs_reader").await;
    let renamed = login_role(&su, "own_rename", "alkblobs_admin").await;
    let od = connect_as(&owner).await;
    let dropped_pool = pool(&od, "drop-pool", "0 seconds", "60 seconds").await;
    put(&od, &dropped_pool, b"owned by a dropped role", "n").await;
    grant_pool(&od, &dropped_pool, &reader, "read").await;
    let rn = connect_as(&renamed).await;
    let renamed_pool = pool(&rn, "rename-pool", "0 seconds", "60 seconds").await;
    put(&rn, &renamed_pool, b"owned by a renamed role", "n").await;
    drop((od, rn));
    for r in [&owner, &reader] {
        su.batch_execute(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{r}';
             DROP OWNED BY {r}; DROP ROLE {r}; CREATE ROLE {r} LOGIN IN ROLE alkblobs_admin"
        ))
        .await
        .unwrap();
    }
    for r in [&owner, &reader] {
        let c = connect_as(r).await;
        let e = c
            .query_one(
                "SELECT alkblobs_get($1, $2)",
                &[&dropped_pool, &key(b"owned by a dropped role")],
            )
            .await
            .expect_err("a new role under a dropped role's name reads its pool");
        assert_eq!(sqlstate(&e), "42501", "{r}: {e}");
    }
    let new_name = format!("{renamed}_new");
    su.batch_execute(&format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{renamed}';
         ALTER ROLE {renamed} RENAME TO {new_name}"
    ))
    .await
    .unwrap();
    let rn = connect_as(&new_name).await;
    let v: Option<Vec<u8>> = rn
        .query_one(
            "SELECT alkblobs_get($1, $2)",
            &[&renamed_pool, &key(b"owned by a renamed role")],
        )
        .await
        .expect("a renamed owner keeps its pool")
        .get(0);
    assert_eq!(v.as_deref(), Some(&b"owned by a renamed role"[..]));
    let e = rn
        .execute(
            "SELECT alkblobs_grant_pool($1, 4000000000::oid::regrole, 'read')",
            &[&renamed_pool],
        )
        .await
        .expect_err("a grant to no role");
    assert_eq!(sqlstate(&e), "42704", "{e}");
}

/// The grantees `alkblobs_pool_grants` lists for `pool`, by name.
async fn grantees(c: &Client, pool: &str) -> Vec<String> {
    c.query(
        "SELECT grantee::text FROM alkblobs_pool_grants WHERE pool = $1 ORDER BY 1",
        &[&pool],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get::<_, String>(0))
    .collect()
}

/// A grant outlives its grantee: once the role is dropped, the regrole
/// form of `alkblobs_revoke_pool` cannot name it, and the name form
/// revokes the recorded grant (and only a gone grantee's: a present role
/// of another name keeps its grant). A name that is neither a role nor a
/// gone grantee of the pool is 42704.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_grantees_grant_is_revoked_by_its_name() {
    let su = connect().await;
    let owner = login_role(&su, "own_revoke", "alkblobs_admin").await;
    let gone = login_role(&su, "rd_gone", "alkblobs_reader").await;
    let kept = login_role(&su, "rd_kept", "alkblobs_reader").await;
    let od = connect_as(&owner).await;
    let p = pool(&od, "revoke-gone", "0 seconds", "60 seconds").await;
    for r in [&gone, &kept] {
        grant_pool(&od, &p, r, "read").await;
    }
    su.batch_execute(&format!("DROP OWNED BY {gone}; DROP ROLE {gone}"))
        .await
        .unwrap();
    assert_eq!(
        grantees(&od, &p).await,
        vec![gone.clone(), kept.clone()],
        "the gone grantee's grant is listed"
    );
    let e = od
        .query_one(
            &format!("SELECT alkblobs_revoke_pool($1, '{gone}'::regrole, 'read')"),
            &[&p],
        )
        .await
        .expect_err("a regrole of a dropped role");
    assert_eq!(sqlstate(&e), "42704", "{e}");
    // The name form, as a literal (what an operator types).
    let revoked: bool = od
        .query_one(
            &format!("SELECT alkblobs_revoke_pool($1, '{gone}', 'read')"),
            &[&p],
        )
        .await
        .unwrap()
        .get(0);
    assert!(revoked);
    assert_eq!(grantees(&od, &p).await, vec![kept.clone()]);
    let again: bool = od
        .query_one(
            &format!("SELECT alkblobs_revoke_pool($1, '{kept}', 'write')"),
            &[&p],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!again, "a present role's grant of another access");
    let e = od
        .query_one(
            "SELECT alkblobs_revoke_pool($1, 'never_a_role', 'read')",
            &[&p],
        )
        .await
        .expect_err("a name that is no role and no gone grantee");
    assert_eq!(sqlstate(&e), "42704", "{e}");
    // The present role's grant goes by its name too, read as an
    // identifier as the regrole form reads it (unquoted: lower case).
    let revoked: bool = od
        .query_one(
            &format!(
                "SELECT alkblobs_revoke_pool($1, '{}', 'read')",
                kept.to_uppercase()
            ),
            &[&p],
        )
        .await
        .unwrap()
        .get(0);
    assert!(revoked);
    assert!(grantees(&od, &p).await.is_empty());

    // A role created later under a dropped grantee's name: the gone
    // grant gives it nothing, a grant to it takes effect, and its revoke
    // takes the gone grant with it.
    let again = login_role(&su, "rd_again", "alkblobs_reader").await;
    grant_pool(&od, &p, &again, "read").await;
    su.batch_execute(&format!(
        "DROP OWNED BY {again}; DROP ROLE {again}; CREATE ROLE {again} LOGIN IN ROLE alkblobs_reader"
    ))
    .await
    .unwrap();
    let ac = connect_as(&again).await;
    let e = ac
        .query("SELECT * FROM alkblobs_list($1)", &[&p])
        .await
        .expect_err("the new role reads through the dropped role's grant");
    assert_eq!(sqlstate(&e), "42501", "{e}");
    grant_pool(&od, &p, &again, "read").await;
    ac.query("SELECT * FROM alkblobs_list($1)", &[&p])
        .await
        .expect("a grant to the new role takes effect");
    let revoked: bool = od
        .query_one(
            &format!("SELECT alkblobs_revoke_pool($1, '{again}', 'read')"),
            &[&p],
        )
        .await
        .unwrap()
        .get(0);
    assert!(revoked);
    assert!(grantees(&od, &p).await.is_empty());
    let e = ac
        .query("SELECT * FROM alkblobs_list($1)", &[&p])
        .await
        .expect_err("revoked");
    assert_eq!(sqlstate(&e), "42501", "{e}");
}

/// Up to 0.6.0 a pool's sweeper lock and a client's sweep lease were
/// advisory locks ('alkb' and 'alkS', pool id), which any role that can
/// connect can take: holding them made every sweep of the pool abort with
/// `sweeper_lock`, registration and staging wait, and every fleet
/// client's sweep report the sweeper lock. Now the sweeper lock is a row
/// lock only the extension's functions take and the lease an expiring row
/// only a role with sweep access to the pool writes, both still exclusive
/// among those who may.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_role_without_access_cannot_hold_a_pools_locks() {
    let c = connect().await;
    let other = pool(&c, "locks-other", "0 seconds", "60 seconds").await;
    let pool = pool(&c, "locks", "0 seconds", "60 seconds").await;
    let id = pool_id(&c, &pool).await;
    let dead = garbage(&c, &pool, b"swept despite the squatter").await;
    // A role with no access to the pool squats on both advisory locks.
    let squatter = login_role(&c, "squat", "alkblobs_reader").await;
    let sq = connect_as(&squatter).await;
    sq.batch_execute(&format!(
        "BEGIN; SELECT pg_advisory_xact_lock(1634495330, {id}), pg_advisory_xact_lock({}, {id})",
        0x616c_6b53
    ))
    .await
    .unwrap();
    // Sweeps are not aborted, registration does not wait, and the lease is
    // free.
    assert_eq!(try_sweep(&c, &pool).await, Ok((1, None)));
    assert!(!exists(&c, &pool, &dead).await);
    let table = table_name(&pool, "live");
    c.batch_execute(&format!(
        "CREATE TABLE {table} (key bytea PRIMARY KEY); SET lock_timeout = '3s'"
    ))
    .await
    .unwrap();
    let reg = c
        .execute(
            "SELECT alkblobs_register_liveness($1, $2::text::regclass)",
            &[&pool, &table],
        )
        .await
        .map(|_| ())
        .map_err(|e| sqlstate(&e));
    c.batch_execute("RESET lock_timeout").await.unwrap();
    assert_eq!(reg, Ok(()), "registration waited for the squatter");
    assert_eq!(lease(&c, &pool, "node-su", "60 seconds").await, Ok(true));
    c.execute("SELECT alkblobs_sweep_lease_end($1, 'node-su')", &[&pool])
        .await
        .unwrap();
    sq.batch_execute("ROLLBACK").await.unwrap();
    // Nobody without access takes the new ones: not the squatter, not the
    // admin of another pool (who may use schema alkblobs for registration),
    // not a sweeper of another pool.
    let admin = login_role(&c, "otheradmin", "alkblobs_admin").await;
    grant_pool(&c, &other, &admin, "admin").await;
    let ad = connect_as(&admin).await;
    let sweeper_b = login_role(&c, "othersweep", "alkblobs_sweeper").await;
    grant_pool(&c, &other, &sweeper_b, "sweep").await;
    let sb = connect_as(&sweeper_b).await;
    for (who, conn) in [
        ("squatter", &sq),
        ("other pool's admin", &ad),
        ("other pool's sweeper", &sb),
    ] {
        for sql in [
            format!("SELECT 1 FROM alkblobs.pool_locks WHERE pool = {id} FOR UPDATE"),
            "SELECT 1 FROM alkblobs.leases FOR UPDATE".to_string(),
            format!("SELECT alkblobs.take_lock({id}, true)"),
            format!("SELECT alkblobs_sweep_lease('{pool}', 'node-x')"),
            format!("SELECT alkblobs_sweep_lease_end('{pool}', 'node-x')"),
        ] {
            let e = conn.batch_execute(&sql).await.unwrap_err();
            assert_eq!(sqlstate(&e), "42501", "{who}: {sql}: {e}");
        }
    }
    // Among those who may, both still exclude: a sweep in progress makes a
    // second one abort; a live lease of one instance refuses another's,
    // until it is ended or expires.
    let sweeper = login_role(&c, "sweeplock", "alkblobs_sweeper").await;
    grant_pool(&c, &pool, &sweeper, "sweep").await;
    let sw = connect_as(&sweeper).await;
    sw.batch_execute(&format!("BEGIN; SELECT * FROM alkblobs_sweep('{pool}')"))
        .await
        .unwrap();
    assert_eq!(
        try_sweep(&c, &pool).await,
        Ok((0, Some("sweeper_lock".into())))
    );
    sw.batch_execute("COMMIT").await.unwrap();
    assert_eq!(try_sweep(&c, &pool).await, Ok((0, None)));
    assert_eq!(lease(&sw, &pool, "node-a", "1 second").await, Ok(true));
    assert_eq!(
        lease(&sw, &pool, "node-a", "1 second").await,
        Ok(true),
        "renewal"
    );
    assert_eq!(lease(&c, &pool, "node-b", "60 seconds").await, Ok(false));
    // The same instance id under another role is another holder.
    assert_eq!(lease(&c, &pool, "node-a", "60 seconds").await, Ok(false));
    let ended: bool = c
        .query_one("SELECT alkblobs_sweep_lease_end($1, 'node-a')", &[&pool])
        .await
        .unwrap()
        .get(0);
    assert!(!ended, "ended another role's lease");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        lease(&c, &pool, "node-b", "60 seconds").await,
        Ok(true),
        "expired"
    );
    assert_eq!(lease(&sw, &pool, "node-a", "60 seconds").await, Ok(false));
    let ended: bool = c
        .query_one("SELECT alkblobs_sweep_lease_end($1, 'node-b')", &[&pool])
        .await
        .unwrap()
        .get(0);
    assert!(ended);
    assert_eq!(
        lease(&sw, &pool, "node-a", "60 seconds").await,
        Ok(true),
        "ended"
    );
    // Leases are taken at READ COMMITTED only, with a bounded ttl.
    sw.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .await
        .unwrap();
    let e = lease(&sw, &pool, "node-a", "60 seconds").await;
    sw.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(e, Err("AB003".into()));
    assert_eq!(
        lease(&sw, &pool, "node-a", "2 hours").await,
        Err("22023".into())
    );
}

/// Until 0.7.0 admins had USAGE on schema `alkblobs` (registration runs as
/// the caller and calls internals there). With it, an admin of one pool
/// could queue an ACCESS EXCLUSIVE lock on the extension's tables behind
/// any reader — `CREATE RULE` and `CREATE TRIGGER` take it before they
/// check ownership — and every call of every pool queued behind that.
/// Now those internals live in `alkblobs_registration`, which holds no
/// table, and the statements fail at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_of_one_pool_cannot_stall_the_others() {
    let c = connect().await;
    let mine = pool(&c, "stall-mine", "0 seconds", "60 seconds").await;
    let admin = login_role(&c, "staller", "alkblobs_admin").await;
    grant_pool(&c, &mine, &admin, "admin").await;
    // A reader of the pools table in an open transaction (here the admin
    // itself, through the pools view).
    let hold = connect_as(&admin).await;
    hold.batch_execute("BEGIN; SELECT count(*) FROM alkblobs_pools")
        .await
        .unwrap();
    let ad = connect_as(&admin).await;
    ad.batch_execute("SET lock_timeout = '2s'").await.unwrap();
    for sql in [
        "CREATE RULE stall AS ON UPDATE TO alkblobs.pools DO INSTEAD NOTHING",
        "CREATE TRIGGER stall AFTER UPDATE ON alkblobs.pools \
         FOR EACH ROW EXECUTE FUNCTION alkblobs_registration.liveness_guard()",
        "CREATE RULE stall AS ON INSERT TO alkblobs.entries DO INSTEAD NOTHING",
    ] {
        let e = ad.batch_execute(sql).await.unwrap_err();
        assert_eq!(sqlstate(&e), "42501", "{sql}: {e}");
    }
    hold.batch_execute("ROLLBACK").await.unwrap();
    // Registration, which needs those internals, still works for the admin.
    let table = table_name(&mine, "live");
    ad.batch_execute(&format!("CREATE TABLE {table} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    register(&ad, &mine, &table).await;
    let unregistered: bool = ad
        .query_one(
            "SELECT alkblobs_unregister_liveness($1, $2::text::regclass)",
            &[&mine, &table],
        )
        .await
        .unwrap()
        .get(0);
    assert!(unregistered);
}

/// Audit follow-up: the per-pool views are security barriers. A reader of
/// one pool writes a qual that fails on any foreign value (a cast of the
/// pool name to integer, guarded to be false on its own rows); without the
/// barrier the planner runs the cheap qual before the pool filter and the
/// error message carries another pool's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_views_do_not_leak_other_pools_rows_through_a_callers_quals() {
    let su = connect().await;
    let mine = pool(&su, "mine", "5 minutes", "60 seconds").await;
    let theirs = pool(&su, "theirs", "5 minutes", "60 seconds").await;
    assert!(put(&su, &theirs, b"their content", "their-node").await);
    garbage(&su, &theirs, b"their garbage").await;
    let reader = login_role(&su, "viewleak", "alkblobs_reader").await;
    grant_pool(&su, &mine, &reader, "read").await;
    let r = connect_as(&reader).await;
    for view in [
        "alkblobs_pools",
        "alkblobs_pool_grants",
        "alkblobs_pins",
        "alkblobs_staged",
        "alkblobs_usage",
    ] {
        let q = format!(
            "SELECT count(*) FROM {view} WHERE CASE WHEN pool = $1 THEN false ELSE pool::int = 0 END"
        );
        match r.query_one(&q, &[&mine]).await {
            Ok(row) => assert_eq!(row.get::<_, i64>(0), 0, "{view}"),
            Err(e) => panic!("{view} evaluated the caller's qual on another pool's row: {e}"),
        }
    }
}

/// Every SQL and PL/pgSQL routine of the extension pins its search_path,
/// but for `alkblobs_sweep_all` and `alkblobs_cron_sweep` (a procedure that
/// commits cannot have a SET clause): those qualify every name and operator instead, which
/// `a_schema_before_pg_catalog_cannot_redirect_any_routine` checks by
/// attack. A routine added without either fails here.
#[tokio::test]
async fn every_routine_but_the_committing_procedures_pins_its_search_path() {
    let c = connect().await;
    alkblobs_tests::pg::ensure_extension(&c).await;
    // By schema and name, not extension membership: the SQL-only flavour
    // has no extension.
    let rows = c
        .query(
            "SELECT p.oid::regprocedure::text FROM pg_proc p
               JOIN pg_language l ON l.oid = p.prolang
              WHERE (p.pronamespace IN ('alkblobs'::regnamespace, 'alkblobs_registration'::regnamespace)
                     OR (p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'alkblobs\\_%'))
                AND l.lanname IN ('plpgsql', 'sql')
                AND NOT coalesce(EXISTS (SELECT 1 FROM unnest(p.proconfig) s WHERE s LIKE 'search_path=%'), false)
              ORDER BY 1",
            &[],
        )
        .await
        .unwrap();
    let unpinned: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(
        unpinned,
        vec![
            "alkblobs_audit(text,integer)".to_owned(),
            "alkblobs_cron_sweep(text)".to_owned(),
            "alkblobs_sweep_all(text,integer)".to_owned()
        ],
        "routines without a pinned search_path"
    );
}

/// An admin who owns a schema that a superuser puts before `pg_catalog` on
/// their search_path plants an operator for every common comparison and
/// arithmetic of the types the extension uses (each records that it ran
/// and tries to make its owner a superuser), then the superuser runs
/// `CALL alkblobs_sweep_all` over a pool with work to do, and the public
/// API's functions and views. None of the planted operators may run. Until
/// 0.8.0 `alkblobs_sweep_all` (no SET clause) used unqualified `+`, `<`
/// and `=`, so the admin's code ran as the superuser and the admin became
/// one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_before_pg_catalog_cannot_redirect_any_routine() {
    let c = connect().await;
    let admin = login_role(&c, "planter", "alkblobs_admin").await;
    let schema = format!("{admin}_ops");
    c.batch_execute(&format!("CREATE SCHEMA {schema} AUTHORIZATION {admin}"))
        .await
        .unwrap();
    let a = connect_as(&admin).await;
    // As the admin: a table of hits and one operator per (name, left,
    // right) pg_catalog has among the common types, each a function that
    // records itself, tries the escalation, and answers as pg_catalog's.
    a.batch_execute(&format!(
        r#"CREATE TABLE {schema}.hits (op text);
           GRANT INSERT, SELECT ON {schema}.hits TO PUBLIC;
           DO $plant$
           DECLARE o record; n integer := 0;
           BEGIN
             FOR o IN SELECT op.oprname, op.oprleft::regtype AS l, op.oprright::regtype AS r, op.oprresult::regtype AS res
                        FROM pg_operator op
                       WHERE op.oprnamespace = 'pg_catalog'::regnamespace AND op.oprkind = 'b'
                         AND op.oprname IN ('=', '<>', '<', '>', '<=', '>=', '+', '-', '*', '~', '||')
                         AND op.oprleft IN ('int4'::regtype, 'int8'::regtype, 'bool'::regtype, 'text'::regtype,
                                            'bytea'::regtype, 'timestamptz'::regtype, 'interval'::regtype,
                                            'numeric'::regtype, 'oid'::regtype, 'name'::regtype)
                         AND op.oprright IN ('int4'::regtype, 'int8'::regtype, 'bool'::regtype, 'text'::regtype,
                                             'bytea'::regtype, 'timestamptz'::regtype, 'interval'::regtype,
                                             'numeric'::regtype, 'oid'::regtype, 'name'::regtype)
             LOOP
               n := n + 1;
               EXECUTE format($f$CREATE FUNCTION {schema}.f%s(a %s, b %s) RETURNS %s LANGUAGE plpgsql AS $b$
                                BEGIN
                                  INSERT INTO {schema}.hits VALUES (%L);
                                  BEGIN
                                    EXECUTE 'ALTER ROLE {admin} SUPERUSER';
                                  EXCEPTION WHEN OTHERS THEN NULL;
                                  END;
                                  RETURN a OPERATOR(pg_catalog.%s) b;
                                END $b$$f$, n, o.l, o.r, o.res, o.oprname || '(' || o.l || ',' || o.r || ')', o.oprname);
               EXECUTE format('CREATE OPERATOR {schema}.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = {schema}.f%s)',
                              o.oprname, o.l, o.r, n);
             END LOOP;
           END $plant$;"#
    ))
    .await
    .unwrap();
    let planted: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_operator WHERE oprnamespace = $1::text::regnamespace",
            &[&schema],
        )
        .await
        .unwrap()
        .get(0);
    assert!(planted > 50, "planted {planted} operators");

    // A pool with work: garbage to stage and delete, a pin, a liveness
    // table of the superuser's.
    let pool = pool(&c, "planted", "0s", "60s").await;
    for i in 0..30u32 {
        garbage(&c, &pool, format!("planted garbage {i}").as_bytes()).await;
    }
    put(&c, &pool, b"planted pinned", "o").await;
    let table = table_name(&pool, "live");
    c.batch_execute(&format!("CREATE TABLE {table} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();

    // A sanity check that the plant works: an unqualified comparison under
    // that search_path runs it (as the admin, who cannot escalate).
    a.batch_execute(&format!(
        "SET search_path = {schema}, pg_catalog, public; SELECT 1 = 1"
    ))
    .await
    .unwrap();
    assert_eq!(hits(&c, &schema).await, 1, "the planted operators are live");
    c.batch_execute(&format!("TRUNCATE {schema}.hits"))
        .await
        .unwrap();
    // The superuser, with the admin's schema first.
    c.batch_execute(&format!("SET search_path = {schema}, pg_catalog, public"))
        .await
        .unwrap();

    let k = key(b"planted pinned");
    let calls = [
        format!("CALL alkblobs_sweep_all('{pool}')"),
        format!("CALL alkblobs_sweep_all('{pool}', 5)"),
        format!("CALL alkblobs_audit('{pool}')"),
        format!("SELECT * FROM alkblobs_sweep('{pool}')"),
        format!("SELECT * FROM alkblobs_sweep('{pool}', dry_run => true)"),
        format!("SELECT alkblobs_register_liveness('{pool}', '{table}')"),
        format!("INSERT INTO {table} VALUES (alkblobs_key('planted pinned'))"),
        format!("DELETE FROM {table}"),
        format!("INSERT INTO {table} VALUES (alkblobs_key('planted pinned'))"),
        format!("TRUNCATE {table}"),
        format!("INSERT INTO {table} VALUES (alkblobs_key('planted pinned'))"),
        format!("SELECT * FROM alkblobs_explain('{pool}', '\\x{}')", hex(&k)),
        format!("SELECT alkblobs_put('{pool}', alkblobs_key('p2'), 'p2', 'o')"),
        format!(
            "SELECT alkblobs_put_many('{pool}', ARRAY[alkblobs_key('p3')], ARRAY['p3'::bytea], 'o')"
        ),
        format!("SELECT alkblobs_get('{pool}', alkblobs_key('p2'))"),
        format!("SELECT * FROM alkblobs_stat('{pool}', alkblobs_key('p2'))"),
        format!("SELECT * FROM alkblobs_list('{pool}')"),
        format!("SELECT alkblobs_renew('{pool}', 'o')"),
        format!("SELECT alkblobs_unpin('{pool}', alkblobs_key('p2'), 'o')"),
        format!("SELECT alkblobs_alter_pool('{pool}', delete_window => '0')"),
        format!("SELECT alkblobs_alter_pool('{pool}', collector => 'mark', audit_every => '0')"),
        format!(
            "SELECT alkblobs_alter_pool('{pool}', collector => 'queue', audit_every => '1 hour')"
        ),
        format!("SELECT alkblobs_request_audit('{pool}')"),
        format!("SELECT alkblobs_grant_pool('{pool}', '{admin}', 'read')"),
        format!("SELECT alkblobs_revoke_pool('{pool}', '{admin}', 'read')"),
        format!("SELECT alkblobs_unregister_liveness('{pool}', '{table}')"),
        "SELECT * FROM alkblobs_health".to_owned(),
        "SELECT * FROM alkblobs_usage".to_owned(),
        "SELECT * FROM alkblobs_pools".to_owned(),
        "SELECT * FROM alkblobs_pins".to_owned(),
        "SELECT * FROM alkblobs_staged".to_owned(),
        "SELECT * FROM alkblobs_sweeps".to_owned(),
        format!("SELECT alkblobs_create_pool('{pool}-2', sweep_every => '1 minute')"),
        format!("CALL alkblobs_cron_sweep('{pool}-2')"),
    ];
    for sql in &calls {
        let sql = &sql_keys(sql);
        c.batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {} {e}", sqlstate(&e)));
        let n = hits(&c, &schema).await;
        assert_eq!(
            n, 0,
            "{sql} ran {n} of the admin's planted operators as the superuser"
        );
    }
    let left: i64 = c
        .query_one("SELECT count(*) FROM alkblobs_list($1)", &[&pool])
        .await
        .unwrap()
        .get(0);
    assert!(left < 33, "the sweeps did their work ({left} entries left)");
    let sup: bool = c
        .query_one(
            "SELECT rolsuper FROM pg_roles WHERE rolname = $1",
            &[&admin],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!sup, "the admin became a superuser");
    c.batch_execute("RESET search_path").await.unwrap();
}

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
        try_register(&e, &pool, &t).await.unwrap();
        let k = garbage(&e, &pool, format!("bait {i}").as_bytes()).await;
        reference(&e, &t, &k).await.unwrap();
        e.batch_execute(&shape.replace("{t}", &t).replace("{f}", &f))
            .await
            .unwrap();
        // A fresh session: nothing of the table is cached yet.
        let sweeper = connect().await;
        let got = try_sweep_detailed(&sweeper, &pool).await;
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
            try_register(&e, &pool, &fresh).await,
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
