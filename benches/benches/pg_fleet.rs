//! Fleet mode on the private cluster (run via `benches/pg-bench.sh
//! pg_fleet`, which starts it and sets ALKBLOBS_PG_URL):
//!
//! 1. Fleet put of 4 KiB blobs (`Store::put` on a fleet store: entry row +
//!    this instance's pin row in one `alkblobs_put_many` call, hash
//!    verified in the server) versus a raw tokio-postgres statement
//!    inserting the same two rows (entry and pin) into plain tables in one
//!    transaction, one at a time, interleaved.
//! 2. Pin renewal of an instance holding 100,000 pins: the one statement a
//!    renewal round runs (`alkblobs_renew`), timed, and the client's memory
//!    for the guards.
//! 3. 8 instances in separate processes putting 4 KiB blobs concurrently
//!    into one pool: aggregate puts/s against one instance alone (this
//!    binary re-runs itself as the instances).
//!
//! Both sides connect without TLS (`sslmode=disable` unless the URL names
//! a mode), as in `pg_engines`.

use std::time::{Duration, Instant};

use alkblobs::Store;
use alkblobs::store::fleet::{FleetLarge, FleetOptions};
use alkblobs_benches::{Lat, data, header, on_worker, paired, rounds, rss_anon_kib};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, NoTls};

async fn connect(url: &str) -> Client {
    let (c, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("connect to the bench cluster");
    tokio::spawn(conn);
    c
}

fn plain(url: &str) -> String {
    if url.contains("sslmode") {
        url.to_owned()
    } else {
        format!(
            "{url}{}sslmode=disable",
            if url.contains('?') { '&' } else { '?' }
        )
    }
}

const WORKER_ENV: &str = "ALKBLOBS_BENCH_FLEET_WORKER";

/// One instance of part 3: `URL POOL SEED N` in the environment; puts N
/// blobs of 4 KiB one after the other and prints how long that took.
fn worker(spec: &str) {
    let mut it = spec.split('\u{1f}');
    let (url, pool, seed, n) = (
        it.next().unwrap().to_owned(),
        it.next().unwrap().to_owned(),
        it.next().unwrap().parse::<u64>().unwrap(),
        it.next().unwrap().parse::<u64>().unwrap(),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let s = Store::open_fleet(FleetOptions::new(&url, &pool, FleetLarge::KvOnly))
            .await
            .unwrap();
        let blobs: Vec<Vec<u8>> = (0..n).map(|i| data(seed + i, 4096)).collect();
        let t = Instant::now();
        for b in blobs {
            let p = s.put(b).await.unwrap();
            drop(p.pin);
        }
        println!("{}", t.elapsed().as_secs_f64());
        s.close().await.unwrap();
    });
}

/// Runs `k` instances of `n` puts each at once; returns the wall time until
/// the last one finished (each process's own timing starts after it opened
/// its store and built its blobs).
fn instances(url: &str, pool: &str, k: u64, n: u64, seed: u64) -> f64 {
    let me = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..k)
        .map(|i| {
            let spec = format!("{url}\u{1f}{pool}\u{1f}{}\u{1f}{n}", seed + i * 1_000_000);
            std::process::Command::new(&me)
                .env(WORKER_ENV, spec)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut slowest = 0f64;
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "a bench instance failed");
        let secs: f64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        slowest = slowest.max(secs);
    }
    slowest
}

