//! Verified ranged reads through BLAKE3 outboards, each beside the read it
//! replaces, one run, one 1 GiB `local` blob (page cache warm on both
//! sides):
//!
//! - a verified 1 MiB range (`Store::get_range_verified`: the 64 groups it
//!   covers hashed, the outboard path read and checked) against the
//!   unverified read of the same range (`Store::get_range`, which trusts
//!   the storage), at random offsets;
//! - a verified whole read (`Store::open_range_verified` over the whole
//!   blob, 4 MiB windows checked before they are returned) against today's
//!   get with re-hash (`Store::get`: read it all, then hash it);
//! - the same whole read into one buffer (`get_range_verified(0, size)`);
//! - the same 1 MiB ranges read cold (the blob file's pages dropped from
//!   the cache before every read, `posix_fadvise(DONTNEED)`), as a range
//!   of a blob bigger than memory is read;
//! - the outboard's size beside the blob's.
//!
//! Warm, a verified range is bounded by BLAKE3: hashing 1 MiB on one core
//! (~160 µs here) costs more than copying it from the page cache (~100
//! µs), and multithreaded hashing does not scale on this 2-vCPU machine
//! (`shared/notes/benchmarking.md`).

use alkblobs::{DirOptions, Store};
use alkblobs_benches::{Lat, data, header, on_worker, paired, rounds};
use bytes::Bytes;
use tokio::io::AsyncReadExt;

const BLOB: usize = 1 << 30;
const RANGE: u64 = 1 << 20;

