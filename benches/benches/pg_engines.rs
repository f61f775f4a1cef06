//! The client's PostgreSQL engines on the private cluster (run via
//! `benches/pg-bench.sh pg_engines`, which starts it and sets
//! ALKBLOBS_PG_URL), each beside the raw baseline it sits on, interleaved:
//!
//! 1. `postgres` kv get of 4 KiB (`alkblobs_get` through the engine) versus
//!    a raw tokio-postgres `SELECT v FROM t WHERE k = $1` on a plain bytea
//!    table, one connection each, one at a time.
//! 2. A batch of 1,000 × 1 KiB puts (`put_many`: one `alkblobs_put_many`
//!    call, hashes verified in the server) versus a raw one-statement batch
//!    `INSERT … SELECT unnest($1), unnest($2)` into the plain table.
//! 3. `pg-lo` streaming get of 256 MiB (1 MiB `lo_get` windows in one
//!    snapshot) versus a `local` get of the same blob from the page cache.
//! 4. `pg-lo` durable put of 256 MiB versus a `local` durable put.
//! 5. 8 concurrent `pg-lo` readers of 64 MiB blobs: aggregate throughput
//!    (recorded, no baseline).
//!
//! `ALKBLOBS_BENCH_PG_LARGE_MIB` overrides the 256 MiB of 3 and 4;
//! `ALKBLOBS_BENCH_ONLY=get,put_many,lo_get,lo_put,readers` runs a subset.

use std::time::Instant;

use alkblobs::backend::local::{LocalBackend, LocalOptions};
use alkblobs::backend::postgres::{PgLoBackend, PgOptions, PgPool, PostgresBackend};
use alkblobs::{Backend, Key, LargeBackend};
use alkblobs_benches::{Lat, data, header, on_worker, paired, rounds, scratch};
use bytes::Bytes;
use tokio::io::AsyncReadExt;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, NoTls};

