//! The races that lost peers' data, replayed against the fleet collector:
//! each test drives, through alkblobs' API, the interleaving that lost data
//! in another project (named after its report), and asserts that nothing
//! protected is lost. `docs/design.md`, "Peers' races, replayed", says why
//! each one cannot happen here. Against the test server scripts/test.sh
//! starts; never skipped.

#![cfg(feature = "pg")]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use alkblobs::store::fleet::{FleetLarge, FleetOptions};
use alkblobs::{Key, PutOutcome, Store, SweepOptions};
use alkblobs_tests::pg::{audit_missed, connect, pool_with, reference, register, table_name, url};

/// A fleet pool (`pg-lo`, window `window`, pin TTL `ttl`) with a registered
/// liveness table `<pool>_refs (key bytea)`: the pool and the table.
async fn pool(tag: &str, window: &str, ttl: &str) -> (String, String) {
    let c = connect().await;
    let pool = pool_with(&c, tag, window, ttl, "pg-lo", false).await;
    let table = table_name(&pool, "refs");
    c.batch_execute(&format!("CREATE TABLE {table} (key bytea NOT NULL)"))
        .await
        .unwrap();
    register(&c, &pool, &table).await;
    (pool, table)
}

/// After the race: an audit of the pool (the full mark) finds no key the
/// review queue missed — every event that left a key unprotected queued it.
async fn audited(pool: &str) {
    let c = connect().await;
    assert_eq!(
        audit_missed(&c, pool).await,
        0,
        "keys the review queue missed"
    );
}

async fn open(pool: &str) -> Store {
    Store::open_fleet(FleetOptions::new(url(), pool, FleetLarge::PgLo).threshold(1024))
        .await
        .expect("open a fleet store")
}

/// The window the staged-then-raced tests use: a first sweep stages
/// (its rows are due only a window after its mark ends, so it executes
/// none of them), the race strikes, and a second sweep past the window
/// executes — re-checking what protects each row.
const WINDOW: Duration = Duration::from_millis(1000);

/// A first sweep that stages at least `n` keys and deletes nothing.
async fn stage(s: &Store, n: u64) {
    let r = s.sweep(SweepOptions::new()).await.unwrap();
    assert!(r.staged >= n && r.deleted == 0, "{r:?}");
}

/// The second sweep, once the first one's rows are due.
async fn execute(s: &Store) -> alkblobs::SweepReport {
    tokio::time::sleep(WINDOW + Duration::from_millis(200)).await;
    s.sweep(SweepOptions::new()).await.unwrap()
}

/// Garbage `n` bytes long (distinct per seed), put and released: staged by
/// the next mark.
async fn garbage(s: &Store, seed: u64, n: usize) -> (Key, Vec<u8>) {
    let v = alkblobs_tests::data(seed, n);
    let p = s.put(v.clone()).await.unwrap();
    (p.key, v)
}

fn same(got: Option<bytes::Bytes>, key: Key) -> bool {
    got.is_some_and(|b| Key::of(&b) == key)
}

/// Nix #15992 (a temporary root taken after the collector checked a path,
/// before it deleted it, was never checked again): instance B pins a key
/// after A's mark staged it and before A's execution. The execution
/// re-checks pins under `FOR UPDATE`, so the key stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nix_15992_a_pin_taken_after_the_mark_before_the_delete_is_honoured() {
    let (pool, _) = pool("peer-nix15992", "1 second", "60 seconds").await;
    let (a, b) = (open(&pool).await, open(&pool).await);
    let (k, _) = garbage(&a, 1, 5_000).await;
    stage(&a, 1).await;
    let held = b.pin(&k).await.expect("the key is present until deleted");
    let r = execute(&a).await;
    assert_eq!(r.deleted, 0, "{r:?}");
    assert!(
        same(b.get(&k).await.unwrap(), k),
        "a pinned key was deleted"
    );
    drop(held);
    audited(&pool).await;
}

