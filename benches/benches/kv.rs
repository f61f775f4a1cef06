//! sqlite kv engine versus raw rusqlite, same pragmas, same data, one run.
//!
//! Baseline table: the hand-rolled bytea table a user would write —
//! `blobs(id INTEGER PRIMARY KEY, key BLOB UNIQUE, value BLOB)`, WAL, the same
//! `synchronous` level. The baseline does not hash (its keys are
//! precomputed); alkblobs hashes every value (BLAKE3, ~1 µs per 4 KiB).

use std::path::Path;

use alkblobs::backend::sqlite::{SqliteBackend, SqliteOptions};
use alkblobs::{Durability, Key, Store};
use alkblobs_benches::{Lat, data, header, on_worker, paired, rounds};
use bytes::Bytes;
use rusqlite::Connection;

fn raw(path: &Path, durability: Durability) -> Connection {
    let c = Connection::open(path).unwrap();
    let _: String = c
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .unwrap();
    let sync = if durability == Durability::Durable {
        "FULL"
    } else {
        "NORMAL"
    };
    c.pragma_update(None, "synchronous", sync).unwrap();
    c.execute_batch("CREATE TABLE IF NOT EXISTS blobs (id INTEGER PRIMARY KEY, key BLOB NOT NULL UNIQUE, value BLOB NOT NULL)")
        .unwrap();
    c
}

