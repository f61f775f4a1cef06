//! `verify` of a PostgreSQL pool walks the pool's record, not the tiers'
//! listings: content lost behind the pool's back (a large object
//! unlinked, a shared-tier file removed) is one missing key named with
//! what references it, never the end of the run nor "0 missing"; reads,
//! `stat` and `explain` call it lost; a re-put restores it; what the tier
//! holds that no record names is `unrecorded`; puts in flight, forward
//! references and malformed liveness rows are not losses; the outcome is
//! kept in the database and `alkblobs_health` is critical while content is
//! missing. Against the server the test script starts (`ALKBLOBS_PG_URL`;
//! without it the tests fail, they never skip).

#![cfg(feature = "pg")]

use std::path::{Path, PathBuf};

use alkblobs::record::Held;
use alkblobs::store::fleet::{FleetLarge, FleetOptions};
use alkblobs::store::postgres::{PgLarge, PostgresOptions};
use alkblobs::{ErrorKind, Key, Store, VerifyOptions};
use alkblobs_tests::pg::{connect, pool_with, register, table_name, url};
use tokio_postgres::Client;

const BIG: usize = 3 << 20;

/// `len` bytes that differ for every `seed`.
fn blob(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Unlinks the large object behind `key`'s entry, as an operator or a
/// careless `vacuumlo` would: the entry stays.
async fn lose_large_object(c: &Client, pool: &str, key: &Key) {
    let n = c
        .execute(
            "SELECT pg_catalog.lo_unlink(e.loid) FROM alkblobs.entries e JOIN alkblobs.pools p ON p.id = e.pool
              WHERE p.name = $1 AND e.key = $2 AND e.tier = 'lo'",
            &[&pool, &key.as_bytes().to_vec()],
        )
        .await
        .unwrap();
    assert_eq!(n, 1, "one large object unlinked");
}

/// The file holding `key` under a local tier's root.
fn file_of(root: &Path, key: &Key) -> PathBuf {
    fn walk(dir: &Path, name: &str) -> Option<PathBuf> {
        for e in std::fs::read_dir(dir).ok()? {
            let e = e.ok()?;
            let p = e.path();
            if p.is_dir() {
                if let Some(f) = walk(&p, name) {
                    return Some(f);
                }
            } else if e.file_name().to_str() == Some(name) {
                return Some(p);
            }
        }
        None
    }
    walk(root, &key.to_string()).unwrap_or_else(|| panic!("no file for {key} under {root:?}"))
}

/// A fleet store of `pool` on a shared local tier under a fresh temporary
/// directory: the directory (kept alive by the caller), the tier's root,
/// the store.
async fn shared_local_store(pool: &str) -> (tempfile::TempDir, PathBuf, Store) {
    let dir = tempfile::tempdir().unwrap();
    let media = dir.path().join("shared");
    let store = Store::open_fleet(FleetOptions::new(
        url(),
        pool,
        FleetLarge::SharedLocal(media.clone()),
    ))
    .await
    .unwrap();
    (dir, media, store)
}

/// `alkblobs_verify_finished` of a whole, clean run of `pool`, as `c`.
async fn record_clean_run(c: &Client, pool: &str) -> Result<u64, tokio_postgres::Error> {
    c.execute(
        "SELECT alkblobs_verify_finished($1, now(), true, 0, 0, 0, 0, 0)",
        &[&pool],
    )
    .await
}

/// `alkblobs_health`'s status, verify_missing and reasons for `pool`.
async fn health(c: &Client, pool: &str) -> (String, Option<i64>, Vec<String>) {
    let r = c
        .query_one(
            "SELECT status, verify_missing, reasons FROM alkblobs_health WHERE pool = $1",
            &[&pool],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2))
}

/// A liveness table for `pool`, registered (forward references if asked).
async fn refs_table(c: &Client, pool: &str, forward: bool) -> String {
    let table = table_name(pool, if forward { "fwd" } else { "refs" });
    c.batch_execute(&format!("CREATE TABLE {table} (key bytea PRIMARY KEY)"))
        .await
        .unwrap();
    if forward {
        c.execute(
            "SELECT alkblobs_register_liveness($1, $2::text::regclass, forward_references => true)",
            &[&pool, &table],
        )
        .await
        .unwrap();
    } else {
        register(c, pool, &table).await;
    }
    table
}

async fn reference(c: &Client, table: &str, key: &[u8]) {
    c.execute(&format!("INSERT INTO {table} VALUES ($1)"), &[&key])
        .await
        .unwrap();
}

