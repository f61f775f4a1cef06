//! Plays "another process" for the crash and locking tests.
//!
//! - `slow-put DIR`: opens the embedded store in DIR and streams an endless
//!   large put, one chunk every 20 ms, printing `writing` once started.
//! - `slow-put-named DIR`: `slow-put` with the large tier's writes staged
//!   in named files (`LocalOptions::named_staging`).
//! - `crash-puts DIR`: puts blobs of mixed sizes in a loop, printing each
//!   key once its put returned (so the parent knows it is durable).
//! - `hold-sqlite-lock DB`: takes SQLite's exclusive write lock on DB with a
//!   plain rusqlite connection, prints `locked`, holds until stdin closes.
//! - `sweep-then-die DIR WINDOW_MS`: runs a sweep on DIR and, once its rows
//!   are staged and sealed, prints `sealed` and hangs until killed.
//! - `powercut DIR`: the power-cut test's workload (tests/powercut.rs) on
//!   the embedded store in DIR, durable, threshold 16 KiB, window zero:
//!   puts, a batch, garbage, a sweep, more puts; prints what each step
//!   acknowledged (`put KEY`, `root KEY`, `unroot KEY`, `sweep-start`,
//!   `swept DELETED`) once it returned, and marks its phases for lossyfs.
//! - `pg-crash-puts URL POOL`: `crash-puts` on a single-instance PostgreSQL
//!   pool (threshold 1 KiB: kv rows and large objects).
//! - `fleet-hold URL POOL N`: a fleet instance (kv-only pool) puts N blobs,
//!   keeps their guards, prints `ready`; on each stdin line `check` it
//!   confirms its guards, re-puts the lapsed ones and prints
//!   `lapsed=L restored=R`.
//! - `fleet-crash-puts URL POOL TIER [DIR]`: `crash-puts` as a fleet
//!   instance (TIER pg-lo, none, local with the shared directory DIR, or
//!   s3 with the pool's location DIR; threshold 1 KiB except kv-only).
//! - `fleet-claim-then-die URL POOL DIR`: a fleet instance over the shared
//!   local tier DIR sweeps; once its claim committed and the claimed files
//!   are unlinked (before it confirms the delete), prints `claimed` and
//!   hangs until killed.
//! - `fleet-claim-then-stop URL POOL S3-LOCATION` (feature `s3`): a fleet
//!   instance over the s3 pool at S3-LOCATION sweeps; once its claim
//!   committed and a claimed object's tombstone is locked, before the
//!   delete is sent, prints `deleting` and stops itself (SIGSTOP). Resumed,
//!   it sends the delete, finishes or fails its sweep, and prints
//!   `swept ok` or `swept error`.
//! - `fleet-race URL POOL TABLE I SECS [S3-LOCATION]`: fleet instance I
//!   (a pg-lo pool, or an s3 pool at S3-LOCATION)
//!   puts, pins, writes and deletes liveness rows in TABLE, releases and
//!   sweeps for SECS seconds, failing (exit 1) if anything it holds a guard
//!   on is missing or different; prints `deleted=N` (what its sweeps
//!   collected).
//! - `s3-put-then-die BUCKET PREFIX MIB` (feature `s3`): opens the s3
//!   engine on the prefix (taking its lease, TTL 3 s), streams MIB MiB into
//!   a write, prints `committing KEY` and commits it as a multipart upload
//!   one 5 MiB part at a time; the parent kills it mid-upload.
//! - `fleet-partitioned URL POOL S3-LOCATION TABLE MIB` (feature `s3`): a
//!   fleet instance (run in its own network namespace by pg_partition)
//!   puts four small blobs and keeps their guards, names the first two in
//!   TABLE, prints `held KEY0 KEY1 KEY2 KEY3` and `putting KEY` and puts MIB
//!   MiB (an s3 upload between its pin and its publish), then prints `put
//!   ok` or `put error KIND`; on a stdin line `write K` it inserts key K
//!   into TABLE and prints `liveness ok` or `liveness SQLSTATE`.
//! - `s3-open BUCKET PREFIX` (feature `s3`): opens the s3 engine with the
//!   credentials of its environment and prints `ok`, or `error KIND`, the
//!   error's text and its `Debug` form, each on its own line.

