//! The `s3` large tier with PostgreSQL: single-instance and fleet stores
//! over an s3 pool (the store and arbiter suites), pools' locations, the
//! fleet-validity rule's location check, and fleet instances in separate
//! processes racing sweeps over one s3 pool. Against the test server and
//! the test S3 server scripts/test.sh starts; never skipped.

#![cfg(all(feature = "pg", feature = "s3"))]

use alkblobs::backend::s3::{S3Location, S3Options};
use alkblobs::conformance::store::Config;
use alkblobs::store::fleet::{FleetLarge, FleetOptions};
use alkblobs::store::postgres::{PgLarge, PostgresOptions};
use alkblobs::{Error, Key, Store, arbiter_suite, store_suite};
use alkblobs_tests::pg::{connect, ensure_extension, sqlstate, unique, url};
use alkblobs_tests::s3::location;

const TIERED: Config = Config {
    kv_only: false,
    big: 100 << 20,
    list_keys: 5_000,
};

/// A fresh s3 pool (window 0 s) at a fresh prefix: its name and location.
async fn s3_pool(tag: &str, single_instance: bool) -> (String, S3Location) {
    alkblobs_tests::s3::pool(tag, "60 seconds", single_instance).await
}

fn s3(loc: &S3Location) -> S3Options {
    S3Options::new(loc.clone()).part_size(5 << 20)
}

async fn fleet(pool: &str, loc: &S3Location) -> Store {
    Store::open_fleet(FleetOptions::new(url(), pool, FleetLarge::S3(s3(loc))).threshold(1024))
        .await
        .expect("open a fleet store over s3")
}

store_suite!(single_s3, TIERED, async {
    let (pool, _) = s3_pool("pgs3-single", true).await;
    // The pool's own location, from the database (PgLarge::FromPool).
    let s = Store::open_postgres(PostgresOptions::new(url(), &pool))
        .await
        .expect("open a single-instance store over s3");
    (s, ())
});

arbiter_suite!(single_s3_arbiter, async {
    let (pool, loc) = s3_pool("pgs3-single-arb", true).await;
    let s = Store::open_postgres(
        PostgresOptions::new(url(), &pool)
            .large(PgLarge::S3(s3(&loc)))
            .threshold(1024),
    )
    .await
    .unwrap();
    (s, ())
});

store_suite!(fleet_s3, TIERED, async {
    let (pool, loc) = s3_pool("pgs3-fleet", false).await;
    (fleet(&pool, &loc).await, ())
});

arbiter_suite!(protocol: fleet_s3_arbiter, async {
    let (pool, loc) = s3_pool("pgs3-fleet-arb", false).await;
    (fleet(&pool, &loc).await, ())
});

/// A pool's location is checked where it is created: given exactly for
/// `s3`, in S3's format, and no pool's location is another's or nests in
/// it (a pool sweeping under another's prefix would delete its objects).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_locations_are_checked_and_never_overlap() {
    let c = connect().await;
    ensure_extension(&c).await;
    let (_, loc) = s3_pool("pgs3-loc", false).await;
    let at = loc.to_string();
    let create = |name: String, tier: &'static str, loc: Option<String>| {
        let c = &c;
        async move {
            c.execute(
                "SELECT alkblobs_create_pool($1, large_tier => $2, large_location => $3)",
                &[&name, &tier, &loc],
            )
            .await
            .map(|_| ())
            .map_err(|e| sqlstate(&e))
        }
    };
    let cases: Vec<(&str, Option<String>, &str)> = vec![
        ("s3", Some(at.clone()), "42710"),
        ("s3", Some(format!("{at}/nested")), "42710"),
        (
            "s3",
            Some(at.rsplit_once('/').unwrap().0.to_owned()),
            "42710",
        ),
        ("s3", None, "22023"),
        ("pg-lo", Some(format!("{at}-x")), "22023"),
        ("s3", Some(format!("{at}-y/")), "22023"),
        ("s3", Some(format!("{at}-y//z")), "22023"),
        ("s3", Some(format!("{at}-y/../z")), "22023"),
        ("s3", Some("s3://Bad_Bucket/p".into()), "22023"),
        ("s3", Some("https://bucket/p".into()), "22023"),
    ];
    for (tier, l, want) in cases {
        let got = create(unique("pgs3-bad"), tier, l.clone()).await;
        assert_eq!(got, Err(want.to_owned()), "{tier} {l:?}");
    }
    // A sibling prefix that only shares a leading string is its own.
    create(unique("pgs3-sib"), "s3", Some(format!("{at}-sibling")))
        .await
        .expect("a sibling prefix");
    let shown: Option<String> = c
        .query_one(
            "SELECT large_location FROM alkblobs_pools WHERE large_location = $1",
            &[&at],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(shown.as_deref(), Some(&at[..]));
}

