//! Cases over one engine, through `&dyn Backend` (every engine) and
//! `&dyn LargeBackend` (large engines: streaming writes and reads).
//!
//! (One file of cases, so the list a third-party engine must pass reads in
//! one place; that is why it is long.)

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;

use super::{absent_key, data};
use crate::backend::{Backend, LargeBackend};
use crate::{BackendExt, Error, Key, PutOutcome};

/// What an engine is expected to handle.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    /// Largest value the cases put (kv engines only ever get small ones).
    pub max_value: usize,
    /// Keys in the big-listing case.
    pub list_keys: usize,
}

/// Stamps one test per case for an engine, kv or large. `$make` is an
/// async block returning `(engine, guard)`; the guard (e.g. a temp dir)
/// lives as long as the test. Every case runs through `Arc<dyn Backend>`.
///
/// ```text
/// alkblobs::backend_suite!(my_engine, alkblobs::conformance::backend::Caps {
///     max_value: 65_537, list_keys: 10_000 }, async { (MyEngine::new(), ()) });
/// ```
#[macro_export]
macro_rules! backend_suite {
    ($engine:ident, $caps:expr, $make:expr) => {
        mod $engine {
            #[allow(unused_imports)]
            use super::*;
            $crate::backend_suite!(@cases $caps, $make, dyn $crate::backend::Backend;
                round_trips, put_is_immutable, missing_keys, delete_semantics,
                ranges_at_edges, list_is_sorted_and_complete, big_listing, scan_reads_every_entry,
                concurrent_puts_of_one_key, batches, usage_matches_contents, model_sequence);
        }
    };
    (@cases $caps:expr, $make:expr, $dyn:ty; $($case:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let (engine, _guard) = $make.await;
                let engine: std::sync::Arc<$dyn> = std::sync::Arc::new(engine);
                $crate::conformance::backend::$case(&engine, $caps).await;
            }
        )*
    };
}

/// [`backend_suite!`] plus the large-engine cases (streaming writes and
/// reads, ranged reads of the window only), for a [`LargeBackend`].
#[macro_export]
macro_rules! large_backend_suite {
    ($engine:ident, $caps:expr, $make:expr) => {
        mod $engine {
            #[allow(unused_imports)]
            use super::*;
            $crate::backend_suite!(@cases $caps, $make, dyn $crate::backend::Backend;
                round_trips, put_is_immutable, missing_keys, delete_semantics,
                ranges_at_edges, list_is_sorted_and_complete, big_listing, scan_reads_every_entry,
                concurrent_puts_of_one_key, batches, usage_matches_contents, model_sequence);
            $crate::backend_suite!(@cases $caps, $make, dyn $crate::backend::LargeBackend;
                streaming_writes, streaming_reads, large_missing_keys, large_ranges_at_edges,
                outboards, digests);
        }
    };
}

fn sizes(caps: Caps) -> Vec<usize> {
    [0, 1, 100, 4096, 65536, 65537, 1 << 20, 8 << 20]
        .into_iter()
        .filter(|s| *s <= caps.max_value)
        .collect()
}

async fn put_new(e: &Arc<dyn Backend>, value: Vec<u8>) -> Key {
    let key = Key::of(&value);
    assert_eq!(
        e.put(&key, Bytes::from(value)).await.unwrap(),
        PutOutcome::Created,
        "{e}"
    );
    key
}

/// Values of every size come back byte-identical with the right size.
pub async fn round_trips(e: &Arc<dyn Backend>, caps: Caps) {
    for (i, size) in sizes(caps).into_iter().enumerate() {
        let value = data(i as u64, size);
        let key = put_new(e, value.clone()).await;
        assert!(e.has(&key).await.unwrap());
        assert_eq!(
            e.size(&key).await.unwrap(),
            Some(size as u64),
            "size of {size}"
        );
        let got = e.get(&key).await.unwrap().expect("present");
        assert_eq!(got.len(), size);
        assert!(got == value, "content of a {size}-byte value differs");
    }
}

