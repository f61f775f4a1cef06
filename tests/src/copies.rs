//! Copies of a database as operators make them (a dump restored, a base
//! backup started, a cluster moved by `pg_upgrade`): a pool put through
//! its paces before ([`fill`]) and what must hold in the copy after
//! ([`check_copy`]). Used by the `pg_restore` and `pg_upgrade` suites.

use std::process::Command;

use tokio_postgres::{Client, NoTls};

use crate::pg::{key, sqlstate};

/// `base` (a database URL) with database `db` and user `user`.
pub fn with_db(base: &str, db: &str, user: &str) -> String {
    base.rsplit_once('/')
        .unwrap()
        .0
        .replacen("postgres@", &format!("{user}@"), 1)
        + "/"
        + db
}

/// A connection to `u`, its driver spawned.
pub async fn conn(u: &str) -> Client {
    let (client, c) = tokio_postgres::connect(u, NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {u}: {e}"));
    tokio::spawn(async move {
        let _ = c.await;
    });
    client
}

/// Runs `cmd` to success (or panics with its stderr); its stdout.
pub fn run(cmd: &mut Command) -> String {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Drops database `db` (if there) and creates it afresh, through `c`.
pub async fn recreate_db(c: &Client, db: &str) {
    c.batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
        .await
        .unwrap();
    c.batch_execute(&format!("CREATE DATABASE {db}"))
        .await
        .unwrap();
}

/// A fresh login role `owner` in alkblobs_admin on `c`'s cluster and a
/// fresh database `db` there with the extension (at `version`, or the
/// default) and `owner` allowed to create tables in it; returns a
/// superuser connection to `db`.
pub async fn owned_database(
    c: &Client,
    base: &str,
    db: &str,
    owner: &str,
    version: Option<&str>,
) -> Client {
    c.batch_execute(&format!(
        "CREATE EXTENSION IF NOT EXISTS alkblobs;
         DROP ROLE IF EXISTS {owner}; CREATE ROLE {owner} LOGIN IN ROLE alkblobs_admin"
    ))
    .await
    .unwrap();
    recreate_db(c, db).await;
    let s = conn(&with_db(base, db, "postgres")).await;
    let version = version
        .map(|v| format!(" VERSION '{v}'"))
        .unwrap_or_default();
    s.batch_execute(&format!(
        "CREATE EXTENSION alkblobs{version}; GRANT CREATE ON SCHEMA public TO {owner}"
    ))
    .await
    .unwrap();
    s
}

/// A pool put through its paces in database `db` at `base` (as its owner
/// `owner`): a kv entry and a large object pinned by `inst`, an entry a
/// liveness row holds, garbage, an entry staged in a 3 s window. Pin TTL
/// 2 s. Returns the large object's bytes.
pub async fn fill(base: &str, db: &str, owner: &str) -> Vec<u8> {
    let o = conn(&with_db(base, db, owner)).await;
    o.batch_execute(
        "SELECT alkblobs_create_pool('p', delete_window => '3 seconds', pin_ttl => '2 seconds');
         SELECT alkblobs_put('p', alkblobs_key('pinned'), 'pinned', 'inst');
         SELECT alkblobs_put('p', alkblobs_key('held'), 'held', 'tmp');
         SELECT alkblobs_put('p', alkblobs_key('staged'), 'staged', 'tmp');
         CREATE TABLE refs (key bytea PRIMARY KEY);
         SELECT alkblobs_register_liveness('p', 'refs');
         INSERT INTO refs VALUES (alkblobs_key('held'));
         SELECT alkblobs_unpin_all('p', 'tmp');
         SELECT * FROM alkblobs_sweep('p');",
    )
    .await
    .unwrap();
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 239) as u8).collect();
    o.batch_execute("BEGIN").await.unwrap();
    let loid: u32 = o
        .query_one("SELECT alkblobs_lo_create('p')", &[])
        .await
        .unwrap()
        .get(0);
    o.execute(
        "SELECT alkblobs_lo_write($1, 0, $2)",
        &[&loid, &big.as_slice()],
    )
    .await
    .unwrap();
    o.execute(
        "SELECT alkblobs_lo_commit('p', $1, $2, 'inst')",
        &[&key(&big), &loid],
    )
    .await
    .unwrap();
    o.batch_execute("COMMIT").await.unwrap();
    let staged: i64 = o
        .query_one(
            "SELECT count(*) FROM alkblobs_staged WHERE pool = 'p' AND NOT due",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        staged, 1,
        "'staged' is in its window when the copy is taken"
    );
    big
}

/// What must hold in a copy of `fill`'s pool taken more than a TTL and a
/// window ago: the owner's pins renew (both of them), the first sweep
/// keeps the pinned, held and staged entries and the large object (whole),
/// the guard still refuses a row naming absent content.
pub async fn check_copy(base: &str, db: &str, owner: &str, big: &[u8], what: &str) {
    let o = conn(&with_db(base, db, owner)).await;
    let d = conn(&with_db(base, db, "postgres")).await;
    let v: String = d
        .query_one(
            "SELECT extversion FROM pg_extension WHERE extname = 'alkblobs'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(v, alkblobs::backend::postgres::EXTENSION_VERSION, "{what}");
    let owner_is: String = d
        .query_one("SELECT owner FROM alkblobs_pools WHERE pool = 'p'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(owner_is, owner, "{what}: the pool's owner");
    d.batch_execute("CALL alkblobs_sweep_all('p')")
        .await
        .unwrap();
    let renewed: i64 = o
        .query_one("SELECT alkblobs_renew('p', 'inst')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(renewed, 2, "{what}: the owner's two pins renew");
    let left: Vec<Vec<u8>> = d
        .query("SELECT key FROM alkblobs_list('p') ORDER BY key", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut want = vec![key(b"pinned"), key(b"held"), key(b"staged"), key(big)];
    want.sort();
    assert_eq!(left, want, "{what}: nothing protected went");
    let got: Vec<u8> = o
        .query_one(
            "SELECT string_agg(chunk, ''::bytea ORDER BY off) FROM (
               SELECT n AS off, alkblobs_lo_read('p', $1, n, 65536) AS chunk
                 FROM generate_series(0, 199999, 65536) n) x",
            &[&key(big)],
        )
        .await
        .unwrap()
        .get(0);
    assert!(got == big, "{what}: the large object reads back whole");
    let e = o
        .batch_execute("INSERT INTO refs VALUES (alkblobs_key('never put'))")
        .await
        .expect_err("the guard still guards");
    assert_eq!(sqlstate(&e), "AB002", "{what}: {e}");
}

/// A command run as the cluster's owner (`postgres` when we are root:
/// PostgreSQL refuses to run as root).
pub fn as_pg(args: &[&str]) -> Command {
    let mut c = if unsafe { libc::geteuid() } == 0 {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]);
        c
    } else {
        Command::new("env")
    };
    c.args(args);
    c
}
