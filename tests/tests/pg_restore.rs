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

#![cfg(feature = "pg")]

use std::process::Command;

use alkblobs_tests::copies::{
    as_pg, check_copy, conn, fill, owned_database, recreate_db, run, with_db,
};
use alkblobs_tests::pg::{key, sqlstate, url};
use tokio_postgres::Client;

/// A client program of the source cluster's major (`ALKBLOBS_PG_BIN`, its
/// bin directory; Debian's PostgreSQL 15 unless set): the dump is taken
/// with the source's own `pg_dump`. (pg_dump 17.11 and 18.6 dumping a
/// PostgreSQL 15.20 server write its `pg_attver` attribute options, which
/// 17 and 18 refuse: docs/operations.md, "Dump and restore".)
fn bin(program: &str) -> String {
    let dir = std::env::var("ALKBLOBS_PG_BIN")
        .unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".to_owned());
    format!("{dir}/{program}")
}

/// A client program of the target cluster's major (`ALKBLOBS_PG_BIN_OTHER`;
/// the source's unless set): the restore runs with the target's
/// `pg_restore` and `psql`, its base backup with its `pg_basebackup`.
fn target_bin(program: &str) -> String {
    match std::env::var("ALKBLOBS_PG_BIN_OTHER") {
        Ok(dir) => format!("{dir}/{program}"),
        Err(_) => bin(program),
    }
}

fn other_url() -> String {
    std::env::var("ALKBLOBS_PG_URL_OTHER").unwrap_or_else(|_| {
        panic!(
            "ALKBLOBS_PG_URL_OTHER is not set: the restore suite needs a second cluster \
             (scripts/test.sh starts one: ALKBLOBS_PG_PRELOAD=0 ALKBLOBS_PG_PORT=54330 scripts/pg-cluster.sh start)"
        )
    })
}

