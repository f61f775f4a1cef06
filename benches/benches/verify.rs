//! `Store::verify` against the raw read + BLAKE3 of the same bytes, in the
//! same run (docs/benchmarks.md, "Verify").
//!
//! 1. An embedded store's kv rows: N blobs of 1.3 KiB (default 20,000;
//!    `ALKBLOBS_BENCH_VERIFY_KEYS`) versus reading every row of
//!    `index.sqlite` in one statement and hashing it (what a script that
//!    scrubs the database by hand does).
//! 2. An embedded store's local files: 48 blobs of 1 MiB versus reading
//!    each file of the tier's directory and hashing it.
//! 3. With `ALKBLOBS_PG_URL` set: a single-instance PostgreSQL pool on
//!    pg-lo (the verify walks the pool's record) versus `lo_get` of each
//!    entry's large object and BLAKE3, over the same connection kind.
//!
//! Both sides read warm (the page cache holds both after the first round),
//! and both hash every byte.

use alkblobs::{DirOptions, Store};
use alkblobs_benches::{Lat, data, header, paired, rounds};
use rusqlite::Connection;

fn keys_default() -> u64 {
    std::env::var("ALKBLOBS_BENCH_VERIFY_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

fn files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_none() && p.file_name().is_some_and(|n| n.len() == 64) {
            out.push(p);
        }
    }
}

fn main() {
    let (rt, dir, mut probes) = alkblobs_benches::setup();
    let n = keys_default();

    // 1. kv rows.
    let root = dir.path().join("kv");
    let store = rt
        .block_on(Store::open_dir_with(&root, DirOptions::new().relaxed()))
        .unwrap();
    for start in (0..n).step_by(5_000) {
        let vals: Vec<Vec<u8>> = (start..(start + 5_000).min(n))
            .map(|i| data(i, 1300))
            .collect();
        rt.block_on(store.put_many(vals)).map(drop).unwrap();
    }
    rt.block_on(store.close()).unwrap();
    let store = rt
        .block_on(Store::open_dir_with(&root, DirOptions::new().relaxed()))
        .unwrap();
    let raw = Connection::open(root.join("index.sqlite")).unwrap();
    header(&format!(
        "verify of {n} kv blobs of 1.3 KiB (embedded, sqlite) vs read + BLAKE3 of every row"
    ));
    let mut a = |lat: &mut Lat| {
        let r = lat.time(|| rt.block_on(store.verify()).unwrap());
        assert!(r.is_clean() && r.checked == n, "{r:?}");
        (n, r.bytes)
    };
    let mut b = |lat: &mut Lat| {
        lat.time(|| {
            let mut st = raw
                .prepare_cached("SELECT e.key, v.value FROM entries e JOIN vals v ON v.vid = e.vid")
                .unwrap();
            let mut rows = st.query([]).unwrap();
            let (mut count, mut bytes) = (0u64, 0u64);
            while let Some(row) = rows.next().unwrap() {
                let key: Vec<u8> = row.get(0).unwrap();
                let value: Vec<u8> = row.get(1).unwrap();
                assert_eq!(blake3::hash(&value).as_bytes().as_slice(), key.as_slice());
                count += 1;
                bytes += value.len() as u64;
            }
            assert_eq!(count, n);
            (count, bytes)
        })
    };
    paired(
        "verify kv rows",
        "alkblobs verify",
        "read + BLAKE3",
        rounds(5),
        &mut a,
        &mut b,
    );
    rt.block_on(store.close()).unwrap();
    probes.take("after kv", dir.path());

    // 2. local files.
    let root = dir.path().join("large");
    let store = rt
        .block_on(Store::open_dir_with(
            &root,
            DirOptions::new().relaxed().threshold(1024),
        ))
        .unwrap();
    let count = 48u64;
    for i in 0..count {
        let _ = rt
            .block_on(store.put(data(1_000_000 + i, 1 << 20)))
            .unwrap();
    }
    let mut paths = Vec::new();
    files(&root.join("large"), &mut paths);
    assert_eq!(paths.len() as u64, count, "{paths:?}");
    header("verify of 48 local blobs of 1 MiB (embedded) vs read + BLAKE3 of every file");
    let mut a = |lat: &mut Lat| {
        let r = lat.time(|| rt.block_on(store.verify()).unwrap());
        assert!(r.is_clean() && r.checked == count, "{r:?}");
        (count, r.bytes)
    };
    let mut b = |lat: &mut Lat| {
        lat.time(|| {
            let mut bytes = 0u64;
            for p in &paths {
                let v = std::fs::read(p).unwrap();
                let h = blake3::hash(&v);
                assert_eq!(
                    h.to_hex().as_str(),
                    p.file_name().unwrap().to_str().unwrap()
                );
                bytes += v.len() as u64;
            }
            (count, bytes)
        })
    };
    paired(
        "verify local files",
        "alkblobs verify",
        "read + BLAKE3",
        rounds(5),
        &mut a,
        &mut b,
    );
    rt.block_on(store.close()).unwrap();
    probes.take("after local", dir.path());

    // 3. PostgreSQL pools on pg-lo and on local files, where a server is
    // given.
    if let Ok(url) = std::env::var("ALKBLOBS_PG_URL") {
        pg_lo(&rt, &url);
        pg_local(&rt, &url, &dir.path().join("pg-local"));
        // A pool of many recorded keys (ALKBLOBS_BENCH_VERIFY_POOL_KEYS,
        // e.g. 1000000): time and peak RSS, once each way (a round of a
        // million keys takes minutes).
        if let Some(n) = std::env::var("ALKBLOBS_BENCH_VERIFY_POOL_KEYS")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            pg_pool_of(&rt, &url, n);
        }
    }
    probes.verdict();
}

