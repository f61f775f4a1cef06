//! The Debian package as an operator uses it (needs root: it installs into
//! the server of `ALKBLOBS_PG_MAJOR`, 15 unless set: Debian's, or the one
//! `scripts/postgres.sh` built from source). The test script builds this
//! version's package for that major and the previous release's from git
//! history (`scripts/package.sh deb --major N [--rev]`) and names them in
//! `ALKBLOBS_DEB_NEW` and `ALKBLOBS_DEB_OLD`: the previous release is installed with apt, a
//! cluster that preloads the library (its scheduler on) is started, the
//! extension created and a pool filled; the new package is installed over
//! it, the server restarted (it preloads the old library),
//! `ALTER EXTENSION alkblobs UPDATE` run, and nothing is lost; then the
//! package is removed and its files are gone, and installed again.

#![cfg(feature = "pg")]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use alkblobs_tests::pg::{key, sqlstate};
use tokio_postgres::{Client, NoTls};

const PORT: &str = "54333";

fn major() -> String {
    std::env::var("ALKBLOBS_PG_MAJOR").unwrap_or_else(|_| "15".into())
}

fn package() -> String {
    format!("postgresql-{}-alkblobs", major())
}

/// What `pg_config --flag` of the major says (where the package installs).
fn pg_config(flag: &str) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/postgres.sh");
    let path = sh(Command::new("bash").args([script, "pg-config", &major()]));
    sh(Command::new(path.trim()).arg(flag)).trim().to_owned()
}

fn deb(var: &str) -> String {
    let p = std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: scripts/test.sh builds the packages (scripts/package.sh deb) and sets it")
    });
    assert!(Path::new(&p).exists(), "{var}={p} does not exist");
    p
}

fn sh(cmd: &mut Command) -> String {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn apt_install(deb: &str) {
    sh(Command::new("apt-get")
        .args(["install", "-y", "-q", "--allow-downgrades", deb])
        .env("DEBIAN_FRONTEND", "noninteractive"));
}

fn installed_version() -> String {
    sh(Command::new("dpkg-query").args(["-W", "-f", "${Version}", &package()]))
}

fn cluster(args: &[&str]) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/pg-cluster.sh");
    sh(Command::new("bash")
        .arg(script)
        .args(args)
        .env("ALKBLOBS_PG_PORT", PORT)
        .env("ALKBLOBS_PG_MAJOR", major()))
    .trim()
    .to_owned()
}

struct Stop;
impl Drop for Stop {
    fn drop(&mut self) {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/pg-cluster.sh");
        let _ = Command::new("bash")
            .arg(script)
            .arg("stop")
            .env("ALKBLOBS_PG_PORT", PORT)
            .env("ALKBLOBS_PG_MAJOR", major())
            .output();
    }
}

