//! The review queue against the full mark (issue 24), one run on the
//! private cluster (`benches/pg-bench.sh pg_queue`).
//!
//! 1. The write path, paired: a fleet put (`alkblobs_put`, entry + pin, one
//!    transaction) and a liveness row inserted then deleted, on a `queue`
//!    pool, against the same on a `mark` pool in a second database whose
//!    queue triggers are dropped and whose table has the guard of 0.7.0
//!    (INSERT OR UPDATE only): the write path as it was before the queue.
//! 2. A pool of `ALKBLOBS_BENCH_QUEUE_ENTRIES` (default 10,000,000) live
//!    entries, each named by a row of a registered liveness table, filled
//!    by the bench as a `mark` pool (no queue rows), then switched to the
//!    queue: the audit that switch asks for is the full mark, timed call
//!    by call (`max_keys` 20,000, one transaction each).
//! 3. 10,000 changes — 5,000 liveness rows deleted, 5,000 puts released
//!    unreferenced — then one incremental cycle: sweep calls until the
//!    queue is drained and nothing due is left, timed; it must collect
//!    exactly those 10,000.

use std::time::{Duration, Instant};

use alkblobs_benches::{Lat, data, header, paired, rounds};
use tokio_postgres::{Client, NoTls};

async fn connect(url: &str) -> Client {
    let (c, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("connect to the bench cluster");
    tokio::spawn(conn);
    c
}

/// `url` with its database replaced by `db`.
fn with_db(url: &str, db: &str) -> String {
    let (base, _) = url.rsplit_once('/').expect("a URL with a database");
    format!("{base}/{db}")
}

fn main() {
    let url = std::env::var("ALKBLOBS_PG_URL").expect(
        "ALKBLOBS_PG_URL is not set: run benches/pg-bench.sh pg_queue, which starts the private cluster",
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let n: i64 = std::env::var("ALKBLOBS_BENCH_QUEUE_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let tag = std::process::id();
    let c = rt.block_on(connect(&url));
    rt.block_on(c.batch_execute("CREATE EXTENSION IF NOT EXISTS alkblobs"))
        .unwrap();

    // 1. The write path (ALKBLOBS_BENCH_QUEUE_WRITES=0 skips it).
    if std::env::var("ALKBLOBS_BENCH_QUEUE_WRITES").as_deref() != Ok("0") {
        write_path(&rt, &c, &url, tag);
    }
    // (ALKBLOBS_BENCH_QUEUE_ENTRIES=0: the write path only.)
    if n > 0 {
        big_pool(&rt, &c, n, tag);
    }
}

/// Section 1: the write path, paired against the same before the queue.
fn write_path(rt: &tokio::runtime::Runtime, c: &Client, url: &str, tag: u32) {
    let before_db = format!("bench_before_queue_{tag}");
    rt.block_on(c.batch_execute(&format!("CREATE DATABASE {before_db}")))
        .unwrap();
    let b = rt.block_on(connect(&with_db(url, &before_db)));
    let (qpool, mpool) = (format!("bench-q-{tag}"), format!("bench-m-{tag}"));
    let (qlive, mlive) = (format!("bench_qlive_{tag}"), format!("bench_mlive_{tag}"));
    rt.block_on(async {
        c.execute(
            "SELECT alkblobs_create_pool($1, '1 hour', '1 hour', collector => 'queue')",
            &[&qpool],
        )
        .await
        .unwrap();
        c.batch_execute(&format!(
            "CREATE TABLE {qlive} (key bytea NOT NULL); CREATE INDEX ON {qlive} (key);
             SELECT alkblobs_register_liveness('{qpool}', '{qlive}');"
        ))
        .await
        .unwrap();
        b.batch_execute(&format!(
            "CREATE EXTENSION alkblobs;
             DROP TRIGGER queue_released ON alkblobs.pins;
             SELECT alkblobs_create_pool('{mpool}', '1 hour', '1 hour', collector => 'mark');
             CREATE TABLE {mlive} (key bytea NOT NULL); CREATE INDEX ON {mlive} (key);
             SELECT alkblobs_register_liveness('{mpool}', '{mlive}');
             DROP TRIGGER alkblobs_liveness_guard ON {mlive};
             DROP TRIGGER alkblobs_liveness_truncate ON {mlive};
             CREATE TRIGGER alkblobs_liveness_guard AFTER INSERT OR UPDATE ON {mlive}
                 FOR EACH ROW EXECUTE FUNCTION alkblobs_registration.liveness_guard();
             ALTER TABLE {mlive} ENABLE ALWAYS TRIGGER alkblobs_liveness_guard;"
        ))
        .await
        .unwrap();
    });
    header(
        "the write path: a queue pool vs the same before the queue (paired, autocommit, one connection each)",
    );
    let put_q = rt
        .block_on(c.prepare("SELECT alkblobs_put($1, $2, $3, 'bench-writer')"))
        .unwrap();
    let put_m = rt
        .block_on(b.prepare("SELECT alkblobs_put($1, $2, $3, 'bench-writer')"))
        .unwrap();
    let mut seed = 1u64 << 60;
    let mut puts = |cl: &Client, st: &tokio_postgres::Statement, pool: &str, lat: &mut Lat| {
        for _ in 0..100 {
            seed += 1;
            let v = data(seed, 4096);
            let k = blake3::hash(&v).as_bytes().to_vec();
            lat.time(|| rt.block_on(cl.query_one(st, &[&pool, &k, &v])).unwrap());
        }
        (100, 100 * 4096)
    };
    let (mut pa, mut pb) = (Vec::new(), Vec::new());
    {
        let puts = std::cell::RefCell::new(&mut puts);
        paired(
            "fleet put 4 KiB",
            "queue pool",
            "before the queue",
            rounds(8),
            &mut |lat| (puts.borrow_mut())(c, &put_q, &qpool, lat),
            &mut |lat| (puts.borrow_mut())(&b, &put_m, &mpool, lat),
        );
    }
    // Liveness rows: insert one naming a held key, then delete it.
    rt.block_on(async {
        for (cl, pool, keys) in [(c, &qpool, &mut pa), (&b, &mpool, &mut pb)] {
            for i in 0..100u64 {
                let v = data(i + 7, 64);
                let k = blake3::hash(&v).as_bytes().to_vec();
                cl.query_one(
                    "SELECT alkblobs_put($1, $2, $3, 'bench-writer')",
                    &[pool, &k, &v],
                )
                .await
                .unwrap();
                keys.push(k);
            }
        }
    });
    let ins_q = rt
        .block_on(c.prepare(&format!("INSERT INTO {qlive} VALUES ($1)")))
        .unwrap();
    let del_q = rt
        .block_on(c.prepare(&format!("DELETE FROM {qlive} WHERE key = $1")))
        .unwrap();
    let ins_m = rt
        .block_on(b.prepare(&format!("INSERT INTO {mlive} VALUES ($1)")))
        .unwrap();
    let del_m = rt
        .block_on(b.prepare(&format!("DELETE FROM {mlive} WHERE key = $1")))
        .unwrap();
    let rows = |cl: &Client,
                ins: &tokio_postgres::Statement,
                del: &tokio_postgres::Statement,
                keys: &[Vec<u8>],
                lat: &mut Lat| {
        for k in keys {
            lat.time(|| {
                rt.block_on(cl.execute(ins, &[k])).unwrap();
                rt.block_on(cl.execute(del, &[k])).unwrap();
            });
        }
        (keys.len() as u64, 0)
    };
    paired(
        "liveness row inserted and deleted",
        "queue pool",
        "before the queue",
        rounds(8),
        &mut |lat| rows(c, &ins_q, &del_q, &pa, lat),
        &mut |lat| rows(&b, &ins_m, &del_m, &pb, lat),
    );
    drop(b);
    rt.block_on(async {
        c.batch_execute(&format!("DROP DATABASE {before_db} WITH (FORCE)"))
            .await
            .unwrap();
    });
}

/// Sections 2 and 3: the big pool, its audit, one incremental cycle.
fn big_pool(rt: &tokio::runtime::Runtime, c: &Client, n: i64, tag: u32) {
    let big = format!("bench-big-q-{tag}");
    let live = format!("bench_big_live_{tag}");
    println!(
        "\n### a pool of {n} live entries: the audit (the full mark) against one incremental cycle after 10,000 changes\n"
    );
    let t = Instant::now();
    rt.block_on(async {
        c.execute(
            "SELECT alkblobs_create_pool($1, '0 seconds', '1 hour', collector => 'mark', audit_every => '0')",
            &[&big],
        )
        .await
        .unwrap();
        c.batch_execute(&format!("CREATE TABLE {live} (key bytea NOT NULL, n bigint NOT NULL)"))
            .await
            .unwrap();
        let mut from = 1i64;
        while from <= n {
            let to = (from + 999_999).min(n);
            c.execute(
                "INSERT INTO alkblobs.entries (pool, key, size, tier, value)
                 SELECT p.id, alkblobs_key(int8send(g)), 8, 'kv', int8send(g)
                   FROM alkblobs.pools p, generate_series($2::bigint, $3::bigint) g WHERE p.name = $1",
                &[&big, &from, &to],
            )
            .await
            .unwrap();
            c.execute(
                &format!(
                    "INSERT INTO {live} (key, n) SELECT alkblobs_key(int8send(g)), g FROM generate_series($1::bigint, $2::bigint) g"
                ),
                &[&from, &to],
            )
            .await
            .unwrap();
            from = to + 1;
        }
        c.batch_execute(&format!("CREATE INDEX ON {live} (key); CREATE INDEX ON {live} (n)"))
            .await
            .unwrap();
        // (Each VACUUM its own statement: it cannot run in a transaction.)
        for t in ["alkblobs.entries", &live] {
            c.batch_execute(&format!("VACUUM ANALYZE {t}")).await.unwrap();
        }
        c.execute(
            "SELECT alkblobs_register_liveness($1, $2::text::regclass)",
            &[&big, &live],
        )
        .await
        .unwrap();
    });
    println!("built {n} entries and liveness rows in {:.1?}", t.elapsed());
    rt.block_on(c.execute(
        "SELECT alkblobs_alter_pool($1, collector => 'queue')",
        &[&big],
    ))
    .unwrap();
    // The audit the switch asked for: the full mark, call by call.
    let sweep = rt
        .block_on(c.prepare(
            "SELECT reviewed, staged, deleted, remaining, mark_done, audit FROM alkblobs_sweep($1)",
        ))
        .unwrap();
    let (mut calls, mut longest, mut total) = (0u32, Duration::ZERO, Duration::ZERO);
    loop {
        let t = Instant::now();
        let r = rt.block_on(c.query_one(&sweep, &[&big])).unwrap();
        let d = t.elapsed();
        calls += 1;
        total += d;
        longest = longest.max(d);
        let staged: i64 = r.get(1);
        assert_eq!(staged, 0, "the audit staged live entries");
        if r.get::<_, bool>(4) {
            let audit: Option<String> = r.get(5);
            assert!(audit.is_some(), "the switch's audit did not run");
            break;
        }
    }
    println!(
        "audit (full mark) of {n} entries: {calls} calls, {:.1?} of call time; longest call (= transaction) {longest:.2?}; {:.2} µs per entry",
        total,
        total.as_secs_f64() * 1e6 / n as f64
    );
    let full = total;

    // 3. 10,000 changes and one incremental cycle.
    rt.block_on(async {
        c.execute(&format!("DELETE FROM {live} WHERE n <= 5000"), &[])
            .await
            .unwrap();
        let mut keys = Vec::new();
        let mut vals = Vec::new();
        for i in 0..5000u64 {
            let v = data(i + (1 << 40), 64);
            keys.push(blake3::hash(&v).as_bytes().to_vec());
            vals.push(v);
        }
        for (ks, vs) in keys.chunks(1000).zip(vals.chunks(1000)) {
            c.query(
                "SELECT alkblobs_put_many($1, $2, $3, 'bench-churn')",
                &[&big, &ks.to_vec(), &vs.to_vec()],
            )
            .await
            .unwrap();
        }
        c.execute("SELECT alkblobs_unpin_all($1, 'bench-churn')", &[&big])
            .await
            .unwrap();
    });
    let (mut calls, mut total, mut reviewed, mut deleted, mut longest) =
        (0u32, Duration::ZERO, 0i64, 0i64, Duration::ZERO);
    loop {
        let t = Instant::now();
        let r = rt.block_on(c.query_one(&sweep, &[&big])).unwrap();
        let d = t.elapsed();
        calls += 1;
        total += d;
        longest = longest.max(d);
        reviewed += r.get::<_, i64>(0);
        deleted += r.get::<_, i64>(2);
        assert_eq!(
            r.get::<_, Option<String>>(5),
            None,
            "an audit ran in the cycle"
        );
        if r.get::<_, i64>(0) < 20_000 && r.get::<_, i64>(3) == 0 {
            break;
        }
    }
    assert_eq!(
        deleted, 10_000,
        "the cycle collected exactly the 10,000 changed"
    );
    println!(
        "incremental cycle after 10,000 changes: {calls} calls, {reviewed} queue rows reviewed, {deleted} deleted, {:.2?} of call time (longest {longest:.2?})",
        total
    );
    println!(
        "the full mark / the incremental cycle: {:.0}×",
        full.as_secs_f64() / total.as_secs_f64()
    );
    rt.block_on(async {
        c.execute("SELECT alkblobs_unregister_liveness($1, $2::text::regclass)", &[&big, &live])
            .await
            .unwrap();
        c.batch_execute(&format!("DROP TABLE {live}")).await.unwrap();
        c.execute(
            "DELETE FROM alkblobs.entries WHERE pool = (SELECT id FROM alkblobs.pools WHERE name = $1)",
            &[&big],
        )
        .await
        .unwrap();
    });
}
