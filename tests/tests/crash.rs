//! A process killed mid-put leaves no torn visible blob, and every put that
//! returned survived.

use std::collections::HashSet;
use std::time::Duration;

use alkblobs::{Key, Store};
use alkblobs_tests::proc::Helper;
use futures::TryStreamExt;

const HELPER: &str = env!("CARGO_BIN_EXE_alkblobs-test-helper");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_writers_never_leave_torn_blobs() {
    let dir = tempfile::tempdir().unwrap();
    let mut returned: HashSet<Key> = HashSet::new();
    for round in 0..4u64 {
        let mut h = Helper::spawn(HELPER, &["crash-puts", dir.path().to_str().unwrap()]);
        // Let it complete a few puts, then kill it at an arbitrary point.
        for _ in 0..(3 + round * 2) {
            let line = h.line().expect("helper died early");
            returned.insert(line.parse().unwrap());
        }
        std::thread::sleep(Duration::from_millis(7 * round));
        h.kill();

        let store = Store::open_dir(dir.path()).await.unwrap();
        let report = store.verify().await.unwrap();
        assert!(
            report.corrupt.is_empty(),
            "round {round}: torn blobs {:?}",
            report.corrupt
        );
        let listed: HashSet<Key> = store.list().try_collect().await.unwrap();
        for k in &returned {
            assert!(
                listed.contains(k),
                "round {round}: a put that returned was lost: {k}"
            );
        }
        drop(store);
    }
}