async fn connect(url: &str) -> Client {
    let (c, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("connect to the bench cluster");
    tokio::spawn(conn);
    c
}

fn main() {
    let url =
        std::env::var("ALKBLOBS_PG_URL").expect("ALKBLOBS_PG_URL (benches/pg-bench.sh sets it)");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let r = rounds(10);
    let large_mib: usize = std::env::var("ALKBLOBS_BENCH_PG_LARGE_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let tag = std::process::id();
    let pool = format!("bench-engines-{tag}");
    let raw = format!("bench_raw_{tag}");
    let admin = rt.block_on(connect(&url));
    rt.block_on(admin.batch_execute(&format!(
        "SELECT alkblobs_create_pool('{pool}', single_instance => true);
         CREATE TABLE {raw} (k bytea PRIMARY KEY, v bytea NOT NULL);"
    )))
    .unwrap();
    // Both sides on the same transport: the raw client connects without
    // TLS, so the engine does too unless the URL says otherwise.
    let engine_url = if url.contains("sslmode") {
        url.clone()
    } else {
        format!(
            "{url}{}sslmode=disable",
            if url.contains('?') { '&' } else { '?' }
        )
    };
    let pg = rt
        .block_on(PgPool::connect(
            &PgOptions::new(&engine_url, &pool).max_connections(16),
        ))
        .unwrap()
        .0;
    let kv = PostgresBackend::new(pg.clone());
    let lo = PgLoBackend::new(pg);
    let rawc = std::sync::Arc::new(rt.block_on(connect(&url)));

    header("postgres kv and pg-lo against raw PostgreSQL and the local engine");
    let only = std::env::var("ALKBLOBS_BENCH_ONLY").ok();
    let run = |part: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|p| p == part))
    };

    if run("get") {
        // 1. kv get of 4 KiB.
        let n = 2000u64;
        let mut keys = Vec::new();
        let mut rows_k = Vec::new();
        let mut rows_v = Vec::new();
        for i in 0..n {
            let v = data(i, 4096);
            let k = Key::of(&v);
            rt.block_on(kv.put(&k, Bytes::from(v.clone()))).unwrap();
            rows_k.push(k.as_bytes().to_vec());
            rows_v.push(v);
            keys.push(k);
        }
        rt.block_on(rawc.execute(
            &format!("INSERT INTO {raw} SELECT * FROM unnest($1::bytea[], $2::bytea[])"),
            &[&rows_k, &rows_v],
        ))
        .unwrap();
        let kv_a = kv.clone();
        let keys_a = keys.clone();
        let mut a = |lat: &mut Lat| {
            let ops: Vec<_> = keys_a
                .iter()
                .map(|k| {
                    let (e, k) = (kv_a.clone(), *k);
                    move || async move { assert_eq!(e.get(&k).await.unwrap().unwrap().len(), 4096) }
                })
                .collect();
            (on_worker(&rt, lat, ops), n * 4096)
        };
        let select = format!("SELECT v FROM {raw} WHERE k = $1");
        let mut b = |lat: &mut Lat| {
            let ops: Vec<_> = rows_k
                .iter()
                .map(|k| {
                    let (c, k, q) = (rawc.clone(), k.clone(), select.clone());
                    move || async move {
                        let row = c.query_typed_one(&q, &[(&k, Type::BYTEA)]).await.unwrap();
                        assert_eq!(row.get::<_, Vec<u8>>(0).len(), 4096);
                    }
                })
                .collect();
            (on_worker(&rt, lat, ops), n * 4096)
        };
        paired(
            "get 4 KiB",
            "postgres engine",
            "raw SELECT",
            r,
            &mut a,
            &mut b,
        );
    }

    if run("put_many") {
        // 2. batches of 1,000 × 1 KiB, fresh keys every block.
        let mut seed_a = 1_000_000u64;
        let kv_b = kv.clone();
        let mut a = |lat: &mut Lat| {
            let items: Vec<(Key, Bytes)> = (0..1000)
                .map(|i| {
                    let v = data(seed_a + i, 1024);
                    (Key::of(&v), Bytes::from(v))
                })
                .collect();
            seed_a += 1000;
            let e = kv_b.clone();
            let ops = vec![move || async move {
                assert_eq!(e.put_many(&items).await.unwrap().len(), 1000);
            }];
            on_worker(&rt, lat, ops);
            (1000, 1000 * 1024)
        };
        let mut seed_b = 5_000_000u64;
        let insert = format!("INSERT INTO {raw} SELECT * FROM unnest($1::bytea[], $2::bytea[])");
        let mut b = |lat: &mut Lat| {
            let vals: Vec<Vec<u8>> = (0..1000).map(|i| data(seed_b + i, 1024)).collect();
            let ks: Vec<Vec<u8>> = vals
                .iter()
                .map(|v| Key::of(v).as_bytes().to_vec())
                .collect();
            seed_b += 1000;
            let (c, q) = (rawc.clone(), insert.clone());
            let ops = vec![move || async move {
                c.execute(&q, &[&ks, &vals]).await.unwrap();
            }];
            on_worker(&rt, lat, ops);
            (1000, 1000 * 1024)
        };
        paired(
            "put_many 1,000 × 1 KiB",
            "postgres engine",
            "raw INSERT unnest",
            r,
            &mut a,
            &mut b,
        );
    }

    // 3. and 4. large blobs against the local engine.
    let dir = scratch();
    let local = rt
        .block_on(LocalBackend::open(
            dir.path().join("large"),
            LocalOptions::default(),
        ))
        .unwrap();
    let size = large_mib << 20;
    let big = data(42, size);
    let big_key = Key::of(&big);
    let put_lo = |e: &PgLoBackend, v: &[u8]| {
        let e = e.clone();
        let v = Bytes::copy_from_slice(v);
        rt.block_on(async move {
            let mut w = e.begin_write().await.unwrap();
            for c in v.chunks(1 << 20) {
                w.write(Bytes::copy_from_slice(c)).await.unwrap();
            }
            let (key, outboard) = alkblobs::outboard::of(&v);
            w.commit(&key, outboard.into()).await.unwrap()
        })
    };
    if run("lo_get") {
        put_lo(&lo, &big);
        rt.block_on(local.put(&big_key, Bytes::from(big.clone())))
            .unwrap();
    }
    let read_all = |r: Option<alkblobs::backend::BlobReader>| async move {
        let mut r = r.unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let mut n = 0usize;
        loop {
            let k = r.read(&mut buf).await.unwrap();
            if k == 0 {
                break n;
            }
            n += k;
        }
    };
    let rr = r.clamp(3, 5);
    if run("lo_get") {
        let mut a = |lat: &mut Lat| {
            let e = lo.clone();
            let ops = vec![move || async move {
                assert_eq!(read_all(e.open_read(&big_key).await.unwrap()).await, size)
            }];
            (on_worker(&rt, lat, ops), size as u64)
        };
        let mut b = |lat: &mut Lat| {
            let e = local.clone();
            let ops = vec![move || async move {
                assert_eq!(read_all(e.open_read(&big_key).await.unwrap()).await, size)
            }];
            (on_worker(&rt, lat, ops), size as u64)
        };
        paired(
            &format!("streaming get {large_mib} MiB"),
            "pg-lo",
            "local (page cache)",
            rr,
            &mut a,
            &mut b,
        );
    }
    if run("lo_put") {
        let mut round = 0u64;
        let mut a = |lat: &mut Lat| {
            round += 1;
            let mut v = big.clone();
            v[..8].copy_from_slice(&round.to_le_bytes());
            let t = Instant::now();
            put_lo(&lo, &v);
            lat.record(t.elapsed());
            (1, size as u64)
        };
        let mut round_b = 0u64;
        let mut b = |lat: &mut Lat| {
            round_b += 1;
            let mut v = big.clone();
            v[..8].copy_from_slice(&(round_b | 1 << 63).to_le_bytes());
            let k = Key::of(&v);
            let t = Instant::now();
            rt.block_on(local.put(&k, Bytes::from(v))).unwrap();
            lat.record(t.elapsed());
            (1, size as u64)
        };
        paired(
            &format!("durable put {large_mib} MiB"),
            "pg-lo",
            "local",
            rr,
            &mut a,
            &mut b,
        );
    }
    // 5. 8 concurrent readers.
    if run("readers") {
        let mut keys8 = Vec::new();
        for i in 0..8u64 {
            let v = data(900 + i, 64 << 20);
            keys8.push(Key::of(&v));
            put_lo(&lo, &v);
        }
        let t = Instant::now();
        let total: usize = rt.block_on(async {
            let tasks: Vec<_> = keys8
                .iter()
                .map(|k| {
                    let (e, k) = (lo.clone(), *k);
                    tokio::spawn(async move { read_all(e.open_read(&k).await.unwrap()).await })
                })
                .collect();
            let mut n = 0;
            for t in tasks {
                n += t.await.unwrap();
            }
            n
        });
        println!(
            "\n8 concurrent pg-lo readers of 64 MiB: {:.0} MB/s aggregate ({} MiB in {:.2} s)",
            total as f64 / t.elapsed().as_secs_f64() / 1e6,
            total >> 20,
            t.elapsed().as_secs_f64()
        );
    }
    rt.block_on(admin.batch_execute(&format!("DROP TABLE {raw}")))
        .unwrap();
}
