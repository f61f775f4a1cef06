//! The store and arbiter conformance suites over the `s3` large engine in
//! the single-node topology (sqlite + s3), against the test S3 server.

#![cfg(feature = "s3")]

use alkblobs::backend::s3::S3Backend;
use alkblobs::backend::sqlite::{SqliteBackend, SqliteOptions};
use alkblobs::conformance::store::Config;
use alkblobs::{Store, arbiter_suite, store_suite};
use alkblobs_tests::s3::options;

const TIERED: Config = Config {
    kv_only: false,
    big: 100 << 20,
    list_keys: 5_000,
};

async fn sqlite_s3(tag: &str, threshold: u64) -> (Store, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let kv = SqliteBackend::open(dir.path().join("index.sqlite"), SqliteOptions::default())
        .await
        .unwrap();
    let large = S3Backend::open(options(tag)).await.unwrap();
    let s = Store::builder()
        .sqlite(kv)
        .large(large)
        .threshold(threshold)
        .build()
        .unwrap();
    (s, dir)
}

store_suite!(sqlite_s3_store, TIERED, sqlite_s3("store", 65_536));
arbiter_suite!(sqlite_s3_arbiter, sqlite_s3("arbiter", 1024));

/// A prefix belongs to the store that first wrote it (`alkblobs.owner`):
/// another embedded store is refused there even once the first has
/// closed (the lease excludes only two at once), with one line naming the
/// owner; the first reopens with its blob; a read-only open is allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_belongs_to_the_store_that_first_wrote_it() {
    use alkblobs::backend::OpenMode;
    use alkblobs::backend::s3::S3Options;
    use alkblobs::{DirOptions, Error, Key};
    let loc = alkblobs_tests::s3::location("owner");
    let s3 = || S3Options::new(loc.clone()).part_size(5 << 20);
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = Store::open_dir_with(a_dir.path(), DirOptions::new().large_s3(s3()))
        .await
        .unwrap();
    let key = a.put(vec![9u8; 200_000]).await.unwrap().key;
    a.close().await.unwrap();
    drop(a);
    let e = Store::open_dir_with(b_dir.path(), DirOptions::new().large_s3(s3()))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("belongs to \"embedded store ") && text.contains("alkblobs.owner"),
        "{text}"
    );
    let ro = Store::open_dir_with(
        b_dir.path(),
        DirOptions::new().mode(OpenMode::ReadOnly).large_s3(s3()),
    )
    .await
    .unwrap();
    assert_eq!(ro.get(&key).await.unwrap().map(|b| Key::of(&b)), Some(key));
    drop(ro);
    let a = Store::open_dir_with(a_dir.path(), DirOptions::new().large_s3(s3()))
        .await
        .unwrap();
    assert_eq!(a.get(&key).await.unwrap().map(|b| Key::of(&b)), Some(key));
    a.close().await.unwrap();
}

/// Four stores open one fresh prefix at once: exactly one becomes its
/// owner, the other three are refused (`Config`). Where the service
/// honours `If-None-Match` (the emulator run) the owner object's creation
/// is exclusive; where it does not (Garage) the writes settle and are
/// read back: either way one owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stores_racing_for_a_fresh_prefix_get_one_owner() {
    use alkblobs::backend::s3::S3Options;
    use alkblobs::{DirOptions, Error};
    let loc = alkblobs_tests::s3::location("owner-race");
    let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let opens = dirs.iter().map(|d| {
        let s3 = S3Options::new(loc.clone()).part_size(5 << 20);
        let path = d.path().to_path_buf();
        tokio::spawn(
            async move { Store::open_dir_with(path, DirOptions::new().large_s3(s3)).await },
        )
    });
    let results = futures::future::join_all(opens).await;
    let mut owners = 0;
    for r in results {
        match r.unwrap() {
            Ok(s) => {
                owners += 1;
                s.close().await.unwrap();
            }
            Err(Error::Config(text)) => assert!(text.contains("belongs to"), "{text}"),
            // (The lease refuses a second owner only while the first is
            // open: a second store past the owner check lands here.)
            Err(e) => panic!("a second store passed the owner check: {e:?}"),
        }
    }
    assert_eq!(owners, 1, "one prefix, one owner");
}

/// Blobs of at most the s3 engine's outboard floor (1 MiB) are stored
/// without an outboard object, by design: a verified range reads them
/// whole and right, `verify` neither counts nor repairs them as missing,
/// `range_check` says so; a bigger blob keeps its outboard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blobs_under_the_outboard_floor_verify_whole_and_are_not_missing() {
    use alkblobs::{RangeCheck, VerifyOptions};
    let (store, _dir) = sqlite_s3("floor", 65_536).await;
    let large = store.large().unwrap().clone();
    assert_eq!(large.outboard_floor(), 1 << 20);
    let small = alkblobs_tests::data(41, 1 << 20);
    let big = alkblobs_tests::data(42, (1 << 20) + 1);
    let ks = store.put(small.clone()).await.unwrap().key;
    let kb = store.put(big.clone()).await.unwrap().key;
    assert_eq!(large.read_outboard(&ks, 0, 64).await.unwrap(), None);
    assert!(large.read_outboard(&kb, 0, 64).await.unwrap().is_some());
    assert_eq!(
        store.range_check(&ks).await.unwrap(),
        Some(RangeCheck::BelowFloor)
    );
    assert_eq!(
        store.range_check(&kb).await.unwrap(),
        Some(RangeCheck::Outboard)
    );
    let got = store
        .get_range_verified(&ks, 300_000, 5000)
        .await
        .unwrap()
        .unwrap();
    assert!(got[..] == small[300_000..305_000]);
    let report = store
        .verify_with_options(VerifyOptions::default().repair_outboards(true), |_| {})
        .await
        .unwrap();
    assert_eq!(
        (report.outboards_missing, report.outboards_repaired),
        (0, 0),
        "{report:?}"
    );
    assert_eq!(large.read_outboard(&ks, 0, 64).await.unwrap(), None);
    assert_eq!(
        large.outboard_usage().await.unwrap(),
        Some(alkblobs::outboard::outboard_len(big.len() as u64))
    );
}