async fn connect(url: &str) -> Client {
    for _ in 0..100 {
        if let Ok((c, conn)) = tokio_postgres::connect(url, NoTls).await {
            tokio::spawn(conn);
            return c;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("cannot connect to {url}");
}

async fn version(c: &Client) -> String {
    c.query_one(
        "SELECT extversion FROM pg_extension WHERE extname = 'alkblobs'",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_package_installs_upgrades_in_place_and_removes() {
    let (old, new) = (deb("ALKBLOBS_DEB_OLD"), deb("ALKBLOBS_DEB_NEW"));
    let share = format!("{}/extension", pg_config("--sharedir"));
    let lib = format!("{}/alkblobs.so", pg_config("--pkglibdir"));
    for d in [&old, &new] {
        let name = sh(Command::new("dpkg-deb").args(["-f", d, "Package"]));
        assert_eq!(name.trim(), package(), "{d} is another major's package");
    }
    let _stop = Stop;
    cluster(&["stop"]);

    // The previous release, as an operator installs it.
    apt_install(&old);
    let old_version = installed_version();
    let url = cluster(&["start"]);
    let c = connect(&url).await;
    c.batch_execute("CREATE EXTENSION alkblobs").await.unwrap();
    assert_eq!(version(&c).await, old_version);
    // A busy pool: kv entries, a large object, pins, a liveness table with
    // a row, garbage staged in its window, a grant.
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    c.batch_execute(
        "CREATE ROLE pkg_reader NOLOGIN IN ROLE alkblobs_reader;
         SELECT alkblobs_create_pool('pkg', delete_window => '1 hour', pin_ttl => '1 hour');
         SELECT alkblobs_grant_pool('pkg', 'pkg_reader', 'read');
         SELECT alkblobs_put('pkg', alkblobs_key('pinned'), 'pinned', 'node-a');
         SELECT alkblobs_put('pkg', alkblobs_key('held'), 'held', 'tmp');
         SELECT alkblobs_put('pkg', alkblobs_key('staged'), 'staged', 'tmp');
         CREATE TABLE pkg_refs (key bytea PRIMARY KEY);
         SELECT alkblobs_register_liveness('pkg', 'pkg_refs');
         INSERT INTO pkg_refs VALUES (alkblobs_key('held'));
         SELECT alkblobs_unpin_all('pkg', 'tmp');
         SELECT * FROM alkblobs_sweep('pkg');",
    )
    .await
    .unwrap();
    c.batch_execute("BEGIN").await.unwrap();
    let loid: u32 = c
        .query_one("SELECT alkblobs_lo_create('pkg')", &[])
        .await
        .unwrap()
        .get(0);
    c.execute(
        "SELECT alkblobs_lo_write($1, 0, $2)",
        &[&loid, &big.as_slice()],
    )
    .await
    .unwrap();
    c.execute(
        "SELECT alkblobs_lo_commit('pkg', $1, $2, 'node-a')",
        &[&key(&big), &loid],
    )
    .await
    .unwrap();
    c.batch_execute("COMMIT").await.unwrap();
    let before: Vec<(Vec<u8>, i64, String)> = c
        .query(
            "SELECT key, size, tier FROM alkblobs_list('pkg') ORDER BY key",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(before.len(), 4);
    drop(c);

    // The new package over it: the server preloads the old library until
    // it restarts; then the extension's own upgrade.
    apt_install(&new);
    let new_version = installed_version();
    assert_ne!(new_version, old_version);
    cluster(&["restart"]);
    let c = connect(&url).await;
    assert_eq!(
        version(&c).await,
        old_version,
        "the package does not touch the database"
    );
    c.batch_execute("ALTER EXTENSION alkblobs UPDATE")
        .await
        .unwrap();
    assert_eq!(version(&c).await, new_version);
    let after: Vec<(Vec<u8>, i64, String)> = c
        .query(
            "SELECT key, size, tier FROM alkblobs_list('pkg') ORDER BY key",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(after, before, "every entry survives the upgrade");
    let got: Vec<u8> = c
        .query_one(
            "SELECT string_agg(chunk, ''::bytea ORDER BY off) FROM (
               SELECT o AS off, alkblobs_lo_read('pkg', $1, o, 65536) AS chunk
                 FROM generate_series(0, 299999, 65536) o) x",
            &[&key(&big)],
        )
        .await
        .unwrap()
        .get(0);
    assert!(got == big, "the large object reads back whole");
    let pins: i64 = c
        .query_one(
            "SELECT count(*) FROM alkblobs_pins WHERE pool = 'pkg' AND owner = 'node-a' AND NOT expired",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(pins, 2);
    let grants: i64 = c
        .query_one(
            "SELECT count(*) FROM alkblobs_pool_grants WHERE pool = 'pkg' AND grantee = 'pkg_reader'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(grants, 1);
    let staged: i64 = c
        .query_one(
            "SELECT count(*) FROM alkblobs_staged WHERE pool = 'pkg' AND NOT due",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(staged, 1, "the staged row keeps its window");
    let e = c
        .batch_execute("INSERT INTO pkg_refs VALUES (alkblobs_key('never put'))")
        .await
        .expect_err("the guard still guards");
    assert_eq!(sqlstate(&e), "AB002");
    // The new library's scheduler runs (the server preloads it).
    let preloaded: bool = c
        .query_one("SELECT alkblobs.scheduler_preloaded()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(preloaded);
    drop(c);

    // Removed: its files are gone (the database keeps its data, and
    // the extension cannot be loaded until it is installed again).
    cluster(&["stop"]);
    sh(Command::new("apt-get")
        .args(["remove", "-y", "-q", &package()])
        .env("DEBIAN_FRONTEND", "noninteractive"));
    assert!(!Path::new(&lib).exists(), "{lib} is still there");
    assert!(!Path::new(&format!("{share}/alkblobs.control")).exists());
    // Back for whatever runs next on this machine.
    apt_install(&new);
    assert!(Path::new(&lib).exists());
}
