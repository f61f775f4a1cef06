//! `pg_dump` of a database with busy pools, restored into another cluster
//! (`ALKBLOBS_PG_URL` is the source, `ALKBLOBS_PG_URL_OTHER` the target:
//! the test script's second cluster), as an operator moves a database:
//! `pg_dumpall -r` for the roles, `pg_dump -Fc`, `pg_restore`.
//!
//! The target's roles get other OIDs than the source's, so whatever the
//! extension stores by OID lands on the wrong role (until 0.8.0 a pool's
//! owner, its grants and its pins did); and its transaction counter is
//! elsewhere, so an upload row's transaction id from the source means
//! nothing there (until 0.8.0 one in the target's future made every sweep,
//! `alkblobs_usage` and `alkblobs_health` fail with 22023). And the restore
//! takes longer than the pool's pin TTL and window: the first sweep after
//! it must still delete nothing that was protected at the dump.

use std::process::Command;

use alkblobs_tests::pg::{key, sqlstate, url};
use tokio_postgres::{Client, NoTls};

const BIN: &str = "/usr/lib/postgresql/15/bin";

fn other_url() -> String {
    std::env::var("ALKBLOBS_PG_URL_OTHER").unwrap_or_else(|_| {
        panic!(
            "ALKBLOBS_PG_URL_OTHER is not set: the restore suite needs a second cluster \
             (scripts/test.sh starts one: ALKBLOBS_PG_PRELOAD=0 ALKBLOBS_PG_PORT=54330 scripts/pg-cluster.sh start)"
        )
    })
}

/// `base` (a database URL) with database `db` and user `user`.
fn with_db(base: &str, db: &str, user: &str) -> String {
    base.rsplit_once('/')
        .unwrap()
        .0
        .replacen("postgres@", &format!("{user}@"), 1)
        + "/"
        + db
}

