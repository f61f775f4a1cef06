//! The SQL-only flavour (`scripts/package.sh sql-only`), on a server like a
//! managed one: the alkblobs library is never loaded, pg_cron is preloaded,
//! and the installing role has CREATEROLE but is not a superuser.
//! `scripts/test.sh` starts that cluster (`ALKBLOBS_PG_PRELOAD=cron`), runs
//! the install script there as such a role, and points `ALKBLOBS_PG_URL`
//! (a superuser, for the test's own set-up) at pg_cron's database and
//! `ALKBLOBS_SQL_ONLY_SCRIPT` at the script. The engine, fleet, race,
//! privilege, liveness-registration, local-tier, argument and randomized
//! suites run against this database as well.
//!
//! What differs from the library flavour, and is checked here: the
//! server trusts writers' keys (clients verify what they read, `verify`
//! finds a forged key), `alkblobs_key` cannot compute a key, sweeps are
//! scheduled by pg_cron with the same history and health.

#![cfg(feature = "pg")]

use std::process::Command;
use std::time::{Duration, Instant};

use alkblobs::backend::postgres::{Flavour, PgPool};
use alkblobs::store::fleet::{FleetLarge, FleetOptions};
use alkblobs::{Error, Key, Store};
use alkblobs_tests::pg::{connect, connect_as, key, login_role, pool, server_major, sqlstate, url};
use tokio_postgres::{Client, NoTls};

fn script() -> String {
    std::env::var("ALKBLOBS_SQL_ONLY_SCRIPT").unwrap_or_else(|_| {
        panic!("ALKBLOBS_SQL_ONLY_SCRIPT is not set: scripts/test.sh sets it to the output of scripts/package.sh sql-only")
    })
}

/// `url()` with another role and database.
fn url_as(role: &str, db: &str) -> String {
    let u = url();
    let (scheme_host, _db) = u.rsplit_once('/').unwrap();
    let host = scheme_host.rsplit_once('@').unwrap().1;
    format!("postgresql://{role}@{host}/{db}")
}