/// A second put of a present key is `Existed` and never rewrites it, small
/// or big (an object store's multipart path: 6 MiB is over S3's smallest
/// part).
pub async fn put_is_immutable(e: &Arc<dyn Backend>, caps: Caps) {
    for (seed, size) in [(7, 1000), (9, caps.max_value.min(6 << 20))] {
        let value = data(seed, size);
        let key = put_new(e, value.clone()).await;
        // Same key, different bytes: an engine that trusts keys reports
        // `Existed`; one that verifies content (a database that re-hashes,
        // as the PostgreSQL extension does) refuses with a hash-mismatch
        // error. Either way the stored entry is left alone rather than
        // overwritten.
        let other = Bytes::from(data(seed + 1, size));
        match e.put(&key, other).await {
            Ok(outcome) => assert_eq!(outcome, PutOutcome::Existed, "a {size}-byte put"),
            Err(err) => assert_eq!(err.kind(), crate::ErrorKind::Corrupt, "{err}"),
        }
        assert!(
            e.get(&key).await.unwrap().unwrap() == value,
            "a {size}-byte entry was rewritten"
        );
    }
}

/// Missing keys read as `None`/`false`, never as errors.
pub async fn missing_keys(e: &Arc<dyn Backend>, _caps: Caps) {
    let k = absent_key("missing");
    assert!(!e.has(&k).await.unwrap());
    assert_eq!(e.get(&k).await.unwrap(), None);
    assert_eq!(e.size(&k).await.unwrap(), None);
    assert_eq!(e.get_range(&k, 0, 10).await.unwrap(), None);
}

/// A large engine's streaming and windowed reads of a missing key are `None`.
pub async fn large_missing_keys(e: &Arc<dyn LargeBackend>, _caps: Caps) {
    let k = absent_key("missing");
    assert_eq!(e.read_range(&k, 0, 10).await.unwrap(), None);
    assert!(e.open_read(&k).await.unwrap().is_none());
}

/// Deleting returns the freed size; deleting a missing key is `Ok(None)`.
pub async fn delete_semantics(e: &Arc<dyn Backend>, _caps: Caps) {
    let key = put_new(e, data(11, 321)).await;
    assert_eq!(e.delete(&key).await.unwrap(), Some(321));
    assert!(!e.has(&key).await.unwrap());
    assert_eq!(e.get(&key).await.unwrap(), None);
    assert_eq!(e.delete(&key).await.unwrap(), None);
    assert_eq!(e.delete(&absent_key("never")).await.unwrap(), None);
    // Delete-then-recover: the same bytes come back under the same key.
    let again = put_new(e, data(11, 321)).await;
    assert_eq!(again, key);
}

/// Ranged reads are clamped at the end and refuse a start past it.
pub async fn ranges_at_edges(e: &Arc<dyn Backend>, caps: Caps) {
    let key = put_new(e, data(12, 70_000.min(caps.max_value))).await;
    let e = e.clone();
    check_ranges(caps, key, move |o, l| {
        let e = e.clone();
        async move { e.get_range(&key, o, l).await }
    })
    .await;
}

/// The same edges through a large engine's windowed read.
pub async fn large_ranges_at_edges(e: &Arc<dyn LargeBackend>, caps: Caps) {
    let value = data(12, 70_000.min(caps.max_value));
    let key = Key::of(&value);
    e.put(&key, Bytes::from(value)).await.unwrap();
    let e = e.clone();
    check_ranges(caps, key, move |o, l| {
        let e = e.clone();
        async move { e.read_range(&key, o, l).await }
    })
    .await;
}

