//! The embedded store gives the disk back: a store made now frees the
//! pages a gc empties on its own; one made before incremental auto-vacuum
//! keeps them until `alkblobs compact`; `usage` shows the database's size
//! on disk beside the blobs' bytes.

mod common;

use std::path::Path;
use std::process::Command;

use common::{BIN, Tmpfs, ok};

/// `n` files of 1.0–1.6 KiB under `dir`, distinct from every other tree
/// (`seed`).
fn tree(dir: &Path, seed: usize, n: usize) {
    std::fs::create_dir_all(dir).unwrap();
    for i in 0..n {
        let mut v = format!("tree {seed} file {i}\n").into_bytes();
        v.resize(1024 + (i * 37) % 600, (i % 251) as u8);
        std::fs::write(dir.join(format!("f{i:06}")), v).unwrap();
    }
}

fn db_size(d: &Path) -> u64 {
    std::fs::metadata(d.join("data/index.sqlite"))
        .unwrap()
        .len()
}

fn auto_vacuum(d: &Path) -> i64 {
    let c = rusqlite::Connection::open(d.join("data/index.sqlite")).unwrap();
    c.query_row("PRAGMA auto_vacuum", [], |r| r.get(0)).unwrap()
}

/// Half a store collected (the older half, unrooted): a store made now is
/// at most 60% of its size after the gc, with no command; the same store
/// made the old way (auto-vacuum off) keeps its size until `compact`,
/// which brings it there and switches it to giving space back itself.
/// Every rooted blob survives both.
#[test]
fn gc_gives_the_disk_back_and_compact_rewrites_an_older_store() {
    for old in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        tree(&d.join("old"), 1, 4_000);
        tree(&d.join("kept"), 2, 4_000);
        ok(d, &["put", "-r", "old"]);
        let kept = ok(d, &["put", "--root", "-r", "kept"]);
        if old {
            // As a store made before 0.8 is.
            let c = rusqlite::Connection::open(d.join("data/index.sqlite")).unwrap();
            c.execute_batch("PRAGMA auto_vacuum = NONE; VACUUM;")
                .unwrap();
            drop(c);
            assert_eq!(auto_vacuum(d), 0);
        } else {
            assert_eq!(auto_vacuum(d), 2, "a new store is incremental");
        }
        let full = db_size(d);
        let gc = ok(d, &["gc", "--window", "0s"]);
        assert!(gc.contains("deleted 4000"), "{gc}");
        let after_gc = db_size(d);
        // usage reports the file as it is, and its free pages.
        let u: serde_json::Value = serde_json::from_str(&ok(d, &["--json", "usage"])).unwrap();
        let disk = &u["kv"]["disk"];
        assert_eq!(disk["on_disk"].as_u64(), Some(after_gc), "{u}");
        if old {
            assert!(
                after_gc * 10 > full * 9,
                "an old store keeps its pages: {after_gc} of {full}"
            );
            assert!(
                disk["free"].as_u64().unwrap() * 3 > full,
                "and usage says they are free: {u}"
            );
            let out = ok(d, &["compact"]);
            assert!(out.contains("sqlite("), "{out}");
            assert_eq!(auto_vacuum(d), 2, "compact switches it to incremental");
        } else {
            let text = ok(d, &["usage"]);
            assert!(text.contains("kv on disk: "), "{text}");
        }
        let now = db_size(d);
        assert!(
            now * 10 <= full * 6,
            "old={old}: {now} bytes on disk after collecting half of {full}"
        );
        for k in kept.lines().take(50) {
            ok(d, &["stat", k]);
        }
        ok(d, &["verify"]);
    }
}

/// `compact` first checks that the disk can hold the copy it writes: on a
/// filesystem too full for it (an 8 MiB tmpfs holding the store and its
/// temporary directory; needs root, as the power-cut test does) it changes
/// nothing and says how much it needs.
#[test]
fn compact_refuses_when_the_disk_cannot_hold_the_copy() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let fs = d.join("fs");
    let _fs = Tmpfs::mount(&fs, "8m");
    tree(&d.join("t"), 1, 800);
    let run_on = |args: &[&str]| {
        Command::new(BIN)
            .args(args)
            .env("ALKBLOBS_DATA_DIR", fs.join("data"))
            .env("SQLITE_TMPDIR", &fs)
            .current_dir(d)
            .output()
            .unwrap()
    };
    assert!(run_on(&["put", "-r", "t"]).status.success());
    let before = std::fs::metadata(fs.join("data/index.sqlite")).unwrap();
    // Leave less than twice the database free.
    let free = rustix::fs::statvfs(&fs).unwrap();
    let avail = free.f_bavail * free.f_frsize;
    let leave = before.len() + before.len() / 2;
    std::fs::write(fs.join("filler"), vec![0u8; (avail - leave) as usize]).unwrap();
    let o = run_on(&["compact"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("not compacted: it needs") && err.contains("nothing was changed"),
        "{err}"
    );
    let after = std::fs::metadata(fs.join("data/index.sqlite")).unwrap();
    assert_eq!(after.len(), before.len(), "the database was not rewritten");
    std::fs::remove_file(fs.join("filler")).unwrap();
    assert!(run_on(&["compact"]).status.success());
    assert!(run_on(&["verify"]).status.success());
}
