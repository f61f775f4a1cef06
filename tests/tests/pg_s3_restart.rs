//! The database restarted while a fleet put over an s3 pool is between its
//! pin and its publish: the pin row and the object's record committed, the
//! object uploading, `alkblobs_local_published` not yet called. Restarts
//! the test cluster (`scripts/pg-cluster.sh restart`), so scripts/test.sh
//! runs this binary alone, with the test S3 server up.

#![cfg(all(feature = "pg", feature = "s3"))]

use std::time::Duration;

use alkblobs::backend::s3::S3Options;
use alkblobs::store::fleet::{FleetLarge, FleetOptions};
use alkblobs::{Key, Store, SweepOptions};
use alkblobs_tests::pg::{cluster, connect, eventually, url};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restart_between_an_s3_pin_and_its_publish_loses_nothing() {
    let c = connect().await;
    let (pool, loc) = alkblobs_tests::s3::pool("pgs3-restart", "60 seconds", false).await;
    let store = Store::open_fleet(
        FleetOptions::new(
            url(),
            &pool,
            FleetLarge::S3(S3Options::new(loc.clone()).part_size(5 << 20)),
        )
        .threshold(1024),
    )
    .await
    .unwrap();
    let kept = store.put(vec![5u8; 300_000]).await.unwrap();

    // 64 MiB: hashed and spooled, then pinned and recorded, then uploaded
    // in 5 MiB parts (well over a second here), then published.
    let big: Vec<u8> = (0..64u32 << 20).map(|i| (i % 239) as u8).collect();
    let key = Key::of(&big);
    let writer = {
        let (store, big) = (store.clone(), big.clone());
        tokio::spawn(async move { store.put_reader(std::io::Cursor::new(big)).await })
    };
    // Its record is committed, not yet published: it is uploading.
    let recorded = loop {
        let published: Option<bool> = c
            .query_opt(
                "SELECT f.published FROM alkblobs.files f JOIN alkblobs.pools p ON p.id = f.pool WHERE p.name = $1 AND f.key = $2",
                &[&pool, &key.as_bytes().to_vec()],
            )
            .await
            .unwrap()
            .map(|r| r.get(0));
        match published {
            Some(p) => break p,
            None => {
                assert!(
                    !writer.is_finished(),
                    "the put ended before it recorded its key"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    assert!(!recorded, "published before the upload");
    assert!(
        !writer.is_finished(),
        "the put finished before the restart: the test did not exercise it"
    );
    drop(c);
    tokio::task::spawn_blocking(|| cluster("restart"))
        .await
        .unwrap();
    let first = writer.await.unwrap();
    eprintln!(
        "the put across the restart: {}",
        match &first {
            Ok(p) => format!("ok ({:?})", p.outcome),
            Err(e) => format!("error: {e}"),
        }
    );
    if let Err(e) = &first {
        assert!(e.is_retryable(), "not retryable: {e}");
    }
    // The pool reconnects; nothing protected was lost, nothing is torn.
    let got = eventually(|| store.get(&kept.key)).await;
    assert_eq!(got.map(|b| Key::of(&b)), Some(kept.key));
    if eventually(|| store.has(&key)).await {
        let back = store.get(&key).await.unwrap().unwrap();
        assert!(back == big, "a torn object is visible");
    }
    // A put again (what the retryable error asks for) publishes it.
    let again = eventually(|| store.put_reader(std::io::Cursor::new(big.clone()))).await;
    assert_eq!(again.key, key);
    let c = connect().await;
    let published: bool = c
        .query_one(
            "SELECT f.published FROM alkblobs.files f JOIN alkblobs.pools p ON p.id = f.pool WHERE p.name = $1 AND f.key = $2",
            &[&pool, &key.as_bytes().to_vec()],
        )
        .await
        .unwrap()
        .get(0);
    assert!(published);
    // Pinned, both survive a sweep (window 0); the store verifies whole.
    let r = eventually(|| store.sweep(SweepOptions::new())).await;
    assert_eq!(r.deleted, 0, "{r:?}");
    assert_eq!(
        store.get(&key).await.unwrap().map(|b| Key::of(&b)),
        Some(key)
    );
    let v = store.verify().await.unwrap();
    assert!(v.corrupt.is_empty(), "{:?}", v.corrupt);
    assert!(v.missing.is_empty(), "verify says lost: {:?}", v.missing);
    drop((kept, again, first));
    store.close().await.unwrap();
}