fn pg_lo(rt: &tokio::runtime::Runtime, url: &str) {
    use alkblobs::store::postgres::{PgLarge, PostgresOptions};
    let (c, conn) = rt
        .block_on(tokio_postgres::connect(url, tokio_postgres::NoTls))
        .unwrap();
    rt.spawn(conn);
    let pool = format!("bench-verify-{}", std::process::id());
    rt.block_on(c.execute(
        "SELECT alkblobs_create_pool($1, large_tier => 'pg-lo', single_instance => true)",
        &[&pool],
    ))
    .unwrap();
    let store = rt
        .block_on(Store::open_postgres(
            PostgresOptions::new(url, &pool)
                .large(PgLarge::PgLo)
                .threshold(1024),
        ))
        .unwrap();
    let count = 32u64;
    for i in 0..count {
        let _ = rt
            .block_on(store.put(data(2_000_000 + i, 1 << 20)))
            .unwrap();
    }
    header("verify of 32 pg-lo blobs of 1 MiB (single-instance pool) vs lo_get + BLAKE3");
    let mut a = |lat: &mut Lat| {
        let r = lat.time(|| rt.block_on(store.verify()).unwrap());
        assert!(r.is_clean() && r.checked == count, "{r:?}");
        (count, r.bytes)
    };
    let mut b = |lat: &mut Lat| {
        lat.time(|| {
            rt.block_on(async {
                let rows = c
                    .query(
                        "SELECT e.key, pg_catalog.lo_get(e.loid) FROM alkblobs.entries e \
                         JOIN alkblobs.pools p ON p.id = e.pool WHERE p.name = $1",
                        &[&pool],
                    )
                    .await
                    .unwrap();
                let mut bytes = 0u64;
                for r in &rows {
                    let key: Vec<u8> = r.get(0);
                    let v: Vec<u8> = r.get(1);
                    assert_eq!(blake3::hash(&v).as_bytes().as_slice(), key.as_slice());
                    bytes += v.len() as u64;
                }
                (rows.len() as u64, bytes)
            })
        })
    };
    paired(
        "verify pg-lo",
        "alkblobs verify",
        "lo_get + BLAKE3",
        rounds(5),
        &mut a,
        &mut b,
    );
    rt.block_on(store.close()).unwrap();
}

/// A single-instance pool whose large tier is local files: verify walks
/// the pool's record (an entry per blob) and reads each file, against
/// read + BLAKE3 of the same files.
fn pg_local(rt: &tokio::runtime::Runtime, url: &str, large: &std::path::Path) {
    use alkblobs::store::postgres::{PgLarge, PostgresOptions};
    let (c, conn) = rt
        .block_on(tokio_postgres::connect(url, tokio_postgres::NoTls))
        .unwrap();
    rt.spawn(conn);
    let pool = format!("bench-verify-local-{}", std::process::id());
    rt.block_on(c.execute(
        "SELECT alkblobs_create_pool($1, large_tier => 'local', single_instance => true)",
        &[&pool],
    ))
    .unwrap();
    let store = rt
        .block_on(Store::open_postgres(
            PostgresOptions::new(url, &pool)
                .large(PgLarge::Local(large.to_owned()))
                .threshold(1024),
        ))
        .unwrap();
    let count = 48u64;
    for i in 0..count {
        let _ = rt
            .block_on(store.put(data(3_000_000 + i, 1 << 20)))
            .unwrap();
    }
    let mut paths = Vec::new();
    files(large, &mut paths);
    assert_eq!(paths.len() as u64, count, "{paths:?}");
    header(
        "verify of 48 local blobs of 1 MiB (single-instance pool on local) vs read + BLAKE3 of every file",
    );
    let mut a = |lat: &mut Lat| {
        let r = lat.time(|| rt.block_on(store.verify()).unwrap());
        assert!(r.is_clean() && r.checked == count, "{r:?}");
        (count, r.bytes)
    };
    let mut b = |lat: &mut Lat| {
        lat.time(|| {
            let mut bytes = 0u64;
            for p in &paths {
                let v = std::fs::read(p).unwrap();
                assert_eq!(
                    blake3::hash(&v).to_hex().as_str(),
                    p.file_name().unwrap().to_str().unwrap()
                );
                bytes += v.len() as u64;
            }
            (count, bytes)
        })
    };
    paired(
        "verify pool on local",
        "alkblobs verify",
        "read + BLAKE3",
        rounds(5),
        &mut a,
        &mut b,
    );
    rt.block_on(store.close()).unwrap();
}

