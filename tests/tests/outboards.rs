//! Verified ranged reads against a lying large engine: flipped bytes,
//! truncated reads, another blob's bytes, wrong outboards and failing
//! transfers. Each is caught at the right offset or read around, never
//! returned as the blob's bytes.

use std::sync::{Arc, Mutex};

use alkblobs::backend::mem::MemBackend;
use alkblobs::backend::{
    Backend, BlobReader, KeyStream, LargeBackend, PutOutcome, Sharing, StagedWrite,
};
use alkblobs::{Error, Key, RangeCheck, Result, Store};
use alkblobs_tests::data;
use async_trait::async_trait;
use bytes::Bytes;
use tokio::io::AsyncReadExt;

const GROUP: u64 = 16 * 1024;

/// What the engine does to what it returns.
#[derive(Debug, Clone, Default)]
enum Lie {
    #[default]
    None,
    /// Flips the blob's byte at this offset in every read covering it.
    Flip(u64),
    /// Returns this many bytes fewer than asked for.
    Truncate(usize),
    /// Answers every read from these bytes instead (same length).
    Other(Bytes),
    /// Answers every outboard read from this outboard instead.
    Outboard(Bytes),
    /// Another blob's bytes and its own outboard: consistent, under the
    /// wrong key.
    OtherWithOutboard(Bytes, Bytes),
    /// Fails this many reads, then tells the truth.
    Fail(usize),
}

/// A large engine over `mem` that lies as told.
#[derive(Debug, Clone, Default)]
struct Lying {
    inner: MemBackend,
    lie: Arc<Mutex<Lie>>,
}

impl Lying {
    fn set(&self, lie: Lie) {
        *self.lie.lock().unwrap() = lie;
    }

    fn lie(&self) -> Lie {
        self.lie.lock().unwrap().clone()
    }
}

impl std::fmt::Display for Lying {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("lying")
    }
}

#[async_trait]
impl Backend for Lying {
    fn name(&self) -> &str {
        "lying"
    }
    fn sharing(&self) -> Sharing {
        Sharing::Process
    }
    async fn has(&self, key: &Key) -> Result<bool> {
        self.inner.has(key).await
    }
    async fn get(&self, key: &Key) -> Result<Option<Bytes>> {
        self.inner.get(key).await
    }
    async fn put(&self, key: &Key, value: Bytes) -> Result<PutOutcome> {
        self.inner.put(key, value).await
    }
    async fn delete(&self, key: &Key) -> Result<Option<u64>> {
        self.inner.delete(key).await
    }
    fn list(&self) -> KeyStream<'_> {
        self.inner.list()
    }
    async fn size(&self, key: &Key) -> Result<Option<u64>> {
        self.inner.size(key).await
    }
}

#[async_trait]
impl LargeBackend for Lying {
    async fn begin_write(&self) -> Result<Box<dyn StagedWrite + '_>> {
        self.inner.begin_write().await
    }
    async fn open_read(&self, key: &Key) -> Result<Option<BlobReader>> {
        let size = self.inner.size(key).await?.unwrap_or(0);
        Ok(self
            .read_range(key, 0, size)
            .await?
            .map(|b| Box::pin(std::io::Cursor::new(b)) as BlobReader))
    }
    async fn read_range(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        let lie = self.lie();
        if let Lie::Fail(n) = lie
            && n > 0
        {
            self.set(Lie::Fail(n - 1));
            return Err(Error::Unavailable {
                engine: "lying".into(),
                source: "connection reset mid-transfer".into(),
            });
        }
        let Some(b) = self.inner.read_range(key, offset, len).await? else {
            return Ok(None);
        };
        Ok(Some(match lie {
            Lie::Flip(at) if (offset..offset + b.len() as u64).contains(&at) => {
                let mut v = b.to_vec();
                v[(at - offset) as usize] ^= 0x01;
                v.into()
            }
            Lie::Truncate(n) => b.slice(..b.len().saturating_sub(n)),
            Lie::Other(other) | Lie::OtherWithOutboard(other, _) => {
                other.slice(offset as usize..offset as usize + b.len())
            }
            _ => b,
        }))
    }
    async fn read_outboard(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
        match self.lie() {
            Lie::Outboard(ob) | Lie::OtherWithOutboard(_, ob) => {
                let end = (offset + len).min(ob.len() as u64);
                Ok(Some(ob.slice(offset.min(end) as usize..end as usize)))
            }
            _ => self.inner.read_outboard(key, offset, len).await,
        }
    }
    async fn put_outboard(&self, key: &Key, outboard: Bytes) -> Result<bool> {
        self.inner.put_outboard(key, outboard).await
    }
}