use std::io::{BufRead, Write};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use alkblobs::{Store, SweepOptions, SweepPhase};
use tokio::io::{AsyncRead, ReadBuf};

struct Slow {
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    n: u64,
}

impl AsyncRead for Slow {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(Duration::from_millis(20))));
        if sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        this.sleep = None;
        this.n += 1;
        let chunk = alkblobs_tests::data(this.n, buf.remaining().min(256 * 1024));
        buf.put_slice(&chunk);
        if this.n == 3 {
            println!("writing");
            let _ = std::io::stdout().flush();
        }
        Poll::Ready(Ok(()))
    }
}

use std::future::Future;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("slow-put") => {
            let store = Store::open_dir(&args[2]).await.expect("open");
            let _ = store.put_reader(Slow { sleep: None, n: 0 }).await;
        }
        Some("slow-put-named") => {
            use alkblobs::backend::local::{LocalBackend, LocalOptions};
            use alkblobs::backend::sqlite::{SqliteBackend, SqliteOptions};
            let dir = std::path::Path::new(&args[2]);
            let kv = SqliteBackend::open(dir.join("index.sqlite"), SqliteOptions::default())
                .await
                .expect("open sqlite");
            let large = LocalBackend::open(
                dir.join("large"),
                LocalOptions::default().named_staging(true),
            )
            .await
            .expect("open local");
            let store = Store::builder()
                .sqlite(kv)
                .large(large)
                .build()
                .expect("build");
            let _ = store.put_reader(Slow { sleep: None, n: 0 }).await;
        }
        Some("crash-puts") => {
            let store = Store::open_dir(&args[2]).await.expect("open");
            for i in 0u64.. {
                let size = match i % 4 {
                    0 => 10,
                    1 => 60_000,
                    2 => 200_000,
                    _ => 3_000_000,
                };
                let put = store.put(alkblobs_tests::data(i, size)).await.expect("put");
                println!("{}", put.key);
                let _ = std::io::stdout().flush();
            }
        }
        Some("powercut") => powercut(&args[2]).await,
        #[cfg(feature = "s3")]
        Some("fleet-partitioned") => {
            fleet_partitioned(
                &args[2],
                &args[3],
                &args[4],
                &args[5],
                args[6].parse().unwrap(),
            )
            .await
        }
        #[cfg(feature = "s3")]
        Some("fleet-claim-then-stop") => fleet_claim_then_stop(&args[2], &args[3], &args[4]).await,
        #[cfg(feature = "s3")]
        Some("s3-open") => {
            use alkblobs::backend::s3::{S3Backend, S3Location, S3Options};
            let opts = S3Options::new(S3Location::new(&args[2], &args[3]).expect("location"))
                .retry_timeout(Duration::from_secs(2));
            match S3Backend::open(opts).await {
                Ok(_) => println!("ok"),
                Err(e) => println!("error {:?}\n{e}\n{e:?}", e.kind()),
            }
        }
        #[cfg(feature = "s3")]
        Some("s3-put-then-die") => {
            s3_put_then_die(&args[2], &args[3], args[4].parse().unwrap()).await
        }
        Some("pg-crash-puts") => {
            let opts =
                alkblobs::store::postgres::PostgresOptions::new(&args[2], &args[3]).threshold(1024);
            let store = Store::open_postgres(opts).await.expect("open");
            for i in 0u64.. {
                let size = match i % 4 {
                    0 => 10,
                    1 => 1_000,
                    2 => 200_000,
                    _ => 6_000_000,
                };
                let put = store.put(alkblobs_tests::data(i, size)).await.expect("put");
                println!("{}", put.key);
                let _ = std::io::stdout().flush();
            }
        }
        Some("fleet-crash-puts") => {
            use alkblobs::store::fleet::{FleetLarge, FleetOptions};
            let (large, threshold, sizes) = match args[4].as_str() {
                "pg-lo" => (FleetLarge::PgLo, 1024, [10, 1_000, 200_000, 6_000_000]),
                "none" => (FleetLarge::KvOnly, 65_536, [10, 1_000, 30_000, 60_000]),
                // 12 MB: a multipart upload of three 5 MiB parts.
                #[cfg(feature = "s3")]
                "s3" => (
                    FleetLarge::S3(
                        alkblobs::backend::s3::S3Options::new(args[5].parse().expect("location"))
                            .part_size(5 << 20),
                    ),
                    1024,
                    [10, 1_000, 200_000, 12_000_000],
                ),
                _ => (
                    FleetLarge::SharedLocal(args[5].clone().into()),
                    1024,
                    [10, 1_000, 200_000, 6_000_000],
                ),
            };
            let store = Store::open_fleet(
                FleetOptions::new(&args[2], &args[3], large).threshold(threshold),
            )
            .await
            .expect("open fleet");
            for i in 0u64.. {
                let put = store
                    .put(alkblobs_tests::data(i, sizes[(i % 4) as usize]))
                    .await
                    .expect("put");
                println!("{}", put.key);
                let _ = std::io::stdout().flush();
                std::mem::forget(put.pin);
            }
        }
        Some("fleet-claim-then-die") => {
            use alkblobs::store::fleet::{FleetLarge, FleetOptions};
            let store = Store::open_fleet(FleetOptions::new(
                &args[2],
                &args[3],
                FleetLarge::SharedLocal(args[4].clone().into()),
            ))
            .await
            .expect("open fleet");
            let opts = SweepOptions::new().hook(|phase| {
                Box::pin(async move {
                    if phase == SweepPhase::Claimed {
                        println!("claimed");
                        let _ = std::io::stdout().flush();
                        std::future::pending::<()>().await;
                    }
                })
            });
            let _ = store.sweep(opts).await;
        }
        Some("fleet-hold") => fleet_hold(&args[2], &args[3], args[4].parse().unwrap()).await,
        Some("fleet-race") => {
            fleet_race(
                &args[2],
                &args[3],
                &args[4],
                args[5].parse().unwrap(),
                args[6].parse().unwrap(),
            )
            .await
        }
        Some("hold-sqlite-lock") => {
            let conn = rusqlite::Connection::open(&args[2]).expect("open");
            conn.execute_batch("BEGIN EXCLUSIVE").expect("lock");
            println!("locked");
            let _ = std::io::stdout().flush();
            let mut line = String::new();
            let _ = std::io::stdin().lock().read_line(&mut line);
            conn.execute_batch("ROLLBACK").expect("unlock");
        }
        Some("sweep-then-die") => {
            let store = Store::open_dir(&args[2]).await.expect("open");
            let window = Duration::from_millis(args[3].parse().expect("window ms"));
            let opts = SweepOptions::new().window(window).hook(|phase| {
                Box::pin(async move {
                    if phase == SweepPhase::Sealed {
                        println!("sealed");
                        let _ = std::io::stdout().flush();
                        std::future::pending::<()>().await;
                    }
                })
            });
            let _ = store.sweep(opts).await;
        }
        _ => {
            eprintln!(
                "usage: alkblobs-test-helper slow-put|crash-puts|pg-crash-puts|hold-sqlite-lock|sweep-then-die ARGS"
            );
            std::process::exit(2);
        }
    }
}