/// The fleet-validity rule over s3: a node declares the pool's tier and
/// the pool's location, or opens nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_declares_the_pools_location() {
    let (pool, _) = s3_pool("pgs3-rule", false).await;
    let other = location("pgs3-rule-other");
    let e = Store::open_fleet(FleetOptions::new(url(), &pool, FleetLarge::S3(s3(&other))))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::Config(m) if m.contains(&other.to_string())),
        "{e}"
    );
    let e = Store::open_fleet(FleetOptions::new(url(), &pool, FleetLarge::PgLo))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::Config(m) if m.contains("fleet-validity rule") && m.contains("FleetLarge::S3")),
        "{e}"
    );
    let c = connect().await;
    let lo = alkblobs_tests::pg::pool_with(
        &c,
        "pgs3-rule-lo",
        "0 seconds",
        "60 seconds",
        "pg-lo",
        false,
    )
    .await;
    let e = Store::open_fleet(FleetOptions::new(url(), &lo, FleetLarge::S3(s3(&other))))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::Config(m) if m.contains("fleet-validity rule")),
        "{e}"
    );
    let (single, _) = s3_pool("pgs3-rule-single", true).await;
    let e =
        Store::open_postgres(PostgresOptions::new(url(), &single).large(PgLarge::S3(s3(&other))))
            .await
            .unwrap_err();
    assert!(
        matches!(&e, Error::Config(m) if m.contains(&other.to_string())),
        "{e}"
    );
}

/// Several fleet instances in separate OS processes share one s3 pool:
/// each puts, pins, writes liveness rows, releases and sweeps while
/// checking what it holds a guard on; afterwards every key a liveness row
/// names is present and byte-identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_processes_share_an_s3_pool_and_lose_nothing() {
    let c = connect().await;
    let (pool, loc) = s3_pool("pgs3-race", false).await;
    let table = alkblobs_tests::pg::seeded_refs(&c, &pool).await;
    let children: Vec<_> = (0..3)
        .map(|i| {
            let args = [
                "fleet-race".to_owned(),
                url(),
                pool.clone(),
                table.clone(),
                i.to_string(),
                "6".to_owned(),
                loc.to_string(),
            ];
            tokio::task::spawn_blocking(move || {
                std::process::Command::new(env!("CARGO_BIN_EXE_alkblobs-test-helper"))
                    .args(&args)
                    .output()
                    .unwrap()
            })
        })
        .collect();
    let mut swept = 0;
    for child in children {
        let out = child.await.unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "a racing instance failed:\n{text}");
        swept += text
            .lines()
            .find_map(|l| l.strip_prefix("deleted="))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    assert!(
        swept > 0,
        "the sweeps never collected anything: the race was idle"
    );
    let s = fleet(&pool, &loc).await;
    alkblobs_tests::pg::seeded_refs_intact(&c, &table, &s).await;
}

