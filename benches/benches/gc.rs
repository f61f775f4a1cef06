//! Single-node GC on sqlite.
//!
//! 1. A sweep of a 1,000,000-entry pool with 10% dead (liveness: 900,000
//!    roots in the same database), window zero, versus a hand-written
//!    anti-join `DELETE` of the same rows on an identical copy of the
//!    database. After each round the dead rows are put back (untimed).
//!    Peak RSS during the sweep is recorded.
//! 2. `Store::put` of 4 KiB (pins taken before publish) versus the same put
//!    with the pin machinery removed (hash + engine put), durable.
//!
//! `ALKBLOBS_BENCH_GC_ENTRIES` overrides the pool size.

use std::time::Instant;

use alkblobs::backend::sqlite::{SqliteBackend, SqliteOptions};
use alkblobs::{Key, Store, SweepOptions};
use alkblobs_benches::{
    Lat, data, header, on_worker, paired, peak_rss_kib, reset_peak_rss, rounds, rss_anon_kib,
};
use bytes::Bytes;
use rusqlite::Connection;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

fn value(i: u64) -> Vec<u8> {
    // Small, distinct values: the pool is about keys, not bytes.
    i.to_le_bytes().repeat(4)
}

fn main() {
    let (rt, dir, mut probes) = alkblobs_benches::setup();
    let n: u64 = std::env::var("ALKBLOBS_BENCH_GC_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let dead_every = 10;
    let ours = dir.path().join("ours.sqlite");
    let theirs = dir.path().join("theirs.sqlite");

    // Build the pool once through the store, then copy it for the baseline.
    let t = Instant::now();
    let (dead_keys, dead_vals) = {
        let engine = rt
            .block_on(SqliteBackend::open(&ours, SqliteOptions::default()))
            .unwrap();
        let store = Store::builder().sqlite(engine).kv_only().build().unwrap();
        let (mut dk, mut dv) = (Vec::new(), Vec::new());
        for start in (0..n).step_by(10_000) {
            let vals: Vec<Vec<u8>> = (start..(start + 10_000).min(n)).map(value).collect();
            let many = rt.block_on(store.put_many(vals.clone())).unwrap();
            let roots: Vec<Key> = many
                .entries
                .iter()
                .zip(start..)
                .filter(|(_, i)| i % dead_every != 0)
                .map(|(e, _)| e.key)
                .collect();
            for (e, i) in many.entries.iter().zip(start..) {
                if i % dead_every == 0 {
                    dk.push(e.key);
                    dv.push(value(i));
                }
            }
            rt.block_on(store.add_roots(&roots)).unwrap();
        }
        (dk, dv)
    };
    {
        let c = Connection::open(&ours).unwrap();
        let _: (i64, i64, i64) = c
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .unwrap();
    }
    std::fs::copy(&ours, &theirs).unwrap();
    println!(
        "built a {n}-entry pool ({} dead) in {:.1?}",
        dead_keys.len(),
        t.elapsed()
    );

    let engine = rt
        .block_on(SqliteBackend::open(&ours, SqliteOptions::default()))
        .unwrap();
    let store = Store::builder().sqlite(engine).kv_only().build().unwrap();
    let raw = Connection::open(&theirs).unwrap();
    let _: String = raw
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .unwrap();
    raw.pragma_update(None, "synchronous", "FULL").unwrap();

    header(&format!(
        "sweep of {n} entries, 10% dead, window 0 (sqlite, durable)"
    ));
    let mut rss = Vec::new();
    let anon_peak = Arc::new(AtomicU64::new(0));
    let mut anon_before = 0;
    let mut a = |lat: &mut Lat| {
        reset_peak_rss();
        let before = peak_rss_kib();
        anon_before = rss_anon_kib();
        let ap = anon_peak.clone();
        let opts = SweepOptions::new()
            .window(std::time::Duration::ZERO)
            .on_progress(move |_| {
                ap.fetch_max(rss_anon_kib(), Ordering::Relaxed);
            });
        let report = lat.time(|| rt.block_on(store.sweep(opts)).unwrap());
        rss.push((before, peak_rss_kib()));
        assert_eq!(report.deleted as usize, dead_keys.len(), "{report:?}");
        rt.block_on(store.put_many(dead_vals.clone()))
            .map(drop)
            .unwrap();
        (n, 0)
    };
    let mut b = |lat: &mut Lat| {
        let deleted = lat.time(|| {
            let tx = raw.unchecked_transaction().unwrap();
            tx.execute(
                "DELETE FROM vals WHERE vid IN (SELECT e.vid FROM entries e WHERE NOT EXISTS (SELECT 1 FROM roots r WHERE r.key = e.key))",
                [],
            )
            .unwrap();
            let d = tx.execute("DELETE FROM entries WHERE NOT EXISTS (SELECT 1 FROM roots r WHERE r.key = entries.key)", []).unwrap();
            tx.commit().unwrap();
            d
        });
        assert_eq!(deleted, dead_keys.len());
        let tx = raw.unchecked_transaction().unwrap();
        {
            let first_vid: i64 = tx
                .query_row("SELECT coalesce(max(vid), 0) + 1 FROM vals", [], |r| {
                    r.get(0)
                })
                .unwrap();
            let mut e = tx
                .prepare("INSERT INTO entries (key, size, vid) VALUES (?1, ?2, ?3)")
                .unwrap();
            let mut v = tx
                .prepare("INSERT INTO vals (vid, value) VALUES (?1, ?2)")
                .unwrap();
            for ((k, val), vid) in dead_keys.iter().zip(&dead_vals).zip(first_vid..) {
                e.execute(rusqlite::params![
                    k.as_bytes().as_slice(),
                    val.len() as i64,
                    vid
                ])
                .unwrap();
                v.execute(rusqlite::params![vid, val]).unwrap();
            }
        }
        tx.commit().unwrap();
        (n, 0)
    };
    let r = rounds(5);
    paired(
        "sweep (mark 1M, stage + execute 100k)",
        "Store::sweep",
        "anti-join DELETE",
        r,
        &mut a,
        &mut b,
    );
    let rss_sweep: Vec<u64> = rss.iter().map(|(b, a)| a.saturating_sub(*b)).collect();
    println!(
        "peak RSS growth during a sweep: {} KiB, incl. memory-mapped database pages (max over rounds; process peak {} MiB); anonymous memory: {} KiB before, {} KiB peak during",
        rss_sweep.iter().max().unwrap_or(&0),
        rss.iter().map(|(_, a)| a).max().unwrap_or(&0) / 1024,
        anon_before,
        anon_peak.load(Ordering::Relaxed)
    );
    probes.take("middle", dir.path());

    header("put 4 KiB with pins vs without (sqlite, durable)");
    let kv = store.kv().clone();
    let mut seed = 1u64 << 50;
    let mut fresh = move || {
        seed += 1;
        Bytes::from(data(seed, 4096))
    };
    let mut a = |lat: &mut Lat| {
        let ops: Vec<_> = (0..60)
            .map(|_| {
                let (s, v) = (store.clone(), fresh());
                move || async move { drop(s.put(v).await.unwrap()) }
            })
            .collect();
        (on_worker(&rt, lat, ops), 60 * 4096)
    };
    let mut seed_b = 1u64 << 51;
    let mut b = |lat: &mut Lat| {
        let ops: Vec<_> = (0..60)
            .map(|_| {
                seed_b += 1;
                let (e, v) = (kv.clone(), Bytes::from(data(seed_b, 4096)));
                // The same work minus the pin map: hash, then the engine put.
                move || async move {
                    let k = Key::of(&v);
                    e.put(&k, v).await.unwrap();
                }
            })
            .collect();
        (on_worker(&rt, lat, ops), 60 * 4096)
    };
    paired(
        "put 4 KiB",
        "Store::put (pinned)",
        "hash + engine put (no pins)",
        rounds(16),
        &mut a,
        &mut b,
    );
    probes.take("end", dir.path());
    probes.verdict();
}