async fn check_ranges<F, Fut>(caps: Caps, key: Key, r: F)
where
    F: Fn(u64, u64) -> Fut,
    Fut: std::future::Future<Output = crate::Result<Option<Bytes>>>,
{
    let size = 70_000.min(caps.max_value);
    let value = data(12, size);
    assert_eq!(Key::of(&value), key);
    assert_eq!(r(0, 0).await.unwrap().unwrap().len(), 0);
    assert_eq!(r(0, 10).await.unwrap().unwrap(), value[..10]);
    assert_eq!(r(5, 100).await.unwrap().unwrap(), value[5..105]);
    assert_eq!(
        r(size as u64 - 3, 100).await.unwrap().unwrap(),
        value[size - 3..]
    );
    assert_eq!(r(size as u64, 100).await.unwrap().unwrap().len(), 0);
    assert_eq!(r(0, u64::MAX).await.unwrap().unwrap(), value);
    match r(size as u64 + 1, 1).await {
        Err(Error::InvalidRange {
            offset, size: s, ..
        }) => {
            assert_eq!((offset, s), (size as u64 + 1, size as u64));
        }
        other => panic!("expected InvalidRange, got {other:?}"),
    }
}

/// `list` is ascending, unique and complete.
pub async fn list_is_sorted_and_complete(e: &Arc<dyn Backend>, _caps: Caps) {
    let mut want = Vec::new();
    for i in 0..300 {
        want.push(put_new(e, data(1000 + i, 10)).await);
    }
    want.sort();
    let got = e.list_all().await.unwrap();
    assert_eq!(got, want);
}

/// Listing a big pool streams every key once, in order.
pub async fn big_listing(e: &Arc<dyn Backend>, caps: Caps) {
    let n = caps.list_keys;
    let mut want: Vec<Key> = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(5000) {
        let items: Vec<(Key, Bytes)> = chunk
            .iter()
            .map(|i| {
                let v = (*i as u64).to_le_bytes().to_vec();
                (Key::of(&v), Bytes::from(v))
            })
            .collect();
        want.extend(items.iter().map(|(k, _)| *k));
        e.put_many(&items).await.unwrap();
    }
    want.sort();
    let mut keys = e.list();
    let mut count = 0usize;
    let mut prev: Option<Key> = None;
    while let Some(k) = keys.try_next().await.unwrap() {
        if let Some(p) = prev {
            assert!(p < k, "list out of order at {count}");
        }
        assert_eq!(k, want[count]);
        prev = Some(k);
        count += 1;
    }
    assert_eq!(count, n);
}

/// `scan` yields every entry once, ascending, with its length and its
/// value, across pages (more rows than a page, and more bytes than one
/// when values are large), and from after a key when asked.
pub async fn scan_reads_every_entry(e: &Arc<dyn Backend>, caps: Caps) {
    let mut want: Vec<(Key, Vec<u8>)> = Vec::new();
    let small: Vec<(Key, Bytes)> = (0..caps.list_keys.min(1100))
        .map(|i| {
            let v = data(50_000 + i as u64, 20);
            (Key::of(&v), Bytes::from(v))
        })
        .collect();
    for chunk in small.chunks(500) {
        e.put_many(chunk).await.unwrap();
    }
    want.extend(small.iter().map(|(k, v)| (*k, v.to_vec())));
    // 12 MiB of the largest values, mixed with the small ones: a page of a
    // kv scan (1,024 rows) ends at 8 MiB before it is full.
    let big = (*sizes(caps).last().unwrap()).max(1);
    for i in 0..((12 << 20) / big + 1).min(200) {
        let v = data(60_000 + i as u64, big);
        want.push((put_new(e, v.clone()).await, v));
    }
    want.sort();
    let got: Vec<(Key, u64, Bytes)> = e.scan(None).try_collect().await.unwrap();
    assert_eq!(got.len(), want.len(), "{e}");
    for ((k, n, v), (wk, wv)) in got.iter().zip(&want) {
        assert_eq!((k, *n, &v[..]), (wk, wv.len() as u64, &wv[..]), "{e}");
    }
    let mid = want[want.len() / 2].0;
    let rest: Vec<Key> = e
        .scan(Some(mid))
        .map_ok(|(k, _, _)| k)
        .try_collect()
        .await
        .unwrap();
    let want_rest: Vec<Key> = want.iter().map(|(k, _)| *k).filter(|k| *k > mid).collect();
    assert_eq!(rest, want_rest, "{e}");
}

