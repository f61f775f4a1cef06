//! The extension on the private cluster (run via `benches/pg-bench.sh`,
//! which starts it and sets ALKBLOBS_PG_URL).
//!
//! 1. `alkblobs_sweep` over 1,000,000 entries, 10% dead, 100,000 pins and a
//!    1,000,000-row liveness table, window zero, versus a hand-written
//!    anti-join DELETE of the same rows on an identical pool. Dead rows are
//!    put back after each round (untimed).
//! 2. A put through the SQL API (entry + pin, one transaction) versus a raw
//!    INSERT of the entry alone into a plain bytea table; one connection,
//!    autocommit, so both pay one commit each.
//! 3. Renewing 10,000 pins of one owner: one statement, timed.
//! 4. Bounded work: a pool of 10,000,000 dead entries swept by repeated
//!    `alkblobs_sweep` calls with the default `max_keys`, each call its own
//!    transaction; prints the number of calls and the longest one.
//!
//! `ALKBLOBS_BENCH_PG_ENTRIES` overrides the pool size of 1 and 3,
//! `ALKBLOBS_BENCH_PG_BIG` the size of 4.

use std::time::Instant;

use alkblobs_benches::{Lat, data, header, paired, rounds};
use tokio_postgres::{Client, NoTls};

async fn connect(url: &str) -> Client {
    let (c, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("connect to the bench cluster");
    tokio::spawn(conn);
    c
}

/// Fills pool `name` with `n` entries (keys are BLAKE3 of int8send(g)),
/// pins every 10th from 5 on, and records 80% of the rest in `live` (plus
/// keys not in the pool), leaving every 10th from 0 dead.
async fn build(c: &Client, name: &str, live: &str, n: i64) {
    // (The full-mark collector: this bench measures the mark.)
    c.execute(
        "SELECT alkblobs_create_pool($1, '0 seconds', '1 hour', collector => 'mark')",
        &[&name],
    )
    .await
    .unwrap();
    c.execute(
        "INSERT INTO alkblobs.entries (pool, key, size, tier, value)
         SELECT p.id, alkblobs_key(int8send(g)), 8, 'kv', int8send(g)
           FROM alkblobs.pools p, generate_series(1, $2::bigint) g WHERE p.name = $1",
        &[&name, &n],
    )
    .await
    .unwrap();
    c.execute(
        "INSERT INTO alkblobs.pins (pool, key, role, owner, expires_at)
         SELECT p.id, alkblobs_key(int8send(g)), r.oid, 'bench-owner', clock_timestamp() + interval '1 hour'
           FROM alkblobs.pools p, generate_series(1, $2::bigint) g, pg_roles r
          WHERE p.name = $1 AND g % 10 = 5 AND r.rolname = session_user",
        &[&name, &n],
    )
    .await
    .unwrap();
    c.batch_execute(&format!(
        "INSERT INTO {live} (key) SELECT alkblobs_key(int8send(g)) FROM generate_series(1, {n}) g
           WHERE g % 10 NOT IN (0, 5) ON CONFLICT DO NOTHING;
         INSERT INTO {live} (key) SELECT alkblobs_key(int8send(-g)) FROM generate_series(1, {n} / 5) g
           ON CONFLICT DO NOTHING;"
    ))
    .await
    .unwrap();
}

async fn restore_dead(c: &Client, name: &str, n: i64) {
    c.execute(
        "INSERT INTO alkblobs.entries (pool, key, size, tier, value)
         SELECT p.id, alkblobs_key(int8send(g)), 8, 'kv', int8send(g)
           FROM alkblobs.pools p, generate_series(0, $2::bigint, 10) g WHERE p.name = $1 AND g > 0",
        &[&name, &n],
    )
    .await
    .unwrap();
}

fn main() {
    let url = std::env::var("ALKBLOBS_PG_URL").expect(
        "ALKBLOBS_PG_URL is not set: run benches/pg-bench.sh, which starts the private cluster",
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let n: i64 = std::env::var("ALKBLOBS_BENCH_PG_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let c = rt.block_on(connect(&url));
    let tag = std::process::id();
    let (ours, theirs, live) = (
        format!("bench-ours-{tag}"),
        format!("bench-theirs-{tag}"),
        format!("bench_live_{tag}"),
    );
    rt.block_on(c.batch_execute("CREATE EXTENSION IF NOT EXISTS alkblobs"))
        .unwrap();
    // The put comparison runs first, while both tables start empty: the
    // same-size b-trees on both sides.
    header("put 4 KiB through the SQL API vs a raw INSERT (autocommit, one connection)");
    rt.block_on(c.batch_execute(&format!(
        "CREATE TABLE bench_raw_{tag} (key bytea PRIMARY KEY, value bytea NOT NULL)"
    )))
    .unwrap();
    let put_pool = format!("bench-put-{tag}");
    rt.block_on(c.execute("SELECT alkblobs_create_pool($1)", &[&put_pool]))
        .unwrap();
    let put = rt
        .block_on(c.prepare("SELECT alkblobs_put($1, $2, $3, 'bench-writer')"))
        .unwrap();
    let raw = rt
        .block_on(c.prepare(&format!(
            "INSERT INTO bench_raw_{tag} (key, value) VALUES ($1, $2)"
        )))
        .unwrap();
    let mut seed = 1u64 << 60;
    let mut a = |lat: &mut Lat| {
        for _ in 0..100 {
            seed += 1;
            let v = data(seed, 4096);
            let k = blake3::hash(&v).as_bytes().to_vec();
            lat.time(|| {
                rt.block_on(c.query_one(&put, &[&put_pool, &k, &v]))
                    .unwrap()
            });
        }
        (100, 100 * 4096)
    };
    let mut seed_b = 1u64 << 61;
    let mut b = |lat: &mut Lat| {
        for _ in 0..100 {
            seed_b += 1;
            let v = data(seed_b, 4096);
            let k = blake3::hash(&v).as_bytes().to_vec();
            lat.time(|| rt.block_on(c.execute(&raw, &[&k, &v])).unwrap());
        }
        (100, 100 * 4096)
    };
    paired(
        "put 4 KiB",
        "alkblobs_put (entry + pin)",
        "INSERT (entry only)",
        rounds(12),
        &mut a,
        &mut b,
    );

    let t = Instant::now();
    rt.block_on(async {
        c.batch_execute("CREATE EXTENSION IF NOT EXISTS alkblobs")
            .await
            .unwrap();
        c.batch_execute(&format!("CREATE TABLE {live} (key bytea PRIMARY KEY)"))
            .await
            .unwrap();
        build(&c, &ours, &live, n).await;
        build(&c, &theirs, &live, n).await;
        c.execute(
            "SELECT alkblobs_register_liveness($1, $2::text::regclass)",
            &[&ours, &live],
        )
        .await
        .unwrap();
        c.batch_execute("VACUUM ANALYZE alkblobs.entries")
            .await
            .unwrap();
        c.batch_execute("VACUUM ANALYZE alkblobs.pins")
            .await
            .unwrap();
        c.batch_execute(&format!("VACUUM ANALYZE {live}"))
            .await
            .unwrap();
    });
    let live_rows: i64 = rt
        .block_on(c.query_one(&format!("SELECT count(*) FROM {live}"), &[]))
        .unwrap()
        .get(0);
    println!(
        "built two pools of {n} entries, {} pins each, a {live_rows}-row liveness table, in {:.1?}",
        n / 10,
        t.elapsed()
    );

    header(&format!(
        "alkblobs_sweep over {n} entries, 10% dead (PostgreSQL 15, private cluster)"
    ));
    let dead = n / 10;
    let mut a = |lat: &mut Lat| {
        let row = lat.time(|| {
            // One call over the whole pool (max_keys = n), to compare with
            // one DELETE; section 4 measures the bounded calls.
            rt.block_on(c.query_one(
                "SELECT deleted, aborted FROM alkblobs_sweep($1, max_keys => $2::bigint::int)",
                &[&ours, &n],
            ))
            .unwrap()
        });
        assert_eq!(
            row.get::<_, i64>(0),
            dead,
            "the sweep deleted exactly the dead rows"
        );
        rt.block_on(restore_dead(&c, &ours, n));
        (n as u64, 0)
    };
    let anti_join = format!(
        "DELETE FROM alkblobs.entries e USING alkblobs.pools p
          WHERE p.name = $1 AND e.pool = p.id
            AND NOT EXISTS (SELECT 1 FROM alkblobs.pins pn WHERE pn.pool = e.pool AND pn.key = e.key AND pn.expires_at > clock_timestamp())
            AND NOT EXISTS (SELECT 1 FROM {live} l WHERE l.key = e.key)"
    );
    let mut b = |lat: &mut Lat| {
        let d = lat.time(|| rt.block_on(c.execute(&anti_join, &[&theirs])).unwrap());
        assert_eq!(d as i64, dead);
        rt.block_on(restore_dead(&c, &theirs, n));
        (n as u64, 0)
    };
    paired(
        "sweep (mark, stage, execute)",
        "alkblobs_sweep",
        "anti-join DELETE",
        rounds(5),
        &mut a,
        &mut b,
    );

    // 10,000 pins of one owner, renewed in one statement.
    rt.block_on(c.execute(
        "INSERT INTO alkblobs.pins (pool, key, role, owner, expires_at)
         SELECT p.id, alkblobs_key(int8send(g)), r.oid, 'renewing-owner', clock_timestamp() + interval '1 hour'
           FROM alkblobs.pools p, generate_series(1, 10000) g, pg_roles r
          WHERE p.name = $1 AND r.rolname = session_user",
        &[&ours],
    ))
    .unwrap();
    let mut times = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let r: i64 = rt
            .block_on(c.query_one("SELECT alkblobs_renew($1, 'renewing-owner')", &[&ours]))
            .unwrap()
            .get(0);
        times.push(t.elapsed());
        assert_eq!(r, 10_000);
    }
    times.sort();
    println!(
        "\nrenewing 10,000 pins of one owner (one statement): median {:.1?}, min {:.1?}, max {:.1?}",
        times[2], times[0], times[4]
    );

    rt.block_on(async {
        for p in [&ours, &theirs] {
            c.execute("DELETE FROM alkblobs.pins WHERE pool = (SELECT id FROM alkblobs.pools WHERE name = $1)", &[p]).await.unwrap();
            c.execute("DELETE FROM alkblobs.staged WHERE pool = (SELECT id FROM alkblobs.pools WHERE name = $1)", &[p]).await.unwrap();
            c.execute("DELETE FROM alkblobs.marks WHERE pool = (SELECT id FROM alkblobs.pools WHERE name = $1)", &[p]).await.unwrap();
            c.execute("DELETE FROM alkblobs.liveness WHERE pool = (SELECT id FROM alkblobs.pools WHERE name = $1)", &[p]).await.unwrap();
            c.execute("DELETE FROM alkblobs.entries WHERE pool = (SELECT id FROM alkblobs.pools WHERE name = $1)", &[p]).await.unwrap();
            c.execute("DELETE FROM alkblobs.pools WHERE name = $1", &[p]).await.unwrap();
        }
        c.batch_execute(&format!("DROP TABLE {live}; DROP TABLE bench_raw_{tag}")).await.unwrap();
    });

    // 4. Bounded work over a big pool.
    let big_n: i64 = std::env::var("ALKBLOBS_BENCH_PG_BIG")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let big = format!("bench-big-{tag}");
    header(&format!(
        "bounded sweep calls over {big_n} dead entries (default max_keys, one transaction per call)"
    ));
    let t = Instant::now();
    rt.block_on(async {
        c.execute(
            "SELECT alkblobs_create_pool($1, '0 seconds', '1 hour', collector => 'mark')",
            &[&big],
        )
            .await
            .unwrap();
        let mut from = 1i64;
        while from <= big_n {
            let to = (from + 999_999).min(big_n);
            c.execute(
                "INSERT INTO alkblobs.entries (pool, key, size, tier, value)
                 SELECT p.id, alkblobs_key(int8send(g)), 8, 'kv', int8send(g)
                   FROM alkblobs.pools p, generate_series($2::bigint, $3::bigint) g WHERE p.name = $1",
                &[&big, &from, &to],
            )
            .await
            .unwrap();
            from = to + 1;
        }
        c.batch_execute("VACUUM ANALYZE alkblobs.entries").await.unwrap();
    });
    println!("built {big_n} entries in {:.1?}", t.elapsed());
    let (mut calls, mut longest, mut deleted, mut marking) =
        (0u32, std::time::Duration::ZERO, 0i64, true);
    let t = Instant::now();
    loop {
        let c0 = Instant::now();
        let row = rt
            .block_on(c.query_one(
                "SELECT deleted, remaining, mark_done FROM alkblobs_sweep($1, mark => $2)",
                &[&big, &marking],
            ))
            .unwrap();
        longest = longest.max(c0.elapsed());
        calls += 1;
        deleted += row.get::<_, i64>(0);
        if row.get::<_, bool>(2) {
            marking = false;
        }
        if !marking && row.get::<_, i64>(1) == 0 {
            break;
        }
    }
    assert_eq!(deleted, big_n, "every dead entry went");
    println!(
        "swept {big_n} entries in {calls} calls, {:.1?} in all; longest call (= transaction) {longest:.2?}",
        t.elapsed()
    );
    rt.block_on(async {
        c.execute("DELETE FROM alkblobs.marks WHERE pool = (SELECT id FROM alkblobs.pools WHERE name = $1)", &[&big]).await.unwrap();
        c.execute("DELETE FROM alkblobs.pools WHERE name = $1", &[&big]).await.unwrap();
    });
}
