//! The `s3` large engine (through an embedded store: sqlite index, blobs on
//! S3) versus raw `object_store` calls on the same server and bucket, one
//! run, interleaved. Needs the test S3 server: `env $(scripts/s3-server.sh
//! start) cargo bench -p alkblobs-benches --bench s3`.
//!
//! Baseline put: one `WriteMultipart` upload of the same bytes (8 MiB
//! parts, 4 in flight — the engine's defaults) to a fresh name; it neither
//! hashes nor checks for an existing object, as the engine does (BLAKE3,
//! one HEAD). Baseline get: `get` and `get_range` of the same object.
//! Concurrency: 16 puts of 1 MiB at once on both sides.

use std::sync::Arc;

use alkblobs::backend::s3::{S3Location, S3Options};
use alkblobs::{DirOptions, Key, Store};
use alkblobs_benches::{Lat, data, header, on_worker, paired, rounds};
use bytes::Bytes;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::{ClientOptions, ObjectStoreExt, WriteMultipart};

const PART: usize = 8 << 20;

async fn raw_put(s: &AmazonS3, path: &Path, bytes: Bytes) {
    if bytes.len() <= PART {
        s.put(path, bytes.into()).await.unwrap();
        return;
    }
    let upload = s.put_multipart(path).await.unwrap();
    let mut w = WriteMultipart::new_with_chunk_size(upload, PART);
    for chunk in bytes.chunks(PART) {
        w.wait_for_capacity(4).await.unwrap();
        w.put(bytes.slice_ref(chunk));
    }
    w.finish().await.unwrap();
}

