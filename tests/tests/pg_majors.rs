//! The extension's files for one PostgreSQL major on a server of another:
//! `CREATE EXTENSION` fails naming both majors and what to install, never
//! with the dynamic linker's words (a 17 build on 15 said `undefined
//! symbol: GetMemoryChunkContext`). Every installed script is stamped with
//! its major (`scripts/stamp-major.sh`, run by
//! `scripts/install-extension.sh` and `scripts/package.sh`) and checks the
//! server before it loads the library.
//!
//! Needs root and every supported major's build installed
//! (`scripts/install-extension.sh 15 17 18`): `scripts/test.sh` runs it on
//! each major's cluster once all are. It puts another major's control file
//! and scripts into this server's extension directory under another
//! extension name (`alkblobs_pgN_build`), as a mixed-up install would,
//! and removes them after.

#![cfg(feature = "pg")]

use std::path::{Path, PathBuf};
use std::process::Command;

use alkblobs_tests::pg::{connect, server_major, sqlstate};

fn majors() -> Vec<i32> {
    let out = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scripts/postgres.sh"
    ))
    .arg("majors")
    .output()
    .expect("scripts/postgres.sh majors");
    assert!(out.status.success(), "scripts/postgres.sh majors failed");
    let majors: Vec<i32> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|m| m.parse().unwrap())
        .collect();
    assert!(majors.len() >= 2, "majors: {majors:?}");
    majors
}

/// `pg_config FLAG` of `major` (scripts/postgres.sh pg-config).
fn pg_config(major: i32, flag: &str) -> PathBuf {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/postgres.sh");
    let out = Command::new(script)
        .args(["pg-config", &major.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "PostgreSQL {major} is not installed here: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pg_config = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let out = Command::new(&pg_config).arg(flag).output().unwrap();
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// The files it put in place, removed when dropped.
struct Placed(Vec<PathBuf>);

impl Drop for Placed {
    fn drop(&mut self) {
        for f in &self.0 {
            let _ = std::fs::remove_file(f);
        }
    }
}

fn alkblobs_scripts(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with("alkblobs--") && n.ends_with(".sql")
        })
        .collect();
    v.sort();
    v
}

/// Every installed script of every major names its major on its first
/// line and checks the server first.
#[test]
fn every_installed_script_is_stamped_with_its_major() {
    for major in majors() {
        let dir = pg_config(major, "--sharedir").join("extension");
        let scripts = alkblobs_scripts(&dir);
        assert!(
            scripts.len() >= 2,
            "{}: no alkblobs scripts installed",
            dir.display()
        );
        for f in scripts {
            let text = std::fs::read_to_string(&f).unwrap();
            assert!(
                text.starts_with(&format!("-- alkblobs: built for PostgreSQL {major} ")),
                "{} is not stamped for {major}",
                f.display()
            );
            assert_eq!(
                text.matches("-- alkblobs: built for PostgreSQL").count(),
                1,
                "{} is stamped twice",
                f.display()
            );
        }
    }
}

#[tokio::test]
async fn another_majors_build_is_refused_naming_both_majors() {
    let c = connect().await;
    let here = server_major(&c).await;
    let ext = pg_config(here, "--sharedir").join("extension");
    // "15, 17 and 18": the majors the hint names.
    let all: Vec<String> = majors().iter().map(|m| m.to_string()).collect();
    let shipped = format!(
        "{} and {}",
        all[..all.len() - 1].join(", "),
        all[all.len() - 1]
    );
    for other in majors().into_iter().filter(|m| *m != here) {
        let from = pg_config(other, "--sharedir").join("extension");
        let lib = pg_config(other, "--pkglibdir").join("alkblobs.so");
        let name = format!("alkblobs_pg{other}_build");
        let control = std::fs::read_to_string(from.join("alkblobs.control")).unwrap();
        let version = control
            .lines()
            .find_map(|l| l.strip_prefix("default_version = "))
            .expect("the control file's default_version")
            .trim_matches('\'')
            .to_owned();
        // The other build's control file, its library named by path.
        let control: String = control
            .lines()
            .map(|l| {
                if l.starts_with("module_pathname") {
                    format!("module_pathname = '{}'\n", lib.display())
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        let mut placed = Placed(vec![ext.join(format!("{name}.control"))]);
        std::fs::write(&placed.0[0], control).unwrap();
        // Its current install script, and the oldest release's (each
        // version's script checks on its own).
        for v in [version.as_str(), "0.1.0"] {
            let to = ext.join(format!("{name}--{v}.sql"));
            std::fs::copy(from.join(format!("alkblobs--{v}.sql")), &to).unwrap();
            placed.0.push(to);
        }
        for v in [version.as_str(), "0.1.0"] {
            let e = c
                .batch_execute(&format!("CREATE EXTENSION {name} VERSION '{v}'"))
                .await
                .expect_err("another major's build was created");
            let db = e.as_db_error().expect("a server error");
            assert_eq!(sqlstate(&e), "0A000", "{other} on {here}, {v}: {db:?}");
            assert!(
                db.message().contains(&format!(
                    "built for PostgreSQL {other}, and this server is PostgreSQL {here}."
                )),
                "{other} on {here}, {v}: {}",
                db.message()
            );
            let hint = db.hint().unwrap_or_default();
            assert!(
                hint.contains(&format!("postgresql-{here}-alkblobs")) && hint.contains(&shipped),
                "{hint}"
            );
        }
        let left: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_extension WHERE extname = $1",
                &[&name],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(left, 0);
        drop(placed);
    }
}
