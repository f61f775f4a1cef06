//! Cases over a `Store`, for every store configuration.
//!
//! (One file of cases, so the list every configuration must pass reads in
//! one place; that is why it is long.)

use std::collections::BTreeMap;

use bytes::Bytes;
use futures::TryStreamExt;
use tokio::io::AsyncReadExt;

use super::{absent_key, data};
use crate::{Error, Key, PutOutcome, Store, Tier};

/// What a configuration is expected to do.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Whether the store has no large tier.
    pub kv_only: bool,
    /// The biggest round trip (100 MiB for stores with a large tier).
    pub big: usize,
    /// Keys in the big-listing case.
    pub list_keys: usize,
}

/// Stamps one test per case for a store configuration. `$make` is an async
/// block returning `(store, guard)`.
#[macro_export]
macro_rules! store_suite {
    ($name:ident, $cfg:expr, $make:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $crate::store_suite!(@cases $cfg, $make;
                round_trips_at_the_edges, dedup, stat_and_missing, ranges_in_both_tiers,
                streaming_puts, missing_input_file, verified_reads, put_verified_refuses_mismatch,
                batched_puts, list_is_a_union_without_duplicates, puts_pin_before_publish,
                verify_clean_pool, concurrent_puts_of_one_key, big_listing, usage_per_tier,
                model_sequence, verified_ranges);
        }
    };
    (@cases $cfg:expr, $make:expr; $($case:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let (store, _guard) = $make.await;
                $crate::conformance::store::$case(&store, $cfg).await;
            }
        )*
    };
}

fn tier_of(store: &Store, size: usize) -> Tier {
    if size as u64 <= store.threshold() {
        Tier::Kv
    } else {
        Tier::Large
    }
}

/// 0 bytes, 1 byte, the threshold, threshold + 1 and the big size round
/// trip into the right tier; kv-only refuses over-threshold puts and stores
/// nothing.
pub async fn round_trips_at_the_edges(store: &Store, cfg: Config) {
    let t = store.threshold() as usize;
    let mut sizes = vec![0, 1, t, t + 1];
    if !cfg.kv_only {
        sizes.push(cfg.big);
    }
    for (i, size) in sizes.into_iter().enumerate() {
        let value = data(i as u64, size);
        let r = store.put(value.clone()).await;
        if cfg.kv_only && size > t {
            match r {
                Err(Error::TooLarge { size: s, threshold }) => {
                    assert_eq!((s, threshold), (size as u64, t as u64));
                }
                other => panic!("kv-only put of {size} bytes: expected TooLarge, got {other:?}"),
            }
            assert!(!store.has(&Key::of(&value)).await.unwrap());
            continue;
        }
        let put = r.unwrap();
        assert_eq!(put.key, Key::of(&value));
        assert_eq!(put.size, size as u64);
        assert_eq!(put.tier, tier_of(store, size), "tier of {size} bytes");
        assert_eq!(put.outcome, PutOutcome::Created);
        let got = store.get(&put.key).await.unwrap().expect("present");
        assert!(got == value, "{size}-byte round trip differs");
        let meta = store.stat(&put.key).await.unwrap().unwrap();
        assert_eq!((meta.size, meta.tier), (size as u64, put.tier));
    }
}

/// The same bytes twice: one entry, same key, second put `Existed`.
pub async fn dedup(store: &Store, _cfg: Config) {
    let value = data(20, 5000);
    let a = store.put(value.clone()).await.unwrap();
    let b = store.put(value.clone()).await.unwrap();
    assert_eq!(a.key, b.key);
    assert_eq!(
        (a.outcome, b.outcome),
        (PutOutcome::Created, PutOutcome::Existed)
    );
    let keys: Vec<Key> = store.list().try_collect().await.unwrap();
    assert_eq!(keys, vec![a.key]);
}