async fn store_with(engine: &Lying) -> Store {
    Store::builder()
        .kv(MemBackend::new())
        .large(engine.clone())
        .build()
        .unwrap()
}

fn corrupt_at(r: Result<Option<Bytes>>) -> u64 {
    match r {
        Err(Error::CorruptAt { offset, .. }) => offset,
        other => panic!("expected CorruptAt, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_is_caught_at_its_group_and_only_there() {
    let engine = Lying::default();
    let store = store_with(&engine).await;
    let value = data(1, 1_000_000);
    let key = store.put(value.clone()).await.unwrap().key;
    let flip = 500_000;
    engine.set(Lie::Flip(flip));
    let group = flip / GROUP * GROUP;
    // A range covering it, one starting inside its group, and a stream.
    assert_eq!(
        corrupt_at(store.get_range_verified(&key, 400_000, 200_000).await),
        group
    );
    assert_eq!(
        corrupt_at(store.get_range_verified(&key, flip - 3, 1).await),
        group
    );
    let mut r = store
        .open_range_verified(&key, 0, 1_000_000)
        .await
        .unwrap()
        .unwrap();
    let mut got = Vec::new();
    let e = r.read_to_end(&mut got).await.unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
    assert!(e.to_string().contains(&format!("from byte {group}")), "{e}");
    assert!(
        got.len() as u64 <= group,
        "no byte of the damaged group was returned"
    );
    assert!(got == value[..got.len()]);
    // Ranges whose groups do not include it read fine.
    let before = store
        .get_range_verified(&key, 0, group)
        .await
        .unwrap()
        .unwrap();
    assert!(before == value[..group as usize]);
    let after = store
        .get_range_verified(&key, group + GROUP, 10_000)
        .await
        .unwrap()
        .unwrap();
    assert!(after == value[(group + GROUP) as usize..(group + GROUP + 10_000) as usize]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_reads_and_another_blobs_bytes_are_caught() {
    let engine = Lying::default();
    let store = store_with(&engine).await;
    let value = data(2, 700_000);
    let key = store.put(value.clone()).await.unwrap().key;

    engine.set(Lie::Truncate(100));
    let at = corrupt_at(store.get_range_verified(&key, 100_000, 50_000).await);
    let read_end = (100_000 + 50_000u64).div_ceil(GROUP) * GROUP;
    assert_eq!(at, read_end - 100, "damaged from where the body ended");

    // Another blob of the same length, served in its place.
    let other = data(3, 700_000);
    engine.set(Lie::Other(Bytes::from(other.clone())));
    assert_eq!(
        corrupt_at(store.get_range_verified(&key, 300_000, 1000).await),
        300_000 / GROUP * GROUP
    );
    // ...with its own outboard too: nothing verifies under this key, and
    // the fallback (the whole blob) says so.
    let (_, other_ob) = alkblobs::outboard::of(&other);
    engine.set(Lie::OtherWithOutboard(
        Bytes::from(other),
        Bytes::from(other_ob),
    ));
    match store.get_range_verified(&key, 300_000, 1000).await {
        Err(Error::CorruptAt { .. } | Error::Corrupt { .. }) => {}
        other => panic!("another blob's bytes passed: {other:?}"),
    }
    engine.set(Lie::None);
    assert!(
        store
            .get_range_verified(&key, 300_000, 1000)
            .await
            .unwrap()
            .unwrap()
            == value[300_000..301_000]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_outboard_is_read_around_with_the_right_bytes() {
    let engine = Lying::default();
    let store = store_with(&engine).await;
    let value = data(4, 2_000_000);
    let key = store.put(value.clone()).await.unwrap().key;
    let (_, mut ob) = alkblobs::outboard::of(&value);
    for i in (0..ob.len()).step_by(97) {
        ob[i] ^= 0x80;
    }
    engine.set(Lie::Outboard(Bytes::from(ob)));
    for (off, len) in [(0, 10), (1_000_000, 300_000), (1_999_990, 10)] {
        let got = store
            .get_range_verified(&key, off, len)
            .await
            .unwrap()
            .unwrap();
        assert!(
            got == value[off as usize..(off + len) as usize],
            "{off}+{len}"
        );
    }
    // A short outboard too.
    engine.set(Lie::Outboard(Bytes::from_static(&[0u8; 64])));
    let got = store.get_range_verified(&key, 5, 5).await.unwrap().unwrap();
    assert!(got == value[5..10]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_transfer_fails_cleanly_and_a_retry_succeeds() {
    let engine = Lying::default();
    let store = store_with(&engine).await;
    let value = data(5, 900_000);
    let key = store.put(value.clone()).await.unwrap().key;
    engine.set(Lie::Fail(1));
    match store.get_range_verified(&key, 10, 100_000).await {
        Err(e) => assert!(e.is_retryable(), "{e}"),
        Ok(v) => panic!("a failed transfer returned {v:?}"),
    }
    let got = store
        .get_range_verified(&key, 10, 100_000)
        .await
        .unwrap()
        .unwrap();
    assert!(got == value[10..100_010]);
    // Mid-stream: the reader fails, a new one reads it all.
    engine.set(Lie::Fail(0));
    let mut r = store
        .open_range_verified(&key, 0, 900_000)
        .await
        .unwrap()
        .unwrap();
    let mut got = Vec::new();
    r.read_to_end(&mut got).await.unwrap();
    assert!(got == value);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_without_an_outboard_reads_verified_until_repaired() {
    let engine = Lying::default();
    let store = store_with(&engine).await;
    let value = data(6, 3_000_000);
    let key = Key::of(&value);
    // An engine-level put, as before outboards: none is stored.
    engine
        .inner
        .put(&key, Bytes::from(value.clone()))
        .await
        .unwrap();
    assert_eq!(
        store.range_check(&key).await.unwrap(),
        Some(RangeCheck::WholeBlob)
    );
    let got = store
        .get_range_verified(&key, 2_000_000, 4096)
        .await
        .unwrap()
        .unwrap();
    assert!(got == value[2_000_000..2_004_096]);
    // Damage is still caught (by the whole blob's hash).
    engine.set(Lie::Flip(10));
    assert!(matches!(
        store.get_range_verified(&key, 2_000_000, 4096).await,
        Err(Error::Corrupt { .. })
    ));
    engine.set(Lie::None);
    let report = store.verify().await.unwrap();
    assert_eq!(report.outboards_missing, 1);
    let report = store
        .verify_with_options(
            alkblobs::VerifyOptions::default().repair_outboards(true),
            |_| {},
        )
        .await
        .unwrap();
    assert_eq!(report.outboards_repaired, 1);
    assert_eq!(
        store.range_check(&key).await.unwrap(),
        Some(RangeCheck::Outboard)
    );
    engine.set(Lie::Flip(2_000_100));
    assert_eq!(
        corrupt_at(store.get_range_verified(&key, 2_000_000, 4096).await),
        2_000_100 / GROUP * GROUP
    );
}
