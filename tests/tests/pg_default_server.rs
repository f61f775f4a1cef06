//! The extension on a server nobody reconfigured: no
//! `shared_preload_libraries`, no `alkblobs.*` settings. The test script
//! starts a second cluster so (`ALKBLOBS_PG_PRELOAD=0 scripts/pg-cluster.sh`)
//! and points `ALKBLOBS_PG_URL` at it; the suite fails on a server that
//! preloads the library, so it cannot pass against the wrong one.
//!
//! Until 0.8.0 the library defined a postmaster-only setting whenever it was
//! loaded, and PostgreSQL answers that after startup with a FATAL error:
//! `CREATE EXTENSION alkblobs` killed the session on such a server.

#![cfg(feature = "pg")]

use std::time::Duration;

use alkblobs_tests::pg::{connect, key, server_major, sqlstate, url};
use tokio_postgres::Client;

/// The URL of database `name` on the test server.
fn db_url(name: &str) -> String {
    let u = url();
    format!("{}/{name}", u.rsplit_once('/').unwrap().0)
}

/// A connection to database `name` and the notices it receives.
async fn connect_collecting(name: &str) -> (Client, std::sync::mpsc::Receiver<String>) {
    alkblobs_tests::pg::connect_collecting(&db_url(name)).await
}

fn drain(rx: &std::sync::mpsc::Receiver<String>) -> Vec<String> {
    std::iter::from_fn(|| rx.recv_timeout(Duration::from_millis(500)).ok()).collect()
}

/// A fresh database on the test server (dropped by the returned guard).
async fn fresh_database(c: &Client, tag: &str) -> DropDb {
    let name = format!("alkblobs_default_{tag}_{}", std::process::id());
    c.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .await
        .unwrap();
    c.batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    DropDb(name)
}

struct DropDb(String);
impl Drop for DropDb {
    fn drop(&mut self) {
        let _ = std::process::Command::new("psql")
            .args(["-X", "-q", &url(), "-c"])
            .arg(format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.0))
            .output();
    }
}

async fn assert_not_preloading(c: &Client) {
    let preload: String = c
        .query_one("SHOW shared_preload_libraries", &[])
        .await
        .unwrap()
        .get(0);
    assert!(
        !preload.contains("alkblobs"),
        "this suite needs a server that does not preload alkblobs (shared_preload_libraries = {preload:?}); \
         scripts/test.sh starts one with ALKBLOBS_PG_PRELOAD=0"
    );
}