/// The dedup-versus-delete race across instances: instance B's sweep has
/// claimed a key (its tombstone committed, the object about to go) while
/// instance A puts the same bytes, whose object still exists. A's put must
/// not take the doomed object for its own: it waits for the claim (or
/// reports a retryable conflict) and then uploads afresh, so the key is
/// present once A's put returns. B is held where it holds no lock (its
/// tombstones committed, no delete started): only the tombstone guards
/// stand between A's dedup hit and B's delete. Fails when pin_new and
/// local_published ignore tombstones (mutation `tombstone-writers`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_put_racing_another_instances_claim_keeps_its_key() {
    use alkblobs::{SweepOptions, SweepPhase};
    let (pool, loc) = s3_pool("pgs3-dedup", false).await;
    let a = fleet(&pool, &loc).await;
    let b = fleet(&pool, &loc).await;
    let v = alkblobs_tests::data(42, 300_000);
    let key = Key::of(&v);
    drop(b.put(v.clone()).await.unwrap()); // unreferenced once its pin goes
    let (claimed_tx, claimed_rx) = tokio::sync::oneshot::channel::<()>();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let gates = std::sync::Arc::new(std::sync::Mutex::new(Some((claimed_tx, go_rx))));
    let opts = SweepOptions::new().hook(move |phase| {
        let gates = gates.clone();
        Box::pin(async move {
            if phase == SweepPhase::Tombstoned {
                let g = gates.lock().unwrap().take();
                if let Some((claimed, go)) = g {
                    let _ = claimed.send(());
                    let _ = go.await;
                }
            }
        })
    });
    let sweep = tokio::spawn(async move { b.sweep(opts).await });
    claimed_rx.await.expect("B's sweep claimed nothing");
    assert!(
        a.has(&key).await.unwrap(),
        "the claimed object is still there"
    );
    // A puts the same bytes while B holds its claim.
    let a2 = a.clone();
    let v2 = v.clone();
    let put = tokio::spawn(async move {
        loop {
            match a2.put(v2.clone()).await {
                Ok(p) => return p,
                Err(e) if e.is_retryable() => {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await
                }
                Err(e) => panic!("A's put: {e}"),
            }
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    go_tx.send(()).unwrap();
    let report = sweep.await.unwrap().expect("B's sweep");
    assert_eq!(report.deleted, 1, "{report:?}");
    let p = put.await.unwrap();
    assert_eq!(p.key, key);
    assert_eq!(
        a.get(&key).await.unwrap().map(|b| Key::of(&b)),
        Some(key),
        "A's put lost its key"
    );
    drop(p);
}

/// The location check of `alkblobs_create_pool` holds only at READ
/// COMMITTED (a snapshot taken before its lock would miss a pool created
/// meanwhile): at REPEATABLE READ and SERIALIZABLE an s3 pool's creation is
/// refused with AB003, and at READ COMMITTED it goes ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_pools_are_created_only_at_read_committed() {
    let c = connect().await;
    ensure_extension(&c).await;
    for level in ["REPEATABLE READ", "SERIALIZABLE", "READ COMMITTED"] {
        let loc = location("pgs3-iso");
        c.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}"))
            .await
            .unwrap();
        let r = c
            .execute(
                "SELECT alkblobs_create_pool($1, large_tier => 's3', large_location => $2)",
                &[&unique("pgs3-iso"), &loc.to_string()],
            )
            .await
            .map(|_| ())
            .map_err(|e| sqlstate(&e));
        c.batch_execute("ROLLBACK").await.unwrap();
        if level == "READ COMMITTED" {
            assert_eq!(r, Ok(()), "{level}");
        } else {
            assert_eq!(r, Err("AB003".to_owned()), "{level}");
        }
    }
}

/// Whether process `pid` is stopped (state `T` in /proc/PID/stat).
fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next().map(|st| st == "T"))
        })
        .unwrap_or(false)
}