/// Concurrent puts of one key: exactly one creates it, all agree on content.
pub async fn concurrent_puts_of_one_key(e: &Arc<dyn Backend>, caps: Caps) {
    let value = Bytes::from(data(13, 200_000.min(caps.max_value)));
    let key = Key::of(&value);
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let e = e.clone();
            let v = value.clone();
            tokio::spawn(async move { e.put(&key, v).await.unwrap() })
        })
        .collect();
    let mut created = 0;
    for t in tasks {
        if t.await.unwrap() == PutOutcome::Created {
            created += 1;
        }
    }
    assert_eq!(created, 1, "exactly one concurrent put creates the entry");
    assert_eq!(e.get(&key).await.unwrap().unwrap(), value);
}

/// Streaming writes publish on commit only; abort and drop leave nothing.
pub async fn streaming_writes(e: &Arc<dyn LargeBackend>, caps: Caps) {
    let value = data(14, (3 << 20).min(caps.max_value));
    let key = Key::of(&value);
    let mut w = e.begin_write().await.unwrap();
    for chunk in value.chunks(100_000) {
        w.write(Bytes::copy_from_slice(chunk)).await.unwrap();
        assert!(!e.has(&key).await.unwrap(), "visible before commit");
    }
    assert_eq!(w.written(), value.len() as u64);
    let ob: Bytes = crate::integrity::outboard::of(&value).1.into();
    assert_eq!(
        w.commit(&key, ob.clone()).await.unwrap(),
        PutOutcome::Created
    );
    assert_eq!(e.get(&key).await.unwrap().unwrap(), value);

    // A second streamed write of the same key is discarded.
    let mut w = e.begin_write().await.unwrap();
    w.write(Bytes::from(value.clone())).await.unwrap();
    assert_eq!(w.commit(&key, ob).await.unwrap(), PutOutcome::Existed);

    let other = data(15, 5000);
    let other_key = Key::of(&other);
    let mut w = e.begin_write().await.unwrap();
    w.write(Bytes::from(other.clone())).await.unwrap();
    w.abort().await.unwrap();
    let mut w = e.begin_write().await.unwrap();
    w.write(Bytes::from(other)).await.unwrap();
    drop(w);
    assert!(!e.has(&other_key).await.unwrap());
    assert_eq!(e.list_all().await.unwrap(), vec![key]);
}