/// The row of the missing key, with what references it.
fn assert_missing(
    report: &alkblobs::VerifyReport,
    key: &Key,
    referenced_by: &str,
    recorded: Option<Held>,
) {
    assert_eq!(
        report.missing.len(),
        1,
        "exactly one key missing: {report:?}"
    );
    let m = &report.missing[0];
    assert_eq!(m.key, *key, "{report:?}");
    assert_eq!(
        m.referenced_by,
        vec![referenced_by.to_owned()],
        "{report:?}"
    );
    assert_eq!(m.recorded, recorded, "{report:?}");
    assert!(report.corrupt.is_empty(), "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_instance_pg_lo_a_lost_large_object_is_one_missing_root_and_a_reput_restores_it() {
    let c = connect().await;
    let pool = pool_with(&c, "vf-si-lo", "0 seconds", "60 seconds", "pg-lo", true).await;
    let store = Store::open_postgres(PostgresOptions::new(url(), &pool).large(PgLarge::PgLo))
        .await
        .unwrap();
    let (a, b, small) = (blob(1, BIG), blob(2, BIG), blob(3, 1000));
    let ka = store.put(a.clone()).await.unwrap().key;
    let kb = store.put(b.clone()).await.unwrap().key;
    let ks = store.put(small.clone()).await.unwrap().key;
    store.add_roots(&[ka, kb]).await.unwrap();
    let clean = store.verify().await.unwrap();
    assert!(clean.is_clean() && clean.checked == 3, "{clean:?}");
    assert_eq!(health(&c, &pool).await.1, Some(0));

    lose_large_object(&c, &pool, &ka).await;
    // Not the end of the run: the other two are read, the lost one named.
    let report = store.verify().await.unwrap();
    assert_missing(&report, &ka, "root", Some(Held::LargeObjectLost));
    assert_eq!(report.checked, 2, "{report:?}");
    assert_eq!(report.bytes, (BIG + 1000) as u64, "{report:?}");
    // Reads and stat agree: lost, not "never stored".
    for e in [
        store.get(&ka).await.unwrap_err(),
        store.stat(&ka).await.unwrap_err(),
        store.open_read(&ka).await.err().unwrap(),
        store.get_range_verified(&ka, 0, 10).await.unwrap_err(),
    ] {
        assert_eq!(e.kind(), ErrorKind::Lost, "{e}");
    }
    let ex = store.explain(&ka).await.unwrap();
    assert!(ex.lost.is_some() && ex.entry.is_none(), "{ex:?}");
    let rows = c
        .query(
            "SELECT aspect, detail FROM alkblobs_explain($1, $2)",
            &[&pool, &ka.as_bytes().to_vec()],
        )
        .await
        .unwrap();
    let entry: String = rows[0].get(1);
    assert!(entry.starts_with("LOST"), "{entry}");
    // The database keeps it: critical until a whole verify finds none.
    let (status, missing, reasons) = health(&c, &pool).await;
    assert_eq!(
        (status.as_str(), missing),
        ("critical", Some(1)),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("verify found")),
        "{reasons:?}"
    );

    // A slice that does not reach it finds nothing, and clears nothing.
    let slice = store
        .verify_with_options(VerifyOptions::default().after(Some(ka)), |_| {})
        .await
        .unwrap();
    let beyond = [kb, ks].iter().filter(|k| **k > ka).count() as u64;
    assert!(
        !slice.whole && slice.is_clean() && slice.checked == beyond,
        "{slice:?}"
    );
    assert_eq!(health(&c, &pool).await.0, "critical");

    // Putting the original bytes again restores it.
    let _ = store.put(a.clone()).await.unwrap();
    assert_eq!(store.get(&ka).await.unwrap().unwrap(), a);
    let after = store.verify().await.unwrap();
    assert!(after.is_clean() && after.checked == 3, "{after:?}");
    assert_eq!(health(&c, &pool).await.0, "ok");
    store.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_pg_lo_a_lost_large_object_named_by_its_liveness_table() {
    let c = connect().await;
    let pool = pool_with(&c, "vf-fl-lo", "0 seconds", "60 seconds", "pg-lo", false).await;
    let table = refs_table(&c, &pool, false).await;
    let store = Store::open_fleet(FleetOptions::new(url(), &pool, FleetLarge::PgLo))
        .await
        .unwrap();
    let ka = store.put(blob(11, BIG)).await.unwrap().key;
    let kb = store.put(blob(12, BIG)).await.unwrap().key;
    for k in [ka, kb] {
        reference(&c, &table, k.as_bytes()).await;
    }
    assert!(store.verify().await.unwrap().is_clean());
    lose_large_object(&c, &pool, &kb).await;
    let report = store.verify().await.unwrap();
    assert_missing(
        &report,
        &kb,
        &format!("liveness public.{table}"),
        Some(Held::LargeObjectLost),
    );
    assert_eq!(report.checked, 1, "{report:?}");
    assert_eq!(store.stat(&kb).await.unwrap_err().kind(), ErrorKind::Lost);
    assert_eq!(health(&c, &pool).await.0, "critical");
    // Once nothing references it, the lost entry is collected: its
    // object's absence does not make every sweep of the pool fail.
    c.execute(
        &format!("DELETE FROM {table} WHERE key = $1"),
        &[&kb.as_bytes().to_vec()],
    )
    .await
    .unwrap();
    for _ in 0..3 {
        let r = store
            .sweep(alkblobs::SweepOptions::new().window(std::time::Duration::ZERO))
            .await
            .unwrap();
        assert!(r.aborted.is_none(), "{r:?}");
    }
    assert!(
        store.stat(&kb).await.unwrap().is_none(),
        "the lost entry was collected"
    );
    let after = store.verify().await.unwrap();
    assert!(after.is_clean() && after.checked == 1, "{after:?}");
    store.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_shared_local_a_removed_file_is_missing_and_reads_call_it_lost() {
    let c = connect().await;
    let pool = pool_with(&c, "vf-fl-local", "0 seconds", "60 seconds", "local", false).await;
    let table = refs_table(&c, &pool, false).await;
    let (_dir, media, store) = shared_local_store(&pool).await;
    let (a, b) = (blob(21, BIG), blob(22, BIG));
    let ka = store.put(a.clone()).await.unwrap().key;
    let kb = store.put(b).await.unwrap().key;
    for k in [ka, kb] {
        reference(&c, &table, k.as_bytes()).await;
    }
    let clean = store.verify().await.unwrap();
    assert!(clean.is_clean() && clean.checked == 2, "{clean:?}");
    assert!(clean.unrecorded.is_empty(), "{clean:?}");

    std::fs::remove_file(file_of(&media, &ka)).unwrap();
    let report = store.verify().await.unwrap();
    assert_missing(
        &report,
        &ka,
        &format!("liveness public.{table}"),
        Some(Held::File { generation: 0 }),
    );
    assert_eq!(report.checked, 1, "{report:?}");
    for e in [
        store.stat(&ka).await.unwrap_err(),
        store.get(&ka).await.unwrap_err(),
    ] {
        assert_eq!(e.kind(), ErrorKind::Lost, "{e}");
    }
    let ex = store.explain(&ka).await.unwrap();
    assert!(ex.lost.is_some() && ex.entry.is_none(), "{ex:?}");
    assert_eq!(health(&c, &pool).await.0, "critical");
    let _ = store.put(a).await.unwrap();
    assert!(store.verify().await.unwrap().is_clean());
    assert_eq!(health(&c, &pool).await.0, "ok");
    store.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unrecorded_objects_puts_in_flight_forward_and_malformed_references_are_not_losses() {
    let c = connect().await;
    let pool = pool_with(&c, "vf-fl-odd", "0 seconds", "60 seconds", "local", false).await;
    let fwd = refs_table(&c, &pool, true).await;
    let (_dir, media, store) = shared_local_store(&pool).await;
    let kept = store.put(blob(31, BIG)).await.unwrap().key;
    // An object no record names: written to the tier behind the pool's
    // back (a crash between a writer's file and its record leaves one).
    let stray = blob(32, BIG);
    let stray_key = Key::from_hash(blake3::hash(&stray));
    {
        use alkblobs::Backend;
        let local = alkblobs::backend::local::LocalBackend::open(
            &media,
            alkblobs::backend::local::LocalOptions::default().shared_media(true),
        )
        .await
        .unwrap();
        local.put(&stray_key, stray.into()).await.unwrap();
        local.close().await.unwrap();
    }
    // A put in flight: recorded, not published.
    let flying = Key::from_hash(blake3::hash(b"in flight"));
    c.execute(
        "SELECT alkblobs_pin_new($1, $2, 'someone')",
        &[&pool, &flying.as_bytes().to_vec()],
    )
    .await
    .unwrap();
    // A forward reference to content not put yet, and a malformed one.
    let later = Key::from_hash(blake3::hash(b"put later"));
    reference(&c, &fwd, later.as_bytes()).await;
    reference(&c, &fwd, b"short").await;

    let report = store.verify().await.unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.checked, 1, "{report:?}");
    assert_eq!(report.unrecorded, vec![stray_key], "{report:?}");
    assert_eq!(report.in_flight, 1, "{report:?}");
    assert_eq!(report.forward, 1, "{report:?}");
    assert_eq!(report.malformed.len(), 1, "{report:?}");
    assert_eq!(report.malformed[0].value, "73686f7274", "{report:?}");
    assert!(
        report.malformed[0].referenced_by[0].starts_with(&format!("liveness public.{fwd}")),
        "{report:?}"
    );
    let _ = kept;
    // Unrecorded alone is not critical.
    assert_eq!(health(&c, &pool).await.0, "ok");
    store.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_naming_content_never_put_is_missing_with_no_record() {
    let c = connect().await;
    let pool = pool_with(&c, "vf-si-root", "0 seconds", "60 seconds", "none", true).await;
    let store = Store::open_postgres(PostgresOptions::new(url(), &pool).large(PgLarge::None))
        .await
        .unwrap();
    let present = store.put(blob(41, 2000)).await.unwrap().key;
    let never = Key::from_hash(blake3::hash(b"never put"));
    store.add_roots(&[present, never]).await.unwrap();
    let report = store.verify().await.unwrap();
    assert_missing(&report, &never, "root", None);
    assert_eq!(report.checked, 1);
    store.close().await.unwrap();
}

/// Verify reads through the extension's functions: a reader may run them,
/// and a role without access to the pool is refused (42501), not shown
/// another pool's record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_is_read_only_by_roles_with_access_to_the_pool() {
    let c = connect().await;
    let pool = pool_with(&c, "vf-acl", "0 seconds", "60 seconds", "none", false).await;
    let outsider = alkblobs_tests::pg::login_role(&c, "vfout", "alkblobs_reader").await;
    let o = alkblobs_tests::pg::connect_as(&outsider).await;
    for sql in [
        "SELECT * FROM alkblobs_verify_records($1)",
        "SELECT * FROM alkblobs_verify_sources($1)",
        "SELECT * FROM alkblobs_verify_abandoned($1)",
    ] {
        let e = o.query(sql, &[&pool]).await.unwrap_err();
        assert_eq!(alkblobs_tests::pg::sqlstate(&e), "42501", "{sql}: {e}");
    }
    let e = record_clean_run(&o, &pool).await.unwrap_err();
    assert_eq!(alkblobs_tests::pg::sqlstate(&e), "42501");
    // A reader of the pool reads its record, but cannot record a run:
    // a reader (the monitoring role) must not clear a pool's alarm.
    let reader = alkblobs_tests::pg::login_role(&c, "vfreader", "alkblobs_reader").await;
    alkblobs_tests::pg::grant_pool(&c, &pool, &reader, "read").await;
    let r = alkblobs_tests::pg::connect_as(&reader).await;
    for sql in [
        "SELECT * FROM alkblobs_verify_records($1)",
        "SELECT * FROM alkblobs_verify_abandoned($1)",
    ] {
        r.query(sql, &[&pool]).await.unwrap();
    }
    let e = record_clean_run(&r, &pool).await.unwrap_err();
    assert_eq!(alkblobs_tests::pg::sqlstate(&e), "42501");
    // A sweeper role (it may run the function) with only read access to
    // this pool: the pool's own access rule refuses it.
    let sweeper = alkblobs_tests::pg::login_role(&c, "vfsweeper", "alkblobs_sweeper").await;
    alkblobs_tests::pg::grant_pool(&c, &pool, &sweeper, "read").await;
    let w = alkblobs_tests::pg::connect_as(&sweeper).await;
    let e = record_clean_run(&w, &pool).await.unwrap_err();
    assert_eq!(alkblobs_tests::pg::sqlstate(&e), "42501");
    alkblobs_tests::pg::grant_pool(&c, &pool, &sweeper, "sweep").await;
    record_clean_run(&w, &pool).await.unwrap();
    // Bad arguments are typed refusals.
    let e = c
        .query(
            "SELECT * FROM alkblobs_verify_records($1, NULL, 0)",
            &[&pool],
        )
        .await
        .unwrap_err();
    assert_eq!(alkblobs_tests::pg::sqlstate(&e), "22023");
    let e = c
        .execute(
            "SELECT alkblobs_verify_finished($1, now(), true, 0, 0, -1, 0, 0)",
            &[&pool],
        )
        .await
        .unwrap_err();
    assert_eq!(alkblobs_tests::pg::sqlstate(&e), "22023");
}

/// A single-instance pool on a `local` tier: the tier is its own index
/// (its files are not rows), so verify hashes what it lists and checks
/// the record's references against it: a rooted file removed is missing,
/// an unrooted blob's damage is corrupt, and intact blobs are neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_instance_local_hashes_its_tier_and_names_a_root_whose_file_is_gone() {
    let c = connect().await;
    let pool = pool_with(&c, "vf-si-local", "0 seconds", "60 seconds", "local", true).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("large");
    let store = Store::open_postgres(
        PostgresOptions::new(url(), &pool).large(PgLarge::Local(root.clone())),
    )
    .await
    .unwrap();
    let (a, b, kept) = (blob(51, BIG), blob(52, BIG), blob(53, BIG));
    let ka = store.put(a).await.unwrap().key;
    let kb = store.put(b).await.unwrap().key;
    let kk = store.put(kept).await.unwrap().key;
    store.add_roots(&[ka, kk]).await.unwrap();
    let clean = store.verify().await.unwrap();
    assert!(clean.is_clean() && clean.checked == 3, "{clean:?}");
    std::fs::remove_file(file_of(&root, &ka)).unwrap();
    let path = file_of(&root, &kb);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[100] ^= 1;
    std::fs::write(&path, bytes).unwrap();
    let report = store.verify().await.unwrap();
    assert_eq!(report.missing.len(), 1, "{report:?}");
    assert_eq!(
        (
            report.missing[0].key,
            report.missing[0].referenced_by.clone()
        ),
        (ka, vec!["root".to_owned()])
    );
    let corrupt: Vec<Key> = report.corrupt.iter().map(|c| c.key).collect();
    assert_eq!(corrupt, vec![kb], "{report:?}");
    assert_eq!(report.checked, 2, "{report:?}");
    assert_eq!(health(&c, &pool).await.0, "critical");
    store.close().await.unwrap();
}

/// An outboard whose blob is gone and that no record names (a writer
/// stopped between its outboard and its blob) is reported by verify as
/// unrecorded and collected by the pool's next audit: its tier listing
/// stages the key, the claim deletes it, the outboard goes with it. And a
/// claimed key whose blob is already gone (its first claimer deleted the
/// blob, then died) loses its outboard too. (Issue 37's outboard leak, on
/// the shared local tier.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outboards_whose_blob_is_gone_are_unrecorded_and_collected() {
    let c = connect().await;
    let pool = pool_with(&c, "vf-obao", "0 seconds", "60 seconds", "local", false).await;
    c.execute(
        "SELECT alkblobs_alter_pool($1, collector => 'queue', audit_every => '0')",
        &[&pool],
    )
    .await
    .unwrap();
    let (_dir, media, store) = shared_local_store(&pool).await;
    let sweep = || async {
        let r = store.sweep(alkblobs::SweepOptions::new()).await.unwrap();
        assert!(r.aborted.is_none(), "{r:?}");
        r
    };
    // A put whose blob is removed before the sweep claims it: the claim
    // finds no blob and still removes the outboard.
    let gone = store.put(blob(61, BIG)).await.unwrap().key;
    let gone_outboard = {
        let mut p = file_of(&media, &gone).into_os_string();
        p.push(".obao");
        PathBuf::from(p)
    };
    assert!(gone_outboard.exists(), "a 3 MiB blob has an outboard file");
    std::fs::remove_file(file_of(&media, &gone)).unwrap();
    for _ in 0..3 {
        sweep().await;
    }
    assert!(
        !gone_outboard.exists(),
        "the claim of a key whose blob was gone left its outboard"
    );
    // An outboard file with no blob and no record.
    let stray = Key::from_hash(blake3::hash(b"an outboard without its blob"));
    let hex = stray.to_hex();
    let shard = media.join("blobs").join(&hex[..2]);
    std::fs::create_dir_all(&shard).unwrap();
    let stray_outboard = shard.join(format!("{hex}.obao"));
    std::fs::write(&stray_outboard, vec![0u8; 64 * 3]).unwrap();
    let report = store.verify().await.unwrap();
    assert_eq!(report.unrecorded, vec![stray], "{report:?}");
    assert!(report.is_clean(), "{report:?}");
    c.execute("SELECT alkblobs_request_audit($1)", &[&pool])
        .await
        .unwrap();
    for _ in 0..4 {
        sweep().await;
    }
    assert!(
        !stray_outboard.exists(),
        "the audit's listing did not collect the outboard without a blob"
    );
    assert!(store.verify().await.unwrap().unrecorded.is_empty());
    store.close().await.unwrap();
}