async fn conn(u: &str) -> Client {
    let (client, c) = tokio_postgres::connect(u, NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {u}: {e}"));
    tokio::spawn(async move {
        let _ = c.await;
    });
    client
}

fn run(cmd: &mut Command) -> String {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

struct Cleanup(Vec<(String, String)>);
impl Drop for Cleanup {
    fn drop(&mut self) {
        for (u, sql) in &self.0 {
            let _ = Command::new(format!("{BIN}/psql"))
                .args(["-X", "-q", u, "-c", sql])
                .output();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_into_another_cluster_keeps_owners_grants_pins_and_sweeps_at_once() {
    let id = std::process::id();
    let (src_db, dst_db) = (format!("restore_src_{id}"), format!("restore_dst_{id}"));
    let (owner, writer, admin, gone) = (
        format!("r_owner_{id}"),
        format!("r_writer_{id}"),
        format!("r_admin_{id}"),
        format!("r_gone_{id}"),
    );
    let src = conn(&url()).await;
    let dst = conn(&other_url()).await;
    let _cleanup = Cleanup(vec![
        (
            url(),
            format!("DROP DATABASE IF EXISTS {src_db} WITH (FORCE)"),
        ),
        (
            other_url(),
            format!("DROP DATABASE IF EXISTS {dst_db} WITH (FORCE)"),
        ),
    ]);
    for (c, db) in [(&src, &src_db), (&dst, &dst_db)] {
        c.batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
            .await
            .unwrap();
        c.batch_execute(&format!("CREATE DATABASE {db}"))
            .await
            .unwrap();
    }
    src.batch_execute(&format!(
        "CREATE EXTENSION IF NOT EXISTS alkblobs;
         DROP ROLE IF EXISTS {owner}; DROP ROLE IF EXISTS {writer}; DROP ROLE IF EXISTS {admin};
         DROP ROLE IF EXISTS {gone};
         CREATE ROLE {admin} LOGIN IN ROLE alkblobs_admin;
         CREATE ROLE {gone} LOGIN IN ROLE alkblobs_writer;
         CREATE ROLE {writer} LOGIN IN ROLE alkblobs_writer;
         CREATE ROLE {owner} LOGIN IN ROLE alkblobs_admin;"
    ))
    .await
    .unwrap();
    let s = conn(&with_db(&url(), &src_db, "postgres")).await;
    s.batch_execute(&format!(
        "CREATE EXTENSION alkblobs; GRANT CREATE ON SCHEMA public TO {owner}"
    ))
    .await
    .unwrap();

    // The owner's busy pool: a pinned entry, an entry a liveness row holds,
    // garbage, a write grant, and an upload abandoned after its commit.
    let o = conn(&with_db(&url(), &src_db, &owner)).await;
    o.batch_execute(&format!(
        "SELECT alkblobs_create_pool('busy', delete_window => '0', pin_ttl => '2 seconds');
         SELECT alkblobs_grant_pool('busy', '{writer}', 'write');
         SELECT alkblobs_put('busy', alkblobs_key('pinned'), 'pinned', 'inst1');
         SELECT alkblobs_put('busy', alkblobs_key('held'), 'held', 'tmp');
         SELECT alkblobs_put('busy', alkblobs_key('garbage'), 'garbage', 'tmp');
         CREATE TABLE docs (key bytea PRIMARY KEY, name text);
         SELECT alkblobs_register_liveness('busy', 'docs');
         INSERT INTO docs VALUES (alkblobs_key('held'), 'a document');
         SELECT alkblobs_unpin_all('busy', 'tmp');
         BEGIN; SELECT alkblobs_lo_create('busy'); COMMIT;
         SELECT alkblobs_create_pool('windowed', delete_window => '3 seconds');
         SELECT alkblobs_put('windowed', alkblobs_key('in its window'), 'in its window', 'tmp');
         SELECT alkblobs_unpin_all('windowed', 'tmp');
         SELECT * FROM alkblobs_sweep('windowed');"
    ))
    .await
    .unwrap();
    let staged: i64 = o
        .query_one(
            "SELECT count(*) FROM alkblobs_staged WHERE pool = 'windowed' AND NOT due",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(staged, 1, "staged, in its window, when the dump is taken");
    // The pin renews until the dump, then nothing renews it.
    let renewed: i64 = o
        .query_one("SELECT alkblobs_renew('busy', 'inst1')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(renewed, 1);
    // A pin of a role the target will not have.
    o.batch_execute(&format!(
        "SELECT alkblobs_grant_pool('busy', '{gone}', 'write')"
    ))
    .await
    .unwrap();
    let g = conn(&with_db(&url(), &src_db, &gone)).await;
    g.batch_execute("SELECT alkblobs_put('busy', alkblobs_key('pinned by a gone role'), 'pinned by a gone role', 'g')")
        .await
        .unwrap();
    drop(g);
    o.batch_execute(&format!(
        "SELECT alkblobs_revoke_pool('busy', '{gone}', 'write')"
    ))
    .await
    .unwrap();
    let upload_xact: String = s
        .query_one("SELECT max(xact)::text FROM alkblobs.uploads", &[])
        .await
        .unwrap()
        .get(0);

    // Move it: roles first, then the database.
    let dump = tempfile::NamedTempFile::new().unwrap();
    let roles = run(Command::new(format!("{BIN}/pg_dumpall"))
        .args(["-r", "--no-role-passwords", "-d"])
        .arg(url()));
    let roles_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(roles_file.path(), roles).unwrap();
    // (Roles the target already has fail to be created again: expected.)
    Command::new(format!("{BIN}/psql"))
        .args(["-X", "-q", "-d"])
        .arg(with_db(&other_url(), "postgres", "postgres"))
        .arg("-f")
        .arg(roles_file.path())
        .output()
        .unwrap();
    // That role is missing in the target (the operator dropped it, or did
    // not move it): its pin must still load, and protect.
    dst.batch_execute(&format!("DROP ROLE IF EXISTS {gone}"))
        .await
        .unwrap();
    run(Command::new(format!("{BIN}/pg_dump"))
        .args(["-Fc", "-f"])
        .arg(dump.path())
        .arg(with_db(&url(), &src_db, "postgres")));
    // The restore takes longer than the pin TTL (2 s) and the window (3 s).
    std::thread::sleep(std::time::Duration::from_millis(3500));
    run(Command::new(format!("{BIN}/pg_restore"))
        .args(["--exit-on-error", "-d"])
        .arg(with_db(&other_url(), &dst_db, "postgres"))
        .arg(dump.path()));

    // The premises that make this a test: the roles have other OIDs in
    // the target, and the upload's transaction is in the target's future.
    assert_ne!(
        oid_of(&src, &owner).await,
        oid_of(&dst, &owner).await,
        "the owner role has the same OID in both clusters: the test proves nothing"
    );
    let d = conn(&with_db(&other_url(), &dst_db, "postgres")).await;
    let future: bool = d
        .query_one(
            "SELECT $1::text::xid8 >= pg_snapshot_xmax(pg_current_snapshot())",
            &[&upload_xact],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        future,
        "the restored upload's transaction id {upload_xact} is not in the target's future: the test proves nothing"
    );

    // Every role identity is the same role, by name.
    let r = d
        .query_one("SELECT owner FROM alkblobs_pools WHERE pool = 'busy'", &[])
        .await
        .unwrap();
    assert_eq!(r.get::<_, String>(0), owner);
    let grants: Vec<(String, String)> = d
        .query(
            "SELECT grantee, access FROM alkblobs_pool_grants WHERE pool = 'busy' ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(grants, vec![(writer.clone(), "write".to_owned())]);
    let pins: Vec<(String, String)> = d
        .query(
            "SELECT role, owner FROM alkblobs_pins WHERE pool = 'busy' ORDER BY 2",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        pins,
        vec![
            (gone.clone(), "g".to_owned()),
            (owner.clone(), "inst1".to_owned())
        ]
    );

    // Access follows: the owner renews its pins, the writer writes, an
    // admin who is neither is refused.
    let od = conn(&with_db(&other_url(), &dst_db, &owner)).await;
    let renewed: i64 = od
        .query_one("SELECT alkblobs_renew('busy', 'inst1')::int8", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        renewed, 1,
        "the owner's pin renews after a restore that took longer than its TTL"
    );
    let wd = conn(&with_db(&other_url(), &dst_db, &writer)).await;
    wd.batch_execute("SELECT alkblobs_put('busy', alkblobs_key('by writer'), 'by writer', 'w')")
        .await
        .expect("the writer's grant survives");
    let ad = conn(&with_db(&other_url(), &dst_db, &admin)).await;
    let e = ad
        .query_one("SELECT count(*) FROM alkblobs_list('busy')", &[])
        .await
        .expect_err("an admin without a grant reads nothing");
    assert_eq!(sqlstate(&e), "42501", "{e}");

    // The restored pool reports and sweeps at once: the abandoned upload
    // is reaped, the garbage goes, the pinned and the held entries stay,
    // and the restored guard refuses a row naming absent content.
    let abandoned: i64 = d
        .query_one(
            "SELECT uploads_abandoned FROM alkblobs_usage WHERE pool = 'busy'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(abandoned, 1);
    let status: String = d
        .query_one(
            "SELECT status FROM alkblobs_health WHERE pool = 'busy'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "ok");
    d.batch_execute("CALL alkblobs_sweep_all('busy')")
        .await
        .unwrap();
    let reaped: i64 = d
        .query_one(
            "SELECT sum(uploads_reaped)::int8 FROM alkblobs_sweeps WHERE pool = 'busy'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(reaped, 1);
    let left: Vec<Vec<u8>> = d
        .query("SELECT key FROM alkblobs_list('busy') ORDER BY key", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut want = vec![
        key(b"pinned"),
        key(b"held"),
        key(b"by writer"),
        key(b"pinned by a gone role"),
    ];
    want.sort();
    assert_eq!(left, want, "exactly the garbage went");
    // The staged row whose window had not ended at the dump has a whole
    // window again.
    d.batch_execute("CALL alkblobs_sweep_all('windowed')")
        .await
        .unwrap();
    let kept: i64 = d
        .query_one(
            "SELECT count(*) FROM alkblobs_staged WHERE pool = 'windowed' AND NOT due",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(kept, 1, "the restored staged row got a fresh window");
    let e = od
        .batch_execute("INSERT INTO docs VALUES (alkblobs_key('never put'), 'x')")
        .await
        .expect_err("the restored guard refuses a row naming absent content");
    assert_eq!(sqlstate(&e), "AB002", "{e}");
    for c in [&src] {
        c.batch_execute(&format!("DROP DATABASE IF EXISTS {src_db} WITH (FORCE)"))
            .await
            .unwrap();
    }
    drop((o, s, od, wd, ad, d));
    dst.batch_execute(&format!("DROP DATABASE IF EXISTS {dst_db} WITH (FORCE)"))
        .await
        .unwrap();
    for c in [&src, &dst] {
        c.batch_execute(&format!(
            "DROP ROLE IF EXISTS {owner}; DROP ROLE IF EXISTS {writer}; DROP ROLE IF EXISTS {admin}; DROP ROLE IF EXISTS {gone}"
        ))
        .await
        .unwrap();
    }
}

async fn oid_of(c: &Client, role: &str) -> i64 {
    c.query_one(
        "SELECT oid::int8 FROM pg_roles WHERE rolname = $1",
        &[&role],
    )
    .await
    .unwrap()
    .get(0)
}
