//! The backend conformance suite over every engine: kv engines run the
//! engine cases, large engines those plus the streaming cases.

use alkblobs::Durability;
use alkblobs::backend::local::{LocalBackend, LocalOptions};
use alkblobs::backend::mem::MemBackend;
use alkblobs::backend::sqlite::{SqliteBackend, SqliteOptions};
use alkblobs::conformance::backend::Caps;
use alkblobs::{backend_suite, large_backend_suite};

const KV: Caps = Caps {
    max_value: 65_537,
    list_keys: 100_000,
};
const LARGE: Caps = Caps {
    max_value: 8 << 20,
    list_keys: 100_000,
};
// 100k durable file puts are 200k fsyncs; the relaxed engine below lists
// 100k keys, the durable one fewer.
const LARGE_DURABLE: Caps = Caps {
    max_value: 8 << 20,
    list_keys: 20_000,
};

backend_suite!(mem_kv, KV, async { (MemBackend::new(), ()) });
large_backend_suite!(mem_large, LARGE, async { (MemBackend::new(), ()) });

backend_suite!(sqlite, KV, async {
    let dir = tempfile::tempdir().unwrap();
    let e = SqliteBackend::open(dir.path().join("kv.sqlite"), SqliteOptions::default())
        .await
        .unwrap();
    (e, dir)
});

large_backend_suite!(local, LARGE_DURABLE, async {
    let dir = tempfile::tempdir().unwrap();
    let e = LocalBackend::open(dir.path().join("large"), LocalOptions::default())
        .await
        .unwrap();
    (e, dir)
});

// The relaxed modes skip fsyncs; the contract is otherwise the same.
backend_suite!(sqlite_relaxed, KV, async {
    let dir = tempfile::tempdir().unwrap();
    let opts = SqliteOptions::default().durability(Durability::Relaxed);
    let e = SqliteBackend::open(dir.path().join("kv.sqlite"), opts)
        .await
        .unwrap();
    (e, dir)
});

// Point reads through a blocking thread instead of on the calling task.
backend_suite!(sqlite_blocking_reads, KV, async {
    let dir = tempfile::tempdir().unwrap();
    let opts = SqliteOptions::default().inline_reads(false);
    let e = SqliteBackend::open(dir.path().join("kv.sqlite"), opts)
        .await
        .unwrap();
    (e, dir)
});

large_backend_suite!(local_relaxed, LARGE, async {
    let dir = tempfile::tempdir().unwrap();
    let opts = LocalOptions::default().durability(Durability::Relaxed);
    let e = LocalBackend::open(dir.path().join("large"), opts)
        .await
        .unwrap();
    (e, dir)
});

// Named staging files (what shared media and filesystems without
// `O_TMPFILE` use) meet the same contract as the default unnamed ones.
large_backend_suite!(local_named_staging, LARGE, async {
    let dir = tempfile::tempdir().unwrap();
    let opts = LocalOptions::default()
        .durability(Durability::Relaxed)
        .named_staging(true);
    let e = LocalBackend::open(dir.path().join("large"), opts)
        .await
        .unwrap();
    (e, dir)
});

/// A shard directory an operator removed is recreated by the next put into
/// it (the publish notices the missing directory), in both durabilities and
/// with both kinds of staging file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_shard_directory_is_recreated_by_a_put() {
    use alkblobs::{Backend, Key};
    use bytes::Bytes;
    // A hardened service's umask: published blobs are still exactly 0444.
    // (Process-wide for the test's duration; other tests in this binary
    // only create files they own.)
    // SAFETY: `umask` has no memory-safety preconditions.
    let umask = unsafe { libc::umask(0o077) };
    for (durability, named) in [
        (Durability::Durable, false),
        (Durability::Relaxed, false),
        (Durability::Durable, true),
        (Durability::Relaxed, true),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let e = LocalBackend::open(
            dir.path().join("large"),
            LocalOptions::default()
                .durability(durability)
                .named_staging(named),
        )
        .await
        .unwrap();
        let v = Bytes::from_static(b"into a shard that is gone");
        let k = Key::of(&v);
        let shard = e.path_of(&k).parent().unwrap().to_owned();
        std::fs::remove_dir(&shard).unwrap();
        assert_eq!(
            e.put(&k, v.clone()).await.unwrap(),
            alkblobs::PutOutcome::Created,
            "{durability:?}"
        );
        assert!(shard.is_dir());
        assert_eq!(e.get(&k).await.unwrap(), Some(v), "{durability:?}");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(e.path_of(&k))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o444, "{durability:?} named={named}");
        e.close().await.unwrap();
    }
    // SAFETY: as above.
    unsafe { libc::umask(umask) };
}
