//! `pg_upgrade` of a cluster with busy pools to a newer major, as an
//! operator moves a server: the old cluster (`ALKBLOBS_PG_BIN_OLD`, its bin
//! directory) preloads the library and runs the sweep scheduler on the
//! pool's database, as the new one (`ALKBLOBS_PG_BIN_NEW`) is configured
//! to; both have the extension installed for their own major. The test
//! makes both clusters itself, on ports 54339 and 54340.
//!
//! What must hold after the upgrade is what holds after a dump and
//! restore (`pg_restore`): the owner and the pins carry over, the large
//! object reads back whole, the guard still guards, and the first sweep,
//! later than the pool's TTL and window, deletes nothing protected.
//! (From Debian's PostgreSQL 15.20 no `pg_upgrade` to 17 or 18 gets that
//! far, for any database: docs/operations.md, "Moving between majors".)

#![cfg(feature = "pg")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use alkblobs_tests::copies::{as_pg, check_copy, conn, fill, owned_database, run};

const OLD_PORT: u16 = 54339;
const NEW_PORT: u16 = 54340;

fn bindir(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: the pg_upgrade suite needs the bin directories of two majors \
             (ALKBLOBS_PG_BIN_OLD=$(scripts/postgres.sh bindir 17) \
             ALKBLOBS_PG_BIN_NEW=$(scripts/postgres.sh bindir 18)), each with the extension \
             installed (scripts/install-extension.sh 17 18)"
        )
    })
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The two clusters' directory: whatever runs is stopped and it is
/// removed when the test ends, however it ends.
struct Clusters {
    base: PathBuf,
    bins: Vec<(String, PathBuf)>,
}

impl Drop for Clusters {
    fn drop(&mut self) {
        for (bin, data) in &self.bins {
            let _ = as_pg(&[
                &format!("{bin}/pg_ctl"),
                "-D",
                s(data),
                "-m",
                "immediate",
                "-w",
                "stop",
            ])
            .output();
        }
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

/// initdb of a cluster in `data` with `bin`'s major, preloading the
/// library and scheduling sweeps in `db` (as the test script's main
/// cluster does), listening on `port`.
fn initdb(bin: &str, data: &Path, sock: &Path, port: u16, db: &str) {
    run(&mut as_pg(&[
        &format!("{bin}/initdb"),
        "-D",
        s(data),
        "-U",
        "postgres",
        "--auth=trust",
        "--no-sync",
        "-E",
        "UTF8",
        "--locale=C",
        // 18 checksums by default and 17 does not: pg_upgrade needs both
        // the same.
        "--data-checksums",
    ]));
    let conf = data.join("postgresql.conf");
    let mut text = std::fs::read_to_string(&conf).unwrap();
    text.push_str(&format!(
        "\nlisten_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{}'\n\
         shared_preload_libraries = 'alkblobs'\nalkblobs.scheduler_databases = '{db}'\n\
         alkblobs.scheduler_naptime = 250\n",
        s(sock)
    ));
    std::fs::write(&conf, text).unwrap();
}

fn start(bin: &str, data: &Path, log: &Path) {
    let o = as_pg(&[
        &format!("{bin}/pg_ctl"),
        "-D",
        s(data),
        "-l",
        s(log),
        "-w",
        "-t",
        "60",
        "start",
    ])
    .output()
    .unwrap();
    assert!(
        o.status.success(),
        "the server in {} did not start: {}\nits log:\n{}",
        data.display(),
        String::from_utf8_lossy(&o.stderr),
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

fn stop(bin: &str, data: &Path) {
    run(&mut as_pg(&[
        &format!("{bin}/pg_ctl"),
        "-D",
        s(data),
        "-m",
        "fast",
        "-w",
        "stop",
    ]));
}

/// The last lines of every log pg_upgrade left under `dir`.
fn log_ends(dir: &Path) -> String {
    let mut out = String::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "log") {
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                out.push_str(&format!("== {}\n", p.display()));
                for l in &lines[lines.len().saturating_sub(12)..] {
                    out.push_str(l);
                    out.push('\n');
                }
            }
        }
    }
    out
}

fn major(bin: &str) -> u32 {
    let v = run(Command::new(format!("{bin}/pg_config")).arg("--version"));
    // "PostgreSQL 17.11"
    v.split_whitespace()
        .nth(1)
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("{bin}/pg_config --version: {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_moved_to_a_newer_major_by_pg_upgrade_keeps_every_protected_key() {
    let (old, new) = (bindir("ALKBLOBS_PG_BIN_OLD"), bindir("ALKBLOBS_PG_BIN_NEW"));
    let (old_major, new_major) = (major(&old), major(&new));
    assert!(
        old_major < new_major,
        "pg_upgrade moves to a newer major: {old_major} → {new_major}"
    );
    let what = format!("pg_upgrade {old_major} → {new_major}");
    let id = std::process::id();
    let base = PathBuf::from(format!("/tmp/alkblobs-pgu-{id}"));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    run(Command::new("chown").arg("postgres:postgres").arg(&base));
    let (old_data, new_data, sock) = (base.join("old"), base.join("new"), base.join("sock"));
    let _clusters = Clusters {
        base: base.clone(),
        bins: vec![
            (old.clone(), old_data.clone()),
            (new.clone(), new_data.clone()),
        ],
    };
    run(&mut as_pg(&["mkdir", "-p", s(&sock)]));
    let db = "alkblobs_pgu";
    let owner = format!("pgu_owner_{id}");

    // The old cluster, its pool put through its paces.
    initdb(&old, &old_data, &sock, OLD_PORT, db);
    start(&old, &old_data, &base.join("old.log"));
    let old_url = format!("postgresql://postgres@127.0.0.1:{OLD_PORT}/postgres");
    let admin = conn(&old_url).await;
    let s_old = owned_database(&admin, &old_url, db, &owner, None).await;
    let big = fill(&old_url, db, &owner).await;
    let filled = Instant::now();
    drop((s_old, admin));
    stop(&old, &old_data);

    // The upgrade, as its documentation says: a fresh cluster of the new
    // major configured like the old one, then pg_upgrade from a directory
    // the cluster's owner can write its logs to.
    initdb(&new, &new_data, &sock, NEW_PORT, db);
    let o = as_pg(&[
        &format!("{new}/pg_upgrade"),
        "-b",
        &old,
        "-B",
        &new,
        "-d",
        s(&old_data),
        "-D",
        s(&new_data),
        "-p",
        &OLD_PORT.to_string(),
        "-P",
        &NEW_PORT.to_string(),
        "-U",
        "postgres",
        "-s",
        s(&sock),
        "--no-sync",
    ])
    .current_dir(&base)
    .output()
    .unwrap();
    assert!(
        o.status.success(),
        "{what} failed:\n{}\n{}\nthe ends of its logs:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
        log_ends(&new_data.join("pg_upgrade_output.d"))
    );

    // Started later than the pool's TTL and window (fill: 2 s and 3 s).
    if let Some(left) = Duration::from_millis(3500).checked_sub(filled.elapsed()) {
        std::thread::sleep(left);
    }
    start(&new, &new_data, &base.join("new.log"));
    let new_url = format!("postgresql://postgres@127.0.0.1:{NEW_PORT}/postgres");
    let version: i32 = conn(&new_url)
        .await
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(version / 10000, new_major as i32, "{what}: the server now");
    check_copy(&new_url, db, &owner, &big, &what).await;
}