/// Nix #6757 (paths built while the collector was deleting were deleted
/// under the build): while A's sweep is about to delete many staged keys,
/// B puts one of them again and a liveness row names it. The put pins
/// before it publishes, the row is written under the guard trigger, and
/// the execution re-checks both: that key stays, the others go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nix_6757_a_key_put_again_while_deletion_runs_is_kept() {
    let (pool, table) = pool("peer-nix6757", "1 second", "60 seconds").await;
    let (a, b) = (open(&pool).await, open(&pool).await);
    let mut staged = Vec::new();
    for seed in 0..40 {
        staged.push(garbage(&a, 100 + seed, 3_000).await);
    }
    stage(&a, 40).await;
    // One key put again (pinned before publish) and referenced; another
    // only referenced by a row (no put: the execution's re-check alone).
    let (k, v) = staged[17].clone();
    let p = b.put(v).await.expect("put again");
    let c = connect().await;
    reference(&c, &table, p.key.as_bytes()).await.unwrap();
    drop(p);
    let (only_row, _) = staged[29];
    reference(&c, &table, only_row.as_bytes()).await.unwrap();
    let r = execute(&a).await;
    assert_eq!(r.deleted, 38, "{r:?}");
    assert!(
        same(a.get(&k).await.unwrap(), k),
        "the key put again was deleted"
    );
    assert!(
        same(a.get(&only_row).await.unwrap(), only_row),
        "the key a row names was deleted"
    );
    audited(&pool).await;
}

/// iroh-blobs #247 (protection moved from the source the collector had not
/// read yet to the one it had read, between its two reads): after A's mark
/// staged a key, B pins it, writes a liveness row naming it and releases
/// the pin, all before A's execution. The execution reads pins and
/// liveness rows in one re-check under the row's lock: the key stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iroh_blobs_247_protection_handed_from_a_pin_to_a_row_mid_sweep_is_kept() {
    let (pool, table) = pool("peer-iroh247", "1 second", "60 seconds").await;
    let (a, b) = (open(&pool).await, open(&pool).await);
    let (k, _) = garbage(&a, 2, 5_000).await;
    stage(&a, 1).await;
    let g = b.pin(&k).await.expect("pin");
    let c = connect().await;
    reference(&c, &table, k.as_bytes()).await.unwrap();
    drop(g);
    // The release reaches the database before A executes.
    b.sweep(SweepOptions::new().dry_run(true)).await.unwrap();
    let r = execute(&a).await;
    assert_eq!(r.deleted, 0, "{r:?}");
    assert!(
        same(a.get(&k).await.unwrap(), k),
        "the referenced key was deleted"
    );
    audited(&pool).await;
}

/// rustic / restic (a prune deciding "unused" from a snapshot of
/// references while a backup re-used the data): after A's mark staged a
/// key, B puts the same bytes (a dedup hit: nothing uploaded), references
/// it and drops its guard. The dedup put still pins the key, and the
/// execution re-checks: the key stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rustic_a_dedup_put_of_a_staged_key_on_another_instance_is_kept() {
    let (pool, table) = pool("peer-rustic", "1 second", "60 seconds").await;
    let (a, b) = (open(&pool).await, open(&pool).await);
    let (k, v) = garbage(&a, 3, 200_000).await;
    stage(&a, 1).await;
    let p = b.put(v).await.expect("put again");
    assert_eq!(p.outcome, PutOutcome::Existed, "the put was a dedup hit");
    let c = connect().await;
    reference(&c, &table, p.key.as_bytes()).await.unwrap();
    drop(p);
    let r = execute(&a).await;
    assert_eq!(r.deleted, 0, "{r:?}");
    assert!(
        same(a.get(&k).await.unwrap(), k),
        "the re-used key was deleted"
    );
    audited(&pool).await;
}

/// Gitaly (`git prune` without an expiry deleted objects a push had written
/// but not yet referenced): with a zero window, a key put and held while a
/// sweep runs, then referenced and released, is kept; and a reference
/// written after the guard was dropped and the key collected fails with
/// AB002 instead of naming a missing key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitaly_content_written_before_its_reference_is_kept() {
    let (pool, table) = pool("peer-gitaly", "0 seconds", "60 seconds").await;
    let s = open(&pool).await;
    let c = connect().await;
    let p = s.put(alkblobs_tests::data(4, 50_000)).await.unwrap();
    let r = s.sweep(SweepOptions::new()).await.unwrap();
    assert_eq!(r.deleted, 0, "a held key was collected: {r:?}");
    reference(&c, &table, p.key.as_bytes()).await.unwrap();
    let k = p.key;
    drop(p);
    let r = s.sweep(SweepOptions::new()).await.unwrap();
    assert_eq!(r.deleted, 0, "a referenced key was collected: {r:?}");
    assert!(same(s.get(&k).await.unwrap(), k));
    // Misuse: the guard dropped before the reference is written.
    let (late, _) = garbage(&s, 5, 50_000).await;
    let r = s.sweep(SweepOptions::new()).await.unwrap();
    assert_eq!(r.deleted, 1, "{r:?}");
    assert_eq!(
        reference(&c, &table, late.as_bytes()).await,
        Err("AB002".into()),
        "a row naming a collected key was accepted"
    );
    audited(&pool).await;
}

