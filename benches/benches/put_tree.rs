//! `alkblobs put -r` of a directory (the CLI, as a user runs it) against
//! the raw pipeline a script would write, in the same run
//! (docs/benchmarks.md, "Many files"):
//!
//! 1. 20,000 files of 1.0–1.6 KiB (`ALKBLOBS_BENCH_PUT_FILES`) into a
//!    fresh embedded store, against reading each file, hashing it with
//!    BLAKE3 and inserting it into SQLite (WAL, `synchronous=FULL`,
//!    committing every 1,000).
//! 2. The same files put again (all present), against read + BLAKE3.
//! 3. 200 files of 4 MiB (`ALKBLOBS_BENCH_PUT_LARGE`) into a fresh store,
//!    against read + BLAKE3 + write + fsync + rename of each.
//! 4. With `ALKBLOBS_PG_URL`: 5,000 of the small files
//!    (`ALKBLOBS_BENCH_PUT_PG_FILES`) into a fresh single-instance pool and
//!    a fresh fleet pool (`--large none`), against the same rows inserted
//!    by a plain client (tokio-postgres): read + BLAKE3, then one
//!    `INSERT … SELECT unnest($1), unnest($2) ON CONFLICT DO NOTHING` and a
//!    commit per 1,000, over one connection.
//!
//! The CLI is `target/release/alkblobs`, built first (`cargo build
//! --release --bin alkblobs`) if it is not there: rebuild it after a
//! change.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use alkblobs_benches::{Lat, data, header, paired, release_cli, rounds};
use rusqlite::Connection;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Writes `n` files of `size(i)` bytes under `dir`, 500 to a directory;
/// returns their paths in the order `put -r` walks them (sorted).
fn tree(dir: &Path, n: usize, size: impl Fn(usize) -> usize) -> Vec<PathBuf> {
    let mut paths = Vec::with_capacity(n);
    for i in 0..n {
        let sub = dir.join(format!("d{:04}", i / 500));
        std::fs::create_dir_all(&sub).unwrap();
        let p = sub.join(format!("f{i:07}"));
        std::fs::write(&p, data(i as u64 * 7 + 3, size(i))).unwrap();
        paths.push(p);
    }
    paths
}

/// `alkblobs put -r <tree>` into `data`; returns the keys printed.
fn put_r(bin: &Path, data_dir: &Path, tree: &Path) -> usize {
    let o = Command::new(bin)
        .args(["--data-dir"])
        .arg(data_dir)
        .args(["put", "-r"])
        .arg(tree)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o.stdout.iter().filter(|&&b| b == b'\n').count()
}

fn fresh(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    let _ = std::fs::remove_dir_all(&p);
    p
}