/// The stalled claimer (docs/design.md, "The shared tier over S3"): an
/// instance in its own process claims a dead key, locks its tombstone and
/// stops (SIGSTOP) before its delete is sent; its database connections
/// die. Another instance's sweep hands the tombstone out again and deletes
/// the object, and a writer re-puts the key and keeps its pin. Then the
/// stopped claimer resumes and sends its delete. The re-put object must
/// survive: the claimer that finished fenced the key, and its new record
/// names a later generation (`<key>.g1`), which the late delete cannot
/// name. Fails when the finished claim leaves no fence (the re-put is
/// generation 0 again, the very object the late delete removes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_claimer_never_deletes_a_re_put_object() {
    use futures::TryStreamExt;
    use std::time::{Duration, Instant};
    let c = connect().await;
    let (pool, loc) = s3_pool("pgs3-stall", false).await;
    let v = alkblobs_tests::data(77, 200_000);
    let key = Key::of(&v);
    let writer = fleet(&pool, &loc).await;
    assert_eq!(writer.put(v.clone()).await.unwrap().key, key);
    writer.close().await.unwrap(); // its pins go: the key is dead
    drop(writer);

    let app = unique("stalled");
    let sep = if url().contains('?') { '&' } else { '?' };
    let helper_url = format!("{}{sep}application_name={app}", url());
    let location = loc.to_string();
    let mut h = alkblobs_tests::proc::Helper::spawn(
        env!("CARGO_BIN_EXE_alkblobs-test-helper"),
        &["fleet-claim-then-stop", &helper_url, &pool, &location],
    );
    let line = h.line().unwrap_or_default();
    assert_eq!(line, "deleting", "helper: {line:?}");
    let pid = h.child.id();
    let t0 = Instant::now();
    while !stopped(pid) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the claimer never stopped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Its connections die (a partition, a server-side timeout): its lock
    // on the tombstone and its sweep lease go with them.
    loop {
        let left: i64 = c
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
                &[&app],
            )
            .await
            .unwrap()
            .get(0);
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Another instance: its sweep re-hands the tombstone and deletes.
    let other = fleet(&pool, &loc).await;
    let r = other.sweep(alkblobs::SweepOptions::new()).await.unwrap();
    assert_eq!(r.deleted, 1, "the re-handed tombstone's object: {r:?}");
    assert!(!other.has(&key).await.unwrap());
    // A writer re-puts the key and holds it.
    let held = other.put(v.clone()).await.unwrap();
    assert_eq!(held.key, key);

    // The stopped claimer resumes and sends the delete it was about to.
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGCONT) }, 0);
    let rest = h.line().unwrap_or_default();
    assert_eq!(rest, "swept error", "its connections are gone");
    assert!(h.child.wait().unwrap().success());

    assert_eq!(
        other.get(&key).await.unwrap().map(|b| Key::of(&b)),
        Some(key),
        "the stalled claimer deleted the re-put object"
    );
    let generation: i64 = c
        .query_one(
            "SELECT f.generation FROM alkblobs.files f JOIN alkblobs.pools p ON p.id = f.pool WHERE p.name = $1 AND f.key = $2",
            &[&pool, &key.as_bytes().to_vec()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        generation, 1,
        "the re-put's record names the fenced generation (the object .g1)"
    );
    let fresh = fleet(&pool, &loc).await;
    assert_eq!(
        fresh.get(&key).await.unwrap().map(|b| Key::of(&b)),
        Some(key)
    );
    assert_eq!(
        fresh.list().try_collect::<Vec<_>>().await.unwrap(),
        vec![key]
    );
    // Held, it survives sweeps; released, it is collected whole (every
    // generation up to the tombstone's), leaving nothing in the bucket.
    let r = fresh.sweep(alkblobs::SweepOptions::new()).await.unwrap();
    assert_eq!(r.deleted, 0, "{r:?}");
    drop(held);
    other.close().await.unwrap();
    let r = fresh.sweep(alkblobs::SweepOptions::new()).await.unwrap();
    assert_eq!(r.deleted, 1, "{r:?}");
    assert!(
        fresh
            .list()
            .try_collect::<Vec<_>>()
            .await
            .unwrap()
            .is_empty()
    );
}

