//! Single-node GC: the protocol's behaviour, and tests that try to break its
//! invariant. Each race test names the guard it exercises; removing that
//! guard makes it fail (see docs/design.md, "How the guards are tested").
//! (One file, so the guard-by-guard mutation table points into one place;
//! that is why it is long.)

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use alkblobs::{
    BoxError, Error, GcAbortCause, Key, LiveSet, PutOutcome, Store, SweepOptions, SweepPhase,
};
use alkblobs_tests::data;
use alkblobs_tests::gc_support::{Live, cases, sqlite_local, sqlite_local_durable};
use futures::TryStreamExt;
use tokio::sync::{Notify, oneshot};

async fn keys(store: &Store) -> HashSet<Key> {
    store.list().try_collect().await.unwrap()
}

async fn put_garbage(store: &Store, seed: u64, size: usize) -> Key {
    let put = store.put(data(seed, size)).await.unwrap();
    put.key
}

/// A mem + mem store whose kv engine sits behind the fault wrapper.
fn fault_store() -> (
    Store,
    Arc<alkblobs_tests::fault::FaultBackend<alkblobs::backend::mem::MemBackend>>,
) {
    use alkblobs::backend::mem::MemBackend;
    let kv = Arc::new(alkblobs_tests::fault::FaultBackend::new(Arc::new(
        MemBackend::new(),
    )));
    let s = Store::builder()
        .kv(kv.clone())
        .large(MemBackend::new())
        .delete_window(Duration::ZERO)
        .build()
        .unwrap();
    (s, kv)
}