/// `stat`, `has`, `get` of a missing key are `None`/`false`.
pub async fn stat_and_missing(store: &Store, _cfg: Config) {
    let k = absent_key("store");
    assert!(!store.has(&k).await.unwrap());
    assert!(store.get(&k).await.unwrap().is_none());
    assert!(store.get_verified(&k).await.unwrap().is_none());
    assert!(store.stat(&k).await.unwrap().is_none());
    assert!(store.get_range(&k, 0, 1).await.unwrap().is_none());
    assert!(store.open_read(&k).await.unwrap().is_none());
}

/// Ranged reads at the edges, in whichever tiers the store has.
pub async fn ranges_in_both_tiers(store: &Store, cfg: Config) {
    let t = store.threshold() as usize;
    let mut sizes = vec![t.max(10)];
    if !cfg.kv_only {
        sizes.push(t + 300_000);
    }
    for (i, size) in sizes.into_iter().enumerate() {
        let value = data(30 + i as u64, size);
        let key = store.put(value.clone()).await.unwrap().key;
        let s = size as u64;
        assert_eq!(
            store.get_range(&key, 0, 7).await.unwrap().unwrap(),
            value[..7]
        );
        assert_eq!(
            store.get_range(&key, s - 5, 50).await.unwrap().unwrap(),
            value[size - 5..]
        );
        assert!(
            store
                .get_range(&key, s, 1)
                .await
                .unwrap()
                .unwrap()
                .is_empty()
        );
        assert!(matches!(
            store.get_range(&key, s + 1, 1).await,
            Err(Error::InvalidRange { .. })
        ));
    }
}

/// Streaming puts from a reader and a file hash while they write and land
/// in the right tier.
pub async fn streaming_puts(store: &Store, cfg: Config) {
    let t = store.threshold() as usize;
    let small = data(40, t / 2);
    let put = store.put_reader(&small[..]).await.unwrap();
    assert_eq!((put.key, put.tier), (Key::of(&small), Tier::Kv));

    let big = data(41, t + 3 * 1024 * 1024 + 17);
    let r = store.put_reader(&big[..]).await;
    if cfg.kv_only {
        assert!(matches!(r, Err(Error::TooLarge { .. })), "got {r:?}");
        assert!(!store.has(&Key::of(&big)).await.unwrap());
    } else {
        let put = r.unwrap();
        assert_eq!(
            (put.key, put.size, put.tier),
            (Key::of(&big), big.len() as u64, Tier::Large)
        );
        assert!(store.get(&put.key).await.unwrap().unwrap() == big);
    }

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("input.bin");
    let file = data(42, if cfg.kv_only { t } else { t * 3 + 1 });
    std::fs::write(&path, &file).unwrap();
    let put = store.put_file(&path).await.unwrap();
    assert_eq!(put.key, Key::of(&file));
    assert_eq!(store.get(&put.key).await.unwrap().unwrap(), file);
}

/// A file that does not exist is a typed input error naming the path.
pub async fn missing_input_file(store: &Store, _cfg: Config) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-such-file");
    match store.put_file(&path).await {
        Err(Error::Input { what, source }) => {
            assert!(what.contains("no-such-file"), "{what}");
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("expected Input error, got {other:?}"),
    }
    assert_eq!(store.list().try_collect::<Vec<_>>().await.unwrap(), vec![]);
}

/// Verified reads pass on intact content.
pub async fn verified_reads(store: &Store, cfg: Config) {
    let t = store.threshold() as usize;
    let sizes = if cfg.kv_only {
        vec![t]
    } else {
        vec![t, t + 2_000_000]
    };
    for (i, size) in sizes.into_iter().enumerate() {
        let value = data(50 + i as u64, size);
        let key = store.put(value.clone()).await.unwrap().key;
        assert_eq!(store.get_verified(&key).await.unwrap().unwrap(), value);
        let mut r = store.open_read_verified(&key).await.unwrap().unwrap();
        let mut got = Vec::new();
        r.read_to_end(&mut got).await.unwrap();
        assert!(got == value);
    }
}