async fn fleet_hold(url: &str, pool: &str, n: u32) {
    use alkblobs::store::fleet::{FleetLarge, FleetOptions};
    let store = Store::open_fleet(FleetOptions::new(url, pool, FleetLarge::KvOnly))
        .await
        .expect("open fleet");
    let value = |i: u32| format!("held by a stopped instance {i}").into_bytes();
    let mut guards = Vec::new();
    for i in 0..n {
        guards.push(store.put(value(i)).await.expect("put"));
    }
    println!("ready");
    let _ = std::io::stdout().flush();
    for line in std::io::stdin().lock().lines() {
        if line.expect("stdin").trim() != "check" {
            continue;
        }
        let (mut lapsed, mut restored) = (0, 0);
        for (i, g) in guards.iter_mut().enumerate() {
            match store.confirm(&g.pin).await {
                Ok(()) => {}
                Err(alkblobs::Error::PinExpired { key }) => {
                    assert_eq!(key, g.key);
                    lapsed += 1;
                    *g = store.put(value(i as u32)).await.expect("re-put");
                    if store.get(&g.key).await.expect("get").as_deref()
                        == Some(&value(i as u32)[..])
                    {
                        restored += 1;
                    }
                }
                Err(e) => panic!("confirm: {e}"),
            }
        }
        println!("lapsed={lapsed} restored={restored}");
        let _ = std::io::stdout().flush();
    }
}