fn zero() -> SweepOptions {
    SweepOptions::new().window(Duration::ZERO)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sweep_collects_exactly_the_unprotected_keys() {
    for case in cases(Duration::ZERO).await {
        let s = &case.store;
        let live = Live::default();
        live.register(s, "index");
        let checked: Arc<std::sync::Mutex<HashSet<Key>>> = Default::default();
        let c2 = checked.clone();
        s.register_live_check("refs", move |k| {
            let c = c2.clone();
            async move { Ok::<_, BoxError>(c.lock().unwrap().contains(&k)) }
        })
        .unwrap();

        let garbage = [put_garbage(s, 1, 10).await, put_garbage(s, 2, 50_000).await];
        let by_set = put_garbage(s, 3, 10).await;
        live.add(by_set).await;
        let by_check = put_garbage(s, 4, 9000).await;
        checked.lock().unwrap().insert(by_check);
        let rooted = put_garbage(s, 5, 10).await;
        s.add_roots(&[rooted]).await.unwrap();
        let pinned = s.put(data(6, 10)).await.unwrap();
        let protected_by_callback = put_garbage(s, 7, 10).await;

        let opts = zero().protect(LiveSet::new(move || async move {
            Ok::<_, BoxError>(HashSet::from([protected_by_callback]))
        }));
        let r = s.sweep(opts).await.unwrap();
        assert_eq!(r.aborted, None, "{}", case.name);
        assert_eq!(r.examined, 7, "{}", case.name);
        assert_eq!(r.pinned, 1, "{}", case.name);
        assert_eq!(r.live, 4, "{}", case.name);
        assert_eq!(
            (r.staged, r.executed, r.deleted, r.kept),
            (2, 2, 2, 0),
            "{}",
            case.name
        );
        assert_eq!(r.bytes_freed, 50_010, "{}", case.name);
        let left = keys(s).await;
        for k in garbage {
            assert!(!left.contains(&k), "{}: garbage survived", case.name);
        }
        for k in [by_set, by_check, rooted, pinned.key, protected_by_callback] {
            assert!(left.contains(&k), "{}: protected key lost", case.name);
        }
        assert!(s.staged(None, 10).await.unwrap().is_empty());
        // Delete-then-recover: the swept content comes back byte-identical.
        let again = s.put(data(2, 50_000)).await.unwrap();
        assert_eq!(
            (again.key, again.outcome),
            (garbage[1], PutOutcome::Created)
        );
        assert_eq!(
            s.get_verified(&again.key).await.unwrap().unwrap(),
            data(2, 50_000)
        );
        assert!(s.verify().await.unwrap().is_clean());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_source_or_protect_callback_aborts_with_nothing_deleted() {
    for case in cases(Duration::ZERO).await {
        let s = &case.store;
        let a = put_garbage(s, 10, 10).await;
        let b = put_garbage(s, 11, 10_000).await;

        let opts = zero().protect(LiveSet::new(|| async {
            Err::<HashSet<Key>, BoxError>("index offline".into())
        }));
        let r = s.sweep(opts).await.unwrap();
        assert_eq!(
            r.aborted,
            Some(GcAbortCause::ProtectionSource {
                source: "protect".into(),
                error: "index offline".into()
            }),
            "{}",
            case.name
        );
        assert_eq!((r.staged, r.deleted), (0, 0));
        assert!(
            s.staged(None, 10).await.unwrap().is_empty(),
            "an aborted sweep stages nothing"
        );
        assert_eq!(keys(s).await, HashSet::from([a, b]), "{}", case.name);

        // A registered source that answers the first call and fails later:
        // the failure at execution time deletes nothing of that batch.
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        s.register_live_set("flaky", move || {
            let n = c.fetch_add(1, Ordering::SeqCst);
            async move {
                if n == 0 {
                    Ok(HashSet::new())
                } else {
                    Err::<HashSet<Key>, BoxError>("lost its database".into())
                }
            }
        })
        .unwrap();
        let r = s.sweep(zero()).await.unwrap();
        assert!(
            matches!(&r.aborted, Some(GcAbortCause::ProtectionSource { source, .. }) if source == "flaky"),
            "{}: {r:?}",
            case.name
        );
        assert_eq!(r.deleted, 0);
        assert_eq!(keys(s).await, HashSet::from([a, b]), "{}", case.name);
        assert!(s.unregister_liveness("flaky"));

        // A source that never answers, with a timeout, aborts too.
        s.register_live_set("stuck", || async {
            std::future::pending::<()>().await;
            Ok::<_, BoxError>(HashSet::new())
        })
        .unwrap();
        let r = s
            .sweep(zero().source_timeout(Duration::from_millis(50)))
            .await
            .unwrap();
        assert!(
            matches!(r.aborted, Some(GcAbortCause::ProtectionSource { .. })),
            "{r:?}"
        );
        assert_eq!(keys(s).await.len(), 2);
        s.unregister_liveness("stuck");
        let r = s.sweep(zero()).await.unwrap();
        assert_eq!(
            r.deleted, 2,
            "{}: once the sources answer, garbage goes",
            case.name
        );
    }
}

/// A source that answers its first `contains` call and fails the next:
/// the sweep aborts in the middle of its mark.
struct FailsMidMark(Arc<AtomicUsize>);

struct FailsMidMarkView(Arc<AtomicUsize>);

#[async_trait::async_trait]
impl alkblobs::LivenessSource for FailsMidMark {
    async fn snapshot(&self) -> Result<Box<dyn alkblobs::LiveSnapshot>, BoxError> {
        Ok(Box::new(FailsMidMarkView(self.0.clone())))
    }
}

#[async_trait::async_trait]
impl alkblobs::LiveSnapshot for FailsMidMarkView {
    async fn contains(&self, keys: &[Key]) -> Result<Vec<bool>, BoxError> {
        if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
            Ok(vec![false; keys.len()])
        } else {
            Err("connection reset".into())
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_source_failing_mid_mark_leaves_nothing_staged() {
    for case in cases(Duration::ZERO).await {
        let s = &case.store;
        // Several mark batches' worth, so the failure lands after the first
        // batch has been staged.
        let many = s
            .put_many((0..10_000u64).map(|i| i.to_le_bytes().to_vec()))
            .await
            .unwrap();
        drop(many.pin);
        s.register_liveness("mid", FailsMidMark(Arc::new(AtomicUsize::new(0))))
            .unwrap();
        let r = s.sweep(zero()).await.unwrap();
        assert!(
            matches!(&r.aborted, Some(GcAbortCause::ProtectionSource { source, .. }) if source == "mid"),
            "{r:?}"
        );
        assert!(
            r.examined > 0 && r.examined < 10_000,
            "the mark stopped part-way: {r:?}"
        );
        assert_eq!(r.deleted, 0);
        assert!(
            s.staged(None, 10).await.unwrap().is_empty(),
            "{}: half a mark left staged rows",
            case.name
        );
        assert_eq!(keys(s).await.len(), 10_000);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_concurrent_sweeps_one_gets_the_sweeper_lock_abort() {
    for case in cases(Duration::ZERO).await {
        let s = case.store.clone();
        let k = put_garbage(&s, 20, 10).await;
        let entered = Arc::new(Notify::new());
        let release = Arc::new(Notify::new());
        let (e2, r2) = (entered.clone(), release.clone());
        let first = tokio::spawn({
            let s = s.clone();
            async move {
                let opts = zero().hook(move |phase| {
                    let (e, r) = (e2.clone(), r2.clone());
                    Box::pin(async move {
                        if phase == SweepPhase::Mark {
                            e.notify_one();
                            r.notified().await;
                        }
                    })
                });
                s.sweep(opts).await.unwrap()
            }
        });
        entered.notified().await;
        let second = s.sweep(zero()).await.unwrap();
        assert_eq!(
            second.aborted,
            Some(GcAbortCause::SweeperLock),
            "{}",
            case.name
        );
        assert_eq!((second.examined, second.deleted), (0, 0));
        assert!(s.has(&k).await.unwrap());
        release.notify_one();
        let first = first.await.unwrap();
        assert_eq!((first.aborted, first.deleted), (None, 1), "{}", case.name);
    }
}

/// Guards: a put clears its key's staged row, and every pin acquired or
/// released during a sweep marks its key touched, which that sweep never
/// deletes. Between mark and execute, (a) a put dedups onto a candidate and
/// lets go at once: its unstage removes the row; (b) a reader pins the
/// candidate and lets go without recording liveness: the row stays, but the
/// key was touched. Either way the content committed (or was referenced)
/// after the sweep started, so that sweep must not delete it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn activity_between_mark_and_execute_protects_the_key_from_that_sweep() {
    for case in cases(Duration::ZERO).await {
        let s = case.store.clone();
        for (i, size) in [10usize, 20_000].into_iter().enumerate() {
            for by_put in [true, false] {
                let seed = 30 + i as u64;
                let k = put_garbage(&s, seed, size).await;
                let s2 = s.clone();
                let opts = zero().hook(move |phase| {
                    let s = s2.clone();
                    Box::pin(async move {
                        if phase == SweepPhase::Sealed {
                            if by_put {
                                let put = s.put(data(seed, size)).await.unwrap();
                                assert_eq!(put.outcome, PutOutcome::Existed);
                                drop(put.pin);
                            } else {
                                drop(s.pin(&Key::of(&data(seed, size))).await.unwrap());
                            }
                        }
                    })
                });
                let r = s.sweep(opts).await.unwrap();
                let want = if by_put { (1, 0, 0, 0) } else { (1, 1, 0, 1) };
                assert_eq!(
                    (r.staged, r.executed, r.deleted, r.kept),
                    want,
                    "{} by_put={by_put}: {r:?}",
                    case.name
                );
                assert!(
                    s.has(&k).await.unwrap(),
                    "{}: an in-flight put was deleted",
                    case.name
                );
                // The next sweep started after that activity: it may go.
                assert_eq!(s.sweep(zero()).await.unwrap().deleted, 1);
            }
        }
    }
}

/// Guards: the touched set (covering releases too) and the claim's re-check
/// of pins. The hand-off: an embedder records a key in its liveness and
/// drops its pin while the executor is deciding that key. The executor reads
/// pins, then liveness, then pins again at the claim; this drives the
/// hand-off at every point of that sequence, with the pin taken before the
/// sweep or during it, released or still held. Reading liveness before pins
/// (the order a peer store got wrong) loses the key in the `acquired at
/// Checked, released` case; leaving out the claim's re-check loses it in the
/// `held` case.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_hand_off_race_never_loses_the_key_whatever_the_order() {
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Pin {
        HeldFromBefore,
        AcquiredInHook,
    }
    for case in cases(Duration::ZERO).await {
        let s = case.store.clone();
        let live = Live::default();
        live.register(&s, "index");
        let mut seed = 4000;
        for at in [
            SweepPhase::Execute,
            SweepPhase::Checked,
            SweepPhase::Claimed,
        ] {
            for pin in [Pin::HeldFromBefore, Pin::AcquiredInHook] {
                for release in [true, false] {
                    seed += 1;
                    let k = put_garbage(&s, seed, 10).await;
                    // Stage it with a short window, let it come due.
                    let r = s
                        .sweep(
                            SweepOptions::new()
                                .window(Duration::from_millis(20))
                                .inline_window(false),
                        )
                        .await
                        .unwrap();
                    assert_eq!(r.staged, 1);
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    let held = Arc::new(std::sync::Mutex::new(match pin {
                        Pin::HeldFromBefore => Some(s.pin(&k).await.unwrap()),
                        Pin::AcquiredInHook => None,
                    }));
                    let (h2, l2, s2) = (held.clone(), live.clone(), s.clone());
                    let opts = zero().hook(move |phase| {
                        let (h, l, s) = (h2.clone(), l2.clone(), s2.clone());
                        Box::pin(async move {
                            if phase != at {
                                return;
                            }
                            if pin == Pin::AcquiredInHook {
                                // At `Claimed` the key may already be claimed:
                                // then this pin waits and finds it gone.
                                match tokio::time::timeout(Duration::from_millis(50), s.pin(&k))
                                    .await
                                {
                                    Ok(Ok(g)) => *h.lock().unwrap() = Some(g),
                                    Ok(Err(_)) | Err(_) => return,
                                }
                            }
                            if release {
                                l.add(k).await;
                                drop(h.lock().unwrap().take());
                            }
                        })
                    });
                    let r = s.sweep(opts).await.unwrap();
                    let still_held = held.lock().unwrap().is_some();
                    let recorded = live.0.lock().await.contains(&k);
                    if still_held || recorded {
                        assert!(
                            s.has(&k).await.unwrap(),
                            "{}: hand-off at {at:?}, pin {pin:?}, release {release}: key lost ({r:?})",
                            case.name
                        );
                    }
                    drop(held.lock().unwrap().take());
                    live.remove(&k).await;
                    s.sweep(zero()).await.unwrap();
                }
            }
        }
    }
}

/// Guard: a pin of a key the executor has claimed waits until the delete is
/// done, so a deduplicating put recreates the entry instead of returning
/// `Existed` for content that is about to vanish.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_put_of_a_key_being_deleted_waits_and_recreates_it() {
    for case in cases(Duration::ZERO).await {
        let s = case.store.clone();
        let k = put_garbage(&s, 50, 3000).await;
        let (tx, rx) = oneshot::channel();
        let tx = Arc::new(std::sync::Mutex::new(Some(tx)));
        let s2 = s.clone();
        let opts = zero().hook(move |phase| {
            let (s, tx) = (s2.clone(), tx.clone());
            Box::pin(async move {
                if phase == SweepPhase::Claimed {
                    let put = tokio::spawn(async move { s.put(data(50, 3000)).await.unwrap() });
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    assert!(!put.is_finished(), "a pin of a claimed key must wait");
                    if let Some(tx) = tx.lock().unwrap().take() {
                        let _ = tx.send(put);
                    }
                }
            })
        });
        let r = s.sweep(opts).await.unwrap();
        assert_eq!(r.deleted, 1, "{}", case.name);
        let put = rx.await.unwrap().await.unwrap();
        assert_eq!(
            put.outcome,
            PutOutcome::Created,
            "{}: the put must recreate it",
            case.name
        );
        assert!(
            s.has(&k).await.unwrap(),
            "{}: a pinned put result was deleted",
            case.name
        );
        assert_eq!(s.get_verified(&k).await.unwrap().unwrap(), data(50, 3000));
    }
}

/// The same guard on every other put path: a batched put, a verified put,
/// a streamed put and a file put of a key the executor has claimed each
/// wait, and recreate the entry. (Pin-before-publish on each path: a path
/// that pinned after publishing would report `Existed` for content the
/// executor then deletes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_put_path_waits_for_a_delete_in_flight_and_recreates_it() {
    #[derive(Clone, Copy, Debug)]
    enum Path {
        Many,
        Verified,
        Reader,
        File,
    }
    for (i, path) in [Path::Many, Path::Verified, Path::Reader, Path::File]
        .into_iter()
        .enumerate()
    {
        for case in cases(Duration::ZERO).await {
            let s = case.store.clone();
            // Streamed paths put a large blob, the others a small one.
            let size = match path {
                Path::Reader | Path::File => 10_000,
                _ => 3000,
            };
            let seed = 500 + i as u64;
            let k = put_garbage(&s, seed, size).await;
            let file = tempfile::NamedTempFile::new().unwrap();
            std::fs::write(file.path(), data(seed, size)).unwrap();
            let file_path = file.path().to_owned();
            let (tx, rx) = oneshot::channel();
            let tx = Arc::new(std::sync::Mutex::new(Some(tx)));
            let s2 = s.clone();
            let opts = zero().hook(move |phase| {
                let (s, tx, file_path) = (s2.clone(), tx.clone(), file_path.clone());
                Box::pin(async move {
                    if phase == SweepPhase::Claimed {
                        let put = tokio::spawn(async move {
                            let bytes = data(seed, size);
                            match path {
                                Path::Many => {
                                    let m = s.put_many([bytes]).await.unwrap();
                                    (m.entries[0].outcome, m.pin)
                                }
                                Path::Verified => {
                                    let p = s.put_verified(&Key::of(&bytes), bytes).await.unwrap();
                                    (p.outcome, p.pin)
                                }
                                Path::Reader => {
                                    let p = s.put_reader(&bytes[..]).await.unwrap();
                                    (p.outcome, p.pin)
                                }
                                Path::File => {
                                    let p = s.put_file(&file_path).await.unwrap();
                                    (p.outcome, p.pin)
                                }
                            }
                        });
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        assert!(
                            !put.is_finished(),
                            "{path:?}: a pin of a claimed key must wait"
                        );
                        if let Some(tx) = tx.lock().unwrap().take() {
                            let _ = tx.send(put);
                        }
                    }
                })
            });
            let r = s.sweep(opts).await.unwrap();
            assert_eq!(r.deleted, 1, "{} {path:?}", case.name);
            let (outcome, _pin) = rx.await.unwrap().await.unwrap();
            assert_eq!(
                outcome,
                PutOutcome::Created,
                "{} {path:?}: the put must recreate it",
                case.name
            );
            assert!(
                s.has(&k).await.unwrap(),
                "{} {path:?}: a pinned put result was deleted",
                case.name
            );
            assert_eq!(s.get_verified(&k).await.unwrap().unwrap(), data(seed, size));
        }
    }
}

/// Guard: a put clears its key's staged row, restarting the window. A key
/// staged by one sweep and re-put is not executed on the stale staging.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_re_put_of_a_staged_key_gets_a_fresh_window() {
    let window = Duration::from_millis(300);
    for case in cases(window).await {
        let s = case.store.clone();
        let no_wait = || SweepOptions::new().inline_window(false);
        let small = put_garbage(&s, 60, 10).await;
        let large = put_garbage(&s, 61, 10_000).await;
        assert_eq!(s.sweep(no_wait()).await.unwrap().staged, 2);
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Re-put both, let go at once, no liveness.
        drop(s.put(data(60, 10)).await.unwrap());
        drop(s.put(data(61, 10_000)).await.unwrap());
        assert!(
            s.staged(None, 10).await.unwrap().is_empty(),
            "{}: put must unstage",
            case.name
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
        // The old window has passed; the re-put's window has not.
        let r = s.sweep(no_wait()).await.unwrap();
        assert_eq!((r.staged, r.deleted), (2, 0), "{}: {r:?}", case.name);
        assert!(s.has(&small).await.unwrap() && s.has(&large).await.unwrap());
        tokio::time::sleep(window + Duration::from_millis(50)).await;
        let r = s.sweep(no_wait()).await.unwrap();
        assert_eq!(r.deleted, 2, "{}: {r:?}", case.name);
    }
}

/// Guard: execution re-checks liveness after the window. A key that turns
/// live during its window is kept; the control key that stays dead goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_that_turns_live_during_its_window_is_kept() {
    let window = Duration::from_millis(200);
    for case in cases(window).await {
        let s = case.store.clone();
        let live = Live::default();
        live.register(&s, "index");
        let flips = put_garbage(&s, 70, 10).await;
        let stays_dead = put_garbage(&s, 71, 10).await;
        let r = s
            .sweep(SweepOptions::new().inline_window(false))
            .await
            .unwrap();
        assert_eq!(r.staged, 2);
        live.add(flips).await;
        tokio::time::sleep(window + Duration::from_millis(30)).await;
        let r = s
            .sweep(SweepOptions::new().inline_window(false))
            .await
            .unwrap();
        assert_eq!(
            (r.executed, r.deleted, r.kept),
            (2, 1, 1),
            "{}: {r:?}",
            case.name
        );
        assert!(s.has(&flips).await.unwrap());
        assert!(!s.has(&stays_dead).await.unwrap());
    }
}

/// The inline window: in-process tables wait out the window inside the
/// call, re-checking at the end; a source flipping during the wait wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_inline_window_rechecks_after_waiting() {
    let s = Store::builder()
        .kv(alkblobs::backend::mem::MemBackend::new())
        .large(alkblobs::backend::mem::MemBackend::new())
        .delete_window(Duration::from_millis(300))
        .build()
        .unwrap();
    assert!(!s.gc_durable());
    let live = Live::default();
    live.register(&s, "index");
    let a = put_garbage(&s, 80, 10).await;
    let b = put_garbage(&s, 81, 10).await;
    let (s2, l2) = (s.clone(), live.clone());
    let sweeper = tokio::spawn(async move { s2.sweep(SweepOptions::new()).await.unwrap() });
    tokio::time::sleep(Duration::from_millis(100)).await;
    l2.add(a).await;
    let r = sweeper.await.unwrap();
    assert_eq!((r.staged, r.deleted, r.kept), (2, 1, 1), "{r:?}");
    assert!(r.duration >= Duration::from_millis(300));
    assert!(s.has(&a).await.unwrap() && !s.has(&b).await.unwrap());
}

/// Many writers put (deduplicating onto each other), record in liveness,
/// let go, sometimes forget keys; a sweeper loops with a zero window; a
/// checker asserts that every key that is pinned or live exists. Thousands
/// of iterations across all configurations, including durable sqlite, whose
/// concurrent puts are group-committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn puts_racing_sweeps_never_lose_a_protected_key() {
    let mut all = cases(Duration::ZERO).await;
    all.push(sqlite_local_durable(Duration::ZERO).await);
    for case in all {
        let s = case.store.clone();
        let live = Live::default();
        live.register(&s, "index");
        let stop = Arc::new(AtomicBool::new(false));
        let sweeps = Arc::new(AtomicUsize::new(0));
        let deleted = Arc::new(AtomicUsize::new(0));
        let sweeper = {
            let (s, stop, sweeps, deleted) =
                (s.clone(), stop.clone(), sweeps.clone(), deleted.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let r = s.sweep(zero()).await.unwrap();
                    assert_eq!(r.aborted, None);
                    sweeps.fetch_add(1, Ordering::SeqCst);
                    deleted.fetch_add(r.deleted as usize, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                }
            })
        };
        let writers: Vec<_> = (0..6u64)
            .map(|w| {
                let (s, live, sweeps) = (s.clone(), live.clone(), sweeps.clone());
                tokio::spawn(async move {
                    // At least 400 iterations, and on until 20 sweeps ran
                    // alongside, so the race is real on every configuration.
                    for i in 0u64.. {
                        if i >= 400 && sweeps.load(Ordering::SeqCst) >= 20 {
                            break;
                        }
                        // A small content pool so puts dedup onto staged and
                        // dying entries; a few are large-tier.
                        let seed = (i * 7 + w * 13) % 97;
                        let size = if seed % 10 == 0 { 6000 } else { 100 };
                        let put = s.put(data(seed, size)).await.unwrap();
                        // While pinned, the entry exists.
                        assert!(s.has(&put.key).await.unwrap(), "pinned key missing");
                        if i % 3 != 0 {
                            live.add(put.key).await;
                        }
                        drop(put.pin);
                        if i % 5 == 0 {
                            live.remove(&put.key).await;
                        }
                        if i % 4 == 0 {
                            // A reader pin on something that may be gone.
                            let other = Key::of(&data((seed + 1) % 97, 100));
                            match s.pin(&other).await {
                                Ok(g) => {
                                    assert!(
                                        s.has(&other).await.unwrap(),
                                        "reader-pinned key missing"
                                    );
                                    drop(g);
                                }
                                Err(Error::NotFound { .. }) => {}
                                Err(e) => panic!("{e}"),
                            }
                        }
                    }
                })
            })
            .collect();
        let checker = {
            let (s, live, stop) = (s.clone(), live.clone(), stop.clone());
            tokio::spawn(async move {
                let mut checks = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    // Holding the index lock: no key can be recorded or
                    // forgotten while we look, so every key in it must exist.
                    let set = live.0.lock().await;
                    for k in set.iter() {
                        assert!(s.has(k).await.unwrap(), "live key {k} was deleted");
                        checks += 1;
                    }
                    drop(set);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                checks
            })
        };
        for w in writers {
            w.await.unwrap();
        }
        stop.store(true, Ordering::SeqCst);
        sweeper.await.unwrap();
        let checks = checker.await.unwrap();
        // Final check, and proof the race actually ran.
        for k in live.0.lock().await.iter() {
            assert!(s.has(k).await.unwrap(), "{}: live key lost", case.name);
        }
        assert!(
            sweeps.load(Ordering::SeqCst) >= 20,
            "{}: sweeps ran",
            case.name
        );
        assert!(
            deleted.load(Ordering::SeqCst) > 0,
            "{}: sweeps deleted something",
            case.name
        );
        assert!(checks > 0);
        assert!(s.verify().await.unwrap().corrupt.is_empty());
    }
}