/// Any range reads verified, through the outboard every large put path
/// stores: whole buffers, streams, verified puts and batches.
pub async fn verified_ranges(store: &Store, cfg: Config) {
    use crate::RangeCheck;
    let t = store.threshold() as usize;
    let size = if cfg.kv_only { t } else { t + 3_000_000 };
    let value = data(90, size);
    let key = store.put(value.clone()).await.unwrap().key;
    let s = size as u64;
    for (off, len) in [
        (0, 1),
        (0, s),
        (16_383, 2),
        (16_384, 16_384),
        (s - 1, 1),
        (s / 2, 1 << 20),
        (s - 5, 100),
    ] {
        let got = store
            .get_range_verified(&key, off, len)
            .await
            .unwrap()
            .unwrap();
        let end = (off + len).min(s) as usize;
        assert!(
            got == value[off as usize..end],
            "range {off}+{len} of {size}"
        );
    }
    assert!(
        store
            .get_range_verified(&key, s, 1)
            .await
            .unwrap()
            .unwrap()
            .is_empty()
    );
    assert!(matches!(
        store.get_range_verified(&key, s + 1, 1).await,
        Err(Error::InvalidRange { .. })
    ));
    let mut r = store
        .open_range_verified(&key, 1000, s)
        .await
        .unwrap()
        .unwrap();
    let mut got = Vec::new();
    r.read_to_end(&mut got).await.unwrap();
    assert!(got == value[1000..], "a verified stream from byte 1000");
    assert_eq!(
        store.range_check(&key).await.unwrap(),
        Some(RangeCheck::Outboard)
    );
    let absent = absent_key("verified range");
    assert!(
        store
            .get_range_verified(&absent, 0, 1)
            .await
            .unwrap()
            .is_none()
    );
    assert!(store.range_check(&absent).await.unwrap().is_none());
    if cfg.kv_only {
        return;
    }
    let streamed = data(91, t + 2_500_000);
    let k1 = store.put_reader(&streamed[..]).await.unwrap().key;
    let verified = data(92, t + 100_000);
    let k2 = store
        .put_verified(&Key::of(&verified), verified.clone())
        .await
        .unwrap()
        .key;
    let batched = data(93, t + 40_000);
    let k3 = store.put_many([batched.clone()]).await.unwrap().entries[0].key;
    // (A blob under the large engine's outboard floor has none, by
    // design: it verifies by the whole blob.)
    let floor = store.large().map_or(0, |l| l.outboard_floor());
    for (k, v) in [(k1, &streamed), (k2, &verified), (k3, &batched)] {
        let expected = if v.len() as u64 <= floor {
            RangeCheck::BelowFloor
        } else {
            RangeCheck::Outboard
        };
        assert_eq!(store.range_check(&k).await.unwrap(), Some(expected));
        let mid = v.len() / 2;
        let got = store
            .get_range_verified(&k, mid as u64, 70_000)
            .await
            .unwrap()
            .unwrap();
        assert!(got == v[mid..(mid + 70_000).min(v.len())]);
    }
}

/// `put_verified` refuses bytes that do not hash to the key.
pub async fn put_verified_refuses_mismatch(store: &Store, _cfg: Config) {
    let value = data(60, 1000);
    let key = Key::of(&value);
    let wrong = data(61, 1000);
    match store.put_verified(&key, wrong.clone()).await {
        Err(Error::HashMismatch { expected, actual }) => {
            assert_eq!((expected, actual), (key, Key::of(&wrong)));
        }
        other => panic!("expected HashMismatch, got {other:?}"),
    }
    assert!(!store.has(&key).await.unwrap());
    assert!(!store.has(&Key::of(&wrong)).await.unwrap());
    let put = store.put_verified(&key, value.clone()).await.unwrap();
    assert_eq!(put.key, key);
    assert_eq!(store.get(&key).await.unwrap().unwrap(), value);
}