/// The retried delete (docs/design.md, "The shared tier over S3"): a
/// sweep's `DeleteObject` is answered 503 by a proxy that keeps it, the
/// HTTP client retries and the retry deletes, the claim finishes and the
/// tombstone goes; a writer re-puts the key and holds it; then the first
/// attempt reaches the service (as one a load balancer still ran, or
/// replays). The re-put object must survive: the finished claim fenced
/// the key, so its new record names `<key>.g1`, which the kept attempt
/// does not name. Fails when a finished claim leaves no fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_attempt_landing_after_its_retry_never_deletes_a_re_put_object() {
    use alkblobs_tests::s3::{Slow, replay, s3_server_addr, slow_proxy};
    let c = connect().await;
    let (pool, loc) = s3_pool("pgs3-retried", false).await;
    let v = alkblobs_tests::data(78, 200_000);
    let key = Key::of(&v);
    let writer = fleet(&pool, &loc).await;
    assert_eq!(writer.put(v.clone()).await.unwrap().key, key);
    writer.close().await.unwrap(); // its pins go: the key is dead
    drop(writer);

    // The sweeper reaches the service through the proxy.
    let kept = std::sync::Arc::new(std::sync::Mutex::new(None));
    let proxy = slow_proxy(
        s3_server_addr(),
        Slow::KeepFirstDelete(b"/blobs/", kept.clone()),
    );
    let sweeper = Store::open_fleet(
        FleetOptions::new(
            url(),
            &pool,
            FleetLarge::S3(s3(&loc).endpoint(format!("http://{proxy}"))),
        )
        .threshold(1024),
    )
    .await
    .unwrap();
    let r = sweeper.sweep(alkblobs::SweepOptions::new()).await.unwrap();
    assert_eq!(r.deleted, 1, "the retry deleted the object: {r:?}");
    let attempt = kept
        .lock()
        .unwrap()
        .take()
        .expect("the proxy kept a first DELETE attempt: the test tests nothing");
    assert!(!sweeper.has(&key).await.unwrap());

    // A writer re-puts the key and holds it.
    let other = fleet(&pool, &loc).await;
    let held = other.put(v.clone()).await.unwrap();
    assert_eq!(held.key, key);

    // The first attempt lands now.
    let status = replay(s3_server_addr(), &attempt);
    assert!(
        status.contains(" 200") || status.contains(" 204"),
        "the kept delete ran: {status}"
    );
    assert_eq!(
        other.get(&key).await.unwrap().map(|b| Key::of(&b)),
        Some(key),
        "the delete's first attempt deleted the re-put object"
    );
    let generation: i64 = c
        .query_one(
            "SELECT f.generation FROM alkblobs.files f JOIN alkblobs.pools p ON p.id = f.pool WHERE p.name = $1 AND f.key = $2",
            &[&pool, &key.as_bytes().to_vec()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        generation, 1,
        "the re-put's record names the fenced generation"
    );
    let fresh = fleet(&pool, &loc).await;
    assert_eq!(
        fresh.get(&key).await.unwrap().map(|b| Key::of(&b)),
        Some(key)
    );
    drop(held);
    other.close().await.unwrap();
    sweeper.close().await.unwrap();
}

