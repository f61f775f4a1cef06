//! The `s3` large engine against the test S3 server (a real one, started
//! by scripts/test.sh): the backend conformance suite, alone and
//! fleet-shared, and the engine's own promises — one writer per prefix,
//! abandoned multipart uploads reclaimed, bad coordinates as clear errors
//! that carry no secret.

#![cfg(feature = "s3")]

use alkblobs::backend::s3::S3Backend;
use alkblobs::conformance::backend::Caps;
use alkblobs::large_backend_suite;
use alkblobs_tests::s3::options;

// Over the network each put is a request or several: a listing of 2,500
// keys crosses S3's 1,000-key pages.
const S3: Caps = Caps {
    max_value: 8 << 20,
    list_keys: 2_500,
};

large_backend_suite!(s3, S3, async {
    (S3Backend::open(options("suite")).await.unwrap(), ())
});

large_backend_suite!(s3_shared, S3, async {
    (
        S3Backend::open(options("suite-shared").shared(true))
            .await
            .unwrap(),
        (),
    )
});

use std::time::{Duration, Instant};

use alkblobs::backend::s3::S3Options;
use alkblobs::backend::{Backend, BackendExt, LargeBackend, OpenMode};
use alkblobs::{Error, Key};
use alkblobs_tests::proc::Helper;
use alkblobs_tests::s3::{Slow, bucket, location, s3_server_addr, slow_proxy};

const HELPER: &str = env!("CARGO_BIN_EXE_alkblobs-test-helper");

/// An in-process arbiter sweeps against its own pins only, so a prefix has
/// one writer: a second gets `InUse` naming the holder, readers open
/// beside it, and the prefix is free again once the first closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_has_one_writer_and_any_number_of_readers() {
    let opts = options("lease");
    let a = S3Backend::open(opts.clone()).await.unwrap();
    match S3Backend::open(opts.clone()).await {
        Err(Error::InUse { holder, .. }) => {
            assert!(holder.contains(&std::process::id().to_string()), "{holder}")
        }
        other => panic!("a second writer must get InUse, got {other:?}"),
    }
    let r = S3Backend::open(opts.clone().mode(OpenMode::ReadOnly))
        .await
        .expect("a reader opens beside the writer");
    let key = Key::of(b"seen by the reader");
    a.put(&key, bytes::Bytes::from_static(b"seen by the reader"))
        .await
        .unwrap();
    assert!(r.has(&key).await.unwrap());
    assert!(matches!(r.delete(&key).await, Err(Error::ReadOnly { .. })));
    a.close().await.unwrap();
    let b = S3Backend::open(opts)
        .await
        .expect("free once the first closed");
    assert!(b.has(&key).await.unwrap());
    // A fleet's prefix is shared: no lease, so a fleet-shared open beside
    // the writer succeeds (only the fleet arbiter sweeps such a prefix).
    let shared = S3Backend::open(
        S3Options::new(b.location().clone())
            .part_size(5 << 20)
            .shared(true),
    )
    .await
    .expect("a fleet-shared open takes no lease");
    assert!(shared.has(&key).await.unwrap());
}

/// A writer SIGKILLed while its multipart upload runs: nothing of the blob
/// is visible, its lease lapses (three TTLs) so another process can write
/// the prefix, a sweep's reclaim leaves the upload alone within its grace
/// and aborts it after, and the key can be put afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_killed_mid_upload_leaves_nothing_and_its_upload_is_reclaimed() {
    let loc = location("killed");
    let mut h = Helper::spawn(
        HELPER,
        &["s3-put-then-die", &bucket(), &loc.prefix(), "160"],
    );
    let line = h.line().expect("the helper's first line");
    let key = Key::parse(line.strip_prefix("committing ").expect(&line)).unwrap();
    let reader = S3Backend::open(S3Options::new(loc.clone()).mode(OpenMode::ReadOnly))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while reader.uploads_in_progress().await.unwrap() == 0 {
        assert!(Instant::now() < deadline, "the helper's upload never began");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    h.child.kill().unwrap();
    h.child.wait().unwrap();
    assert!(
        !reader.has(&key).await.unwrap(),
        "160 MiB in 5 MiB parts one at a time finished in 200 ms, or a killed upload is visible"
    );
    assert_eq!(reader.list_all().await.unwrap(), vec![]);
    assert_eq!(reader.uploads_in_progress().await.unwrap(), 1);

    // The dead writer's lease lapses after three TTLs (3 s each).
    let open = |grace: Duration| {
        let loc = loc.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                match S3Backend::open(
                    S3Options::new(loc.clone())
                        .part_size(5 << 20)
                        .lease_ttl(Duration::from_secs(3))
                        .upload_grace(grace),
                )
                .await
                {
                    Ok(e) => return e,
                    Err(Error::InUse { .. }) if Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(250)).await
                    }
                    Err(e) => panic!("open after the writer died: {e}"),
                }
            }
        }
    };
    let w = open(Duration::from_secs(3600)).await;
    assert_eq!(
        w.reclaim_abandoned().await.unwrap(),
        0,
        "an upload younger than its grace may still be running"
    );
    assert_eq!(w.uploads_in_progress().await.unwrap(), 1);
    w.close().await.unwrap();
    let w = open(Duration::ZERO).await;
    assert_eq!(w.reclaim_abandoned().await.unwrap(), 1);
    assert_eq!(w.uploads_in_progress().await.unwrap(), 0);
    assert!(!w.has(&key).await.unwrap());
    let mut again = w.begin_write().await.unwrap();
    for i in 0..12 {
        again
            .write(alkblobs_tests::data(i, 1 << 20).into())
            .await
            .unwrap();
    }
    let (small_key, outboard) = {
        let mut hash = alkblobs::outboard::Builder::new();
        for i in 0..12 {
            hash.update(&alkblobs_tests::data(i, 1 << 20));
        }
        hash.finish()
    };
    again.commit(&small_key, outboard.into()).await.unwrap();
    assert_eq!(w.size(&small_key).await.unwrap(), Some(12 << 20));
}