/// A batch stores every blob, in input order, pinned by one guard.
pub async fn batched_puts(store: &Store, cfg: Config) {
    let t = store.threshold() as usize;
    let mut blobs: Vec<Vec<u8>> = (0..1000).map(|i| data(70 + i, 1024)).collect();
    blobs.push(blobs[3].clone());
    if !cfg.kv_only {
        blobs.push(data(69, t + 1));
    }
    let many = store.put_many(blobs.clone()).await.unwrap();
    assert_eq!(many.entries.len(), blobs.len());
    for (e, b) in many.entries.iter().zip(&blobs) {
        assert_eq!(e.key, Key::of(b));
        assert_eq!(store.get(&e.key).await.unwrap().unwrap(), b[..]);
        assert!(store.pin_count(&e.key) >= 1);
    }
    assert_eq!(many.entries[1000].outcome, PutOutcome::Existed);
    let k = many.entries[0].key;
    drop(many);
    assert_eq!(store.pin_count(&k), 0);
    if cfg.kv_only {
        let r = store.put_many(vec![data(1, 10), data(2, t + 1)]).await;
        assert!(matches!(r, Err(Error::TooLarge { .. })));
        assert!(
            !store.has(&Key::of(&data(1, 10))).await.unwrap(),
            "batch is all or nothing"
        );
    }
}

/// `list` is the sorted union of the tiers, each key once, even when an
/// entry sits in both (written under an older threshold).
pub async fn list_is_a_union_without_duplicates(store: &Store, cfg: Config) {
    let t = store.threshold() as usize;
    let mut want = Vec::new();
    for i in 0..50 {
        want.push(store.put(data(80 + i, 100)).await.unwrap().key);
    }
    if !cfg.kv_only {
        for i in 0..5 {
            want.push(store.put(data(90 + i, t + 10)).await.unwrap().key);
        }
        // The same small entry placed directly in the large engine as well.
        let dup = data(80, 100);
        store
            .large()
            .unwrap()
            .put(&Key::of(&dup), Bytes::from(dup.clone()))
            .await
            .unwrap();
    }
    want.sort();
    let got: Vec<Key> = store.list().try_collect().await.unwrap();
    assert_eq!(got, want);
}

/// Every put returns a pin taken before publish; `pin` refuses missing keys.
pub async fn puts_pin_before_publish(store: &Store, _cfg: Config) {
    let put = store.put(data(100, 10)).await.unwrap();
    assert_eq!(store.pin_count(&put.key), 1);
    let second = store.put(data(100, 10)).await.unwrap();
    assert_eq!(store.pin_count(&put.key), 2, "a dedup put pins too");
    drop(second);
    let reader = store.pin(&put.key).await.unwrap();
    assert_eq!(store.pin_count(&put.key), 2);
    drop(put.pin);
    drop(reader);
    assert_eq!(store.pin_count(&put.key), 0);
    let missing = absent_key("pin");
    assert!(matches!(store.pin(&missing).await, Err(Error::NotFound { key }) if key == missing));
    assert_eq!(store.pin_count(&missing), 0, "a failed pin releases itself");
}

/// A fresh pool verifies clean and counts what it checked.
pub async fn verify_clean_pool(store: &Store, cfg: Config) {
    let t = store.threshold() as usize;
    let mut n = 0;
    let mut bytes = 0;
    for i in 0..10 {
        let size = if !cfg.kv_only && i % 3 == 0 {
            t + 1000
        } else {
            500
        };
        let _ = store.put(data(110 + i, size)).await.unwrap();
        n += 1;
        bytes += size as u64;
    }
    let report = store.verify().await.unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert_eq!((report.checked, report.bytes), (n, bytes));
}

/// Concurrent puts of one blob through the store: one creates, all get the
/// same key, the content is intact.
pub async fn concurrent_puts_of_one_key(store: &Store, cfg: Config) {
    let size = if cfg.kv_only {
        1000
    } else {
        store.threshold() as usize + 100_000
    };
    let value = Bytes::from(data(120, size));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let s = store.clone();
            let v = value.clone();
            tokio::spawn(async move { s.put(v).await.unwrap().outcome })
        })
        .collect();
    let mut created = 0;
    for t in tasks {
        created += (t.await.unwrap() == PutOutcome::Created) as u32;
    }
    assert_eq!(created, 1);
    assert_eq!(
        store.get_verified(&Key::of(&value)).await.unwrap().unwrap(),
        value
    );
}