fn main() {
    let (_rt, dir, mut probes) = alkblobs_benches::setup();
    let bin = release_cli();
    let root = dir.path();
    let n = env_or("ALKBLOBS_BENCH_PUT_FILES", 20_000);
    let small = tree(&root.join("small"), n, |i| 1024 + (i * 37) % 600);
    let bytes: u64 = small.iter().map(|p| p.metadata().unwrap().len()).sum();

    // 1. A fresh store against the batched raw pipeline.
    header(&format!(
        "put -r of {n} files of 1.0–1.6 KiB (embedded, durable) vs read + BLAKE3 + SQLite insert, a commit per 1,000"
    ));
    let mut a = |lat: &mut Lat| {
        let d = fresh(root, "store");
        let k = lat.time(|| put_r(&bin, &d, &root.join("small")));
        assert_eq!(k, n);
        (n as u64, bytes)
    };
    let mut b = |lat: &mut Lat| {
        let db = fresh(root, "raw");
        std::fs::create_dir_all(&db).unwrap();
        lat.time(|| {
            let mut c = Connection::open(db.join("raw.sqlite")).unwrap();
            c.pragma_update(None, "journal_mode", "WAL").unwrap();
            c.pragma_update(None, "synchronous", "FULL").unwrap();
            c.execute_batch("CREATE TABLE blobs (key BLOB PRIMARY KEY, value BLOB NOT NULL)")
                .unwrap();
            for chunk in small.chunks(1000) {
                let tx = c.transaction().unwrap();
                {
                    let mut st = tx
                        .prepare_cached("INSERT OR IGNORE INTO blobs VALUES (?1, ?2)")
                        .unwrap();
                    for p in chunk {
                        let v = std::fs::read(p).unwrap();
                        let h = blake3::hash(&v);
                        st.execute(rusqlite::params![h.as_bytes().as_slice(), v])
                            .unwrap();
                    }
                }
                tx.commit().unwrap();
            }
        });
        (n as u64, bytes)
    };
    paired(
        "put -r small files",
        "alkblobs put -r",
        "read + BLAKE3 + insert",
        rounds(3),
        &mut a,
        &mut b,
    );
    probes.take("after small", root);

    // 2. The same files again, all present, against read + hash.
    let present = fresh(root, "present");
    assert_eq!(put_r(&bin, &present, &root.join("small")), n);
    header(&format!(
        "put -r of {n} files already stored vs read + BLAKE3 of each"
    ));
    let mut a = |lat: &mut Lat| {
        let k = lat.time(|| put_r(&bin, &present, &root.join("small")));
        assert_eq!(k, n);
        (n as u64, bytes)
    };
    let mut b = |lat: &mut Lat| {
        lat.time(|| {
            for p in &small {
                let v = std::fs::read(p).unwrap();
                std::hint::black_box(blake3::hash(&v));
            }
        });
        (n as u64, bytes)
    };
    paired(
        "put -r present files",
        "alkblobs put -r",
        "read + BLAKE3",
        rounds(3),
        &mut a,
        &mut b,
    );
    probes.take("after present", root);

    // 3. Large files against read + hash + write + fsync + rename.
    let m = env_or("ALKBLOBS_BENCH_PUT_LARGE", 200);
    let large = tree(&root.join("large"), m, |_| 4 << 20);
    let lbytes = (m as u64) << 22;
    header(&format!(
        "put -r of {m} files of 4 MiB (embedded, durable) vs read + BLAKE3 + write + fsync + rename"
    ));
    let mut a = |lat: &mut Lat| {
        let d = fresh(root, "store");
        let k = lat.time(|| put_r(&bin, &d, &root.join("large")));
        assert_eq!(k, m);
        (m as u64, lbytes)
    };
    let mut b = |lat: &mut Lat| {
        let out = fresh(root, "raw");
        std::fs::create_dir_all(&out).unwrap();
        let mut buf = Vec::with_capacity(4 << 20);
        lat.time(|| {
            for p in &large {
                buf.clear();
                std::fs::File::open(p)
                    .unwrap()
                    .read_to_end(&mut buf)
                    .unwrap();
                let h = blake3::hash(&buf).to_hex();
                let tmp = out.join(format!("{h}.tmp"));
                let mut f = std::fs::File::create(&tmp).unwrap();
                f.write_all(&buf).unwrap();
                f.sync_all().unwrap();
                std::fs::rename(&tmp, out.join(h.as_str())).unwrap();
            }
        });
        (m as u64, lbytes)
    };
    paired(
        "put -r large files",
        "alkblobs put -r",
        "read + BLAKE3 + write + fsync + rename",
        rounds(3),
        &mut a,
        &mut b,
    );
    if let Ok(url) = std::env::var("ALKBLOBS_PG_URL") {
        let k = env_or("ALKBLOBS_BENCH_PUT_PG_FILES", 5_000);
        pools(&bin, &url, root, &small[..k.min(small.len())]);
    }
    probes.take("end", root);
    probes.verdict();
}