/// Guard: the touched set records releases as well as acquisitions. A put
/// that pinned before the sweep began and committed after it did is
/// in flight across the sweep's start; it lets go (no liveness) before the
/// mark reaches it. That sweep must still not delete it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_put_in_flight_when_the_sweep_starts_survives_it() {
    let (s, kv) = fault_store();
    for i in 0..3u64 {
        kv.delay_writes(Duration::from_millis(150));
        let done = Arc::new(Notify::new());
        let put = {
            let (s, done) = (s.clone(), done.clone());
            tokio::spawn(async move {
                let p = s.put(data(6000 + i, 100)).await.unwrap();
                let k = p.key;
                drop(p.pin);
                done.notify_one();
                k
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            s.pin_count(&Key::of(&data(6000 + i, 100))),
            1,
            "the put is in flight"
        );
        let d2 = done.clone();
        let opts = zero().hook(move |phase| {
            let d = d2.clone();
            Box::pin(async move {
                if phase == SweepPhase::Mark {
                    // Let the put commit and let go before the mark looks.
                    d.notified().await;
                }
            })
        });
        let r = s.sweep(opts).await.unwrap();
        let k = put.await.unwrap();
        kv.delay_writes(Duration::ZERO);
        assert!(
            s.has(&k).await.unwrap(),
            "a put in flight at the sweep's start was deleted ({r:?})"
        );
        assert_eq!(
            s.sweep(zero()).await.unwrap().deleted,
            1,
            "the next sweep may collect it"
        );
    }
}

/// Explicit `pin` racing a sweep of garbage: either it fails with not-found,
/// or the key exists for as long as the pin is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pin_racing_a_sweep_is_not_found_or_safe() {
    for case in cases(Duration::ZERO).await {
        let s = case.store.clone();
        let (mut got, mut missed) = (0, 0);
        for i in 0..300u64 {
            let k = put_garbage(&s, 1000 + i, 100).await;
            let s2 = s.clone();
            let sweep = tokio::spawn(async move { s2.sweep(zero()).await.unwrap() });
            match s.pin(&k).await {
                Ok(g) => {
                    got += 1;
                    let _ = sweep.await.unwrap();
                    assert!(
                        s.has(&k).await.unwrap(),
                        "{}: pinned key deleted",
                        case.name
                    );
                    drop(g);
                }
                Err(Error::NotFound { .. }) => {
                    missed += 1;
                    let _ = sweep.await.unwrap();
                }
                Err(e) => panic!("{e}"),
            }
            let _ = s.sweep(zero()).await.unwrap();
        }
        assert_eq!(got + missed, 300);
    }
}