async fn fleet_race(url: &str, pool: &str, table: &str, me: u64, secs: u64) {
    use alkblobs::store::fleet::{FleetLarge, FleetOptions};
    use rand::Rng;
    // A seventh argument `s3://BUCKET/PREFIX`: the pool's large tier is on
    // S3; `routed=URL`: this racer is a kv-only node routing large content
    // to that storage node (which sweeps: a routed node never does).
    let routed = std::env::args().nth(7).filter(|a| a.starts_with("routed="));
    let large = match std::env::args().nth(7) {
        Some(_) if routed.is_some() => {
            FleetLarge::Routed(alkblobs::backend::routed::RoutedOptions::new(
                &routed.clone().unwrap()["routed=".len()..],
            ))
        }
        #[cfg(feature = "s3")]
        Some(loc) => FleetLarge::S3(alkblobs::backend::s3::S3Options::new(
            loc.parse().expect("an s3 location"),
        )),
        #[cfg(not(feature = "s3"))]
        Some(_) => panic!("this helper was built without the s3 feature"),
        None => FleetLarge::PgLo,
    };
    let store =
        Store::open_fleet(FleetOptions::new(url, pool, large).instance(format!("racer-{me}")))
            .await
            .expect("open fleet");
    let (db, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    let mut rng = rand::rng();
    let mut held: Vec<(u64, alkblobs::Put)> = Vec::new();
    let mut deleted = 0u64;
    let until = std::time::Instant::now() + Duration::from_secs(secs);
    let fail = |what: String| -> ! {
        eprintln!("VIOLATION (racer {me}): {what}");
        std::process::exit(1)
    };
    let mut i = 0u64;
    while std::time::Instant::now() < until {
        i += 1;
        // Seeds shared by every racer: the same content put concurrently.
        let seed = rng.random_range(0..120u64);
        let v = alkblobs_tests::fleet_value(seed);
        let put = store.put(v.clone()).await.expect("put");
        match rng.random_range(0..3) {
            0 => {
                let r = db
                    .execute(
                        &format!("INSERT INTO {table} VALUES ($1, $2) ON CONFLICT DO NOTHING"),
                        &[&put.key.as_bytes().as_slice(), &(seed as i64)],
                    )
                    .await;
                if let Err(e) = r {
                    fail(format!("liveness write of a pinned key failed: {e:?}"));
                }
            }
            1 => {
                let _ = db
                    .execute(
                        &format!("DELETE FROM {table} WHERE seed = $1"),
                        &[&(rng.random_range(0..120u64) as i64)],
                    )
                    .await;
            }
            _ => {}
        }
        held.push((seed, put));
        // Whatever is held must be there, byte for byte.
        let (seed, g) = &held[rng.random_range(0..held.len())];
        match store.get(&g.key).await {
            Ok(Some(b)) if b[..] == alkblobs_tests::fleet_value(*seed)[..] => {}
            other => fail(format!(
                "held key {} read back {:?}",
                g.key,
                other.map(|o| o.map(|b| b.len()))
            )),
        }
        if held.len() > 8 || rng.random_range(0..4) == 0 {
            let k = rng.random_range(0..held.len());
            drop(held.swap_remove(k));
        }
        if i.is_multiple_of(10) && routed.is_none() {
            match store.sweep(SweepOptions::new()).await {
                Ok(r) => deleted += r.deleted,
                Err(e) if e.is_retryable() => {}
                Err(e) => fail(format!("sweep: {e}")),
            }
        }
        // A pin of something another racer may be collecting right now.
        let other = alkblobs_tests::fleet_value(rng.random_range(0..120u64));
        match store.pin(&alkblobs::Key::of(&other)).await {
            Ok(g) => match store.get(&alkblobs::Key::of(&other)).await {
                Ok(Some(b)) if b[..] == other[..] => drop(g),
                r => fail(format!(
                    "a pinned existing key read back {:?}",
                    r.map(|o| o.map(|b| b.len()))
                )),
            },
            Err(e) if e.is_not_found() => {}
            Err(e) => fail(format!("pin: {e}")),
        }
    }
    drop(held);
    store.close().await.expect("close");
    println!("deleted={deleted}");
}

/// The `powercut` workload: every line it prints is a step that returned
/// (stdout is line-buffered, so a line is out before the next step starts).
async fn powercut(dir: &str) {
    use alkblobs::store::DirOptions;
    let dir = std::path::Path::new(dir);
    let phase = |name: &str| {
        // lossyfs records the phase at this lookup (the name never exists).
        let _ = std::fs::metadata(dir.join(format!(".lossyfs-phase-{name}")));
    };
    let opts = DirOptions::new()
        .threshold(16 * 1024)
        .delete_window(Duration::ZERO);
    let store = Store::open_dir_with(dir, opts).await.expect("open");
    let ack = |what: &str, key: &alkblobs::Key| println!("{what} {key}");
    phase("put");
    for (i, size) in [100usize, 3_000, 40_000, 300_000].into_iter().enumerate() {
        let put = store
            .put(alkblobs_tests::data(i as u64, size))
            .await
            .expect("put");
        ack("put", &put.key);
        store.add_roots(&[put.key]).await.expect("add root");
        ack("root", &put.key);
    }
    phase("batch");
    let batch: Vec<Vec<u8>> = (0..12u64)
        .map(|i| {
            alkblobs_tests::data(
                100 + i,
                if i % 3 == 0 {
                    30_000 + i as usize
                } else {
                    500 + i as usize
                },
            )
        })
        .collect();
    let many = store.put_many(batch).await.expect("put_many");
    let keys: Vec<alkblobs::Key> = many.entries.iter().map(|e| e.key).collect();
    for k in &keys {
        ack("put", k);
    }
    store.add_roots(&keys).await.expect("add roots");
    for k in &keys {
        ack("root", k);
    }
    drop(many);
    phase("garbage");
    for i in 0..6u64 {
        let put = store
            .put(alkblobs_tests::data(
                200 + i,
                if i % 2 == 0 { 700 } else { 50_000 },
            ))
            .await
            .expect("put");
        ack("put", &put.key);
    }
    store.remove_roots(&keys[..2]).await.expect("remove roots");
    ack("unroot", &keys[0]);
    ack("unroot", &keys[1]);
    phase("sweep");
    println!("sweep-start");
    let report = store.sweep(SweepOptions::new()).await.expect("sweep");
    println!("swept {}", report.deleted);
    phase("after");
    for i in 0..3u64 {
        let put = store
            .put(alkblobs_tests::data(300 + i, 20_000 * i as usize + 10))
            .await
            .expect("put");
        ack("put", &put.key);
        store.add_roots(&[put.key]).await.expect("add root");
        ack("root", &put.key);
    }
    phase("end");
    store.close().await.expect("close");
    println!("closed");
}

#[cfg(feature = "s3")]
async fn s3_put_then_die(bucket: &str, prefix: &str, mib: u64) {
    use alkblobs::backend::LargeBackend;
    use alkblobs::backend::s3::{S3Backend, S3Location, S3Options};
    let opts = S3Options::new(S3Location::new(bucket, prefix).expect("location"))
        .part_size(5 << 20)
        .upload_concurrency(1)
        .lease_ttl(Duration::from_secs(3));
    let engine = S3Backend::open(opts).await.expect("open s3");
    let mut w = engine.begin_write().await.expect("begin");
    let mut hash = alkblobs::outboard::Builder::new();
    for i in 0..mib {
        let chunk = alkblobs_tests::data(i, 1 << 20);
        hash.update(&chunk);
        w.write(chunk.into()).await.expect("write");
    }
    let (key, outboard) = hash.finish();
    println!("committing {key}");
    let _ = std::io::stdout().flush();
    w.commit(&key, outboard.into()).await.expect("commit");
    println!("committed");
    let _ = std::io::stdout().flush();
    std::future::pending::<()>().await;
}

/// `fleet-partitioned`: see the module docs.
#[cfg(feature = "s3")]
async fn fleet_partitioned(url: &str, pool: &str, location: &str, table: &str, mib: usize) {
    use alkblobs::backend::s3::S3Options;
    use alkblobs::store::fleet::{FleetLarge, FleetOptions};
    let say = |line: String| {
        println!("{line}");
        let _ = std::io::stdout().flush();
    };
    let loc = location.parse().expect("an s3 location");
    let store = Store::open_fleet(
        FleetOptions::new(
            url,
            pool,
            FleetLarge::S3(S3Options::new(loc).part_size(5 << 20)),
        )
        .threshold(1024),
    )
    .await
    .expect("open fleet");
    let (db, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    let mut held = Vec::new();
    for i in 0..4 {
        held.push(
            store
                .put(format!("held across a partition {i}").into_bytes())
                .await
                .expect("put"),
        );
    }
    for g in &held[..2] {
        db.execute(
            &format!("INSERT INTO {table} VALUES ($1)"),
            &[&g.key.as_bytes().to_vec()],
        )
        .await
        .expect("liveness row");
    }
    say(format!(
        "held {}",
        held.iter()
            .map(|g| g.key.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    ));
    let big = alkblobs_tests::data(mib as u64, mib << 20);
    say(format!("putting {}", alkblobs::Key::of(&big)));
    match store.put(big).await {
        Ok(_) => say("put ok".into()),
        Err(e) => say(format!("put error {:?}", e.kind())),
    }
    for line in std::io::stdin().lock().lines() {
        let line = line.expect("stdin");
        let Some(k) = line.strip_prefix("write ") else {
            continue;
        };
        let k: alkblobs::Key = k.trim().parse().expect("a key");
        match db
            .execute(
                &format!("INSERT INTO {table} VALUES ($1)"),
                &[&k.as_bytes().to_vec()],
            )
            .await
        {
            Ok(_) => say("liveness ok".into()),
            Err(e) => say(format!(
                "liveness {}",
                e.code().map(|c| c.code().to_owned()).unwrap_or_default()
            )),
        }
    }
    drop(held);
}

/// `fleet-claim-then-stop`: see the module docs.
#[cfg(feature = "s3")]
async fn fleet_claim_then_stop(url: &str, pool: &str, location: &str) {
    use alkblobs::backend::s3::S3Options;
    use alkblobs::store::fleet::{FleetLarge, FleetOptions};
    let loc = location.parse().expect("an s3 location");
    let store = Store::open_fleet(FleetOptions::new(
        url,
        pool,
        FleetLarge::S3(S3Options::new(loc).retry_timeout(Duration::from_secs(5))),
    ))
    .await
    .expect("open fleet");
    let opts = SweepOptions::new().hook(|phase| {
        Box::pin(async move {
            if phase == SweepPhase::Deleting {
                println!("deleting");
                let _ = std::io::stdout().flush();
                // Stopped as by a long pause: the parent resumes it.
                // SAFETY: kill(2) on this process, no memory involved.
                let stopped = unsafe { libc::kill(std::process::id() as i32, libc::SIGSTOP) };
                assert_eq!(stopped, 0, "SIGSTOP itself");
            }
        })
    });
    let r = store.sweep(opts).await;
    println!("swept {}", if r.is_ok() { "ok" } else { "error" });
    let _ = std::io::stdout().flush();
}