struct Cleanup(Vec<(String, String)>);
impl Drop for Cleanup {
    fn drop(&mut self) {
        for (u, sql) in &self.0 {
            let _ = Command::new(bin("psql"))
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
        recreate_db(c, db).await;
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

    // The source's transaction counter well ahead of the target's (as it
    // is for a busy database moved to a new cluster), so that the upload's
    // transaction id below is in the target's future.
    let ahead: i64 = dst
        .query_one(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::int8 + 20000",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    s.batch_execute(&format!(
        "DO $$ BEGIN
           WHILE pg_snapshot_xmax(pg_current_snapshot())::text::int8 < {ahead} LOOP
             PERFORM pg_current_xact_id(); COMMIT;
           END LOOP;
         END $$"
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
    // (Its grant stays: a restore without the role must still load every
    // other grant, and this one's row.)
    let upload_xact: String = s
        .query_one("SELECT max(xact)::text FROM alkblobs.uploads", &[])
        .await
        .unwrap()
        .get(0);

    // Move it: roles first, then the database.
    let dump = tempfile::NamedTempFile::new().unwrap();
    let roles = run(Command::new(bin("pg_dumpall"))
        .args(["-r", "--no-role-passwords", "-d"])
        .arg(url()));
    let roles_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(roles_file.path(), roles).unwrap();
    // (Roles the target already has fail to be created again: expected.)
    Command::new(target_bin("psql"))
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
    run(Command::new(bin("pg_dump"))
        .args(["-Fc", "-f"])
        .arg(dump.path())
        .arg(with_db(&url(), &src_db, "postgres")));
    // The restore takes longer than the pin TTL (2 s) and the window (3 s).
    std::thread::sleep(std::time::Duration::from_millis(3500));
    run(Command::new(target_bin("pg_restore"))
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
    assert_eq!(
        grants,
        vec![
            (gone.clone(), "write".to_owned()),
            (writer.clone(), "write".to_owned())
        ],
        "one missing grantee costs no other grant"
    );
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
    // A pool whose owner role does not exist (restored without it): the
    // owner's name is nobody — refused, never an error — and the grantees
    // keep their access.
    d.batch_execute(&format!(
        "UPDATE alkblobs.pools SET owner = 'r_no_such_{id}' WHERE name = 'busy'"
    ))
    .await
    .unwrap();
    let e = od
        .query_one("SELECT count(*) FROM alkblobs_list('busy')", &[])
        .await
        .expect_err("the former owner's name no longer owns it");
    assert_eq!(sqlstate(&e), "42501", "{e}");
    wd.batch_execute("SELECT alkblobs_renew('busy', 'w')")
        .await
        .expect("a grantee writes to a pool whose owner is missing");
    let v: Option<Vec<u8>> = wd
        .query_one(
            "SELECT alkblobs_get('busy', alkblobs_key('by writer'))",
            &[],
        )
        .await
        .expect("and reads")
        .get(0);
    assert_eq!(v.as_deref(), Some(&b"by writer"[..]));
    d.batch_execute(&format!(
        "UPDATE alkblobs.pools SET owner = '{owner}' WHERE name = 'busy'"
    ))
    .await
    .unwrap();

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

/// A dump of the previous release (0.7.0, which stored roles by OID) in
/// both formats pg_dump writes — custom through pg_restore, plain through
/// psql — restored into a fresh database of the same cluster with this
/// version: large objects come back whole, the guard triggers (which name
/// 0.7.0's function) still guard, the owner's pins renew, and the first
/// sweep deletes nothing protected although the restore took longer than
/// the TTL and the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previous_release_dumps_in_both_formats_restore_into_this_one() {
    let id = std::process::id();
    let src_db = format!("prev_src_{id}");
    let owner = format!("prev_owner_{id}");
    let admin = conn(&url()).await;
    let mut cleanup = vec![(
        url(),
        format!("DROP DATABASE IF EXISTS {src_db} WITH (FORCE)"),
    )];
    let _s = owned_database(&admin, &url(), &src_db, &owner, Some("0.7.0")).await;
    let big = fill(&url(), &src_db, &owner).await;
    let dir = tempfile::tempdir().unwrap();
    let (custom, plain) = (dir.path().join("p.dump"), dir.path().join("p.sql"));
    run(Command::new(bin("pg_dump"))
        .args(["-Fc", "-f"])
        .arg(&custom)
        .arg(with_db(&url(), &src_db, "postgres")));
    run(Command::new(bin("pg_dump"))
        .args(["-Fp", "-f"])
        .arg(&plain)
        .arg(with_db(&url(), &src_db, "postgres")));
    // The restore takes longer than the TTL and the window.
    std::thread::sleep(std::time::Duration::from_millis(3500));
    for format in ["custom", "plain"] {
        let db = format!("prev_{format}_{id}");
        cleanup.push((url(), format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)")));
        recreate_db(&admin, &db).await;
        if format == "custom" {
            run(Command::new(bin("pg_restore"))
                .args(["--exit-on-error", "-d"])
                .arg(with_db(&url(), &db, "postgres"))
                .arg(&custom));
        } else {
            run(Command::new(bin("psql"))
                .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d"])
                .arg(with_db(&url(), &db, "postgres"))
                .arg("-f")
                .arg(&plain));
        }
        check_copy(
            &url(),
            &db,
            &owner,
            &big,
            &format!("0.7.0 dump, {format} format"),
        )
        .await;
    }
    cleanup.push((url(), format!("DROP ROLE IF EXISTS {owner}")));
    drop(Cleanup(cleanup));
}

/// A physical backup (`pg_basebackup` of the second cluster) started as a
/// cluster of its own more than a TTL and a window later: a new server
/// start, so the pool's first use gives its pins a fresh TTL and its marks
/// a fresh window, and everything protected when the backup was taken is
/// still there after the first sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_base_backup_started_later_keeps_every_protected_key() {
    let id = std::process::id();
    let db = format!("bb_src_{id}");
    let owner = format!("bb_owner_{id}");
    let other = other_url();
    let admin = conn(&other).await;
    let s = owned_database(&admin, &other, &db, &owner, None).await;
    let big = fill(&other, &db, &owner).await;

    // The backup, as the postgres user (the cluster's files are its).
    let base = std::path::PathBuf::from(format!("/tmp/alkblobs-bb-{id}"));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    run(Command::new("chown").arg("postgres:postgres").arg(&base));
    let data = base.join("data");
    let port = other
        .rsplit_once(':')
        .unwrap()
        .1
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    run(&mut as_pg(&[
        &target_bin("pg_basebackup"),
        "-D",
        data.to_str().unwrap(),
        "-X",
        "stream",
        "-d",
        &format!("host=127.0.0.1 port={port} user=postgres"),
    ]));
    struct StopCopy(std::path::PathBuf);
    impl Drop for StopCopy {
        fn drop(&mut self) {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", &target_bin("pg_ctl"), "-D"])
                .arg(self.0.join("data"))
                .args(["-m", "immediate", "-w", "stop"]);
            let _ = c.output();
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _stop = StopCopy(base.clone());
    // Started later than a TTL and a window, on a port of its own.
    std::thread::sleep(std::time::Duration::from_millis(3500));
    let copy_port = 54336;
    let sock = base.join("sock");
    run(&mut as_pg(&["mkdir", "-p", sock.to_str().unwrap()]));
    let conf = data.join("postgresql.conf");
    let mut text = std::fs::read_to_string(&conf).unwrap();
    text.push_str(&format!(
        "\nport = {copy_port}\nunix_socket_directories = '{}'\n",
        sock.display()
    ));
    std::fs::write(&conf, text).unwrap();
    let started = as_pg(&[
        &target_bin("pg_ctl"),
        "-D",
        data.to_str().unwrap(),
        "-l",
        base.join("server.log").to_str().unwrap(),
        "-w",
        "-t",
        "60",
        "start",
    ])
    .output()
    .unwrap();
    assert!(
        started.status.success(),
        "the base backup's server did not start: {}\nits log:\n{}",
        String::from_utf8_lossy(&started.stderr),
        std::fs::read_to_string(base.join("server.log")).unwrap_or_default()
    );
    let copy = format!("postgresql://postgres@127.0.0.1:{copy_port}/{db}");
    check_copy(&copy, &db, &owner, &big, "a base backup").await;
    drop(s);
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
        .await
        .unwrap();
    admin
        .batch_execute(&format!("DROP ROLE IF EXISTS {owner}"))
        .await
        .unwrap();
}