/// The tests that create the extension in a fresh database, one at a
/// time: one of them makes alkblobs_owner (a cluster-wide role) unfit for
/// a while.
static CREATING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_extension_works_on_a_server_that_does_not_preload_and_says_scheduling_is_off() {
    let _one = CREATING.lock().await;
    let admin = connect().await;
    assert_not_preloading(&admin).await;
    let db = fresh_database(&admin, "create").await;
    let (c, notices) = connect_collecting(&db.0).await;
    c.batch_execute("CREATE EXTENSION alkblobs")
        .await
        .expect("CREATE EXTENSION alkblobs on a server that does not preload the library");
    let said = drain(&notices);
    assert!(
        said.iter().any(|n| n.starts_with("WARNING")
            && n.contains("scheduled sweeps are off")
            && n.contains("shared_preload_libraries")),
        "CREATE EXTENSION says that scheduling is off: {said:?}"
    );
    // The session survived (the defect killed it at FATAL level).
    let one: i32 = c.query_one("SELECT 1", &[]).await.unwrap().get(0);
    assert_eq!(one, 1);
    let v: String = c
        .query_one(
            "SELECT extversion FROM pg_extension WHERE extname = 'alkblobs'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(v, alkblobs::backend::postgres::EXTENSION_VERSION);

    // A new session loads the library on its own, explicitly too, and
    // sees the reloadable settings; the postmaster-only one does not exist.
    let (c2, _n2) = connect_collecting(&db.0).await;
    c2.batch_execute("LOAD 'alkblobs'")
        .await
        .expect("LOAD 'alkblobs'");
    let enabled: String = c2
        .query_one("SHOW alkblobs.scheduler_enabled", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(enabled, "on");
    let dbs: Option<String> = c2
        .query_one(
            "SELECT current_setting('alkblobs.scheduler_databases', true)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(dbs, None);

    // A pool with a schedule: the notice and the health row say why
    // nothing runs it.
    c.batch_execute(
        "SELECT alkblobs_create_pool('sched', delete_window => '0', sweep_every => '1 minute')",
    )
    .await
    .unwrap();
    let said = drain(&notices);
    assert!(
        said.iter()
            .any(|n| n.contains("scheduling is off")
                && n.contains("not in shared_preload_libraries")),
        "{said:?}"
    );
    let r = c
        .query_one(
            "SELECT scheduler, status, reasons FROM alkblobs_health WHERE pool = 'sched'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(r.get::<_, String>(0), "off");
    assert_eq!(r.get::<_, String>(1), "warn");
    let reasons: Vec<String> = r.get(2);
    assert!(
        reasons.iter().any(|x| x.contains("scheduling is off")
            && x.contains("the alkblobs library is not in shared_preload_libraries")),
        "{reasons:?}"
    );

    // Everything but scheduling works: a put, an unpin, a sweep from psql
    // that collects, and the Rust functions (hashing, locking for a sweep).
    let k = key(b"on a default server");
    c.execute(
        "SELECT alkblobs_put('sched', $1, 'on a default server', 'o')",
        &[&k],
    )
    .await
    .unwrap();
    c.execute("SELECT alkblobs_unpin('sched', $1, 'o')", &[&k])
        .await
        .unwrap();
    c.batch_execute("CALL alkblobs_sweep_all('sched')")
        .await
        .unwrap();
    let left: i64 = c
        .query_one("SELECT count(*) FROM alkblobs_list('sched')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "a manual sweep collects on a default server");
    // Nothing swept it on its own: every sweep in the history is ours.
    let scheduled: i64 = c
        .query_one(
            "SELECT count(*) FROM alkblobs_sweeps WHERE pool = 'sched' AND scheduled",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(scheduled, 0);
    drop(c);
    drop(c2);
}

/// alkblobs_owner owns every table and definer function of the extension:
/// `CREATE EXTENSION` refuses while a role may use its privileges (a
/// member with INHERIT or SET), naming it; since PostgreSQL 16 a member
/// WITH ADMIN OPTION only (what CREATE ROLE gives a non-superuser creator:
/// the SQL-only installer) may administer it and never act as it, and the
/// extension installs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_extension_refuses_while_a_role_can_act_as_alkblobs_owner() {
    let _one = CREATING.lock().await;
    let admin = connect().await;
    let db = fresh_database(&admin, "ownermember").await;
    let member = format!("alkblobs_owner_member_{}", std::process::id());
    admin
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {member}; CREATE ROLE {member};
             DO $$ BEGIN
               IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'alkblobs_owner') THEN
                 CREATE ROLE alkblobs_owner NOLOGIN;
               END IF;
             END $$;
             GRANT alkblobs_owner TO {member};"
        ))
        .await
        .unwrap();
    let (c, _) = connect_collecting(&db.0).await;
    let refused = c.batch_execute("CREATE EXTENSION alkblobs").await;
    let major = server_major(&admin).await;
    if major >= 16 {
        admin
            .batch_execute(&format!(
                "REVOKE alkblobs_owner FROM {member};
                 GRANT alkblobs_owner TO {member} WITH ADMIN OPTION, INHERIT FALSE, SET FALSE;"
            ))
            .await
            .unwrap();
    } else {
        admin
            .batch_execute(&format!("REVOKE alkblobs_owner FROM {member}"))
            .await
            .unwrap();
    }
    let installed = c.batch_execute("CREATE EXTENSION alkblobs").await;
    admin
        .batch_execute(&format!(
            "REVOKE alkblobs_owner FROM {member}; DROP ROLE {member}"
        ))
        .await
        .unwrap();
    let e = refused.expect_err("CREATE EXTENSION with a member acting as alkblobs_owner");
    assert_eq!(sqlstate(&e), "42501", "{e}");
    let msg = e
        .as_db_error()
        .map(|d| d.message().to_owned())
        .unwrap_or_default();
    assert!(msg.contains(&member), "the refusal names the member: {msg}");
    installed.unwrap_or_else(|e| {
        panic!("CREATE EXTENSION with an ADMIN-only member (PostgreSQL {major}) or none: {e}")
    });
}
