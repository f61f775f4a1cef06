//! Fleet mode from the client (issue 10), against the server the test
//! script starts (`ALKBLOBS_PG_URL`; without it the tests fail, they never
//! skip): the conformance suite over each fleet configuration, pin rows
//! committed with their entries and released by their guards, renewal,
//! the fleet-validity rule, one sweeper per pool, and instances in separate
//! OS processes (helper `alkblobs-test-helper fleet-*`).

#![cfg(feature = "pg")]

use std::time::Duration;

use alkblobs::arbiter::GcAbortCause;
use alkblobs::conformance::store::Config;
use alkblobs::store::fleet::{FleetLarge, FleetOptions};
use alkblobs::store::postgres::PostgresOptions;
use alkblobs::{Error, Key, Store, SweepOptions, arbiter_suite, store_suite};
use alkblobs_tests::pg::{connect, pool_with, url};
use tokio_postgres::Client;

const MIB: usize = 1 << 20;
const TIERED: Config = Config {
    kv_only: false,
    big: 100 * MIB,
    list_keys: 20_000,
};
const KV_ONLY: Config = Config {
    kv_only: true,
    big: 0,
    list_keys: 20_000,
};

/// A fresh fleet pool: window 0 s, the TTL and large tier given.
async fn fleet_pool(tag: &str, ttl: &str, large: &str) -> String {
    let c = connect().await;
    pool_with(&c, tag, "0 seconds", ttl, large, false).await
}

async fn open(pool: &str, large: FleetLarge) -> Store {
    Store::open_fleet(FleetOptions::new(url(), pool, large))
        .await
        .expect("open fleet store")
}

store_suite!(fleet_pg_lo, TIERED, async {
    let pool = fleet_pool("fl-lo", "60 seconds", "pg-lo").await;
    (open(&pool, FleetLarge::PgLo).await, ())
});

store_suite!(fleet_kv_only, KV_ONLY, async {
    let pool = fleet_pool("fl-none", "60 seconds", "none").await;
    (open(&pool, FleetLarge::KvOnly).await, ())
});

// The published arbiter cases every arbiter answers, over the fleet
// arbiter in each of its configurations (it has no in-process registry, and
// the window is the pool's: 0 s here).
arbiter_suite!(protocol: fleet_pg_lo_arbiter, async {
    let pool = fleet_pool("fa-lo", "60 seconds", "pg-lo").await;
    (open(&pool, FleetLarge::PgLo).await, ())
});

arbiter_suite!(protocol: fleet_kv_only_arbiter, async {
    let pool = fleet_pool("fa-none", "60 seconds", "none").await;
    (open(&pool, FleetLarge::KvOnly).await, ())
});

arbiter_suite!(protocol: fleet_shared_local_arbiter, async {
    let pool = fleet_pool("fa-local", "60 seconds", "local").await;
    let dir = tempfile::tempdir().unwrap();
    let s = open(&pool, FleetLarge::SharedLocal(dir.path().join("large"))).await;
    (s, dir)
});

store_suite!(fleet_shared_local, TIERED, async {
    let pool = fleet_pool("fl-local", "60 seconds", "local").await;
    let dir = tempfile::tempdir().unwrap();
    let s = open(&pool, FleetLarge::SharedLocal(dir.path().join("large"))).await;
    (s, dir)
});