/// Fleet writers over an s3 pool SIGKILLed mid-put, three times (often
/// inside a 12 MB multipart upload): nothing torn, every put that returned
/// is there, and once their pins expire another instance's sweep reaps
/// them and aborts every upload they left (no marker, no multipart upload
/// left behind).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_writers_killed_mid_put_leave_nothing_torn() {
    use alkblobs::backend::s3::S3Backend;
    use std::time::Duration;
    let c = connect().await;
    ensure_extension(&c).await;
    let pool = unique("pgs3-kill");
    let loc = location("pgs3-kill");
    c.execute(
        "SELECT alkblobs_create_pool($1, '1 second', '1 second', 's3', large_location => $2)",
        &[&pool, &loc.to_string()],
    )
    .await
    .unwrap();
    let mut returned = std::collections::BTreeSet::new();
    for round in 0..3u64 {
        let location = loc.to_string();
        let args = ["fleet-crash-puts", &*url(), &*pool, "s3", &*location];
        let mut h =
            alkblobs_tests::proc::Helper::spawn(env!("CARGO_BIN_EXE_alkblobs-test-helper"), &args);
        // Up to its (3 + 4·round)th put, a 200 kB one: the next is 12 MB.
        for _ in 0..(3 + 4 * round) {
            let line = h.line().expect("helper died early");
            returned.insert(line.parse::<Key>().unwrap());
        }
        // Kill it at an arbitrary point of that put (often its upload).
        std::thread::sleep(Duration::from_millis(60 + 40 * round));
        h.kill();
    }
    let s = Store::open_fleet(
        FleetOptions::new(
            url(),
            &pool,
            FleetLarge::S3(s3(&loc).upload_grace(Duration::ZERO)),
        )
        .threshold(1024),
    )
    .await
    .unwrap();
    let v = s.verify().await.unwrap();
    assert!(v.corrupt.is_empty(), "torn: {:?}", v.corrupt);
    assert!(v.missing.is_empty(), "verify says lost: {:?}", v.missing);
    assert!(v.checked >= returned.len() as u64, "{v:?}");
    for k in &returned {
        assert!(s.has(k).await.unwrap(), "a returned put was lost: {k}");
    }
    let engine = S3Backend::open(S3Options::new(loc.clone()).shared(true))
        .await
        .unwrap();
    let markers = engine.uploads_in_progress().await.unwrap();
    eprintln!("uploads the killed writers left: {markers}");
    // The killed instances' pins expire; a sweep reaps them and aborts
    // their uploads.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let r = s.sweep(alkblobs::SweepOptions::new()).await.unwrap();
    assert!(r.aborted.is_none(), "{r:?}");
    assert!(r.pins_reaped >= returned.len() as u64 / 2, "{r:?}");
    assert_eq!(r.reclaimed, markers, "{r:?}");
    assert_eq!(engine.uploads_in_progress().await.unwrap(), 0, "{r:?}");
    s.close().await.unwrap();
}

/// A pool's prefix is the pool's alone, and an embedded store's is the
/// store's (`alkblobs.owner`, written at the first writable open): an
/// embedded store at a fleet pool's prefix is refused, and so is a fleet
/// pool created over a prefix an embedded store already wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_is_one_pools_or_one_stores() {
    use alkblobs::DirOptions;
    let (pool, loc) = s3_pool("pgs3-owner", false).await;
    let f = fleet(&pool, &loc).await;
    let dir = tempfile::tempdir().unwrap();
    let e = Store::open_dir_with(dir.path(), DirOptions::new().large_s3(s3(&loc)))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e:?}");
    assert!(
        e.to_string()
            .contains(&format!("belongs to \"fleet pool {pool}\"")),
        "{e}"
    );
    f.close().await.unwrap();

    let theirs = location("pgs3-owner-emb");
    let d = tempfile::tempdir().unwrap();
    let s = Store::open_dir_with(d.path(), DirOptions::new().large_s3(s3(&theirs)))
        .await
        .unwrap();
    drop(s.put(vec![4u8; 100_000]).await.unwrap());
    s.close().await.unwrap();
    let c = connect().await;
    let late = unique("pgs3-owner-late");
    c.execute(
        "SELECT alkblobs_create_pool($1, '0 seconds', '60 seconds', 's3', large_location => $2)",
        &[&late, &theirs.to_string()],
    )
    .await
    .unwrap();
    let e = Store::open_fleet(FleetOptions::new(url(), &late, FleetLarge::S3(s3(&theirs))))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e:?}");
    assert!(
        e.to_string().contains("belongs to \"embedded store "),
        "{e}"
    );
}