/// A blob's outboard is committed with it, read back by window (clamped
/// at its end), replaced by `put_outboard` only for a present blob, not
/// stored by an engine-level `put`, and gone with the blob.
pub async fn outboards(e: &Arc<dyn LargeBackend>, caps: Caps) {
    // Above the engine's outboard floor (under it a blob has none).
    let floor = usize::try_from(e.outboard_floor()).unwrap_or(usize::MAX);
    // Verification reads the engine through `integrity::Source`: the
    // engine's own floor, not a default.
    assert_eq!(
        crate::backend::source(e).outboard_floor(),
        e.outboard_floor(),
        "{e}: the floor verification sees"
    );
    let value = data(17, floor.saturating_add(1 << 20).min(caps.max_value));
    let (key, ob) = crate::integrity::outboard::of(&value);
    assert!(
        ob.len() >= 64,
        "a blob of several 16 KiB groups has parents"
    );
    let n = ob.len() as u64;
    let mut w = e.begin_write().await.unwrap();
    w.write(Bytes::from(value.clone())).await.unwrap();
    w.commit(&key, ob.clone().into()).await.unwrap();
    let read = async |k: &Key, off: u64, len: u64| e.read_outboard(k, off, len).await.unwrap();
    assert_eq!(
        read(&key, 0, n).await.unwrap(),
        ob,
        "{e}: the whole outboard"
    );
    assert_eq!(
        read(&key, 64, 128).await.unwrap(),
        ob[64..192],
        "{e}: a window"
    );
    assert_eq!(
        read(&key, n - 10, 100).await.unwrap(),
        ob[ob.len() - 10..],
        "{e}: clamped"
    );
    let mut bad = ob.clone();
    bad[3] ^= 1;
    assert!(e.put_outboard(&key, bad.clone().into()).await.unwrap());
    assert_eq!(read(&key, 0, n).await.unwrap(), bad, "{e}: replaced");
    assert!(e.put_outboard(&key, ob.clone().into()).await.unwrap());
    assert_eq!(read(&key, 0, n).await.unwrap(), ob, "{e}: mended");
    let absent = absent_key("outboard");
    assert!(!e.put_outboard(&absent, ob.clone().into()).await.unwrap());
    assert!(
        read(&absent, 0, 64).await.is_none(),
        "{e}: nothing for an absent blob"
    );

    // An engine-level put stores none: the blob reads as one stored before
    // outboards, until one is put.
    let plain = data(18, 200_000.min(caps.max_value));
    let (plain_key, plain_ob) = crate::integrity::outboard::of(&plain);
    e.put(&plain_key, Bytes::from(plain)).await.unwrap();
    assert!(
        read(&plain_key, 0, 64).await.is_none(),
        "{e}: put stores no outboard"
    );
    assert!(
        e.put_outboard(&plain_key, plain_ob.clone().into())
            .await
            .unwrap()
    );
    assert_eq!(
        read(&plain_key, 0, plain_ob.len() as u64).await.unwrap(),
        plain_ob
    );
    if let Some(bytes) = e.outboard_usage().await.unwrap() {
        assert_eq!(bytes, n + plain_ob.len() as u64, "{e}: outboard usage");
    }

    // Deleted with its blob (its bytes too); a put of the same bytes
    // brings it back.
    assert!(e.delete(&key).await.unwrap().is_some());
    assert!(read(&key, 0, 64).await.is_none(), "{e}: gone with the blob");
    if let Some(bytes) = e.outboard_usage().await.unwrap() {
        assert_eq!(
            bytes,
            plain_ob.len() as u64,
            "{e}: a deleted blob's outboard is gone"
        );
    }
    let mut w = e.begin_write().await.unwrap();
    w.write(Bytes::from(value)).await.unwrap();
    w.commit(&key, ob.clone().into()).await.unwrap();
    assert_eq!(
        read(&key, 0, n).await.unwrap(),
        ob,
        "{e}: back with the blob"
    );

    // A blob at the engine's outboard floor is committed without its
    // outboard.
    if floor > 0 && floor <= caps.max_value {
        let small = data(19, floor);
        let (small_key, small_ob) = crate::integrity::outboard::of(&small);
        let mut w = e.begin_write().await.unwrap();
        w.write(Bytes::from(small)).await.unwrap();
        w.commit(&small_key, small_ob.into()).await.unwrap();
        assert!(e.has(&small_key).await.unwrap());
        assert!(
            read(&small_key, 0, 64).await.is_none(),
            "{e}: a blob under the floor got an outboard"
        );
    }
}

/// Streaming reads return the exact bytes.
pub async fn streaming_reads(e: &Arc<dyn LargeBackend>, caps: Caps) {
    use tokio::io::AsyncReadExt;
    let value = data(16, (2 << 20).min(caps.max_value));
    let key = Key::of(&value);
    assert_eq!(
        e.put(&key, Bytes::from(value.clone())).await.unwrap(),
        PutOutcome::Created
    );
    let mut r = e.open_read(&key).await.unwrap().unwrap();
    let mut got = Vec::new();
    r.read_to_end(&mut got).await.unwrap();
    assert!(got == value);
}