/// The pin rows of `pool`: (key, owner, expired).
async fn pin_rows(c: &Client, pool: &str) -> Vec<(Vec<u8>, String, bool)> {
    c.query(
        "SELECT pn.key, pn.owner, pn.expires_at <= clock_timestamp()
           FROM alkblobs.pins pn JOIN alkblobs.pools p ON p.id = pn.pool
          WHERE p.name = $1 ORDER BY 1, 2",
        &[&pool],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

async fn eventually(mut f: impl AsyncFnMut() -> bool, what: &str) {
    for _ in 0..500 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never: {what}");
}

fn now() -> SweepOptions {
    SweepOptions::new()
}

/// Fleet mode is declared, never inferred, and the declaration must be
/// valid: a single-instance pool, a large tier other than the pool's, an
/// in-process liveness source, roots, a protect callback or a per-sweep
/// window are each refused with a configuration error naming what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_validity_rule_and_fleet_only_liveness() {
    let c = connect().await;
    let lo = fleet_pool("fl-rule", "60 seconds", "pg-lo").await;
    let e = Store::open_fleet(FleetOptions::new(
        url(),
        &lo,
        FleetLarge::SharedLocal("/tmp/x".into()),
    ))
    .await
    .expect_err("a large tier other than the pool's");
    assert!(
        matches!(&e, Error::Config(m) if m.contains("fleet-validity rule") && m.contains("FleetLarge::PgLo")),
        "{e}"
    );
    let local = fleet_pool("fl-rule-local", "60 seconds", "local").await;
    let e = Store::open_fleet(FleetOptions::new(url(), &local, FleetLarge::PgLo))
        .await
        .expect_err("pg-lo over a local-tier pool");
    assert!(
        matches!(&e, Error::Config(m) if m.contains("fleet-validity rule") && m.contains("SharedLocal")),
        "{e}"
    );
    // A kv-only node is sound over any pool (routed); it refuses large puts.
    let client = open(&local, FleetLarge::KvOnly).await;
    let e = client
        .put(vec![1u8; 100_000])
        .await
        .expect_err("a large put on a kv-only node");
    assert!(matches!(e, Error::TooLarge { .. }), "{e}");
    let single = pool_with(&c, "fl-single", "0 seconds", "60 seconds", "pg-lo", true).await;
    let e = Store::open_fleet(FleetOptions::new(url(), &single, FleetLarge::PgLo))
        .await
        .expect_err("a single-instance pool");
    assert!(
        matches!(&e, Error::Config(m) if m.contains("single-instance")),
        "{e}"
    );
    // ... and the single-instance preset refuses the fleet pool.
    let e = Store::open_postgres(PostgresOptions::new(url(), &lo))
        .await
        .expect_err("a fleet pool opened single-instance");
    assert!(
        matches!(&e, Error::Config(m) if m.contains("fleet pool")),
        "{e}"
    );

    let s = open(&lo, FleetLarge::PgLo).await;
    let e = s
        .register_live_set("mine", || async { Ok(Default::default()) })
        .expect_err("a callback source");
    assert!(
        matches!(&e, Error::Config(m) if m.contains("alkblobs_register_liveness")),
        "{e}"
    );
    assert!(
        s.add_roots(&[Key::of(b"r")]).await.is_err(),
        "roots on a fleet"
    );
    let e = s
        .sweep(now().protect(alkblobs::arbiter::LiveSet::new(|| async {
            Ok(Default::default())
        })))
        .await
        .expect_err("a protect callback");
    assert!(
        matches!(&e, Error::Config(m) if m.contains("liveness table")),
        "{e}"
    );
    let e = s
        .sweep(now().window(Duration::from_secs(3600)))
        .await
        .expect_err("a per-sweep window");
    assert!(
        matches!(&e, Error::Config(m) if m.contains("alkblobs_alter_pool")),
        "{e}"
    );
    // The window and the TTL are the pool's.
    assert_eq!(s.delete_window(), Duration::ZERO);
}

/// A put commits its pin row (this instance's owner) with its entry; the
/// row goes when the last guard drops; another instance's sweep keeps the
/// pinned entry and collects it once released. Pin counts are per guard,
/// rows per key and instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pin_rows_follow_the_guards() {
    let c = connect().await;
    let pool = fleet_pool("fl-pins", "60 seconds", "pg-lo").await;
    let a = Store::open_fleet(FleetOptions::new(url(), &pool, FleetLarge::PgLo).instance("node-a"))
        .await
        .unwrap();
    let b = Store::open_fleet(FleetOptions::new(url(), &pool, FleetLarge::PgLo).instance("node-b"))
        .await
        .unwrap();
    let small = a.put(b"pinned small".to_vec()).await.unwrap();
    let big = a.put(vec![5u8; 200_000]).await.unwrap();
    let again = a.put(b"pinned small".to_vec()).await.unwrap();
    assert_eq!(a.pin_count(&small.key), 2);
    let rows = pin_rows(&c, &pool).await;
    assert_eq!(rows.len(), 2, "one row per key and instance: {rows:?}");
    assert!(rows.iter().all(|(_, o, expired)| o == "node-a" && !expired));

    let r = b.sweep(now()).await.unwrap();
    assert!(r.aborted.is_none(), "{r:?}");
    assert!(a.has(&small.key).await.unwrap() && a.has(&big.key).await.unwrap());

    drop(small);
    assert_eq!(pin_rows(&c, &pool).await.len(), 2, "a guard is left");
    drop(again);
    drop(big);
    eventually(
        async || pin_rows(&c, &pool).await.is_empty(),
        "the released pins' rows are deleted",
    )
    .await;
    let r = b.sweep(now()).await.unwrap();
    assert_eq!(r.deleted, 2, "{r:?}");
    assert!(!b.has(&Key::of(b"pinned small")).await.unwrap());
    // A pin of a collected key: NotFound, and no row left behind.
    let e = b
        .pin(&Key::of(b"pinned small"))
        .await
        .expect_err("collected");
    assert!(e.is_not_found(), "{e}");
    // Close releases what an instance still holds at once.
    let kept = b.put(b"held at close".to_vec()).await.unwrap();
    b.close().await.unwrap();
    assert!(
        pin_rows(&c, &pool).await.is_empty(),
        "close released the pins"
    );
    drop(kept);
}