/// A kv pool of `n` recorded keys of about 100 bytes (a single-instance
/// pool: every key an entry), verified whole once, against one query
/// streaming the same rows and hashing each. Reports both times, their
/// ratio, and verify's peak RSS (the kernel's high-water mark, reset just
/// before the run).
fn pg_pool_of(rt: &tokio::runtime::Runtime, url: &str, n: u64) {
    use alkblobs::store::postgres::{PgLarge, PostgresOptions};
    use futures::TryStreamExt;
    let (c, conn) = rt
        .block_on(tokio_postgres::connect(url, tokio_postgres::NoTls))
        .unwrap();
    rt.spawn(conn);
    let pool = format!("bench-verify-many-{}", std::process::id());
    rt.block_on(c.execute(
        "SELECT alkblobs_create_pool($1, large_tier => 'none', single_instance => true)",
        &[&pool],
    ))
    .unwrap();
    let filled = std::time::Instant::now();
    let batch = 10_000u64;
    for start in (0..n).step_by(batch as usize) {
        let vals: Vec<Vec<u8>> = (start..(start + batch).min(n))
            .map(|i| data(10_000_000 + i, 100))
            .collect();
        let keys: Vec<Vec<u8>> = vals
            .iter()
            .map(|v| blake3::hash(v).as_bytes().to_vec())
            .collect();
        rt.block_on(c.execute(
            "SELECT alkblobs_put_many($1, $2, $3, NULL)",
            &[&pool, &keys, &vals],
        ))
        .unwrap();
    }
    eprintln!("filled {n} keys in {:?}", filled.elapsed());
    let store = rt
        .block_on(Store::open_postgres(
            PostgresOptions::new(url, &pool).large(PgLarge::None),
        ))
        .unwrap();
    // The high-water mark from here (Linux: "5" resets VmHWM to the
    // current RSS).
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let rss_before = alkblobs_benches::peak_rss_kib();
    let t = std::time::Instant::now();
    let r = rt.block_on(store.verify()).unwrap();
    let verify = t.elapsed();
    let rss_peak = alkblobs_benches::peak_rss_kib();
    assert!(r.is_clean() && r.checked == n, "{r:?}");
    let t = std::time::Instant::now();
    let hashed = rt.block_on(async {
        let rows = c
            .query_raw(
                "SELECT e.key, e.value FROM alkblobs.entries e \
                 JOIN alkblobs.pools p ON p.id = e.pool WHERE p.name = $1 ORDER BY e.key",
                [&pool],
            )
            .await
            .unwrap();
        futures::pin_mut!(rows);
        let mut count = 0u64;
        while let Some(row) = rows.try_next().await.unwrap() {
            let key: &[u8] = row.get(0);
            let value: &[u8] = row.get(1);
            assert_eq!(blake3::hash(value).as_bytes().as_slice(), key);
            count += 1;
        }
        count
    });
    let raw = t.elapsed();
    assert_eq!(hashed, n);
    println!(
        "\n### verify of a pool of {n} recorded keys of 100 bytes (single-instance, kv) vs one query streaming them + BLAKE3\n"
    );
    println!("| scenario | alkblobs | baseline | ratio | runs | verify's peak RSS |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| verify {n} keys | {:.1} s | {:.1} s | **{:.3}×** | once each | {} MiB (RSS before: {} MiB) |",
        verify.as_secs_f64(),
        raw.as_secs_f64(),
        raw.as_secs_f64() / verify.as_secs_f64(),
        rss_peak / 1024,
        rss_before / 1024
    );
    rt.block_on(store.close()).unwrap();
}
