//! Cases over a store's arbiter: the GC invariant through the public store
//! API, for any arbiter and engine pair. Each case uses explicit zero
//! windows and leaves the store's own window alone.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::FutureExt;

use super::data;
use crate::{BoxError, GcAbortCause, Key, Store, SweepOptions, SweepPhase};

/// Stamps one test per arbiter case for a store configuration. `$make` is an
/// async block returning `(store, guard)`. `protocol: name, make` stamps
/// only the protection-protocol cases every arbiter answers (pins, one
/// sweeper, dry runs), for an arbiter without a
/// [`crate::arbiter::Registry`] (no in-process roots or liveness callbacks)
/// whose delete window is its pool's (a fleet's: the pool needs a zero
/// window for these cases). Not among them: `a_put_during_a_sweep_survives_it`,
/// which holds for an in-process arbiter by its touched set even at window
/// 0; a fleet protects such a put by the pool's delete window (what a mark
/// stages is due a window after the mark ends), which a zero-window pool
/// gives up — the database side of that race is in the PostgreSQL race
/// suites.
#[macro_export]
macro_rules! arbiter_suite {
    (protocol: $name:ident, $make:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $crate::arbiter_suite!(@cases $make;
                pins_protect_until_dropped, a_second_sweeper_gets_the_lock_abort,
                dry_runs_change_nothing);
        }
    };
    ($name:ident, $make:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $crate::arbiter_suite!(@cases $make;
                pins_protect_until_dropped, liveness_protects_until_unregistered,
                roots_protect_until_removed, a_failing_source_aborts_and_deletes_nothing,
                a_second_sweeper_gets_the_lock_abort, a_put_during_a_sweep_survives_it,
                an_explicit_window_applies_to_what_is_staged, dry_runs_change_nothing);
        }
    };
    (@cases $make:expr; $($case:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let (store, _guard) = $make.await;
                $crate::conformance::arbiter::$case(&store).await;
            }
        )*
    };
}

fn now() -> SweepOptions {
    SweepOptions::new()
        .window(Duration::ZERO)
        .inline_window(false)
}

async fn sweep(store: &Store) -> crate::SweepReport {
    let r = store.sweep(now()).await.unwrap();
    assert_eq!(r.aborted, None, "unexpected abort: {r:?}");
    r
}

/// A pinned key survives every sweep; once its guard drops a sweep collects
/// it, and putting the bytes again restores it under the same key.
pub async fn pins_protect_until_dropped(store: &Store) {
    let bytes = data(1, 3000);
    let put = store.put(bytes.clone()).await.unwrap();
    for _ in 0..2 {
        sweep(store).await;
        assert!(store.has(&put.key).await.unwrap(), "a pinned key was swept");
    }
    let key = put.key;
    drop(put.pin);
    let r = sweep(store).await;
    assert!(r.deleted >= 1);
    assert!(
        !store.has(&key).await.unwrap(),
        "an unprotected key survived"
    );
    let again = store.put(bytes).await.unwrap();
    assert_eq!(again.key, key);
    assert!(store.has(&key).await.unwrap());
}

/// A key a liveness source reports live is never collected.
pub async fn liveness_protects_until_unregistered(store: &Store) {
    let put = store.put(data(2, 100)).await.unwrap();
    let key = put.key;
    store
        .register_live_set("conformance-live", move || async move {
            Ok::<_, BoxError>(HashSet::from([key]))
        })
        .unwrap();
    drop(put.pin);
    sweep(store).await;
    assert!(store.has(&key).await.unwrap(), "a live key was swept");
    assert!(store.unregister_liveness("conformance-live"));
    sweep(store).await;
    assert!(!store.has(&key).await.unwrap());
}

/// Persistent roots protect like a liveness source.
pub async fn roots_protect_until_removed(store: &Store) {
    let put = store.put(data(3, 100)).await.unwrap();
    store.add_roots(&[put.key]).await.unwrap();
    let key = put.key;
    drop(put.pin);
    sweep(store).await;
    assert!(store.has(&key).await.unwrap(), "a root was swept");
    assert_eq!(store.remove_roots(&[key]).await.unwrap(), 1);
    sweep(store).await;
    assert!(!store.has(&key).await.unwrap());
}