fn main() {
    let (rt, dir, mut probes) = alkblobs_benches::setup();
    let store = rt
        .block_on(Store::open_dir_with(
            dir.path().join("store"),
            DirOptions::new().relaxed(),
        ))
        .unwrap();
    let v = Bytes::from(data(7, BLOB));
    let put = rt.block_on(store.put(v.clone())).unwrap();
    let key = put.key;
    drop(put.pin);
    drop(v);
    let blob = store.large().unwrap();
    let (blob_path, obao) = {
        let local = dir.path().join("store/large/blobs");
        let hex = key.to_string();
        (
            local.join(&hex[..2]).join(&hex),
            local.join(&hex[..2]).join(format!("{hex}.obao")),
        )
    };
    let ob_len = std::fs::metadata(&obao).map(|m| m.len()).unwrap_or(0);
    assert_eq!(ob_len, alkblobs::outboard::outboard_len(BLOB as u64));
    header("verified ranges, 1 GiB local blob (page cache warm)");

    // Random 1 MiB ranges, the same offsets on both sides of a round.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut offsets = move || {
        (0..64)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed % (BLOB as u64 - RANGE)
            })
            .collect::<Vec<u64>>()
    };
    let round_offsets = std::cell::RefCell::new(offsets());
    let mut a = |lat: &mut Lat| {
        let offs = round_offsets.borrow().clone();
        let ops: Vec<_> = offs
            .into_iter()
            .map(|o| {
                let s = store.clone();
                move || async move {
                    let got = s.get_range_verified(&key, o, RANGE).await.unwrap().unwrap();
                    assert_eq!(got.len() as u64, RANGE);
                }
            })
            .collect();
        let n = on_worker(&rt, lat, ops);
        (n, n * RANGE)
    };
    let mut b = |lat: &mut Lat| {
        let offs = std::mem::replace(&mut *round_offsets.borrow_mut(), offsets());
        let ops: Vec<_> = offs
            .into_iter()
            .map(|o| {
                let s = store.clone();
                move || async move {
                    let got = s.get_range(&key, o, RANGE).await.unwrap().unwrap();
                    assert_eq!(got.len() as u64, RANGE);
                }
            })
            .collect();
        let n = on_worker(&rt, lat, ops);
        (n, n * RANGE)
    };
    paired(
        "1 MiB range of 1 GiB",
        "get_range_verified",
        "get_range (unverified)",
        rounds(12),
        &mut a,
        &mut b,
    );

    // Cold: every read starts with the blob's (and its outboard's) pages
    // out of the cache.
    let drop_cache = || {
        for path in [&blob_path, &obao] {
            let f = std::fs::File::open(path).unwrap();
            use std::os::fd::AsRawFd;
            // SAFETY: a valid open descriptor; advice only.
            let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            assert_eq!(rc, 0);
        }
    };
    let cold_offsets = std::cell::RefCell::new(offsets());
    let mut a = |lat: &mut Lat| {
        let offs = cold_offsets.borrow()[..8].to_vec();
        let mut n = 0;
        for o in offs {
            drop_cache();
            let s = store.clone();
            n += on_worker(
                &rt,
                lat,
                vec![move || async move {
                    let got = s.get_range_verified(&key, o, RANGE).await.unwrap().unwrap();
                    assert_eq!(got.len() as u64, RANGE);
                }],
            );
        }
        (n, n * RANGE)
    };
    let mut b = |lat: &mut Lat| {
        let offs = std::mem::replace(&mut *cold_offsets.borrow_mut(), offsets())[..8].to_vec();
        let mut n = 0;
        for o in offs {
            drop_cache();
            let s = store.clone();
            n += on_worker(
                &rt,
                lat,
                vec![move || async move {
                    let got = s.get_range(&key, o, RANGE).await.unwrap().unwrap();
                    assert_eq!(got.len() as u64, RANGE);
                }],
            );
        }
        (n, n * RANGE)
    };
    paired(
        "1 MiB range of 1 GiB, cold cache",
        "get_range_verified",
        "get_range (unverified)",
        rounds(12),
        &mut a,
        &mut b,
    );
    // Warm again for the whole reads.
    rt.block_on(store.get(&key)).unwrap();

    let mut a = |lat: &mut Lat| {
        let s = store.clone();
        on_worker(
            &rt,
            lat,
            vec![move || async move {
                let mut r = s
                    .open_range_verified(&key, 0, BLOB as u64)
                    .await
                    .unwrap()
                    .unwrap();
                let mut buf = Vec::with_capacity(BLOB);
                r.read_to_end(&mut buf).await.unwrap();
                assert_eq!(buf.len(), BLOB);
            }],
        );
        (1, BLOB as u64)
    };
    let mut b = |lat: &mut Lat| {
        let s = store.clone();
        on_worker(
            &rt,
            lat,
            vec![move || async move {
                assert_eq!(s.get(&key).await.unwrap().unwrap().len(), BLOB);
            }],
        );
        (1, BLOB as u64)
    };
    paired(
        "whole 1 GiB, verified",
        "open_range_verified (streamed)",
        "get (read, then re-hash)",
        rounds(6),
        &mut a,
        &mut b,
    );
    // The same, into one buffer as `get` returns it.
    let mut a = |lat: &mut Lat| {
        let s = store.clone();
        on_worker(
            &rt,
            lat,
            vec![move || async move {
                let got = s
                    .get_range_verified(&key, 0, BLOB as u64)
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(got.len(), BLOB);
            }],
        );
        (1, BLOB as u64)
    };
    let mut b = |lat: &mut Lat| {
        let s = store.clone();
        on_worker(
            &rt,
            lat,
            vec![move || async move {
                assert_eq!(s.get(&key).await.unwrap().unwrap().len(), BLOB);
            }],
        );
        (1, BLOB as u64)
    };
    paired(
        "whole 1 GiB, verified, one buffer",
        "get_range_verified (0, size)",
        "get (read, then re-hash)",
        rounds(6),
        &mut a,
        &mut b,
    );
    println!(
        "\noutboard: {ob_len} bytes for {BLOB} ({:.3}% of the blob); engine {blob}",
        ob_len as f64 * 100.0 / BLOB as f64
    );
    probes.take("after the reads", dir.path());
    probes.verdict();
}