fn main() {
    if let Ok(spec) = std::env::var(WORKER_ENV) {
        return worker(&spec);
    }
    let url = plain(
        &std::env::var("ALKBLOBS_PG_URL").expect("ALKBLOBS_PG_URL (benches/pg-bench.sh sets it)"),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let r = rounds(10);
    let tag = std::process::id();
    let pool = format!("bench-fleet-{tag}");
    let admin = rt.block_on(connect(&url));
    rt.block_on(admin.batch_execute(&format!(
        "SELECT alkblobs_create_pool('{pool}', large_tier => 'none');
         CREATE TABLE bench_fleet_e_{tag} (pool int, key bytea, size bigint, tier text, value bytea,
                                          created_at timestamptz DEFAULT now(), PRIMARY KEY (pool, key));
         CREATE TABLE bench_fleet_p_{tag} (pool int, key bytea, role oid, owner text,
                                          expires_at timestamptz, PRIMARY KEY (pool, key, role, owner));"
    )))
    .unwrap();
    header("fleet mode against raw PostgreSQL");

    // 1. Fleet put of 4 KiB.
    let store = rt
        .block_on(Store::open_fleet(
            FleetOptions::new(&url, &pool, FleetLarge::KvOnly).instance(format!("bench-{tag}")),
        ))
        .unwrap();
    let raw = std::sync::Arc::new(rt.block_on(connect(&url)));
    let n = 500u64;
    let mut seed_a = 0u64;
    let s_a = store.clone();
    let mut a = |lat: &mut Lat| {
        let blobs: Vec<Vec<u8>> = (0..n).map(|i| data(seed_a + i, 4096)).collect();
        seed_a += n;
        let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let ops: Vec<_> = blobs
            .into_iter()
            .map(|b| {
                let (s, held) = (s_a.clone(), held.clone());
                move || async move {
                    let p = s.put(b).await.unwrap();
                    held.lock().unwrap().push(p);
                }
            })
            .collect();
        let ran = on_worker(&rt, lat, ops);
        // The guards drop outside the timed block (their rows are deleted
        // in the background, in batches).
        drop(held);
        (ran, n * 4096)
    };
    let mut seed_b = 50_000_000u64;
    let insert = format!(
        "WITH e AS (INSERT INTO bench_fleet_e_{tag} (pool, key, size, tier, value) VALUES (1, $1, 4096, 'kv', $2))
         INSERT INTO bench_fleet_p_{tag} VALUES (1, $1, 10, 'bench', clock_timestamp() + interval '60 seconds')"
    );
    let mut b = |lat: &mut Lat| {
        let blobs: Vec<Vec<u8>> = (0..n).map(|i| data(seed_b + i, 4096)).collect();
        seed_b += n;
        let ops: Vec<_> = blobs
            .into_iter()
            .map(|v| {
                let (c, q) = (raw.clone(), insert.clone());
                let k = blake3::hash(&v).as_bytes().to_vec();
                move || async move {
                    c.query_typed(&q, &[(&k, Type::BYTEA), (&v, Type::BYTEA)])
                        .await
                        .unwrap();
                }
            })
            .collect();
        (on_worker(&rt, lat, ops), n * 4096)
    };
    paired(
        "fleet put 4 KiB (entry + pin)",
        "fleet store",
        "raw INSERT entry + pin",
        r,
        &mut a,
        &mut b,
    );

    // 2. Renewal with 100,000 pins held.
    let before = rss_anon_kib();
    let mut guards = Vec::new();
    let t = Instant::now();
    for batch in 0..100u64 {
        let blobs: Vec<Vec<u8>> = (0..1000u64)
            .map(|i| data(90_000_000 + batch * 1000 + i, 256))
            .collect();
        guards.push(rt.block_on(store.put_many(blobs)).unwrap());
    }
    let filled = t.elapsed();
    let held_kib = rss_anon_kib().saturating_sub(before);
    let owner = format!("bench-{tag}");
    let mut times = Vec::new();
    let mut renewed = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let n: i64 = rt
            .block_on(admin.query_one("SELECT alkblobs_renew($1, $2)", &[&pool, &owner]))
            .unwrap()
            .get(0);
        times.push(t.elapsed());
        // (The store's own renewal task may hold some rows at that moment:
        // those are passed over, SKIP LOCKED.)
        assert!(n > 0, "renewed nothing");
        renewed.push(n);
    }
    times.sort();
    println!(
        "\nrenewal of 100,000 pins (one `alkblobs_renew` statement; rows renewed per call {:?}): median {:.0} ms (min {:.0}, max {:.0}); client memory for the guards {} KiB ({} B per pin); putting them took {:.1} s",
        renewed,
        times[2].as_secs_f64() * 1e3,
        times[0].as_secs_f64() * 1e3,
        times[4].as_secs_f64() * 1e3,
        held_kib,
        held_kib * 1024 / 100_000,
        filled.as_secs_f64()
    );
    drop(guards);
    std::thread::sleep(Duration::from_secs(1));

    // 3. 8 instances in separate processes against one.
    let per = 400u64;
    let one = instances(&url, &pool, 1, per, 200_000_000);
    let eight = instances(&url, &pool, 8, per, 300_000_000);
    println!(
        "\n8 instances in separate processes, {per} × 4 KiB puts each: {:.0} puts/s aggregate ({:.2} s); one instance alone: {:.0} puts/s ({:.2} s); {:.1}× one",
        8.0 * per as f64 / eight,
        eight,
        per as f64 / one,
        one,
        (8.0 * per as f64 / eight) / (per as f64 / one)
    );
    rt.block_on(store.close()).unwrap();
    rt.block_on(admin.batch_execute(&format!(
        "DROP TABLE bench_fleet_e_{tag}, bench_fleet_p_{tag}"
    )))
    .unwrap();
}