/// `verify` of a fleet pool on s3 walks the pool's record: an object a
/// lifecycle rule or an operator deleted from the bucket, while a liveness
/// row still references it, is one missing key named with its table (not
/// "0 missing"); reads and stat call it lost; the pool's health is
/// critical; a re-put restores it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_names_an_object_deleted_from_the_bucket() {
    use object_store::ObjectStoreExt;
    let c = connect().await;
    let (pool, loc) = s3_pool("pgs3-verify", false).await;
    let table = alkblobs_tests::pg::table_name(&pool, "refs");
    c.batch_execute(&format!("CREATE TABLE {table} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    alkblobs_tests::pg::register(&c, &pool, &table).await;
    let s = fleet(&pool, &loc).await;
    let value = |seed: u8| -> Vec<u8> {
        (0..3 << 20)
            .map(|i: u32| (i.wrapping_mul(31) as u8) ^ seed)
            .collect()
    };
    let (a, b) = (value(1), value(2));
    let ka = s.put(a.clone()).await.unwrap().key;
    let kb = s.put(b).await.unwrap().key;
    for k in [ka, kb] {
        c.execute(
            &format!("INSERT INTO {table} VALUES ($1)"),
            &[&k.as_bytes().to_vec()],
        )
        .await
        .unwrap();
    }
    let clean = s.verify().await.unwrap();
    assert!(clean.is_clean() && clean.checked == 2, "{clean:?}");

    let raw = object_store::aws::AmazonS3Builder::from_env()
        .with_bucket_name(loc.bucket())
        .with_client_options(object_store::ClientOptions::new().with_allow_http(true))
        .build()
        .unwrap();
    let hex = ka.to_hex();
    let path =
        object_store::path::Path::from(format!("{}/blobs/{}/{hex}", loc.prefix(), &hex[..2]));
    raw.delete(&path).await.unwrap();

    let report = s.verify().await.unwrap();
    assert_eq!(report.checked, 1, "{report:?}");
    let missing: Vec<(Key, Vec<String>)> = report
        .missing
        .iter()
        .map(|m| (m.key, m.referenced_by.clone()))
        .collect();
    assert_eq!(
        missing,
        vec![(ka, vec![format!("liveness public.{table}")])],
        "{report:?}"
    );
    for e in [
        s.stat(&ka).await.unwrap_err(),
        s.get(&ka).await.unwrap_err(),
    ] {
        assert_eq!(e.kind(), alkblobs::ErrorKind::Lost, "{e}");
    }
    let status: String = c
        .query_one(
            "SELECT status FROM alkblobs_health WHERE pool = $1",
            &[&pool],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "critical");
    let _ = s.put(a).await.unwrap();
    assert!(s.verify().await.unwrap().is_clean());

    // A files row publishing a generation no object bears (as if the key
    // was recorded again after a fence and that object was lost): the
    // older object still holds the bytes, but a late delete may remove
    // it, so the recorded object is missing, named with its generation.
    let set_generation = |g: i64| {
        let c = &c;
        let (pool, kb) = (pool.clone(), kb.as_bytes().to_vec());
        async move {
            let n = c
                .execute(
                    "UPDATE alkblobs.files f SET generation = $3 FROM alkblobs.pools p
                      WHERE p.id = f.pool AND p.name = $1 AND f.key = $2",
                    &[&pool, &kb, &g],
                )
                .await
                .unwrap();
            assert_eq!(n, 1);
        }
    };
    set_generation(4).await;
    let report = s.verify().await.unwrap();
    let missing: Vec<(Key, Option<alkblobs::record::Held>)> =
        report.missing.iter().map(|m| (m.key, m.recorded)).collect();
    assert_eq!(
        missing,
        vec![(kb, Some(alkblobs::record::Held::File { generation: 4 }))],
        "{report:?}"
    );
    assert_eq!(report.checked, 1, "the other key is read: {report:?}");
    set_generation(0).await;
    assert!(s.verify().await.unwrap().is_clean());
    s.close().await.unwrap();

    // A bucket that cannot be reached is an error naming it (the CLI's
    // exit 1: not an integrity failure), never "0 missing".
    let unreachable = Store::open_fleet(
        FleetOptions::new(
            url(),
            &pool,
            FleetLarge::S3(
                s3(&loc)
                    .endpoint("http://127.0.0.1:1")
                    .retry_timeout(std::time::Duration::from_secs(1)),
            ),
        )
        .threshold(1024),
    )
    .await;
    let err = match unreachable {
        Err(e) => e,
        Ok(u) => u.verify().await.unwrap_err(),
    };
    assert!(
        matches!(
            err.kind(),
            alkblobs::ErrorKind::Unavailable | alkblobs::ErrorKind::Engine
        ),
        "{err}"
    );
    assert!(err.to_string().contains(loc.bucket()), "{err}");
}

/// The s3 outboard leak: a claimed key whose blob object is already gone
/// (its first claimer's delete reached the server, then the claimer died)
/// loses its outboard object too; an outboard object with no blob and no
/// record (a writer killed between its outboard PUT and its blob PUT) is
/// reported by verify as unrecorded and collected by the next audit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outboards_without_their_blob_do_not_outlive_an_audit() {
    use object_store::ObjectStoreExt;
    let c = connect().await;
    let (pool, loc) = s3_pool("pgs3-obao", false).await;
    c.execute(
        "SELECT alkblobs_alter_pool($1, collector => 'queue', audit_every => '0')",
        &[&pool],
    )
    .await
    .unwrap();
    let s = fleet(&pool, &loc).await;
    let raw = object_store::aws::AmazonS3Builder::from_env()
        .with_bucket_name(loc.bucket())
        .with_client_options(object_store::ClientOptions::new().with_allow_http(true))
        .build()
        .unwrap();
    let path = |dir: &str, k: &Key| {
        let hex = k.to_hex();
        object_store::path::Path::from(format!("{}/{dir}/{}/{hex}", loc.prefix(), &hex[..2]))
    };
    let exists = |p: object_store::path::Path| {
        let raw = &raw;
        async move { raw.head(&p).await.is_ok() }
    };
    let sweep = || async {
        let r = s.sweep(alkblobs::SweepOptions::new()).await.unwrap();
        assert!(r.aborted.is_none(), "{r:?}");
    };
    let v: Vec<u8> = (0..3u32 << 20).map(|i| (i % 241) as u8).collect();
    let k = s.put(v).await.unwrap().key;
    assert!(
        exists(path("outboards", &k)).await,
        "a 3 MiB blob has an outboard"
    );
    raw.delete(&path("blobs", &k)).await.unwrap();
    for _ in 0..3 {
        sweep().await;
    }
    assert!(
        !exists(path("outboards", &k)).await,
        "the claim of a key whose blob was gone left its outboard object"
    );
    let stray = Key::of(b"an outboard object without its blob");
    raw.put(&path("outboards", &stray), vec![0u8; 64 * 3].into())
        .await
        .unwrap();
    let report = s.verify().await.unwrap();
    assert_eq!(report.unrecorded, vec![stray], "{report:?}");
    c.execute("SELECT alkblobs_request_audit($1)", &[&pool])
        .await
        .unwrap();
    for _ in 0..4 {
        sweep().await;
    }
    assert!(
        !exists(path("outboards", &stray)).await,
        "the audit did not collect the outboard object without a blob"
    );
    s.close().await.unwrap();
}
