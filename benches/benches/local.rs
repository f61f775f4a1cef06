//! The `local` large engine (through the store) versus plain file I/O on the
//! same filesystem, same durability, one run.
//!
//! Baseline put: write a temp file, fsync it, rename it into place, fsync
//! the directory — the minimum for a durable, atomic publish. The baseline
//! does not hash; alkblobs hashes (BLAKE3) before publishing. Baseline get:
//! `std::fs::read` of the same file.

use std::io::Write;

use alkblobs::{Key, Store};
use alkblobs_benches::{Lat, data, header, on_worker, paired, rounds};
use bytes::Bytes;

fn raw_put(dir: &std::path::Path, name: &str, bytes: &[u8]) {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = std::fs::File::create(&tmp).unwrap();
    f.write_all(bytes).unwrap();
    f.sync_all().unwrap();
    drop(f);
    std::fs::rename(&tmp, dir.join(name)).unwrap();
    std::fs::File::open(dir).unwrap().sync_all().unwrap();
}

fn main() {
    let (rt, dir, mut probes) = alkblobs_benches::setup();
    let store = rt
        .block_on(Store::open_dir(dir.path().join("store")))
        .unwrap();
    let raw_dir = dir.path().join("raw");
    std::fs::create_dir_all(&raw_dir).unwrap();
    header("local large tier, durable");

    for (size, per_block, r) in [
        (1usize << 20, 24u64, rounds(16)),
        (256usize << 20, 1, rounds(10).min(10)),
    ] {
        let label = if size == 1 << 20 { "1 MiB" } else { "256 MiB" };
        // Distinct content per operation (else puts dedup): a base buffer
        // whose first 8 bytes are a counter. Copies happen outside timing.
        let base = std::cell::RefCell::new((data(size as u64, size), 0u64));
        let fresh = || {
            let mut b = base.borrow_mut();
            b.1 += 1;
            let c = b.1;
            b.0[..8].copy_from_slice(&c.to_le_bytes());
            b.0.clone()
        };
        let mut written: Vec<Key> = Vec::new();
        let mut a = |lat: &mut Lat| {
            let ops: Vec<_> = (0..per_block)
                .map(|_| {
                    let (s, v) = (store.clone(), Bytes::from(fresh()));
                    written.push(Key::of(&v));
                    move || async move { drop(s.put(v).await.unwrap()) }
                })
                .collect();
            let n = on_worker(&rt, lat, ops);
            for k in written.drain(..) {
                rt.block_on(store.large().unwrap().delete(&k)).unwrap();
            }
            (n, n * size as u64)
        };
        let mut b = |lat: &mut Lat| {
            let vals: Vec<Vec<u8>> = (0..per_block).map(|_| fresh()).collect();
            for (i, v) in vals.iter().enumerate() {
                lat.time(|| raw_put(&raw_dir, &format!("blob{i}"), v));
            }
            for i in 0..per_block {
                let _ = std::fs::remove_file(raw_dir.join(format!("blob{i}")));
            }
            (per_block, per_block * size as u64)
        };
        paired(
            &format!("put {label}"),
            "Store::put",
            "write+fsync+rename+dirfsync",
            r,
            &mut a,
            &mut b,
        );

        // Reads of one committed blob, page cache warm on both sides.
        let v = fresh();
        let put = rt.block_on(store.put(v.clone())).unwrap();
        let key = put.key;
        drop(put.pin);
        raw_put(&raw_dir, "read-me", &v);
        let reads = if size == 1 << 20 { 256 } else { 2 };
        let mut a = |lat: &mut Lat| {
            let ops: Vec<_> =
                (0..reads)
                    .map(|_| {
                        let s = store.clone();
                        move || async move {
                            assert_eq!(s.get(&key).await.unwrap().unwrap().len(), size)
                        }
                    })
                    .collect();
            (on_worker(&rt, lat, ops), reads * size as u64)
        };
        let path = raw_dir.join("read-me");
        let mut b = |lat: &mut Lat| {
            for _ in 0..reads {
                lat.time(|| assert_eq!(std::fs::read(&path).unwrap().len(), size));
            }
            (reads, reads * size as u64)
        };
        paired(
            &format!("get {label}"),
            "Store::get",
            "fs::read",
            r.max(8),
            &mut a,
            &mut b,
        );
        probes.take(&format!("after {label}"), dir.path());
    }
    file_import(&rt, dir.path(), &mut probes);
    probes.verdict();
}

/// The raw pipeline a large put cannot beat: read the source once, hash it,
/// write it once to a staging file and rename it into place (no fsync:
/// compared with the relaxed store).
fn raw_import(src: &std::path::Path, dst_dir: &std::path::Path) -> Key {
    use std::io::Read;
    let mut input = std::fs::File::open(src).unwrap();
    let tmp = dst_dir.join("import.tmp");
    let mut out = std::fs::File::create(&tmp).unwrap();
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = input.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).unwrap();
    }
    drop(out);
    let key = Key::from_hash(hasher.finalize());
    std::fs::rename(&tmp, dst_dir.join(key.to_string())).unwrap();
    key
}

/// 64 MiB file imports: relaxed `Store::put_file` against `raw_import`, the
/// page cache warm for the source on both sides.
fn file_import(
    rt: &tokio::runtime::Runtime,
    dir: &std::path::Path,
    probes: &mut alkblobs_benches::Probes,
) {
    const SIZE: usize = 64 << 20;
    header("64 MiB file import, relaxed (no fsync on either side)");
    let store = rt
        .block_on(Store::open_dir_with(
            dir.join("import-store"),
            alkblobs::DirOptions::new().relaxed(),
        ))
        .unwrap();
    let raw_dir = dir.join("import-raw");
    std::fs::create_dir_all(&raw_dir).unwrap();
    let src_dir = dir.join("import-src");
    std::fs::create_dir_all(&src_dir).unwrap();
    // Distinct sources per round (else puts dedup), written outside timing.
    let counter = std::cell::Cell::new(0u64);
    let make_src = || {
        counter.set(counter.get() + 1);
        let counter = counter.get();
        let mut v = data(1 << 33, SIZE);
        v[..8].copy_from_slice(&counter.to_le_bytes());
        let p = src_dir.join(format!("src{counter}"));
        std::fs::write(&p, &v).unwrap();
        (p, Key::of(&v))
    };
    let mut a = |lat: &mut Lat| {
        let (src, key) = make_src();
        let s = store.clone();
        let p = src.clone();
        on_worker(
            rt,
            lat,
            vec![move || async move {
                let put = s.put_file(&p).await.unwrap();
                assert_eq!(put.key, key);
            }],
        );
        rt.block_on(store.large().unwrap().delete(&key)).unwrap();
        std::fs::remove_file(src).unwrap();
        (1, SIZE as u64)
    };
    let mut b = |lat: &mut Lat| {
        let (src, key) = make_src();
        let got = lat.time(|| raw_import(&src, &raw_dir));
        assert_eq!(got, key);
        std::fs::remove_file(raw_dir.join(key.to_string())).unwrap();
        std::fs::remove_file(src).unwrap();
        (1, SIZE as u64)
    };
    paired(
        "put_file 64 MiB",
        "Store::put_file (relaxed)",
        "read+hash+write+rename",
        rounds(12),
        &mut a,
        &mut b,
    );
    probes.take("after 64 MiB imports", dir);
}