fn open_as(env: &[(&str, &str)], bucket: &str) -> Vec<String> {
    let out = std::process::Command::new(HELPER)
        .args(["s3-open", bucket, "p"])
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect()
}

/// A missing bucket and refused credentials are one clear `Config` error
/// naming the bucket, and no secret appears in its text or `Debug` form.
#[test]
fn bad_coordinates_are_clear_errors_without_secrets() {
    let b = bucket();
    assert_eq!(open_as(&[], &b), ["ok"]);
    let missing = open_as(&[], "alkblobs-no-such-bucket");
    assert_eq!(missing[0], "error Config", "{missing:?}");
    assert!(
        missing[1].contains("alkblobs-no-such-bucket"),
        "{missing:?}"
    );
    let secret = std::env::var("AWS_SECRET_ACCESS_KEY").unwrap();
    let wrong = "0000000000000000000000000000000000000000000000000000000000000000";
    for env in [
        vec![("AWS_SECRET_ACCESS_KEY", wrong)],
        vec![("AWS_ACCESS_KEY_ID", "GK000000000000000000000000")],
    ] {
        let lines = open_as(&env, &b);
        assert_eq!(lines[0], "error Config", "{env:?}: {lines:?}");
        assert!(lines[1].contains(&b), "{lines:?}");
        for l in &lines {
            assert!(
                !l.contains(&secret) && !l.contains(wrong),
                "a secret in {l:?}"
            );
        }
    }
}

/// A process closing its store reads the prefix's lease (its own) and
/// then deletes it. If the read is answered late — after the lease lapsed
/// and another process took it over — the delete must not follow: it
/// would delete the new holder's lease, and a third process could then
/// write the prefix beside it (two in-process arbiters, each deleting the
/// other's puts). The release gives up two TTLs after its last renewal,
/// before any takeover is possible, and leaves the lease to lapse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_release_answered_late_never_deletes_the_next_holders_lease() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
    let (hold, held) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let proxy = slow_proxy(
        s3_server_addr(),
        Slow::Answers(b"alkblobs.lock", hold.clone(), held.clone()),
    );
    let loc = location("late-release");
    let ttl = Duration::from_secs(3);
    let opts = S3Options::new(loc).lease_ttl(ttl);
    let a = S3Backend::open(opts.clone().endpoint(format!("http://{proxy}")))
        .await
        .unwrap();
    hold.store(true, SeqCst);
    let closing = tokio::spawn(async move { a.close().await });
    // Another process takes the lease once A's last renewal is three TTLs
    // old (A's renewals stopped at its close).
    let deadline = Instant::now() + Duration::from_secs(60);
    let b = loop {
        match S3Backend::open(opts.clone()).await {
            Ok(b) => break b,
            Err(Error::InUse { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await
            }
            Err(e) => panic!("open after A's lease lapsed: {e}"),
        }
    };
    assert!(
        held.load(SeqCst) >= 1,
        "A's release never read the lease through the proxy: the test tests nothing"
    );
    // A's read is answered now, with the lease as it was when A asked.
    hold.store(false, SeqCst);
    closing.await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    match S3Backend::open(opts.clone()).await {
        Err(Error::InUse { .. }) => {}
        Ok(_) => panic!("A's late release deleted B's lease: a third process opened the prefix"),
        Err(e) => panic!("open beside B: {e}"),
    }
    b.close().await.unwrap();
}

/// A writer whose parts each take longer than the upload grace (a slow
/// link) keeps its upload marker young on a clock, so the sweeps that run
/// meanwhile (each aborting the uploads of markers older than the grace)
/// leave its live upload alone and the put completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_upload_whose_parts_outlast_the_grace_is_not_aborted() {
    let proxy = slow_proxy(
        s3_server_addr(),
        Slow::Sends(b"partNumber=", Duration::from_secs(3)),
    );
    let loc = alkblobs_tests::s3::location("slow-parts");
    let opts = alkblobs::backend::s3::S3Options::new(loc.clone())
        .shared(true)
        .part_size(5 << 20)
        .upload_concurrency(1)
        .upload_grace(std::time::Duration::from_secs(2))
        .retry_timeout(std::time::Duration::from_secs(30));
    let writer = S3Backend::open(opts.clone().endpoint(format!("http://{proxy}")))
        .await
        .unwrap();
    let sweeper = S3Backend::open(opts).await.unwrap();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reclaims = {
        let done = done.clone();
        tokio::spawn(async move {
            let mut aborted = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                aborted += sweeper.reclaim_abandoned().await.unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            }
            aborted
        })
    };
    let v = alkblobs_tests::data(77, 11 << 20);
    let key = alkblobs::Key::from_hash(blake3::hash(&v));
    let mut w = writer.begin_write().await.unwrap();
    w.write(v.clone().into()).await.unwrap();
    let put = w.commit(&key, bytes::Bytes::new()).await;
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let aborted = reclaims.await.unwrap();
    put.expect("the live upload completes");
    assert_eq!(aborted, 0, "a sweep aborted a live upload");
    assert_eq!(writer.get(&key).await.unwrap().unwrap(), v);
}