/// A delete failing mid-sweep is an `Err`; nothing protected is lost, the
/// claim is released (a later put of a claimed key does not hang), and the
/// next sweep finishes the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_engine_failing_during_a_sweep_loses_nothing() {
    let (s, kv) = fault_store();
    let live = Live::default();
    live.register(&s, "index");
    let mut protected = Vec::new();
    for i in 0..20u64 {
        let put = s.put(data(2000 + i, 100)).await.unwrap();
        if i % 2 == 0 {
            live.add(put.key).await;
            protected.push(put.key);
        }
    }
    kv.fail_nth_delete(1);
    let e = s.sweep(zero()).await.unwrap_err();
    assert!(e.to_string().contains("injected failure"), "{e}");
    for k in &protected {
        assert!(s.has(k).await.unwrap());
    }
    let again = tokio::time::timeout(Duration::from_secs(5), s.put(data(2001, 100)))
        .await
        .expect("a put of a claimed key hung after a failed delete")
        .unwrap();
    drop(again);
    let r = s.sweep(zero()).await.unwrap();
    assert_eq!(r.deleted, 10, "{r:?}");
    assert_eq!(keys(&s).await, protected.iter().copied().collect());

    // A failing write: the put errors, its pin is released, nothing visible.
    kv.fail_nth_write(1);
    let e = s.put(data(3000, 10)).await.unwrap_err();
    assert!(e.to_string().contains("injected"));
    assert_eq!(s.pin_count(&Key::of(&data(3000, 10))), 0);
    assert!(!s.has(&Key::of(&data(3000, 10))).await.unwrap());
}