fn main() {
    let (rt, dir, mut probes) = alkblobs_benches::setup();
    let bucket = std::env::var("ALKBLOBS_S3_BUCKET")
        .expect("ALKBLOBS_S3_BUCKET: run under `env $(scripts/s3-server.sh start)`");
    let run = format!("bench/{}", std::process::id());
    let loc = S3Location::new(&bucket, &format!("{run}/store")).unwrap();
    let store = rt
        .block_on(Store::open_dir_with(
            dir.path().join("store"),
            DirOptions::new().large_s3(S3Options::new(loc)),
        ))
        .unwrap();
    let raw = Arc::new(
        AmazonS3Builder::from_env()
            .with_bucket_name(&bucket)
            .with_client_options(ClientOptions::new().with_allow_http(true))
            .build()
            .unwrap(),
    );
    header("s3 large tier (Garage on this machine) vs raw object_store");

    let counter = std::cell::Cell::new(0u64);
    let fresh = |size: usize| {
        let c = counter.get() + 1;
        counter.set(c);
        let mut v = data(size as u64, size);
        v[..8].copy_from_slice(&c.to_le_bytes());
        Bytes::from(v)
    };

    // put 64 MiB, one at a time.
    let size = 64usize << 20;
    let mut written: Vec<Key> = Vec::new();
    let mut a = |lat: &mut Lat| {
        let v = fresh(size);
        written.push(Key::of(&v));
        let s = store.clone();
        let n = on_worker(
            &rt,
            lat,
            vec![move || async move { drop(s.put(v).await.unwrap()) }],
        );
        for k in written.drain(..) {
            rt.block_on(store.large().unwrap().delete(&k)).unwrap();
        }
        (n, n * size as u64)
    };
    let mut b = |lat: &mut Lat| {
        let v = fresh(size);
        let (s, p) = (raw.clone(), Path::from(format!("{run}/raw/put64")));
        let n = on_worker(
            &rt,
            lat,
            vec![move || async move { raw_put(&s, &p, v).await }],
        );
        (n, n * size as u64)
    };
    paired(
        "put 64 MiB",
        "Store::put",
        "WriteMultipart",
        rounds(8),
        &mut a,
        &mut b,
    );

    // get 64 MiB and a ranged get of 1 MiB of one committed blob.
    let v = fresh(size);
    let put = rt.block_on(store.put(v.clone())).unwrap();
    let key = put.key;
    drop(put.pin);
    let raw_path = Path::from(format!("{run}/raw/get64"));
    rt.block_on(raw_put(&raw, &raw_path, v));
    let mut a = |lat: &mut Lat| {
        let s = store.clone();
        let n = on_worker(
            &rt,
            lat,
            vec![
                move || async move { assert_eq!(s.get(&key).await.unwrap().unwrap().len(), size) },
            ],
        );
        (n, n * size as u64)
    };
    let mut b = |lat: &mut Lat| {
        let (s, p) = (raw.clone(), raw_path.clone());
        let n = on_worker(
            &rt,
            lat,
            vec![move || async move {
                assert_eq!(s.get(&p).await.unwrap().bytes().await.unwrap().len(), size)
            }],
        );
        (n, n * size as u64)
    };
    paired(
        "get 64 MiB",
        "Store::get",
        "get().bytes()",
        rounds(8),
        &mut a,
        &mut b,
    );

    let reads = 16u64;
    let mib = 1u64 << 20;
    let mut a = |lat: &mut Lat| {
        let ops: Vec<_> = (0..reads)
            .map(|i| {
                let s = store.clone();
                move || async move {
                    let r = s
                        .get_range(&key, (i * 3 + 1) * mib, mib)
                        .await
                        .unwrap()
                        .unwrap();
                    assert_eq!(r.len() as u64, mib)
                }
            })
            .collect();
        (on_worker(&rt, lat, ops), reads * mib)
    };
    let mut b = |lat: &mut Lat| {
        let ops: Vec<_> = (0..reads)
            .map(|i| {
                let (s, p) = (raw.clone(), raw_path.clone());
                move || async move {
                    let at = (i * 3 + 1) * mib;
                    let r = s.get_range(&p, at..at + mib).await.unwrap();
                    assert_eq!(r.len() as u64, mib)
                }
            })
            .collect();
        (on_worker(&rt, lat, ops), reads * mib)
    };
    paired(
        "ranged get 1 MiB",
        "Store::get_range",
        "get_range",
        rounds(8),
        &mut a,
        &mut b,
    );

    // 16 puts of 1 MiB at once.
    let (n, one) = (16usize, 1usize << 20);
    let mut a = |lat: &mut Lat| {
        let vals: Vec<Bytes> = (0..n).map(|_| fresh(one)).collect();
        let keys: Vec<Key> = vals.iter().map(|v| Key::of(v)).collect();
        let s = store.clone();
        on_worker(
            &rt,
            lat,
            vec![move || async move {
                let tasks: Vec<_> = vals
                    .into_iter()
                    .map(|v| {
                        let s = s.clone();
                        tokio::spawn(async move { drop(s.put(v).await.unwrap()) })
                    })
                    .collect();
                for t in tasks {
                    t.await.unwrap();
                }
            }],
        );
        for k in keys {
            rt.block_on(store.large().unwrap().delete(&k)).unwrap();
        }
        (n as u64, (n * one) as u64)
    };
    let mut b = |lat: &mut Lat| {
        let vals: Vec<Bytes> = (0..n).map(|_| fresh(one)).collect();
        let s = raw.clone();
        let run = run.clone();
        on_worker(
            &rt,
            lat,
            vec![move || async move {
                let tasks: Vec<_> = vals
                    .into_iter()
                    .enumerate()
                    .map(|(i, v)| {
                        let (s, p) = (s.clone(), Path::from(format!("{run}/raw/c{i}")));
                        tokio::spawn(async move { s.put(&p, v.into()).await.unwrap() })
                    })
                    .collect();
                for t in tasks {
                    t.await.unwrap();
                }
            }],
        );
        (n as u64, (n * one) as u64)
    };
    paired(
        "16 concurrent puts of 1 MiB",
        "Store::put ×16",
        "put ×16",
        rounds(10),
        &mut a,
        &mut b,
    );

    // verify of 48 blobs of 1 MiB in a store of their own, against GET +
    // BLAKE3 of the same objects, two at a time (verify's default jobs).
    let vloc = S3Location::new(&bucket, &format!("{run}/verify")).unwrap();
    let vstore = rt
        .block_on(Store::open_dir_with(
            dir.path().join("verify"),
            DirOptions::new().large_s3(S3Options::new(vloc)),
        ))
        .unwrap();
    let count = 48u64;
    let mut vkeys = Vec::new();
    for _ in 0..count {
        vkeys.push(rt.block_on(vstore.put(fresh(1 << 20))).unwrap().key);
    }
    let paths: Vec<Path> = vkeys
        .iter()
        .map(|k| {
            let hex = k.to_string();
            Path::from(format!("{run}/verify/blobs/{}/{hex}", &hex[..2]))
        })
        .collect();
    header("verify of 48 s3 blobs of 1 MiB (embedded, Garage) vs GET + BLAKE3 of every object");
    let mut a = |lat: &mut Lat| {
        let r = lat.time(|| rt.block_on(vstore.verify()).unwrap());
        assert!(r.is_clean() && r.checked == count, "{r:?}");
        (count, r.bytes)
    };
    let mut b = |lat: &mut Lat| {
        lat.time(|| {
            rt.block_on(async {
                use futures::StreamExt;
                let got: Vec<u64> = futures::stream::iter(paths.iter().zip(&vkeys))
                    .map(|(p, k)| {
                        let s = raw.clone();
                        async move {
                            let v = s.get(p).await.unwrap().bytes().await.unwrap();
                            assert_eq!(blake3::hash(&v).as_bytes(), k.as_bytes());
                            v.len() as u64
                        }
                    })
                    .buffer_unordered(2)
                    .collect()
                    .await;
                (got.len() as u64, got.iter().sum())
            })
        })
    };
    paired(
        "verify s3 objects",
        "alkblobs verify",
        "GET + BLAKE3",
        rounds(5),
        &mut a,
        &mut b,
    );
    rt.block_on(vstore.close()).unwrap();

    probes.take("after s3", dir.path());
    probes.verdict();
}