/// `alkblobs put -r` of `files` (copied into a tree of their own) into a
/// fresh pool per round, single-instance and fleet, against a plain
/// client's batched insert of the same rows into a fresh table.
fn pools(bin: &Path, url: &str, root: &Path, files: &[PathBuf]) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (c, conn) = rt
        .block_on(tokio_postgres::connect(url, tokio_postgres::NoTls))
        .unwrap();
    rt.spawn(conn);
    let fsync: String = rt.block_on(c.query_one("SHOW fsync", &[])).unwrap().get(0);
    let tree = root.join("pg-tree");
    for (i, f) in files.iter().enumerate() {
        let sub = tree.join(format!("d{:02}", i / 500));
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::copy(f, sub.join(format!("f{i:06}"))).unwrap();
    }
    let mut sorted = Vec::new();
    collect(&tree, &mut sorted);
    let n = sorted.len();
    let bytes: u64 = sorted.iter().map(|p| p.metadata().unwrap().len()).sum();
    let tag = std::process::id();
    for fleet in [false, true] {
        let kind = if fleet { "fleet" } else { "single-instance" };
        header(&format!(
            "put -r of {n} files of 1.0–1.6 KiB into a {kind} pool (fsync={fsync}) vs read + BLAKE3 + INSERT … unnest, a commit per 1,000"
        ));
        let mut round = 0;
        let mut a = |lat: &mut Lat| {
            round += 1;
            let pool = format!("bench-put-r-{kind}-{tag}-{round}");
            let mode: &[&str] = if fleet {
                &["--fleet", "--large", "none"]
            } else {
                &[]
            };
            let mut create = Command::new(bin);
            create
                .args(mode)
                .args(["pool", "create", &pool])
                .args(if fleet {
                    &[][..]
                } else {
                    &["--single-instance", "--large", "none"][..]
                })
                .env("ALKBLOBS_POSTGRES", url);
            assert!(create.status().unwrap().success());
            let keys = lat.time(|| {
                let o = Command::new(bin)
                    .args(mode)
                    .args(["put", "-r"])
                    .arg(&tree)
                    .env("ALKBLOBS_POSTGRES", url)
                    .env("ALKBLOBS_POOL", &pool)
                    .output()
                    .unwrap();
                assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
                o.stdout.iter().filter(|&&b| b == b'\n').count()
            });
            assert_eq!(keys, n);
            (n as u64, bytes)
        };
        let mut b = |lat: &mut Lat| {
            rt.block_on(c.batch_execute(
                "DROP TABLE IF EXISTS bench_put_r_raw; CREATE TABLE bench_put_r_raw (key bytea PRIMARY KEY, value bytea NOT NULL)",
            ))
            .unwrap();
            lat.time(|| {
                rt.block_on(async {
                    for chunk in sorted.chunks(1000) {
                        let mut keys = Vec::with_capacity(chunk.len());
                        let mut vals = Vec::with_capacity(chunk.len());
                        for p in chunk {
                            let v = std::fs::read(p).unwrap();
                            keys.push(blake3::hash(&v).as_bytes().to_vec());
                            vals.push(v);
                        }
                        c.batch_execute("BEGIN").await.unwrap();
                        c.execute(
                            "INSERT INTO bench_put_r_raw SELECT * FROM unnest($1::bytea[], $2::bytea[]) ON CONFLICT DO NOTHING",
                            &[&keys, &vals],
                        )
                        .await
                        .unwrap();
                        c.batch_execute("COMMIT").await.unwrap();
                    }
                })
            });
            (n as u64, bytes)
        };
        paired(
            &format!("put -r into a {kind} pool"),
            "alkblobs put -r",
            "read + BLAKE3 + INSERT",
            rounds(3),
            &mut a,
            &mut b,
        );
    }
    rt.block_on(c.batch_execute("DROP TABLE IF EXISTS bench_put_r_raw"))
        .unwrap();
}

/// Every file under `dir`, in the order `put -r` walks them.
fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            collect(&p, out);
        } else {
            out.push(p);
        }
    }
}