/// A sqlite store's staged rows survive a sweep killed between stage and
/// execute; the reopened store executes the overdue rows on its next sweep,
/// re-arbitrated: what became live meanwhile is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sweep_killed_after_staging_is_finished_correctly_after_restart() {
    use alkblobs_tests::proc::Helper;
    let dir = tempfile::tempdir().unwrap();
    let (dead, revived, rooted) = {
        let s = Store::open_dir(dir.path()).await.unwrap();
        let dead = put_garbage(&s, 90, 10).await;
        let revived = put_garbage(&s, 91, 200_000).await;
        let rooted = put_garbage(&s, 92, 10).await;
        s.add_roots(&[rooted]).await.unwrap();
        (dead, revived, rooted)
    };
    let mut h = Helper::spawn(
        env!("CARGO_BIN_EXE_alkblobs-test-helper"),
        &["sweep-then-die", dir.path().to_str().unwrap(), "400"],
    );
    h.wait_for("sealed");
    h.kill();

    let s = Store::open_dir(dir.path()).await.unwrap();
    let staged: HashSet<Key> = s
        .staged(None, 10)
        .await
        .unwrap()
        .iter()
        .map(|r| r.key)
        .collect();
    assert_eq!(
        staged,
        HashSet::from([dead, revived]),
        "staged rows are durable"
    );
    // During the window, one candidate becomes live again.
    s.add_roots(&[revived]).await.unwrap();
    // Not yet due: a sweep now deletes nothing.
    let r = s
        .sweep(SweepOptions::new().window(Duration::from_secs(3600)))
        .await
        .unwrap();
    assert_eq!(r.deleted, 0, "{r:?}");
    tokio::time::sleep(Duration::from_millis(450)).await;
    let r = s
        .sweep(SweepOptions::new().window(Duration::from_secs(3600)))
        .await
        .unwrap();
    assert_eq!((r.executed, r.deleted, r.kept), (2, 1, 1), "{r:?}");
    assert_eq!(keys(&s).await, HashSet::from([revived, rooted]));
}