/// A source that fails aborts the sweep (report data, not an error) and
/// nothing is deleted.
pub async fn a_failing_source_aborts_and_deletes_nothing(store: &Store) {
    let put = store.put(data(4, 100)).await.unwrap();
    let key = put.key;
    drop(put.pin);
    store
        .register_live_set("conformance-broken", || async {
            Err::<HashSet<Key>, BoxError>("index unavailable".into())
        })
        .unwrap();
    let r = store.sweep(now()).await.unwrap();
    assert!(
        matches!(&r.aborted, Some(GcAbortCause::ProtectionSource { source, .. }) if source == "conformance-broken"),
        "{r:?}"
    );
    assert_eq!(r.deleted, 0);
    assert!(store.has(&key).await.unwrap());
    store.unregister_liveness("conformance-broken");
}

/// While one sweep runs, another gets the sweeper-lock abort and deletes
/// nothing.
pub async fn a_second_sweeper_gets_the_lock_abort(store: &Store) {
    let put = store.put(data(5, 100)).await.unwrap();
    let key = put.key;
    drop(put.pin);
    let (entered_tx, entered_rx) = tokio::sync::oneshot::channel::<()>();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let entered = Arc::new(std::sync::Mutex::new(Some(entered_tx)));
    let go = Arc::new(tokio::sync::Mutex::new(Some(go_rx)));
    let first = {
        let store = store.clone();
        tokio::spawn(async move {
            let opts = now().hook(move |phase| {
                let entered = entered.clone();
                let go = go.clone();
                async move {
                    if phase == SweepPhase::Mark {
                        if let Some(tx) = entered.lock().unwrap().take() {
                            let _ = tx.send(());
                        }
                        if let Some(rx) = go.lock().await.take() {
                            let _ = rx.await;
                        }
                    }
                }
                .boxed()
            });
            store.sweep(opts).await.unwrap()
        })
    };
    entered_rx.await.unwrap();
    let second = store.sweep(now()).await.unwrap();
    assert_eq!(second.aborted, Some(GcAbortCause::SweeperLock));
    assert_eq!(second.deleted, 0);
    assert!(store.has(&key).await.unwrap());
    go_tx.send(()).unwrap();
    let first = first.await.unwrap();
    assert_eq!(first.aborted, None);
}

/// A put that commits while a sweep is marking is not deleted by that
/// sweep, even if its pin is released before the sweep executes.
pub async fn a_put_during_a_sweep_survives_it(store: &Store) {
    let done = Arc::new(AtomicBool::new(false));
    let key = Key::of(&data(6, 100));
    let opts = {
        let store = store.clone();
        let done = done.clone();
        now().hook(move |phase| {
            let store = store.clone();
            let done = done.clone();
            async move {
                if phase == SweepPhase::Mark && !done.swap(true, Ordering::SeqCst) {
                    let put = store.put(data(6, 100)).await.unwrap();
                    drop(put.pin);
                }
            }
            .boxed()
        })
    };
    store.sweep(opts).await.unwrap();
    assert!(done.load(Ordering::SeqCst));
    assert!(
        store.has(&key).await.unwrap(),
        "a put that committed during the sweep was deleted by it"
    );
    // The next sweep, which started after the put, may collect it.
    sweep(store).await;
    assert!(!store.has(&key).await.unwrap());
}

/// A sweep with an explicit window applies it to candidates staged earlier
/// with a longer one.
pub async fn an_explicit_window_applies_to_what_is_staged(store: &Store) {
    let put = store.put(data(7, 100)).await.unwrap();
    let key = put.key;
    drop(put.pin);
    let long = SweepOptions::new()
        .window(Duration::from_secs(3600))
        .inline_window(false);
    let r = store.sweep(long).await.unwrap();
    assert!(r.staged >= 1 && r.deleted == 0, "{r:?}");
    assert!(store.has(&key).await.unwrap());
    let r = sweep(store).await;
    assert!(
        r.deleted >= 1,
        "window 0 did not apply to staged rows: {r:?}"
    );
    assert!(!store.has(&key).await.unwrap());
}

/// A dry run reports candidates and changes nothing.
pub async fn dry_runs_change_nothing(store: &Store) {
    let put = store.put(data(8, 100)).await.unwrap();
    let key = put.key;
    drop(put.pin);
    let r = store.sweep(now().dry_run(true)).await.unwrap();
    assert!(r.staged >= 1 && r.deleted == 0, "{r:?}");
    assert!(store.has(&key).await.unwrap());
    assert!(store.staged(None, 10).await.unwrap().is_empty());
}