/// Two puts restoring one lost large object at once, at each isolation
/// level: the second waits for the first's row lock; at READ COMMITTED it
/// then finds the first's object and drops its own, at REPEATABLE READ and
/// SERIALIZABLE it fails with 40001 (retryable) and stores nothing. Either
/// way the entry names one live object and no upload object is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_restoring_puts_at_every_isolation_level_leak_nothing() {
    /// A large-object put through the extension on `c` (in its open
    /// transaction, if any): its upload's object id.
    async fn put(
        c: &Client,
        v: Vec<u8>,
        k: Vec<u8>,
        pool: String,
    ) -> Result<u32, tokio_postgres::Error> {
        let loid: u32 = c
            .query_one("SELECT alkblobs_lo_create($1)", &[&pool])
            .await?
            .get(0);
        c.execute("SELECT alkblobs_lo_write($1, 0, $2)", &[&loid, &v])
            .await?;
        c.execute(
            "SELECT alkblobs_lo_commit($1, $2, $3, NULL)",
            &[&pool, &k, &loid],
        )
        .await?;
        Ok(loid)
    }
    let c = connect().await;
    let v = blob(71, 100_000);
    let k = alkblobs::Key::of(&v).as_bytes().to_vec();
    for level in ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"] {
        let pool = pool_with(&c, "vf-restore", "0 seconds", "60 seconds", "pg-lo", true).await;
        c.batch_execute("BEGIN").await.unwrap();
        put(&c, v.clone(), k.clone(), pool.clone()).await.unwrap();
        c.batch_execute("COMMIT").await.unwrap();
        let key = Key::from_slice(&k).unwrap();
        lose_large_object(&c, &pool, &key).await;
        let (a, b) = (connect().await, connect().await);
        a.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}"))
            .await
            .unwrap();
        b.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}"))
            .await
            .unwrap();
        // Both snapshots taken before either restores.
        a.execute("SELECT 1", &[]).await.unwrap();
        b.execute("SELECT 1", &[]).await.unwrap();
        let first = put(&a, v.clone(), k.clone(), pool.clone()).await.unwrap();
        let second = tokio::spawn({
            let (v, k, pool) = (v.clone(), k.clone(), pool.clone());
            async move {
                let r = put(&b, v, k, pool).await;
                let end = if r.is_ok() { "COMMIT" } else { "ROLLBACK" };
                b.batch_execute(end).await.unwrap();
                r
            }
        });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(
            !second.is_finished(),
            "{level}: the second put waits for the first's lock"
        );
        a.batch_execute("COMMIT").await.unwrap();
        let second = second.await.unwrap();
        match level {
            "READ COMMITTED" => {
                let theirs = second.expect("at READ COMMITTED the second put succeeds");
                let gone: bool = c
                    .query_one(
                        "SELECT NOT EXISTS (SELECT 1 FROM pg_largeobject_metadata WHERE oid = $1)",
                        &[&theirs],
                    )
                    .await
                    .unwrap()
                    .get(0);
                assert!(
                    gone,
                    "{level}: the second put's object was dropped, not leaked"
                );
            }
            _ => {
                let e = second.expect_err("the second put must not overwrite the first's restore");
                assert_eq!(alkblobs_tests::pg::sqlstate(&e), "40001", "{level}: {e}");
            }
        }
        let row = c
            .query_one(
                "SELECT e.loid = $3, EXISTS (SELECT 1 FROM pg_largeobject_metadata m WHERE m.oid = e.loid)
                   FROM alkblobs.entries e JOIN alkblobs.pools p ON p.id = e.pool
                  WHERE p.name = $1 AND e.key = $2",
                &[&pool, &k, &first],
            )
            .await
            .unwrap();
        assert!(
            row.get::<_, bool>(0) && row.get::<_, bool>(1),
            "{level}: the entry names the first restore's object"
        );
    }
}