fn main() {
    let (rt, dir, mut probes) = alkblobs_benches::setup();
    let r = rounds(16);
    let mut seed = 0u64;
    let mut next = |len| {
        seed += 1;
        data(seed, len)
    };

    for durability in [Durability::Durable, Durability::Relaxed] {
        let tag = if durability == Durability::Durable {
            "durable (FULL)"
        } else {
            "relaxed (NORMAL)"
        };
        header(&format!("sqlite kv, {tag}"));
        let sub = dir.path().join(format!("{durability:?}"));
        std::fs::create_dir_all(&sub).unwrap();
        let engine = rt
            .block_on(SqliteBackend::open(
                sub.join("alkblobs.sqlite"),
                SqliteOptions::default().durability(durability),
            ))
            .unwrap();
        let store = Store::builder().sqlite(engine).kv_only().build().unwrap();
        let conn = raw(&sub.join("raw.sqlite"), durability);
        let per_block = if durability == Durability::Durable {
            60
        } else {
            400
        };

        // put 4 KiB, one transaction per put.
        let mut a = |lat: &mut Lat| {
            let ops: Vec<_> = (0..per_block)
                .map(|_| {
                    let (s, v) = (store.clone(), Bytes::from(next(4096)));
                    move || async move { drop(s.put(v).await.unwrap()) }
                })
                .collect();
            (on_worker(&rt, lat, ops), per_block * 4096)
        };
        let mut seed_b = 1u64 << 40;
        let mut b = |lat: &mut Lat| {
            let vals: Vec<(Key, Vec<u8>)> = (0..per_block)
                .map(|_| {
                    seed_b += 1;
                    let v = data(seed_b, 4096);
                    (Key::of(&v), v)
                })
                .collect();
            let mut stmt = conn
                .prepare_cached("INSERT INTO blobs (key, value) VALUES (?1, ?2)")
                .unwrap();
            for (k, v) in vals {
                lat.time(|| {
                    stmt.execute(rusqlite::params![k.as_bytes().as_slice(), v])
                        .unwrap()
                });
            }
            (per_block, per_block * 4096)
        };
        paired("put 4 KiB", "Store::put", "INSERT", r, &mut a, &mut b);

        if durability == Durability::Durable {
            // Group commit: 16 tasks putting concurrently share commits and
            // fsyncs; the baseline is the same store with one task putting
            // the same number of blobs in sequence.
            let n = 4 * per_block;
            let mut seed_c = 1u64 << 50;
            let mut fresh = move || {
                seed_c += 1;
                Bytes::from(data(seed_c, 4096))
            };
            let mut a = |lat: &mut Lat| {
                let batches: Vec<Vec<Bytes>> = (0..16)
                    .map(|_| (0..n / 16).map(|_| fresh()).collect())
                    .collect();
                let s = store.clone();
                let t = std::time::Instant::now();
                rt.block_on(async move {
                    let tasks: Vec<_> = batches
                        .into_iter()
                        .map(|vals| {
                            let s = s.clone();
                            tokio::spawn(async move {
                                for v in vals {
                                    drop(s.put(v).await.unwrap());
                                }
                            })
                        })
                        .collect();
                    for t in tasks {
                        t.await.unwrap();
                    }
                });
                lat.record(t.elapsed() / (n as u32));
                (n, n * 4096)
            };
            let mut seed_d = 1u64 << 51;
            let mut b = |lat: &mut Lat| {
                let ops: Vec<_> = (0..n)
                    .map(|_| {
                        seed_d += 1;
                        let (s, v) = (store.clone(), Bytes::from(data(seed_d, 4096)));
                        move || async move { drop(s.put(v).await.unwrap()) }
                    })
                    .collect();
                (on_worker(&rt, lat, ops), n * 4096)
            };
            paired(
                "put 4 KiB, 16 tasks vs 1 (group commit)",
                "16 concurrent tasks",
                "1 task",
                r.min(8),
                &mut a,
                &mut b,
            );
        }

        // put_many 10,000 x 1 KiB in one transaction.
        let mut a = |lat: &mut Lat| {
            let (s, vals): (Store, Vec<Vec<u8>>) =
                (store.clone(), (0..10_000).map(|_| next(1024)).collect());
            let op = move || async move { drop(s.put_many(vals).await.unwrap()) };
            on_worker(&rt, lat, vec![op]);
            (10_000, 10_000 * 1024)
        };
        let mut b = |lat: &mut Lat| {
            let vals: Vec<(Key, Vec<u8>)> = (0..10_000)
                .map(|_| {
                    seed_b += 1;
                    let v = data(seed_b, 1024);
                    (Key::of(&v), v)
                })
                .collect();
            lat.time(|| {
                let tx = conn.unchecked_transaction().unwrap();
                {
                    let mut stmt = tx
                        .prepare_cached("INSERT INTO blobs (key, value) VALUES (?1, ?2)")
                        .unwrap();
                    for (k, v) in &vals {
                        stmt.execute(rusqlite::params![k.as_bytes().as_slice(), v])
                            .unwrap();
                    }
                }
                tx.commit().unwrap();
            });
            (10_000, 10_000 * 1024)
        };
        paired(
            "put_many 10k × 1 KiB",
            "Store::put_many",
            "INSERT ×10k in 1 tx",
            r,
            &mut a,
            &mut b,
        );

        // get 4 KiB from 2,000 keys, each side in a fresh, checkpointed
        // database (so neither pays for the other's write history).
        let engine = rt
            .block_on(SqliteBackend::open(
                sub.join("get.sqlite"),
                SqliteOptions::default().durability(durability),
            ))
            .unwrap();
        let store = Store::builder().sqlite(engine).kv_only().build().unwrap();
        let conn = raw(&sub.join("raw-get.sqlite"), durability);
        let keys: Vec<Key> = (0..2000)
            .map(|_| {
                let v = next(4096);
                let k = Key::of(&v);
                let _ = rt.block_on(store.put(v.clone())).unwrap();
                conn.execute(
                    "INSERT INTO blobs (key, value) VALUES (?1, ?2)",
                    rusqlite::params![k.as_bytes().as_slice(), v],
                )
                .unwrap();
                k
            })
            .collect();
        for db in ["get.sqlite", "raw-get.sqlite"] {
            let c = Connection::open(sub.join(db)).unwrap();
            let _: (i64, i64, i64) = c
                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })
                .unwrap();
        }
        let mut i = 0usize;
        let mut a = |lat: &mut Lat| {
            let ops: Vec<_> = (0..2000)
                .map(|_| {
                    i = (i * 7919 + 13) % keys.len();
                    let (s, k) = (store.clone(), keys[i]);
                    move || async move { assert!(s.get(&k).await.unwrap().is_some()) }
                })
                .collect();
            (on_worker(&rt, lat, ops), 2000 * 4096)
        };
        let mut j = 0usize;
        let mut b = |lat: &mut Lat| {
            let mut stmt = conn
                .prepare_cached("SELECT value FROM blobs WHERE key = ?1")
                .unwrap();
            for _ in 0..2000 {
                j = (j * 7919 + 13) % keys.len();
                let k = keys[j];
                lat.time(|| {
                    let v: Vec<u8> = stmt
                        .query_row([k.as_bytes().as_slice()], |r| r.get(0))
                        .unwrap();
                    assert_eq!(v.len(), 4096);
                });
            }
            (2000, 2000 * 4096)
        };
        paired("get 4 KiB", "Store::get", "SELECT", r, &mut a, &mut b);
        if durability == Durability::Durable {
            probes.take("middle", dir.path());
        }
    }
    probes.take("end", dir.path());
    probes.verdict();
}