/// Renewal: with a pin TTL of 3 s, a guard held for 7.5 s keeps its entry
/// through sweeps by another instance every 500 ms (the renewal task runs
/// every TTL/3); the pool's TTL is the one applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_a_held_pin_past_its_ttl() {
    let pool = fleet_pool("fl-renew", "3 seconds", "none").await;
    let a = open(&pool, FleetLarge::KvOnly).await;
    let b = open(&pool, FleetLarge::KvOnly).await;
    let held = a.put(b"renewed while held".to_vec()).await.unwrap();
    for _ in 0..15 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let r = b.sweep(now()).await.unwrap();
        assert!(r.aborted.is_none(), "{r:?}");
        assert!(
            b.has(&held.key).await.unwrap(),
            "a held, renewed pin lost its entry"
        );
    }
    a.confirm(&held.pin).await.expect("the pin is held");
    drop(held);
}

/// Two instances sweeping at once: exactly one does the work; the other
/// reports the sweeper lock and deletes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sweepers_one_does_the_work() {
    one_of_two_sweeps_does_the_work(false).await;
}

/// The same with two sweeps of one instance (each sweep's lease has a
/// token of its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sweeps_of_one_instance_one_does_the_work() {
    one_of_two_sweeps_does_the_work(true).await;
}

async fn one_of_two_sweeps_does_the_work(same_instance: bool) {
    let pool = fleet_pool("fl-two", "60 seconds", "none").await;
    let a = open(&pool, FleetLarge::KvOnly).await;
    let b = if same_instance {
        a.clone()
    } else {
        open(&pool, FleetLarge::KvOnly).await
    };
    for i in 0..20u32 {
        drop(a.put(format!("garbage {i}").into_bytes()).await.unwrap());
    }
    let (entered_tx, entered_rx) = tokio::sync::oneshot::channel::<()>();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let entered = std::sync::Mutex::new(Some(entered_tx));
    let go = std::sync::Arc::new(tokio::sync::Mutex::new(Some(go_rx)));
    let opts = now().hook(move |phase| {
        let signal = if phase == alkblobs::arbiter::SweepPhase::Mark {
            entered.lock().unwrap().take()
        } else {
            None
        };
        let go = go.clone();
        Box::pin(async move {
            if let Some(tx) = signal {
                let _ = tx.send(());
                if let Some(rx) = go.lock().await.take() {
                    let _ = rx.await;
                }
            }
        })
    });
    // Wait for the releases of the 20 pins, so there is work to do.
    let c = connect().await;
    eventually(
        async || pin_rows(&c, &pool).await.is_empty(),
        "pins released",
    )
    .await;
    let first = tokio::spawn({
        let a = a.clone();
        async move { a.sweep(opts).await }
    });
    entered_rx.await.unwrap();
    let second = b.sweep(now()).await.unwrap();
    assert_eq!(
        second.aborted,
        Some(GcAbortCause::SweeperLock),
        "{second:?}"
    );
    assert_eq!(second.deleted, 0);
    go_tx.send(()).unwrap();
    let first = first.await.unwrap().unwrap();
    assert!(first.aborted.is_none(), "{first:?}");
    assert_eq!(first.deleted, 20, "{first:?}");
}