/// A digest reads every byte (values of every size, across the buffers
/// an engine reads in): the key, the length and the outboard are the
/// bytes', and an absent key has none.
pub async fn digests(e: &Arc<dyn LargeBackend>, caps: Caps) {
    use crate::integrity::outboard::Digest;
    for (i, n) in sizes(caps)
        .into_iter()
        .chain([(64 << 10) + 1, (1 << 20) + 3])
        .filter(|n| *n <= caps.max_value)
        .enumerate()
    {
        let value = data(40 + i as u64, n);
        let (key, outboard) = crate::integrity::outboard::of(&value);
        let _ = e.put(&key, Bytes::from(value)).await.unwrap();
        match e.digest(&key, n as u64).await.unwrap() {
            Some(Digest::Whole {
                hash,
                len,
                outboard: got,
            }) => {
                assert_eq!((hash, len), (key, n as u64), "{e}: {n} bytes");
                assert!(got == outboard, "{e}: the outboard of {n} bytes");
            }
            other => panic!("{e}: a digest of {n} bytes: {other:?}"),
        }
    }
    let absent = crate::conformance::absent_key("digests");
    assert!(e.digest(&absent, 1).await.unwrap().is_none(), "{e}");
}

/// `put_many` and `delete_many` report per key.
pub async fn batches(e: &Arc<dyn Backend>, _caps: Caps) {
    let items: Vec<(Key, Bytes)> = (0..50)
        .map(|i| {
            let v = data(2000 + i, 1024);
            (Key::of(&v), Bytes::from(v))
        })
        .collect();
    assert!(
        e.put_many(&items[..25])
            .await
            .unwrap()
            .iter()
            .all(|o| *o == PutOutcome::Created)
    );
    let out = e.put_many(&items).await.unwrap();
    assert_eq!(
        out.iter().filter(|o| **o == PutOutcome::Existed).count(),
        25
    );
    assert_eq!(
        out.iter().filter(|o| **o == PutOutcome::Created).count(),
        25
    );
    let mut keys: Vec<Key> = items.iter().map(|(k, _)| *k).collect();
    keys.push(absent_key("batch"));
    // get_many: each key's size and value in order, an absent one None.
    let mut asked = keys.clone();
    asked.reverse();
    let got = e.get_many(&asked).await.unwrap();
    assert_eq!(got.len(), asked.len(), "{e}");
    assert!(got[0].is_none(), "{e}: an absent key");
    for (k, g) in asked[1..].iter().zip(&got[1..]) {
        let (n, v) = g.as_ref().unwrap_or_else(|| panic!("{e}: {k} is present"));
        let want = &items.iter().find(|(ik, _)| ik == k).unwrap().1;
        assert!(*n == 1024 && v == want, "{e}: {k}");
    }
    let freed = e.delete_many(&keys).await.unwrap();
    assert_eq!(freed.iter().flatten().count(), 50);
    assert!(freed.iter().flatten().all(|s| *s == 1024));
    assert_eq!(freed[50], None);
    assert!(e.list_all().await.unwrap().is_empty());
}

/// Usage counts entries and bytes without loading values.
pub async fn usage_matches_contents(e: &Arc<dyn Backend>, _caps: Caps) {
    assert_eq!(e.count_and_bytes().await.unwrap(), (0, 0));
    let mut bytes = 0;
    for i in 0..20u64 {
        put_new(e, data(3000 + i, (i * 100) as usize)).await;
        bytes += i * 100;
    }
    assert_eq!(e.count_and_bytes().await.unwrap(), (20, bytes));
}

