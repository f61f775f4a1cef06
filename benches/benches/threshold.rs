//! Where the kv/large crossover lies: the same blobs put into and read back
//! from the sqlite engine and the local engine, interleaved, per size. The
//! ratio is sqlite throughput over local throughput: above 1, kv wins.

use alkblobs::Key;
use alkblobs::backend::Backend;
use alkblobs::backend::local::{LocalBackend, LocalOptions};
use alkblobs::backend::sqlite::{SqliteBackend, SqliteOptions};
use alkblobs_benches::{Lat, data, header, on_worker, paired, rounds};
use bytes::Bytes;
use std::sync::Arc;

fn main() {
    let (rt, dir, mut probes) = alkblobs_benches::setup();
    let kv: Arc<dyn Backend> = Arc::new(
        rt.block_on(SqliteBackend::open(
            dir.path().join("kv.sqlite"),
            SqliteOptions::default(),
        ))
        .unwrap(),
    );
    let large: Arc<dyn Backend> = Arc::new(
        rt.block_on(LocalBackend::open(
            dir.path().join("large"),
            LocalOptions::default(),
        ))
        .unwrap(),
    );
    let r = rounds(8);
    let mut seed = 0u64;
    header("kv (sqlite) vs large (local), durable: ratio = sqlite / local");
    for size in [
        4usize << 10,
        16 << 10,
        64 << 10,
        128 << 10,
        256 << 10,
        1 << 20,
    ] {
        let label = format!("{} KiB", size >> 10);
        let per_block = 20u64;
        let put_block = |engine: &Arc<dyn Backend>, lat: &mut Lat| {
            let ops: Vec<_> = (0..per_block)
                .map(|_| {
                    seed += 1;
                    let v = Bytes::from(data(seed, size));
                    let (e, k) = (engine.clone(), Key::of(&v));
                    move || async move { e.put(&k, v).await.map(drop).unwrap() }
                })
                .collect();
            (on_worker(&rt, lat, ops), per_block * size as u64)
        };
        let (kv2, large2) = (kv.clone(), large.clone());
        let put_block = std::cell::RefCell::new(put_block);
        paired(
            &format!("put {label}"),
            "sqlite",
            "local",
            r,
            &mut |lat| (put_block.borrow_mut())(&kv2, lat),
            &mut |lat| (put_block.borrow_mut())(&large2, lat),
        );
        // Reads: 200 blobs of this size in each engine, read in a scattered order.
        let keys: Vec<Key> = (0..200)
            .map(|i| {
                let v = Bytes::from(data(1_000_000 + i * 7 + size as u64, size));
                let k = Key::of(&v);
                rt.block_on(kv.put(&k, v.clone())).unwrap();
                rt.block_on(large.put(&k, v)).unwrap();
                k
            })
            .collect();
        let get_block = |engine: &Arc<dyn Backend>, lat: &mut Lat| {
            let ops: Vec<_> = (0..400usize)
                .map(|i| {
                    let (e, k) = (engine.clone(), keys[(i * 37) % keys.len()]);
                    move || async move { assert_eq!(e.get(&k).await.unwrap().unwrap().len(), size) }
                })
                .collect();
            (on_worker(&rt, lat, ops), 400 * size as u64)
        };
        paired(
            &format!("get {label}"),
            "sqlite",
            "local",
            r,
            &mut |lat| get_block(&kv, lat),
            &mut |lat| get_block(&large, lat),
        );
    }
    probes.take("end", dir.path());
    probes.verdict();
}