/// Random sequences of put / pin / unpin / mark-live / unmark / sweep
/// against a model: after every zero-window sweep the pool is exactly the
/// protected set plus nothing else; protected keys are never missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_gc_sequences_match_the_model() {
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    #[derive(Debug, Clone)]
    enum Op {
        Put(u8),
        Pin(u8),
        Unpin(u8),
        MarkLive(u8),
        Unmark(u8),
        Sweep,
    }
    let op = prop_oneof![
        3 => (0u8..12).prop_map(Op::Put),
        1 => (0u8..12).prop_map(Op::Pin),
        2 => (0u8..12).prop_map(Op::Unpin),
        2 => (0u8..12).prop_map(Op::MarkLive),
        1 => (0u8..12).prop_map(Op::Unmark),
        2 => Just(Op::Sweep),
    ];
    let mut runner = TestRunner::deterministic();
    for round in 0..40 {
        let ops = proptest::collection::vec(op.clone(), 10..60)
            .new_tree(&mut runner)
            .unwrap()
            .current();
        let case = if round % 2 == 0 {
            sqlite_local(Duration::ZERO).await
        } else {
            cases(Duration::ZERO).await.remove(0)
        };
        let s = &case.store;
        let live = Live::default();
        live.register(s, "index");
        let content = |i: u8| data(5000 + i as u64, if i.is_multiple_of(3) { 5000 } else { 64 });
        let mut guards: Vec<(Key, alkblobs::PinGuard)> = Vec::new();
        let mut present: HashSet<Key> = HashSet::new();
        for op in &ops {
            match op {
                Op::Put(i) => {
                    let p = s.put(content(*i)).await.unwrap();
                    present.insert(p.key);
                    guards.push((p.key, p.pin));
                }
                Op::Pin(i) => {
                    let k = Key::of(&content(*i));
                    match s.pin(&k).await {
                        Ok(g) => {
                            assert!(present.contains(&k), "pin succeeded on an absent key");
                            guards.push((k, g));
                        }
                        Err(Error::NotFound { .. }) => {
                            assert!(!present.contains(&k), "pin of a present key failed")
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
                Op::Unpin(i) => {
                    let k = Key::of(&content(*i));
                    if let Some(pos) = guards.iter().position(|(g, _)| *g == k) {
                        drop(guards.remove(pos));
                    }
                }
                Op::MarkLive(i) => live.add(Key::of(&content(*i))).await,
                Op::Unmark(i) => live.remove(&Key::of(&content(*i))).await,
                Op::Sweep => {
                    let r = s.sweep(zero()).await.unwrap();
                    assert_eq!(r.aborted, None);
                    let protected: HashSet<Key> = guards
                        .iter()
                        .map(|(k, _)| *k)
                        .chain(live.0.lock().await.iter().copied())
                        .filter(|k| present.contains(k))
                        .collect();
                    let now = keys(s).await;
                    assert_eq!(now, protected, "{}: after {ops:?}", case.name);
                    present = now;
                }
            }
        }
    }
}