/// A large object the pool created for an upload that ended without
/// `alkblobs_lo_commit` references no entry: verify names it (the object
/// and its bytes) as abandoned, not missing, counts it as unrecorded in
/// the pool's verify state, and after the next sweep it is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_upload_is_named_and_the_next_sweep_unlinks_it() {
    let mut c = connect().await;
    let pool = pool_with(&c, "vf-abandon", "0 seconds", "60 seconds", "pg-lo", true).await;
    let store = Store::open_postgres(PostgresOptions::new(url(), &pool).large(PgLarge::PgLo))
        .await
        .unwrap();
    let k = store.put(blob(40, BIG)).await.unwrap().key;
    store.add_roots(&[k]).await.unwrap();
    let clean = store.verify().await.unwrap();
    assert!(clean.abandoned_uploads.is_empty(), "{clean:?}");
    // A client that wrote its chunks and committed without lo_commit.
    let tx = c.transaction().await.unwrap();
    let oid: u32 = tx
        .query_one("SELECT alkblobs_lo_create($1)", &[&pool])
        .await
        .unwrap()
        .get(0);
    tx.execute(
        "SELECT alkblobs_lo_write($1, 0, $2)",
        &[&oid, &blob(41, 5000)],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let report = store.verify().await.unwrap();
    assert!(report.is_clean() && report.checked == 1, "{report:?}");
    assert_eq!(
        report.abandoned_uploads,
        vec![alkblobs::record::AbandonedUpload {
            loid: oid,
            bytes: 5000
        }],
        "{report:?}"
    );
    let unrecorded: i64 = c
        .query_one(
            "SELECT v.unrecorded FROM alkblobs.verifies v JOIN alkblobs.pools p ON p.id = v.pool WHERE p.name = $1",
            &[&pool],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(unrecorded, 1);
    store.sweep(alkblobs::SweepOptions::new()).await.unwrap();
    let after = store.verify().await.unwrap();
    assert!(
        after.abandoned_uploads.is_empty() && after.is_clean(),
        "{after:?}"
    );
    let left: bool = c
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_largeobject_metadata WHERE oid = $1)",
            &[&oid],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!left, "the sweep unlinked the abandoned upload");
    store.close().await.unwrap();
}