/// A random sequence of operations matches an in-memory model.
pub async fn model_sequence(e: &Arc<dyn Backend>, caps: Caps) {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    #[derive(Debug, Clone)]
    enum Op {
        Put(u8, u16),
        Delete(u8, u16),
        Get(u8, u16),
        Range(u8, u16, u32, u32),
        List,
    }
    let max = caps.max_value.min(20_000) as u16;
    let op = prop_oneof![
        (any::<u8>(), 0..max).prop_map(|(s, l)| Op::Put(s % 16, l)),
        (any::<u8>(), 0..max).prop_map(|(s, l)| Op::Delete(s % 16, l)),
        (any::<u8>(), 0..max).prop_map(|(s, l)| Op::Get(s % 16, l)),
        (any::<u8>(), 0..max, any::<u32>(), any::<u32>()).prop_map(|(s, l, o, n)| Op::Range(
            s % 16,
            l,
            o % 30_000,
            n % 30_000
        )),
        Just(Op::List),
    ];
    let mut runner = TestRunner::new(Config {
        cases: 24,
        failure_persistence: None,
        ..Config::default()
    });
    let rt = tokio::runtime::Handle::current();
    let result = runner.run(&proptest::collection::vec(op, 1..40), |ops| {
        // The engine is shared across cases: clear it first.
        let e = e.clone();
        let outcome = std::thread::scope(|s| {
            s.spawn(|| {
                rt.block_on(async {
                    let keys = e.list_all().await.unwrap();
                    e.delete_many(&keys).await.unwrap();
                    let mut model: BTreeMap<Key, Vec<u8>> = BTreeMap::new();
                    for op in ops {
                        match op {
                            Op::Put(s, l) => {
                                let v = data(s as u64 * 100_000 + l as u64, l as usize);
                                let k = Key::of(&v);
                                let out = e.put(&k, Bytes::from(v.clone())).await.unwrap();
                                let want = if model.contains_key(&k) {
                                    PutOutcome::Existed
                                } else {
                                    PutOutcome::Created
                                };
                                if out != want {
                                    return Err(format!("put outcome {out:?}, model {want:?}"));
                                }
                                model.insert(k, v);
                            }
                            Op::Delete(s, l) => {
                                let k = Key::of(&data(s as u64 * 100_000 + l as u64, l as usize));
                                let got = e.delete(&k).await.unwrap();
                                let want = model.remove(&k).map(|v| v.len() as u64);
                                if got != want {
                                    return Err(format!("delete {got:?}, model {want:?}"));
                                }
                            }
                            Op::Get(s, l) => {
                                let k = Key::of(&data(s as u64 * 100_000 + l as u64, l as usize));
                                let got = e.get(&k).await.unwrap().map(|b| b.to_vec());
                                if got.as_ref() != model.get(&k) {
                                    return Err("get differs from model".into());
                                }
                                let size = e.size(&k).await.unwrap();
                                if size != model.get(&k).map(|v| v.len() as u64) {
                                    return Err("size differs from model".into());
                                }
                            }
                            Op::Range(s, l, o, n) => {
                                let k = Key::of(&data(s as u64 * 100_000 + l as u64, l as usize));
                                let got = e.get_range(&k, o as u64, n as u64).await;
                                match (model.get(&k), got) {
                                    (None, Ok(None)) => {}
                                    (Some(v), Ok(Some(b))) if (o as usize) <= v.len() => {
                                        let end = (o as usize + n as usize).min(v.len());
                                        if b[..] != v[o as usize..end] {
                                            return Err("range differs from model".into());
                                        }
                                    }
                                    (Some(v), Err(Error::InvalidRange { .. }))
                                        if o as usize > v.len() => {}
                                    (m, g) => {
                                        return Err(format!(
                                            "range: model has {:?} bytes, engine said {g:?}",
                                            m.map(|v| v.len())
                                        ));
                                    }
                                }
                            }
                            Op::List => {
                                let got = e.list_all().await.unwrap();
                                let want: Vec<Key> = model.keys().copied().collect();
                                if got != want {
                                    return Err("list differs from model".into());
                                }
                            }
                        }
                    }
                    Ok(())
                })
            })
            .join()
            .unwrap()
        });
        outcome.map_err(proptest::test_runner::TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