/// An instance stopped (SIGSTOP, 4 s) past its pins' TTL (3 s) while it
/// holds them:
/// the pins expire and another instance's sweep reaps them and collects
/// the content; after SIGCONT the stopped instance's check of its guards
/// gets the typed "lapsed, re-put" error and a re-put restores the content
/// byte for byte. Its renewal resumes for pins taken after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_instance_loses_its_pins_and_recovers_by_re_putting() {
    use std::io::Write;
    let pool = fleet_pool("fl-stop", "3 seconds", "none").await;
    // (Killed if this test fails while the helper is stopped.)
    let mut h = alkblobs_tests::proc::Helper::spawn(
        env!("CARGO_BIN_EXE_alkblobs-test-helper"),
        &["fleet-hold", &url(), &pool, "5"],
    );
    let mut input = h.child.stdin.take().unwrap();
    let line = h.line().unwrap_or_default();
    assert_eq!(line, "ready", "helper: {line}");
    let pid = h.child.id() as i32;
    let other = open(&pool, FleetLarge::KvOnly).await;
    // Held and renewed past the TTL: sweeps keep them.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let r = other.sweep(now()).await.unwrap();
    assert_eq!(r.deleted, 0, "held pins lost their entries: {r:?}");
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    tokio::time::sleep(Duration::from_millis(4000)).await;
    let r = other.sweep(now()).await.unwrap();
    assert_eq!(r.pins_reaped, 5, "{r:?}");
    assert_eq!(r.deleted, 5, "expired pins protect nothing: {r:?}");
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    writeln!(input, "check").unwrap();
    let report = h.line().unwrap_or_default();
    assert_eq!(
        report, "lapsed=5 restored=5",
        "the helper's view after SIGCONT"
    );
    // The re-puts restored every blob, pinned again and renewed.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let r = other.sweep(now()).await.unwrap();
    assert_eq!(r.deleted, 0, "re-put blobs were collected: {r:?}");
    for i in 0..5u32 {
        let v = format!("held by a stopped instance {i}").into_bytes();
        assert_eq!(
            other.get(&Key::of(&v)).await.unwrap().as_deref(),
            Some(&v[..])
        );
    }
    drop(input);
    assert!(h.child.wait().unwrap().success());
}

/// Several instances in separate OS processes share one pool for a bounded
/// time: each puts, pins, writes liveness rows into a registered table,
/// releases, and sweeps, while checking that whatever it holds a guard on
/// is present and byte-identical. Afterwards every key a liveness row
/// names is present and byte-identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_in_separate_processes_race_sweeps_and_lose_nothing() {
    let c = connect().await;
    let pool = fleet_pool("fl-race", "60 seconds", "pg-lo").await;
    let table = alkblobs_tests::pg::seeded_refs(&c, &pool).await;
    let children: Vec<_> = (0..3)
        .map(|i| {
            std::process::Command::new(env!("CARGO_BIN_EXE_alkblobs-test-helper"))
                .args(["fleet-race", &url(), &pool, &table, &i.to_string(), "6"])
                .output_async()
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
    let s = open(&pool, FleetLarge::PgLo).await;
    alkblobs_tests::pg::seeded_refs_intact(&c, &table, &s).await;
}

/// Two kv-only nodes in their own processes route large content to a
/// storage node (`alkblobs serve` over its shared local tier) and race its
/// sweeps with puts, liveness writes and deletes, pins and reads: every
/// byte they read back is checked, and afterwards every key a liveness row
/// names is present and byte-identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn routed_nodes_race_the_storage_nodes_sweeps_and_lose_nothing() {
    let c = connect().await;
    let pool = fleet_pool("fl-routed", "60 seconds", "local").await;
    let table = alkblobs_tests::pg::seeded_refs(&c, &pool).await;
    let dir = tempfile::tempdir().unwrap();
    let node = open(&pool, FleetLarge::SharedLocal(dir.path().join("large"))).await;
    let server = alkblobs::serve::start(
        node.clone(),
        alkblobs::serve::ServeOptions::new("127.0.0.1:0".parse().unwrap()),
    )
    .await
    .unwrap();
    let routed = format!("routed=http://{}", server.addr());
    let children: Vec<_> = (0..2)
        .map(|i| {
            std::process::Command::new(env!("CARGO_BIN_EXE_alkblobs-test-helper"))
                .args([
                    "fleet-race",
                    &url(),
                    &pool,
                    &table,
                    &i.to_string(),
                    "6",
                    &routed,
                ])
                .output_async()
        })
        .collect();
    // The storage node sweeps while they race.
    let sweeper = {
        let node = node.clone();
        tokio::spawn(async move {
            let mut deleted = 0;
            let until = std::time::Instant::now() + std::time::Duration::from_secs(7);
            while std::time::Instant::now() < until {
                match node.sweep(alkblobs::SweepOptions::new()).await {
                    Ok(r) => deleted += r.deleted,
                    Err(e) if e.is_retryable() => {}
                    Err(e) => panic!("the storage node's sweep: {e}"),
                }
                tokio::time::sleep(std::time::Duration::from_millis(150)).await;
            }
            deleted
        })
    };
    for child in children {
        let out = child.await.unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "a routed node failed:\n{text}");
    }
    let swept = sweeper.await.unwrap();
    assert!(
        swept > 0,
        "the storage node's sweeps never collected anything"
    );
    alkblobs_tests::pg::seeded_refs_intact(&c, &table, &node).await;
    server
        .shutdown(std::time::Duration::from_secs(5))
        .await
        .unwrap();
}