/// An entry whose large object was lost keeps its OID, which the server
/// may hand out again (the OID counter comes round; a restore without the
/// large objects). `alkblobs_lo_create` never hands out an OID an entry
/// names: the lost entry stays lost, and deleting it unlinks nobody's
/// bytes. (The next OID is learned from a probe object, then given to the
/// lost entry; a concurrent session taking it first only makes the test
/// weaker, never wrong.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oid_a_lost_entry_names_is_never_handed_out_again() {
    let mut c = connect().await;
    let pool = pool_with(&c, "vf-oid", "0 seconds", "60 seconds", "pg-lo", true).await;
    let store = Store::open_postgres(PostgresOptions::new(url(), &pool).large(PgLarge::PgLo))
        .await
        .unwrap();
    let lost = store.put(blob(50, BIG)).await.unwrap().key;
    lose_large_object(&c, &pool, &lost).await;
    let tx = c.transaction().await.unwrap();
    let probe: u32 = tx
        .query_one("SELECT pg_catalog.lo_create(0)", &[])
        .await
        .unwrap()
        .get(0);
    tx.execute("SELECT pg_catalog.lo_unlink($1)", &[&probe])
        .await
        .unwrap();
    let next = probe + 1;
    tx.execute(
        "UPDATE alkblobs.entries e SET loid = $3 FROM alkblobs.pools p
          WHERE p.id = e.pool AND p.name = $1 AND e.key = $2",
        &[&pool, &lost.as_bytes().to_vec(), &next],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    // A put of other bytes: its upload must not take the lost entry's OID.
    let kept = store.put(blob(51, BIG)).await.unwrap().key;
    let loid: u32 = c
        .query_one(
            "SELECT e.loid FROM alkblobs.entries e JOIN alkblobs.pools p ON p.id = e.pool
              WHERE p.name = $1 AND e.key = $2",
            &[&pool, &kept.as_bytes().to_vec()],
        )
        .await
        .unwrap()
        .get(0);
    assert_ne!(loid, next, "the new entry took the lost entry's OID");
    let report = store.verify().await.unwrap();
    assert_eq!(
        report.missing.iter().map(|m| m.key).collect::<Vec<_>>(),
        vec![lost],
        "{report:?}"
    );
    // Deleting the lost entry leaves the other's bytes alone.
    c.execute(
        "SELECT alkblobs_delete($1, ARRAY[$2::bytea])",
        &[&pool, &lost.as_bytes().to_vec()],
    )
    .await
    .unwrap();
    assert_eq!(store.get(&kept).await.unwrap().unwrap(), blob(51, BIG));
    // Two entries can never share one object.
    let e = c
        .execute(
            "UPDATE alkblobs.entries e SET loid = $3 FROM alkblobs.pools p
              WHERE p.id = e.pool AND p.name = $1 AND e.key = $2",
            &[&pool, &lost.as_bytes().to_vec(), &loid],
        )
        .await;
    if let Err(e) = e {
        assert_eq!(alkblobs_tests::pg::sqlstate(&e), "23505");
    }
    store.close().await.unwrap();
}