/// Listing a big pool streams every key once, in order.
pub async fn big_listing(store: &Store, cfg: Config) {
    let n = cfg.list_keys;
    let mut want = Vec::with_capacity(n);
    for start in (0..n).step_by(5000) {
        let blobs: Vec<Vec<u8>> = (start..(start + 5000).min(n))
            .map(|i| (i as u64).to_le_bytes().to_vec())
            .collect();
        let many = store.put_many(blobs).await.unwrap();
        want.extend(many.entries.iter().map(|e| e.key));
    }
    want.sort();
    let mut keys = store.list();
    let mut i = 0;
    while let Some(k) = keys.try_next().await.unwrap() {
        assert_eq!(k, want[i], "key {i}");
        i += 1;
    }
    assert_eq!(i, n);
}

/// Usage per tier from the cheap probes.
pub async fn usage_per_tier(store: &Store, cfg: Config) {
    let t = store.threshold() as usize;
    for i in 0..4 {
        let _ = store.put(data(130 + i, 1000)).await.unwrap();
    }
    if !cfg.kv_only {
        for i in 0..3 {
            let _ = store.put(data(140 + i, t + 1)).await.unwrap();
        }
    }
    let u = store.usage().await.unwrap();
    assert_eq!((u.kv.entries, u.kv.bytes), (4, 4000));
    match u.large {
        Some(l) => {
            assert!(!cfg.kv_only);
            assert_eq!((l.entries, l.bytes), (3, 3 * (t as u64 + 1)));
        }
        None => assert!(cfg.kv_only),
    }
}

/// Random puts, gets, stats, ranges and listings match a model.
pub async fn model_sequence(store: &Store, cfg: Config) {
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let t = store.threshold() as usize;
    let max = if cfg.kv_only { t } else { t * 2 };
    let op = prop_oneof![
        (0u64..40, 0..=max).prop_map(|(s, l)| (0u8, s, l)),
        (0u64..40, 0..=max).prop_map(|(s, l)| (1u8, s, l)),
        Just((2u8, 0, 0)),
    ];
    let mut runner = TestRunner::deterministic();
    let mut model: BTreeMap<Key, Vec<u8>> = BTreeMap::new();
    for _ in 0..3 {
        let ops = proptest::collection::vec(op.clone(), 30)
            .new_tree(&mut runner)
            .unwrap()
            .current();
        for (kind, seed, len) in ops {
            let v = data(seed * 1_000_000 + len as u64, len);
            let k = Key::of(&v);
            match kind {
                0 => {
                    let r = store.put(v.clone()).await;
                    if cfg.kv_only && len > t {
                        assert!(matches!(r, Err(Error::TooLarge { .. })));
                    } else {
                        let p = r.unwrap();
                        let want = if model.contains_key(&k) {
                            PutOutcome::Existed
                        } else {
                            PutOutcome::Created
                        };
                        assert_eq!(p.outcome, want);
                        model.insert(k, v);
                    }
                }
                1 => {
                    let got = store.get(&k).await.unwrap();
                    assert_eq!(got.as_deref(), model.get(&k).map(|v| &v[..]));
                    let meta = store.stat(&k).await.unwrap();
                    assert_eq!(meta.map(|m| m.size), model.get(&k).map(|v| v.len() as u64));
                    if let Some(v) = model.get(&k) {
                        let mid = v.len() / 2;
                        let r = store.get_range(&k, mid as u64, 100).await.unwrap().unwrap();
                        assert_eq!(r, v[mid..(mid + 100).min(v.len())]);
                    }
                }
                _ => {
                    let got: Vec<Key> = store.list().try_collect().await.unwrap();
                    assert_eq!(got, model.keys().copied().collect::<Vec<_>>());
                }
            }
        }
    }
}