/// kubo #6252 (blocks added after the collector's first pause were not
/// pinned, as the adder kept pinning a cached root): one writer puts keys
/// one after another for longer than twice the pin TTL while another
/// instance sweeps; every guard is kept. Renewal covers pins taken after
/// it started, so every key is there at the end, the late ones too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubo_6252_pins_taken_while_sweeps_run_are_all_renewed() {
    let (pool, _) = pool("peer-kubo6252", "0 seconds", "3 seconds").await;
    let (w, sweeper) = (open(&pool).await, open(&pool).await);
    let stop = Arc::new(AtomicBool::new(false));
    let sweeps = {
        let (sweeper, stop) = (sweeper.clone(), stop.clone());
        tokio::spawn(async move {
            let mut deleted = 0;
            while !stop.load(Ordering::SeqCst) {
                deleted += sweeper.sweep(SweepOptions::new()).await.unwrap().deleted;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            deleted
        })
    };
    let mut held = Vec::new();
    let started = std::time::Instant::now();
    let mut seed = 1000;
    while started.elapsed() < Duration::from_secs(7) {
        let size = if seed % 2 == 0 { 500 } else { 20_000 };
        held.push(w.put(alkblobs_tests::data(seed, size)).await.unwrap());
        seed += 1;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let deleted = sweeps.await.unwrap();
    assert_eq!(deleted, 0, "sweeps collected held keys");
    for p in &held {
        assert!(same(w.get(&p.key).await.unwrap(), p.key), "lost {}", p.key);
    }
    assert!(held.len() > 20, "the writer barely ran: {}", held.len());
    audited(&pool).await;
}

/// moby #53321 (a prune deleted every lease with its label, those of pulls
/// in progress too): a pin held and renewed by a live instance is never
/// reaped, however many sweeps another instance runs past its TTL; only a
/// pin whose holder stopped renewing is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moby_53321_a_renewed_pin_is_never_reaped() {
    let (pool, _) = pool("peer-moby53321", "0 seconds", "2 seconds").await;
    let (holder, sweeper) = (open(&pool).await, open(&pool).await);
    let p = holder.put(alkblobs_tests::data(6, 30_000)).await.unwrap();
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        let r = sweeper.sweep(SweepOptions::new()).await.unwrap();
        assert_eq!(r.pins_reaped, 0, "a renewed pin was reaped: {r:?}");
        assert_eq!(r.deleted, 0, "{r:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        holder.confirm(&p.pin).await.is_ok(),
        "the holder lost its pin"
    );
    assert!(same(sweeper.get(&p.key).await.unwrap(), p.key));
    audited(&pool).await;
}

/// iroh-blobs #235 (a download in progress, its entry not yet tagged, was
/// collected): a streaming put whose reader takes longer than the pin TTL,
/// while sweeps run, of content equal to a key that is staged and
/// unprotected. The put pins before it publishes and keeps its pin renewed:
/// it returns the key, and the key is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iroh_blobs_235_a_slow_streaming_put_spanning_sweeps_is_kept() {
    let (pool, _) = pool("peer-iroh235", "0 seconds", "2 seconds").await;
    let (w, sweeper) = (open(&pool).await, open(&pool).await);
    let (k, v) = garbage(&w, 7, 400_000).await;
    let stop = Arc::new(AtomicBool::new(false));
    let sweeps = {
        let (sweeper, stop) = (sweeper.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                sweeper.sweep(SweepOptions::new()).await.unwrap();
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    // 400 kB in 40 chunks, 100 ms apart: 4 s, twice the TTL.
    let (reader, mut feed) = tokio::io::duplex(64 * 1024);
    let feeder = {
        let v = v.clone();
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for chunk in v.chunks(10_000) {
                tokio::time::sleep(Duration::from_millis(100)).await;
                feed.write_all(chunk).await.unwrap();
            }
        })
    };
    let put = w.put_reader(reader).await.unwrap();
    feeder.await.unwrap();
    assert_eq!(put.key, k);
    stop.store(true, Ordering::SeqCst);
    sweeps.await.unwrap();
    let r = sweeper.sweep(SweepOptions::new()).await.unwrap();
    assert_eq!(r.deleted, 0, "the held key was collected: {r:?}");
    assert!(
        same(w.get(&k).await.unwrap(), k),
        "the streamed key is not whole"
    );
    drop(put);
    audited(&pool).await;
}