/// A page whose keys a sweep deletes while the page waits for a liveness
/// table's lock (the sweep holds it until it commits) keeps those keys,
/// with nothing recorded: a page emptied that way would end the walk
/// early, and a run that stopped there would be recorded as whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_whose_keys_are_deleted_meanwhile_is_not_short() {
    let c = connect().await;
    let pool = pool_with(&c, "vf-page", "0 seconds", "60 seconds", "none", false).await;
    let table = refs_table(&c, &pool, false).await;
    let store = Store::open_fleet(FleetOptions::new(url(), &pool, FleetLarge::KvOnly))
        .await
        .unwrap();
    let mut keys = Vec::new();
    for i in 0..4 {
        keys.push(store.put(blob(60 + i, 100)).await.unwrap().key);
    }
    keys.sort();
    reference(&c, &table, keys[3].as_bytes()).await;
    // A "sweep": the first three entries deleted, the table's lock held.
    let sweeper = connect().await;
    sweeper
        .batch_execute(&format!(
            "BEGIN; LOCK TABLE {table} IN SHARE UPDATE EXCLUSIVE MODE"
        ))
        .await
        .unwrap();
    for k in &keys[..3] {
        sweeper
            .execute(
                "DELETE FROM alkblobs.entries e USING alkblobs.pools p WHERE p.id = e.pool AND p.name = $1 AND e.key = $2",
                &[&pool, &k.as_bytes().to_vec()],
            )
            .await
            .unwrap();
    }
    let page = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let c = connect().await;
            c.query(
                "SELECT key, record FROM alkblobs_verify_records($1, NULL, 3)",
                &[&pool],
            )
            .await
            .unwrap()
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    sweeper.batch_execute("COMMIT").await.unwrap();
    let rows = page.await.unwrap();
    let got: Vec<(Vec<u8>, Option<String>)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let want: Vec<(Vec<u8>, Option<String>)> = keys[..3]
        .iter()
        .map(|k| (k.as_bytes().to_vec(), None))
        .collect();
    assert_eq!(got, want);
    // And the walk goes on past them to the rooted key.
    let report = store.verify().await.unwrap();
    assert!(report.is_clean() && report.checked == 1, "{report:?}");
    store.close().await.unwrap();
}