async fn connect_to(u: &str) -> Client {
    let (c, conn) = tokio_postgres::connect(u, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect {u}: {e}"));
    tokio::spawn(async move {
        let _ = conn.await;
    });
    c
}

/// One run of the install script at a time. Each makes its installer a
/// member of the cluster-wide role alkblobs_owner for its transaction, and
/// each refuses to start while that role has members: two at once in one
/// cluster made the second fail with "role alkblobs_owner must be a member
/// of no role" once in a CI run (PostgreSQL 15; not reproduced in two runs
/// since). Tests that install run in parallel threads of this binary.
/// The backup tool's dump and restore make the installer such a member for
/// their run too (a 17 CI run failed an install that way), so they take it.
/// The pg_cron test holds it while pg_cron's launcher reads its new job.
static INSTALLS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `scripts/sql-only-backup.py` with `args`, under `INSTALLS`.
fn backup_tool(args: &[&str]) -> std::process::Output {
    let _one = INSTALLS.lock().unwrap_or_else(|p| p.into_inner());
    let tool = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/sql-only-backup.py");
    Command::new(tool).args(args).output().unwrap()
}

fn psql_file(u: &str, file: &str) -> std::process::Output {
    let _one = INSTALLS.lock().unwrap_or_else(|p| p.into_inner());
    Command::new("psql")
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", u, "-f", file])
        .output()
        .expect("run psql")
}

/// The database the suites use has the SQL-only install, made by a role
/// that is not a superuser, with nothing of the library in it.
#[tokio::test]
async fn the_install_is_sql_only_and_was_made_by_a_non_superuser() {
    let c = connect().await;
    let flavour: String = c
        .query_one("SELECT alkblobs_flavour()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(flavour, "sql-only");
    let ext: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_extension WHERE extname = 'alkblobs'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(ext, 0, "no extension: the library flavour would have one");
    // The installer owns the schema the script created; it is no superuser
    // and no longer a member of alkblobs_owner.
    // (Since PostgreSQL 16 it keeps the membership CREATE ROLE gave it,
    // WITH ADMIN OPTION only: it may administer the role, never act as it.)
    let can_act = if server_major(&c).await >= 16 {
        "pg_has_role(r.oid, 'alkblobs_owner', 'USAGE') OR pg_has_role(r.oid, 'alkblobs_owner', 'SET')"
    } else {
        "pg_has_role(r.oid, 'alkblobs_owner', 'MEMBER')"
    };
    let r = c
        .query_one(
            &format!(
                "SELECT r.rolname::text, r.rolsuper, r.rolcreaterole, {can_act}
                   FROM pg_namespace n JOIN pg_roles r ON r.oid = n.nspowner WHERE n.nspname = 'alkblobs_registration'"
            ),
            &[],
        )
        .await
        .unwrap();
    let (who, sup, createrole, member): (String, bool, bool, bool) =
        (r.get(0), r.get(1), r.get(2), r.get(3));
    assert!(!sup, "installed by {who}, a superuser");
    assert!(createrole, "{who} has CREATEROLE");
    assert!(
        !member,
        "{who} stayed a member of alkblobs_owner after the install"
    );
    // Every routine is SQL or PL/pgSQL; no event trigger exists.
    let foreign: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
              WHERE (p.pronamespace IN ('alkblobs'::regnamespace, 'alkblobs_registration'::regnamespace)
                     OR p.proname LIKE 'alkblobs\\_%')
                AND l.lanname NOT IN ('sql', 'plpgsql')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(foreign, 0, "a routine in another language than SQL");
    let evt: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_event_trigger WHERE evtname LIKE 'alkblobs%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(evt, 0);
    let loaded: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_proc WHERE probin LIKE '%alkblobs%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(loaded, 0, "a routine of the alkblobs library");
}

/// A fresh database owned by a fresh `LOGIN CREATEROLE` role, and a plain
/// `LOGIN` role; dropped (with what they own) by `drop_fresh`.
async fn fresh_db(c: &Client, what: &str) -> (String, String, String) {
    let tag = std::process::id();
    let db = format!("alkblobs_{what}_{tag}");
    let installer = format!("alkblobs_inst_{what}_{tag}");
    let plain = format!("alkblobs_plain_{what}_{tag}");
    drop_fresh(c, &db, &installer, &plain).await;
    for sql in [
        format!("CREATE ROLE {installer} LOGIN CREATEROLE"),
        format!("CREATE ROLE {plain} LOGIN CREATEROLE"),
        format!("CREATE DATABASE {db} OWNER {installer}"),
    ] {
        c.batch_execute(&sql).await.unwrap();
    }
    administer_alkblobs_roles(c, &installer).await;
    (db, installer, plain)
}

/// The roles `role` is a member of (with whether it may administer each).
async fn memberships(c: &Client, role: &str) -> String {
    c.query_one(
        "SELECT coalesce(string_agg(m.roleid::regrole::text || ':' || m.admin_option, ',' \
                  ORDER BY m.roleid::regrole::text), '') \
           FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.member WHERE r.rolname = $1",
        &[&role],
    )
    .await
    .unwrap()
    .get(0)
}

/// The alkblobs roles are the cluster's: since PostgreSQL 16 only a role
/// with ADMIN OPTION on them may install into a further database (the
/// first installer has it; a provider gives it to another admin role).
/// What the install's hint says to do, as the test's superuser.
async fn administer_alkblobs_roles(c: &Client, role: &str) {
    if server_major(c).await < 16 {
        return;
    }
    c.batch_execute(&format!(
        "DO $$ DECLARE r text; BEGIN
           FOR r IN SELECT rolname FROM pg_roles WHERE rolname IN
                    ('alkblobs_owner', 'alkblobs_admin', 'alkblobs_writer', 'alkblobs_reader', 'alkblobs_sweeper') LOOP
             EXECUTE format('GRANT %I TO {role} WITH ADMIN OPTION, INHERIT FALSE, SET FALSE', r);
           END LOOP;
         END $$"
    ))
    .await
    .unwrap();
}

async fn drop_fresh(c: &Client, db: &str, installer: &str, plain: &str) {
    c.batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
        .await
        .unwrap();
    for role in [plain, installer] {
        c.batch_execute(&format!(
            "DO $$ BEGIN IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN \
             EXECUTE 'DROP OWNED BY {role}'; EXECUTE 'DROP ROLE {role}'; END IF; END $$"
        ))
        .await
        .unwrap();
    }
}

fn stderr_of(out: &std::process::Output) -> String {
    assert!(!out.status.success(), "the install was expected to fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The script installs into a fresh database as a fresh non-superuser
/// with CREATEROLE that owns the database; a second run, a role without
/// CREATEROLE and one that does not own the database are refused with a
/// clear error, leaving nothing half-made.
#[tokio::test]
async fn the_script_installs_as_a_createrole_role_and_refuses_twice() {
    let c = connect().await;
    let (db, installer, plain) = fresh_db(&c, "sqlonly").await;
    if server_major(&c).await >= 16 {
        // A CREATEROLE role that was not given ADMIN OPTION on the
        // cluster's alkblobs roles: refused, naming them.
        let outsider = format!("{plain}_noadmin");
        c.batch_execute(&format!(
            "CREATE ROLE {outsider} LOGIN CREATEROLE; GRANT CREATE ON DATABASE {db} TO {outsider}"
        ))
        .await
        .unwrap();
        let err = stderr_of(&psql_file(&url_as(&outsider, &db), &script()));
        c.batch_execute(&format!(
            "REVOKE CREATE ON DATABASE {db} FROM {outsider}; DROP ROLE {outsider}"
        ))
        .await
        .unwrap();
        assert!(
            err.contains("has no ADMIN OPTION on them") && err.contains("alkblobs_owner"),
            "{err}"
        );
    }
    // What follows refuses `plain` for what it lacks besides that.
    administer_alkblobs_roles(&c, &plain).await;
    // Without CREATEROLE: refused before anything is made.
    c.batch_execute(&format!("ALTER ROLE {plain} NOCREATEROLE"))
        .await
        .unwrap();
    let err = stderr_of(&psql_file(&url_as(&plain, &db), &script()));
    assert!(err.contains("needs a role with CREATEROLE"), "{err}");
    // With CREATEROLE, not owning the database: no schemas of its own…
    c.batch_execute(&format!("ALTER ROLE {plain} CREATEROLE"))
        .await
        .unwrap();
    let err = stderr_of(&psql_file(&url_as(&plain, &db), &script()));
    assert!(err.contains("needs CREATE on database"), "{err}");
    // …and, given CREATE on it, still not public's owner.
    c.batch_execute(&format!("GRANT CREATE ON DATABASE {db} TO {plain}"))
        .await
        .unwrap();
    let err = stderr_of(&psql_file(&url_as(&plain, &db), &script()));
    assert!(err.contains("needs to own schema public"), "{err}");
    let out = psql_file(&url_as(&installer, &db), &script());
    assert!(
        out.status.success(),
        "install as {installer}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = stderr_of(&psql_file(&url_as(&installer, &db), &script()));
    assert!(err.contains("schema alkblobs exists"), "{err}");
    // It works there: a pool, a put, a get, a sweep, as the installer's
    // own roles would.
    let d = connect_to(&url_as("postgres", &db)).await;
    let k = key(b"fresh");
    d.batch_execute("SELECT alkblobs_create_pool('p')")
        .await
        .unwrap();
    d.execute("SELECT alkblobs_put('p', $1, 'fresh', 'o')", &[&k])
        .await
        .unwrap();
    let v: Vec<u8> = d
        .query_one("SELECT alkblobs_get('p', $1)", &[&k])
        .await
        .unwrap()
        .get(0);
    assert_eq!(v, b"fresh");
    d.batch_execute("CALL alkblobs_sweep_all('p')")
        .await
        .unwrap();
    drop(d);
    drop_fresh(&c, &db, &installer, &plain).await;
}

/// The install's own statements resolve names in pg_catalog first, so an
/// installer whose search_path puts someone's schema before pg_catalog
/// runs none of that schema's operators.
#[tokio::test]
async fn the_install_resolves_its_names_in_pg_catalog_whatever_the_installers_search_path() {
    let c = connect().await;
    let (db, installer, plain) = fresh_db(&c, "sqlonlypath").await;
    let d = connect_to(&url_as("postgres", &db)).await;
    d.batch_execute(&format!(
        "CREATE SCHEMA trap AUTHORIZATION {plain};
         SET ROLE {plain};
         CREATE FUNCTION trap.name_eq(name, name) RETURNS boolean LANGUAGE plpgsql AS
           $$ BEGIN RAISE EXCEPTION 'trapped: the install ran an operator of schema trap'; END $$;
         CREATE OPERATOR trap.= (FUNCTION = trap.name_eq, LEFTARG = name, RIGHTARG = name);
         CREATE FUNCTION trap.text_eq(text, text) RETURNS boolean LANGUAGE plpgsql AS
           $$ BEGIN RAISE EXCEPTION 'trapped: the install ran an operator of schema trap'; END $$;
         CREATE OPERATOR trap.= (FUNCTION = trap.text_eq, LEFTARG = text, RIGHTARG = text);
         GRANT USAGE ON SCHEMA trap TO PUBLIC;
         RESET ROLE;
         ALTER ROLE {installer} IN DATABASE {db} SET search_path = trap, pg_catalog, public"
    ))
    .await
    .unwrap();
    // The trap is armed: in that search_path a plain comparison runs it.
    let probe = Command::new("psql")
        .args([
            "-X",
            "-q",
            "-d",
            &url_as(&installer, &db),
            "-c",
            "SELECT 'a'::text = 'b'::text",
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&probe.stderr).contains("trapped"));
    let out = psql_file(&url_as(&installer, &db), &script());
    assert!(
        out.status.success(),
        "install with schema trap first: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(d);
    drop_fresh(&c, &db, &installer, &plain).await;
}

/// The server cannot verify BLAKE3 here: it checks key lengths and NULLs
/// (same SQLSTATEs) and trusts the rest. A forged key is caught by every
/// client read and by `verify`; `alkblobs_key` says it cannot.
#[tokio::test]
async fn a_forged_key_is_stored_but_every_read_and_verify_catch_it() {
    let c = connect().await;
    let e = c
        .query_one("SELECT alkblobs_key('x')", &[])
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "0A000", "{e}");
    let p = pool(&c, "forged", "60 seconds", "60 seconds").await;
    let short = vec![1u8; 31];
    let e = c
        .execute("SELECT alkblobs_put($1, $2, 'v', 'o')", &[&p, &short])
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "22023", "{e}");
    let e = c
        .execute(
            "SELECT alkblobs_put_many($1, ARRAY[$2::bytea], ARRAY['v'::bytea], 'o')",
            &[&p, &short],
        )
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "22023", "{e}");
    // A key that is not the value's hash: accepted (the documented trust).
    let forged = key(b"what the key claims");
    c.execute(
        "SELECT alkblobs_put($1, $2, 'something else', 'o')",
        &[&p, &forged],
    )
    .await
    .expect("the SQL-only server trusts the writer's key");
    let honest = key(b"honest");
    c.execute("SELECT alkblobs_put($1, $2, 'honest', 'o')", &[&p, &honest])
        .await
        .unwrap();
    let store = Store::open_fleet(FleetOptions::new(url(), &p, FleetLarge::PgLo))
        .await
        .unwrap();
    let fk = Key::from_slice(&forged).unwrap();
    match store.get(&fk).await {
        Err(Error::HashMismatch { .. } | Error::Corrupt { .. }) => {}
        other => panic!("a read of a forged key returned {other:?}"),
    }
    let hk = Key::from_slice(&honest).unwrap();
    assert_eq!(store.get(&hk).await.unwrap().unwrap().as_ref(), b"honest");
    let report = store.verify().await.unwrap();
    let bad: Vec<Key> = report.corrupt.iter().map(|c| c.key).collect();
    assert_eq!(bad, vec![fk], "verify finds the forged key and only it");
}

/// A key stored with bytes that are not its hash cannot squat it unseen:
/// a put of the same key with other bytes, of any size, through any put
/// (one value, a batch, a key twice in one batch, a large object, the Rust
/// client) fails with AB005 and stores nothing; a put of the very bytes
/// stored is a plain dedup hit.
#[tokio::test]
async fn a_put_of_a_present_key_with_other_bytes_is_refused() {
    let c = connect().await;
    let p = pool(&c, "squat", "60 seconds", "60 seconds").await;
    let honest: &[u8] = b"the honest content";
    let k = key(honest);
    // The forger's bytes, once of another length and once of the same.
    c.execute("SELECT alkblobs_put($1, $2, 'short', 'o')", &[&p, &k])
        .await
        .unwrap();
    let same_len = key(b"another honest one");
    let forged_same_len = b"xxxxxxxxxxxxxxxxxx".to_vec();
    assert_eq!(forged_same_len.len(), b"another honest one".len());
    c.execute(
        "SELECT alkblobs_put($1, $2, $3, 'o')",
        &[&p, &same_len, &forged_same_len],
    )
    .await
    .unwrap();
    let new = key(b"new");
    for (present, value) in [(&k, honest), (&same_len, b"another honest one".as_slice())] {
        let e = c
            .execute(
                "SELECT alkblobs_put($1, $2, $3, 'o')",
                &[&p, present, &value],
            )
            .await
            .unwrap_err();
        assert_eq!(sqlstate(&e), "AB005", "{e}");
        let e = c
            .execute(
                "SELECT alkblobs_put_many($1, ARRAY[$2::bytea, $3], ARRAY['new'::bytea, $4], 'o')",
                &[&p, &new, present, &value],
            )
            .await
            .unwrap_err();
        assert_eq!(sqlstate(&e), "AB005", "{e}");
        let msg = e.as_db_error().unwrap().message();
        assert!(msg.contains("position 2"), "{msg}");
    }
    // Nothing of the refused batch stayed.
    let n: i64 = c
        .query_one(
            "SELECT count(*) FROM alkblobs_list($1, NULL, 100) WHERE key = $2",
            &[&p, &new],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
    // The same key twice in one batch, with two values.
    let twice = key(b"twice");
    let e = c
        .execute(
            "SELECT alkblobs_put_many($1, ARRAY[$2::bytea, $2], ARRAY['twice'::bytea, 'twicf'], 'o')",
            &[&p, &twice],
        )
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "AB005", "{e}");
    // The stored bytes again: a dedup hit, not an error.
    let present: bool = c
        .query_one("SELECT alkblobs_put($1, $2, 'short', 'o')", &[&p, &k])
        .await
        .unwrap()
        .get(0);
    assert!(!present);
    let hits: Vec<bool> = c
        .query_one(
            "SELECT alkblobs_put_many($1, ARRAY[$2::bytea, $3], ARRAY['short'::bytea, $4], 'o')",
            &[&p, &k, &same_len, &forged_same_len],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(hits, vec![false, false]);
    // A large object of the honest bytes over a forged entry, and over a
    // forged large object of the same size.
    let lo_commit = |key: Vec<u8>, bytes: Vec<u8>| {
        let p = p.clone();
        async move {
            let c = connect().await;
            c.batch_execute("BEGIN").await.unwrap();
            let o: u32 = c
                .query_one("SELECT alkblobs_lo_create($1)", &[&p])
                .await
                .unwrap()
                .get(0);
            c.execute("SELECT alkblobs_lo_write($1, 0, $2)", &[&o, &bytes])
                .await
                .unwrap();
            let r = c
                .query_one(
                    "SELECT alkblobs_lo_commit($1, $2, $3, 'o')",
                    &[&p, &key, &o],
                )
                .await
                .map(|row| row.get::<_, bool>(0));
            if r.is_ok() {
                c.batch_execute("COMMIT").await.unwrap();
            }
            r
        }
    };
    let e = lo_commit(k.clone(), honest.to_vec()).await.unwrap_err();
    assert_eq!(sqlstate(&e), "AB005", "{e}");
    let big_honest: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let big_key = key(&big_honest);
    let mut big_forged = big_honest.clone();
    big_forged[2_500_000] ^= 1; // past the first 1 MiB compared
    assert!(
        lo_commit(big_key.clone(), big_forged.clone())
            .await
            .unwrap()
    );
    let e = lo_commit(big_key.clone(), big_honest).await.unwrap_err();
    assert_eq!(sqlstate(&e), "AB005", "{e}");
    assert!(
        !lo_commit(big_key, big_forged).await.unwrap(),
        "the same bytes: a dedup hit"
    );
    // The Rust client, whose keys are always the hash, learns it as corrupt.
    let store = Store::open_fleet(FleetOptions::new(url(), &p, FleetLarge::PgLo))
        .await
        .unwrap();
    let e = store.put(honest).await.unwrap_err();
    assert_eq!(e.kind(), alkblobs::ErrorKind::Corrupt, "{e}");
}

/// The client tells the flavours apart at connect.
#[tokio::test]
async fn the_client_reports_the_flavour() {
    let db = PgPool::connect_db(&url()).await.unwrap();
    assert_eq!(db.flavour().await.unwrap(), Flavour::SqlOnly);
    let c = connect().await;
    let p = pool(&c, "flavour", "60 seconds", "60 seconds").await;
    let health = db.health(Some(&p)).await.unwrap();
    assert_eq!(health[0].flavour, Flavour::SqlOnly);
}

/// A lock on a registered table needs UPDATE here (LOCK TABLE checks it;
/// registration grants it): revoked, every sweep aborts instead of reading
/// a table whose definition it cannot hold still, and registering again
/// mends it.
#[tokio::test]
async fn a_registered_table_alkblobs_owner_cannot_lock_aborts_the_sweep() {
    let c = connect().await;
    let p = pool(&c, "nolock", "0 seconds", "60 seconds").await;
    let t = alkblobs_tests::pg::table_name(&p, "lv");
    let k = key(b"kept by the table");
    c.execute(
        "SELECT alkblobs_put($1, $2, 'kept by the table', 'o')",
        &[&p, &k],
    )
    .await
    .unwrap();
    c.batch_execute(&format!("CREATE TABLE {t} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    c.execute(&format!("INSERT INTO {t} VALUES ($1)"), &[&k])
        .await
        .unwrap();
    c.execute(
        "SELECT alkblobs_register_liveness($1, $2::text::regclass)",
        &[&p, &t],
    )
    .await
    .unwrap();
    c.execute("SELECT alkblobs_unpin($1, $2, 'o')", &[&p, &k])
        .await
        .unwrap();
    c.batch_execute(&format!("REVOKE UPDATE ON {t} FROM alkblobs_owner"))
        .await
        .unwrap();
    let r = c
        .query_one("SELECT aborted FROM alkblobs_sweep($1)", &[&p])
        .await
        .unwrap();
    assert_eq!(
        r.get::<_, Option<String>>(0).as_deref(),
        Some("liveness_table_invalid")
    );
    // Its schema's USAGE revoked: the same, and said as such (not taken
    // for a rename race, which would report the table busy).
    let schema = format!("nolock_{}", std::process::id());
    let moved = format!("{schema}.{t}");
    c.batch_execute(&format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};
         SELECT alkblobs_unregister_liveness('{p}', '{t}'::regclass);
         ALTER TABLE {t} SET SCHEMA {schema};
         GRANT USAGE ON SCHEMA {schema} TO alkblobs_owner;"
    ))
    .await
    .unwrap();
    c.execute(
        "SELECT alkblobs_register_liveness($1, $2::text::regclass)",
        &[&p, &moved],
    )
    .await
    .unwrap();
    c.batch_execute(&format!(
        "REVOKE USAGE ON SCHEMA {schema} FROM alkblobs_owner"
    ))
    .await
    .unwrap();
    let (w, warnings) = alkblobs_tests::pg::connect_collecting(&url()).await;
    let r = w
        .query_one("SELECT aborted FROM alkblobs_sweep($1)", &[&p])
        .await
        .unwrap();
    assert_eq!(
        r.get::<_, Option<String>>(0).as_deref(),
        Some("liveness_table_invalid")
    );
    let said: Vec<String> = warnings.try_iter().collect();
    let said = said.join("\n");
    assert!(said.contains("no USAGE on the table's schema"), "{said}");
    c.batch_execute(&format!(
        "GRANT USAGE ON SCHEMA {schema} TO alkblobs_owner;
         SELECT alkblobs_unregister_liveness('{p}', '{moved}'::regclass);
         ALTER TABLE {moved} SET SCHEMA public;
         DROP SCHEMA {schema};"
    ))
    .await
    .unwrap();
    c.execute(
        "SELECT alkblobs_register_liveness($1, $2::text::regclass)",
        &[&p, &t],
    )
    .await
    .unwrap();
    for _ in 0..3 {
        let r = c
            .query_one("SELECT aborted, deleted FROM alkblobs_sweep($1)", &[&p])
            .await
            .unwrap();
        assert_eq!(r.get::<_, Option<String>>(0), None);
        assert_eq!(r.get::<_, i64>(1), 0, "the table's key was deleted");
    }
    let held: i64 = c
        .query_one("SELECT count(*) FROM alkblobs_stat($1, $2)", &[&p, &k])
        .await
        .unwrap()
        .get(0);
    assert_eq!(held, 1);
}

/// One call schedules a pool's sweeps with pg_cron, as the calling login
/// role: its job runs, sweeps what is due, records scheduled sweeps in the
/// history, and the health says pg_cron schedules the pool. Unscheduling
/// removes the job.
#[tokio::test]
// INSTALLS is held across awaits: every test has its own runtime thread,
// and the other holders block only theirs.
#[allow(clippy::await_holding_lock)]
async fn pg_cron_sweeps_a_pool_scheduled_with_one_call() {
    let c = connect().await;
    let admin = login_role(&c, "cronadm", "alkblobs_admin").await;
    c.batch_execute(&format!("GRANT USAGE ON SCHEMA cron TO {admin}"))
        .await
        .unwrap();
    let a = connect_as(&admin).await;
    let p = format!("cron-{}", std::process::id());
    a.execute(
        "SELECT alkblobs_create_pool($1, '0 seconds', '60 seconds')",
        &[&p],
    )
    .await
    .unwrap();
    let gone = key(b"garbage for pg_cron");
    a.execute(
        "SELECT alkblobs_put($1, $2, 'garbage for pg_cron', 'o')",
        &[&p, &gone],
    )
    .await
    .unwrap();
    a.execute("SELECT alkblobs_unpin($1, $2, 'o')", &[&p, &gone])
        .await
        .unwrap();
    // Without a schedule (and an interval) it says how.
    let e = a
        .query_one("SELECT alkblobs_schedule_cron($1)", &[&p])
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "22023", "{e}");
    // pg_cron's launcher (1.4.2 here, and every release up to its commit
    // f677150 of September 2025) drops the job table's invalidation when a
    // burst of catalog changes overflows its shared-invalidation queue,
    // and then never starts the new job until cron.job changes again
    // (docs/operations.md, "Scheduling with pg_cron"). This binary's other
    // tests run installs and restores in parallel threads, which made that
    // burst in a CI run: none runs until the launcher, which wakes every
    // second, has read the job.
    let job: i64 = {
        let _quiet = INSTALLS.lock().unwrap_or_else(|p| p.into_inner());
        let job = a
            .query_one("SELECT alkblobs_schedule_cron($1, '1 second')", &[&p])
            .await
            .unwrap()
            .get(0);
        tokio::time::sleep(Duration::from_secs(3)).await;
        job
    };
    let r = c
        .query_one(
            "SELECT username::text, database::text, command FROM cron.job WHERE jobid = $1",
            &[&job],
        )
        .await
        .unwrap();
    assert_eq!(r.get::<_, String>(0), admin, "the job runs as its caller");
    assert_eq!(r.get::<_, String>(1), url().rsplit_once('/').unwrap().1);
    // pg_cron starts jobs on the minute: a run marks, the next one (a
    // minute later) deletes (window 0).
    let deadline = Instant::now() + Duration::from_secs(200);
    loop {
        let held: i64 = a
            .query_one("SELECT count(*) FROM alkblobs_stat($1, $2)", &[&p, &gone])
            .await
            .unwrap()
            .get(0);
        if held == 0 {
            break;
        }
        if Instant::now() >= deadline {
            panic!(
                "pg_cron never swept the pool; {}",
                cron_state(&c, job, &p).await
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let r = a
        .query_one(
            "SELECT count(*) FILTER (WHERE scheduled), count(*) FILTER (WHERE outcome <> 'ok') FROM alkblobs_sweeps WHERE pool = $1",
            &[&p],
        )
        .await
        .unwrap();
    assert!(r.get::<_, i64>(0) >= 1, "scheduled sweeps in the history");
    assert_eq!(r.get::<_, i64>(1), 0, "a scheduled sweep failed");
    let h = a
        .query_one(
            "SELECT status, scheduler, reasons FROM alkblobs_health WHERE pool = $1",
            &[&p],
        )
        .await
        .unwrap();
    assert_eq!(h.get::<_, String>(1), "pg_cron");
    assert_eq!(
        h.get::<_, String>(0),
        "ok",
        "{:?}",
        h.get::<_, Vec<String>>(2)
    );
    assert!(
        a.query_one("SELECT alkblobs_unschedule_cron($1)", &[&p])
            .await
            .unwrap()
            .get::<_, bool>(0)
    );
    assert!(
        !a.query_one("SELECT alkblobs_unschedule_cron($1)", &[&p])
            .await
            .unwrap()
            .get::<_, bool>(0)
    );
    let jobs: i64 = c
        .query_one("SELECT count(*) FROM cron.job WHERE jobid = $1", &[&job])
        .await
        .unwrap()
        .get(0);
    assert_eq!(jobs, 0);
}

/// What pg_cron and the pool say about job `job` of pool `p`: its runs,
/// the pool's schedule row and sweeps, the sessions running its command
/// (a failure's message, not an assertion).
async fn cron_state(c: &Client, job: i64, p: &str) -> String {
    let mut out = String::new();
    for (what, sql) in [
        (
            "runs",
            "SELECT string_agg(format('%s %s %s %s', runid, status, start_time, return_message), '; ' ORDER BY runid) FROM cron.job_run_details WHERE jobid = $1::bigint AND $2::text IS NOT NULL",
        ),
        (
            "schedule",
            "SELECT string_agg(format('%s %s', s.last_scheduled, s.runner), '; ') FROM alkblobs.schedule s JOIN alkblobs.pools pl ON pl.id = s.pool WHERE pl.name = $2 AND $1::bigint IS NOT NULL",
        ),
        (
            "sweeps",
            "SELECT string_agg(format('%s %s %s %s %s %s', started, scheduled, outcome, deleted, aborted, error), '; ') FROM alkblobs_sweeps WHERE pool = $2 AND $1::bigint IS NOT NULL",
        ),
        (
            "sessions",
            "SELECT string_agg(format('%s %s %s %s %s', pid, state, wait_event_type, wait_event, left(query, 80)), '; ') FROM pg_stat_activity WHERE query LIKE '%alkblobs_cron%' AND pid <> pg_backend_pid() AND $1::bigint IS NOT NULL AND $2::text IS NOT NULL",
        ),
    ] {
        let got = match c.query_one(sql, &[&job, &p]).await {
            Ok(r) => r.get::<_, Option<String>>(0).unwrap_or_default(),
            Err(e) => format!("({e})"),
        };
        out.push_str(&format!("{what}: [{got}] "));
    }
    out
}

/// A dump of a busy SQL-only install, taken and restored by its installing
/// role alone (`scripts/sql-only-backup.py`), into another database of the
/// same server — where the dump's copy of `alkblobs.incarnation` would
/// otherwise pass for this installation's and the restored pool would not
/// be adopted — after every pin lapsed: the first sweeps delete only the
/// garbage; pinned content, a registered table's content and its guard,
/// the grants and a staged row's window come back.
#[tokio::test]
async fn a_dump_restored_by_the_installer_into_another_database_keeps_what_was_protected() {
    let c = connect().await;
    let (src, installer, app) = fresh_db(&c, "bksrc").await;
    let dst = src.replace("bksrc", "bkdst");
    for sql in [
        format!("DROP DATABASE IF EXISTS {dst} WITH (FORCE)"),
        format!("CREATE DATABASE {dst} OWNER {installer}"),
        format!("ALTER ROLE {app} NOCREATEROLE"),
    ] {
        c.batch_execute(&sql).await.unwrap();
    }
    let out = psql_file(&url_as(&installer, &src), &script());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The busy pool, as its application role makes it.
    let s = connect_to(&url_as("postgres", &src)).await;
    s.batch_execute(&format!(
        "GRANT alkblobs_admin, alkblobs_writer TO {app};
         GRANT CREATE ON SCHEMA public TO {app};
         SELECT alkblobs_create_pool('p', '0 seconds', '2 seconds');
         SELECT alkblobs_create_pool('w', '1 hour', '60 seconds');
         SELECT alkblobs_grant_pool('p', '{app}', 'admin');
         SELECT alkblobs_grant_pool('w', '{app}', 'admin');"
    ))
    .await
    .unwrap();
    let a = connect_to(&url_as(&app, &src)).await;
    let (pinned, held, garbage, staged) = (
        key(b"pinned"),
        key(b"held"),
        key(b"garbage"),
        key(b"staged"),
    );
    for (k, v) in [(&pinned, "pinned"), (&held, "held"), (&garbage, "garbage")] {
        a.execute(
            "SELECT alkblobs_put('p', $1, $2::text::bytea, 'node')",
            &[k, &v],
        )
        .await
        .unwrap();
    }
    a.execute("SELECT alkblobs_put('w', $1, 'staged', 'node')", &[&staged])
        .await
        .unwrap();
    a.batch_execute(
        "CREATE TABLE refs (key bytea PRIMARY KEY);
         SELECT alkblobs_register_liveness('p', 'refs');",
    )
    .await
    .unwrap();
    a.execute("INSERT INTO refs VALUES ($1)", &[&held])
        .await
        .unwrap();
    for k in [&held, &garbage] {
        a.execute("SELECT alkblobs_unpin('p', $1, 'node')", &[k])
            .await
            .unwrap();
    }
    a.execute("SELECT alkblobs_unpin('w', $1, 'node')", &[&staged])
        .await
        .unwrap();
    // `w`'s key staged, its window an hour long.
    let r = s
        .query_one("SELECT staged FROM alkblobs_sweep('w')", &[])
        .await
        .unwrap();
    assert_eq!(r.get::<_, i64>(0), 1);
    // `pinned` is pinned at the dump (renewed just before it).
    a.execute("SELECT alkblobs_pin('p', $1, 'node')", &[&pinned])
        .await
        .unwrap();
    // Since PostgreSQL 16 a CREATEROLE role may grant only the roles it
    // has ADMIN OPTION on: on a managed server the admin role creates the
    // application's roles and has it; here the superuser made `app`.
    if server_major(&c).await >= 16 {
        c.batch_execute(&format!(
            "GRANT {app} TO {installer} WITH ADMIN OPTION, INHERIT FALSE, SET FALSE"
        ))
        .await
        .unwrap();
    }
    let before = memberships(&c, &installer).await;
    let backup = std::env::temp_dir().join(format!("alkblobs-bk-{}", std::process::id()));
    let backup = backup.to_str().unwrap();
    let ran = backup_tool(&["dump", &url_as(&installer, &src), backup]);
    assert!(
        ran.status.success(),
        "dump: {}",
        String::from_utf8_lossy(&ran.stderr)
    );
    // The installer holds no membership it did not have.
    assert_eq!(
        memberships(&c, &installer).await,
        before,
        "the dump left the installer a member of a role"
    );
    // Longer than the pin TTL: every pin has lapsed when the restore is used.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let ran = backup_tool(&["restore", backup, &url_as(&installer, &dst)]);
    assert!(
        ran.status.success(),
        "restore: {}",
        String::from_utf8_lossy(&ran.stderr)
    );
    let d = connect_to(&url_as("postgres", &dst)).await;
    let incarnations: Vec<String> = {
        let mut v = Vec::new();
        for cl in [&s, &d] {
            v.push(
                cl.query_one("SELECT id::text FROM alkblobs.incarnation", &[])
                    .await
                    .unwrap()
                    .get(0),
            );
        }
        v
    };
    assert_eq!(
        incarnations[0], incarnations[1],
        "the dump carries the row (what this test is about)"
    );
    let mut deleted = 0;
    for _ in 0..3 {
        let r = d
            .query_one("SELECT aborted, deleted FROM alkblobs_sweep('p')", &[])
            .await
            .unwrap();
        assert_eq!(r.get::<_, Option<String>>(0), None);
        deleted += r.get::<_, i64>(1);
        let r = d
            .query_one("SELECT aborted, deleted FROM alkblobs_sweep('w')", &[])
            .await
            .unwrap();
        assert_eq!(
            r.get::<_, i64>(1),
            0,
            "a staged row lost its window in the restore"
        );
    }
    assert_eq!(deleted, 1, "only the garbage goes");
    for (pool, k) in [("p", &pinned), ("p", &held), ("w", &staged)] {
        let n: i64 = d
            .query_one("SELECT count(*) FROM alkblobs_stat($1, $2)", &[&pool, k])
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 1, "a key protected at the dump is gone from {pool}");
    }
    let n: i64 = d
        .query_one(
            "SELECT count(*) FROM alkblobs.incarnation WHERE id::text <> $1",
            &[&incarnations[0]],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        n, 1,
        "the restored installation has an incarnation of its own now"
    );
    // The guard and the grants came back: the application role writes
    // through them, and a row naming nothing is refused.
    let ad = connect_to(&url_as(&app, &dst)).await;
    let e = ad
        .execute("INSERT INTO refs VALUES ($1)", &[&key(b"never put")])
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "AB002", "{e}");
    ad.execute(
        "SELECT alkblobs_put('p', $1, 'new', 'node')",
        &[&key(b"new")],
    )
    .await
    .unwrap();
    // The stale view of the old table OID went at adoption: unregistered,
    // the table drops without CASCADE.
    ad.batch_execute("SELECT alkblobs_unregister_liveness('p', 'refs'); DROP TABLE refs")
        .await
        .unwrap();
    drop((a, s, d, ad));
    for f in ["dump", "roles.sql", "owners", "list"] {
        let _ = std::fs::remove_file(format!("{backup}.{f}"));
    }
    c.batch_execute(&format!("DROP DATABASE {dst} WITH (FORCE)"))
        .await
        .unwrap();
    drop_fresh(&c, &src, &installer, &app).await;
}