/// A routed declaration is refused over a pool without a large tier, and
/// by a single-instance store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routed_is_refused_where_no_storage_node_can_hold_the_content() {
    let pool = fleet_pool("fl-routed-none", "60 seconds", "none").await;
    let o = alkblobs::backend::routed::RoutedOptions::new("http://127.0.0.1:9");
    let e = Store::open_fleet(FleetOptions::new(
        url(),
        &pool,
        FleetLarge::Routed(o.clone()),
    ))
    .await
    .unwrap_err();
    assert!(
        matches!(&e, Error::Config(m) if m.contains("fleet-validity rule") && m.contains("has none")),
        "{e}"
    );
}

/// `Command::output` off the async workers.
trait OutputAsync {
    fn output_async(self) -> tokio::task::JoinHandle<std::process::Output>;
}

impl OutputAsync for &mut std::process::Command {
    fn output_async(self) -> tokio::task::JoinHandle<std::process::Output> {
        let child = self
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
    }
}

/// A shared-local-tier sweeper killed after unlinking the files it claimed
/// and before confirming the delete: no pinned or live key lost its file;
/// the claimed key reads as gone, a liveness row naming it is refused
/// (AB002) and a put of it waits and then fails retryably while the
/// tombstone stands; the next sweep finishes the claim, and a re-put
/// restores the content.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_claimer_killed_mid_delete_loses_nothing_protected() {
    use std::io::{BufRead, BufReader};
    let c = connect().await;
    let pool = fleet_pool("fl-claim", "60 seconds", "local").await;
    let table = alkblobs_tests::pg::table_name(&pool, "refs");
    c.batch_execute(&format!("CREATE TABLE {table} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    c.execute(
        "SELECT alkblobs_register_liveness($1, $2::text::regclass)",
        &[&pool, &table],
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let media = dir.path().join("shared");
    let s = open(&pool, FleetLarge::SharedLocal(media.clone())).await;
    let big = |tag: &str| -> Vec<u8> {
        let mut v = tag.as_bytes().to_vec();
        v.resize(300_000, 7);
        v
    };
    let live = s.put(big("live")).await.unwrap();
    c.execute(
        &format!("INSERT INTO {table} VALUES ($1)"),
        &[&live.key.as_bytes().as_slice()],
    )
    .await
    .unwrap();
    drop(live.pin);
    let pinned = s.put(big("pinned")).await.unwrap();
    let dead = s.put(big("dead")).await.unwrap();
    let dead_key = dead.key;
    drop(dead);
    eventually(
        async || pin_rows(&c, &pool).await.len() == 1,
        "the dead key's pin is released",
    )
    .await;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_alkblobs-test-helper"))
        .args([
            "fleet-claim-then-die",
            &url(),
            &pool,
            media.to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "claimed");
    child.kill().unwrap();
    child.wait().unwrap();

    let k = |p: &alkblobs::Put| p.key;
    assert_eq!(
        s.get(&k(&pinned)).await.unwrap().as_deref(),
        Some(&big("pinned")[..])
    );
    let live_key = Key::of(&big("live"));
    assert_eq!(
        s.get(&live_key).await.unwrap().as_deref(),
        Some(&big("live")[..])
    );
    assert!(
        s.get(&dead_key).await.unwrap().is_none(),
        "the claimed file"
    );
    let e = c
        .execute(
            &format!("INSERT INTO {table} VALUES ($1)"),
            &[&dead_key.as_bytes().as_slice()],
        )
        .await
        .unwrap_err();
    assert_eq!(alkblobs_tests::pg::sqlstate(&e), "AB002");
    let e = s
        .put(big("dead"))
        .await
        .expect_err("a put under a tombstone");
    assert!(e.is_retryable(), "{e}");
    // The next sweep finishes the claim; the content comes back by a put.
    let r = s.sweep(now()).await.unwrap();
    assert!(r.aborted.is_none(), "{r:?}");
    let again = s.put(big("dead")).await.unwrap();
    assert_eq!(again.key, dead_key);
    assert_eq!(
        s.get(&dead_key).await.unwrap().as_deref(),
        Some(&big("dead")[..])
    );
    drop(pinned);
}

/// Large objects that are neither an entry nor an upload.
async fn orphan_objects(c: &Client) -> i64 {
    c.query_one(
        "SELECT count(*) FROM pg_largeobject_metadata m
          WHERE NOT EXISTS (SELECT 1 FROM alkblobs.entries e WHERE e.loid = m.oid)
            AND NOT EXISTS (SELECT 1 FROM alkblobs.uploads u WHERE u.loid = m.oid)",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// A fleet instance SIGKILLed mid-put, in each tier (kv rows, large
/// objects, files on the shared local tier), three times: nothing torn,
/// every put that returned is there, no large object is orphaned, and
/// once its pins have expired another instance's sweep reaps them and
/// reclaims the killed writers' staging files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_killed_mid_put_leave_nothing_torn_in_any_tier() {
    let c = connect().await;
    for tier in ["pg-lo", "local", "none"] {
        let pool = fleet_pool(&format!("fl-kill-{tier}"), "1 second", tier).await;
        let dir = tempfile::tempdir().unwrap();
        let media = dir.path().join("shared");
        let orphans_before = orphan_objects(&c).await;
        let mut returned = std::collections::BTreeSet::new();
        for round in 0..3u64 {
            let mut args = vec!["fleet-crash-puts", &*url(), &*pool, tier]
                .into_iter()
                .map(String::from)
                .collect::<Vec<_>>();
            args.push(media.to_string_lossy().into_owned());
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let mut h = alkblobs_tests::proc::Helper::spawn(
                env!("CARGO_BIN_EXE_alkblobs-test-helper"),
                &args,
            );
            for _ in 0..(3 + round * 2) {
                let line = h.line().expect("helper died early");
                returned.insert(line.parse::<Key>().unwrap());
            }
            // Kill it at an arbitrary point (often inside a large put).
            std::thread::sleep(Duration::from_millis(20 + 30 * round));
            h.kill();
        }
        let large = match tier {
            "pg-lo" => FleetLarge::PgLo,
            "none" => FleetLarge::KvOnly,
            _ => FleetLarge::SharedLocal(media.clone()),
        };
        let threshold = if tier == "none" { 65_536 } else { 1024 };
        let s = Store::open_fleet(
            FleetOptions::new(url(), &pool, large)
                .threshold(threshold)
                .staging_grace(Duration::ZERO),
        )
        .await
        .unwrap();
        let v = s.verify().await.unwrap();
        assert!(v.corrupt.is_empty(), "{tier}: torn {:?}", v.corrupt);
        // Verify walks the pool's record: it agrees that nothing recorded
        // was lost, whatever the killed writers left in flight.
        assert!(
            v.missing.is_empty(),
            "{tier}: verify says lost: {:?}",
            v.missing
        );
        assert!(v.checked >= returned.len() as u64, "{tier}: {v:?}");
        for k in &returned {
            assert!(
                s.has(k).await.unwrap(),
                "{tier}: a returned put was lost: {k}"
            );
        }
        // The killed instances' pins expire; a sweep reaps them.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let staged_files = std::fs::read_dir(media.join("staging"))
            .map(|d| d.count())
            .unwrap_or(0);
        let r = s.sweep(now()).await.unwrap();
        assert!(r.aborted.is_none(), "{tier}: {r:?}");
        assert!(r.pins_reaped >= returned.len() as u64 / 2, "{tier}: {r:?}");
        assert_eq!(r.reclaimed as usize, staged_files, "{tier}: {r:?}");
        if tier == "local" {
            let left = std::fs::read_dir(media.join("staging"))
                .map(|d| d.count())
                .unwrap_or(0);
            assert_eq!(left, 0, "killed writers' staging files left behind: {r:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            orphan_objects(&c).await,
            orphans_before,
            "{tier}: a killed upload left a large object"
        );
        s.close().await.unwrap();
    }
}

/// A shared tier is listed (to find files nobody recorded) once a mark
/// seals — in a `queue` pool, an audit — and not in every sweep: a file
/// put on the tier by hand is staged by no sweep until an audit runs, and
/// by the first sweep after it. (Without `tier_listing_due` every sweep
/// lists the tier, and the first check fails.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_pools_shared_tier_is_listed_after_audits_only() {
    use alkblobs::LargeBackend;
    use alkblobs::backend::local::{LocalBackend, LocalOptions};
    let c = connect().await;
    let pool = fleet_pool("fl-listing", "60 seconds", "local").await;
    c.execute(
        "SELECT alkblobs_alter_pool($1, collector => 'queue', audit_every => '0')",
        &[&pool],
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let media = dir.path().join("large");
    let s = open(&pool, FleetLarge::SharedLocal(media.clone())).await;
    let due = async |c: &Client| -> bool {
        c.query_one(
            "SELECT tier_listing_due IS NOT NULL FROM alkblobs_pools WHERE pool = $1",
            &[&pool],
        )
        .await
        .unwrap()
        .get(0)
    };
    assert!(due(&c).await, "a new shared-tier pool has a listing due");
    // The first sweep lists the (empty) tier; the listing is then done.
    let r = s.sweep(now()).await.unwrap();
    assert!(r.aborted.is_none(), "{r:?}");
    // (Any audit the collector switch asked for has run and sealed: that
    // listing may be due again; one more sweep does it.)
    if due(&c).await {
        s.sweep(now()).await.unwrap();
    }
    assert!(!due(&c).await, "a sweep did the listing that was due");

    // A file copied onto the tier by hand: no pin, no record, no event.
    let by_hand = LocalBackend::open(&media, LocalOptions::default().shared_media(true))
        .await
        .unwrap();
    let v = b"copied in by hand, never put".repeat(100);
    let (k, outboard) = alkblobs::outboard::of(&v);
    let mut w = by_hand.begin_write().await.unwrap();
    w.write(bytes::Bytes::from(v)).await.unwrap();
    w.commit(&k, outboard.into()).await.unwrap();
    let path = by_hand.path_of(&k);
    let staged = async |c: &Client| -> i64 {
        c.query_one(
            "SELECT count(*) FROM alkblobs_staged WHERE pool = $1 AND key = $2",
            &[&pool, &k.to_hex()],
        )
        .await
        .unwrap()
        .get(0)
    };
    for _ in 0..2 {
        let r = s.sweep(now()).await.unwrap();
        assert!(r.aborted.is_none() && r.audit.is_none(), "{r:?}");
        assert_eq!(
            staged(&c).await,
            0,
            "a sweep without an audit listed the tier"
        );
        assert!(path.exists());
    }
    // An audit: its sweep stages the file when it seals (window 0 s), the
    // next sweep claims and unlinks it.
    c.execute("SELECT alkblobs_request_audit($1)", &[&pool])
        .await
        .unwrap();
    let r = s.sweep(now()).await.unwrap();
    assert!(r.aborted.is_none() && r.audit.is_some(), "{r:?}");
    assert!(due(&c).await, "the audit's seal makes a listing due");
    let r = s.sweep(now()).await.unwrap();
    assert!(r.aborted.is_none(), "{r:?}");
    assert!(
        r.staged >= 1,
        "the listing after the audit staged the file: {r:?}"
    );
    assert!(!due(&c).await);
    let r = s.sweep(now()).await.unwrap();
    assert!(r.aborted.is_none(), "{r:?}");
    assert!(
        !path.exists(),
        "the file found by the audit's listing was deleted: {r:?}"
    );
    s.close().await.unwrap();
}