/// Only a whole run that started after the last run that found damage
/// clears a pool's alarm: a long whole run does not clear what a slice
/// found while it ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_run_clears_only_damage_found_before_it_started() {
    let c = connect().await;
    let pool = pool_with(&c, "vf-clear", "0 seconds", "60 seconds", "none", true).await;
    let finished = |started: &'static str, whole: bool, missing: i64| {
        let c = &c;
        let pool = pool.clone();
        async move {
            c.execute(
                &format!("SELECT alkblobs_verify_finished($1, {started}, $2, 1, 1, $3, 0, 0)"),
                &[&pool, &whole, &missing],
            )
            .await
            .unwrap();
        }
    };
    finished("clock_timestamp()", true, 1).await;
    assert_eq!(health(&c, &pool).await.0, "critical");
    let long_start: std::time::SystemTime = c
        .query_one("SELECT clock_timestamp()", &[])
        .await
        .unwrap()
        .get(0);
    // A slice finds more while the long run goes on.
    finished("clock_timestamp()", false, 1).await;
    c.execute(
        "SELECT alkblobs_verify_finished($1, $2, true, 1, 1, 0, 0, 0)",
        &[&pool, &long_start],
    )
    .await
    .unwrap();
    assert_eq!(health(&c, &pool).await.0, "critical");
    finished("clock_timestamp()", true, 0).await;
    assert_eq!(health(&c, &pool).await.0, "ok");
}

