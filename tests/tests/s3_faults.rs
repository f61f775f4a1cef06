//! Faults of the S3 server under an embedded store whose large tier is on
//! it: the server SIGKILLed mid-upload and mid-sweep, and an object whose
//! bytes are not its key's. This binary kills and restarts the test S3
//! server, so scripts/test.sh runs it alone, after the other s3 suites.

#![cfg(feature = "s3")]

use std::time::{Duration, Instant};

use alkblobs::backend::s3::{S3Backend, S3Options};
use alkblobs::backend::{BackendExt, OpenMode};
use alkblobs::{DirOptions, Key, Store, SweepOptions, SweepPhase};
use alkblobs_tests::s3::{location, server_script};

fn server(action: &str) {
    let st = std::process::Command::new(server_script())
        .arg(action)
        .status()
        .unwrap();
    assert!(st.success(), "scripts/s3-server.sh {action}");
}

fn value(seed: u64, len: usize) -> Vec<u8> {
    alkblobs_tests::data(seed, len)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_killed_mid_upload_and_mid_sweep_loses_nothing_protected() {
    let dir = tempfile::tempdir().unwrap();
    let loc = location("faults");
    let s3 = S3Options::new(loc.clone())
        .part_size(5 << 20)
        .upload_concurrency(1)
        .upload_grace(Duration::from_secs(1))
        .retry_timeout(Duration::from_secs(2));
    let store = Store::open_dir_with(dir.path(), DirOptions::new().large_s3(s3))
        .await
        .unwrap();
    let kept = value(1, 6 << 20);
    let kept_put = store.put(kept.clone()).await.unwrap();
    let kept_key = kept_put.key;
    store.add_roots(&[kept_key]).await.unwrap();
    drop(kept_put);

    // Mid-upload: a 120 MiB put in 5 MiB parts, one at a time.
    let reader = S3Backend::open(S3Options::new(loc.clone()).mode(OpenMode::ReadOnly))
        .await
        .unwrap();
    let big = value(2, 120 << 20);
    let big_key = Key::of(&big);
    let s = store.clone();
    let put = tokio::spawn({
        let big = big.clone();
        async move { s.put(big).await.map(|p| p.key) }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while reader.uploads_in_progress().await.unwrap() == 0 {
        assert!(Instant::now() < deadline, "the upload never began");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server("kill");
    let e = put
        .await
        .unwrap()
        .expect_err("a put whose server died must fail");
    assert!(
        e.is_retryable(),
        "a dead server is a retryable error: {e:?}"
    );
    server("resume");
    // Nothing torn: the failed blob is absent, the protected one intact.
    assert!(!store.has(&big_key).await.unwrap());
    assert_eq!(
        store.get(&kept_key).await.unwrap().as_deref(),
        Some(&kept[..])
    );
    // The put again succeeds.
    let again = store.put(big.clone()).await.unwrap();
    assert_eq!(again.key, big_key);
    drop(again);

    // Mid-sweep: garbage, the server killed once the mark is sealed.
    let mut garbage = Vec::new();
    for i in 0..4 {
        let p = store.put(value(10 + i, 2 << 20)).await.unwrap();
        garbage.push(p.key);
    }
    let killed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let k = killed.clone();
    let opts = SweepOptions::new()
        .window(Duration::ZERO)
        .hook(move |phase| {
            let k = k.clone();
            Box::pin(async move {
                if phase == SweepPhase::Execute
                    && !k.swap(true, std::sync::atomic::Ordering::SeqCst)
                {
                    tokio::task::spawn_blocking(|| server("kill"))
                        .await
                        .unwrap();
                }
            })
        });
    let r = store.sweep(opts).await;
    assert!(
        killed.load(std::sync::atomic::Ordering::SeqCst),
        "the hook never ran"
    );
    match &r {
        Err(e) => assert!(e.is_retryable(), "{e:?}"),
        Ok(report) => assert!(
            report.deleted < 5,
            "a sweep without its server deleted: {report:?}"
        ),
    }
    server("resume");
    assert_eq!(
        store.get(&kept_key).await.unwrap().as_deref(),
        Some(&kept[..])
    );
    // The next sweep completes: every unreferenced blob goes (the 120 MiB
    // one too), the rooted one stays, and the orphaned multipart upload of
    // the killed put is aborted (its marker is past the 1 s grace).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let report = store
        .sweep(SweepOptions::new().window(Duration::ZERO))
        .await
        .expect("the sweep after the restart");
    for k in garbage.iter().chain([&big_key]) {
        assert!(
            !store.has(k).await.unwrap(),
            "{k} survived the sweep: {report:?}"
        );
    }
    assert_eq!(
        store.get(&kept_key).await.unwrap().as_deref(),
        Some(&kept[..])
    );
    assert_eq!(
        reader.uploads_in_progress().await.unwrap(),
        0,
        "the orphan was not aborted"
    );
}

/// An object whose bytes are not its key's (a service fault, or another
/// writer in the prefix): `verify` reports it corrupt, a read refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_with_other_bytes_is_reported_corrupt() {
    use object_store::ObjectStoreExt;
    let dir = tempfile::tempdir().unwrap();
    let loc = location("corrupt");
    let store = Store::open_dir_with(
        dir.path(),
        DirOptions::new().large_s3(S3Options::new(loc.clone()).part_size(5 << 20)),
    )
    .await
    .unwrap();
    let v = value(3, 1 << 20);
    let put = store.put(v.clone()).await.unwrap();
    let key = put.key;
    let raw = object_store::aws::AmazonS3Builder::from_env()
        .with_bucket_name(loc.bucket())
        .with_client_options(object_store::ClientOptions::new().with_allow_http(true))
        .build()
        .unwrap();
    let hex = key.to_hex();
    let path =
        object_store::path::Path::from(format!("{}/blobs/{}/{hex}", loc.prefix(), &hex[..2]));
    raw.put(&path, value(4, 1 << 20).into()).await.unwrap();
    let report = store.verify().await.unwrap();
    assert_eq!(report.corrupt.len(), 1, "{report:?}");
    assert_eq!(report.corrupt[0].key, key);
    assert!(
        store.get(&key).await.is_err(),
        "a read must not return other bytes"
    );
    let listed = S3Backend::open(S3Options::new(loc).mode(OpenMode::ReadOnly))
        .await
        .unwrap()
        .list_all()
        .await
        .unwrap();
    assert_eq!(listed, vec![key]);
}