/// A liveness table the verifying role cannot read for part of the walk
/// is named as unchecked and the run is not whole: the keys of the pages
/// read meanwhile were not checked against it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_lost_mid_run_makes_the_run_not_whole() {
    let c = connect().await;
    let pool = pool_with(&c, "vf-midrun", "0 seconds", "60 seconds", "none", false).await;
    let table = refs_table(&c, &pool, false).await;
    let role = alkblobs_tests::pg::login_role(&c, "vfmid", "alkblobs_sweeper").await;
    alkblobs_tests::pg::grant_pool(&c, &pool, &role, "sweep").await;
    alkblobs_tests::pg::grant_pool(&c, &pool, &role, "write").await;
    c.batch_execute(&format!(
        "GRANT alkblobs_writer TO {role}; GRANT SELECT ON {table} TO {role}"
    ))
    .await
    .unwrap();
    let writer = Store::open_fleet(FleetOptions::new(url(), &pool, FleetLarge::KvOnly))
        .await
        .unwrap();
    for i in 0..6 {
        let k = writer.put(blob(70 + i, 100)).await.unwrap().key;
        reference(&c, &table, k.as_bytes()).await;
    }
    writer.close().await.unwrap();
    let as_role = url().replacen("postgres@", &format!("{role}@"), 1);
    let store = Store::open_fleet(FleetOptions::new(as_role, &pool, FleetLarge::KvOnly))
        .await
        .unwrap();
    let whole = store
        .verify_with_options(VerifyOptions::default().page(2), |_| {})
        .await
        .unwrap();
    assert!(
        whole.whole && whole.unchecked_sources.is_empty(),
        "{whole:?}"
    );
    // Revoked while the first page is checked, granted again while the
    // second is: only that page's read finds the table unreadable (the
    // checks before and after the walk see it fine).
    let psql = |sql: String| {
        let o = std::process::Command::new("psql")
            .args(["-X", "-q", &url(), "-c", &sql])
            .output()
            .unwrap();
        assert!(o.status.success(), "{o:?}");
    };
    let calls = std::sync::atomic::AtomicUsize::new(0);
    let report = store
        .verify_with_options(VerifyOptions::default().page(2), |_| {
            match calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
                0 => psql(format!("REVOKE SELECT ON {table} FROM {role}")),
                2 => psql(format!("GRANT SELECT ON {table} TO {role}")),
                _ => {}
            }
        })
        .await
        .unwrap();
    assert!(calls.into_inner() >= 6);
    assert!(!report.whole, "{report:?}");
    assert_eq!(
        report
            .unchecked_sources
            .iter()
            .map(|u| u.source.as_str())
            .collect::<Vec<_>>(),
        vec![format!("liveness public.{table}")],
        "{report:?}"
    );
    store.close().await.unwrap();
}
