//! `verify` over a pool's record of what must exist, driven by a record
//! the test controls (no server): a key the record named when the page was
//! read, whose content is then gone, is missing only if the record still
//! says it must exist when it is looked up again — a sweep that deleted it
//! in between is no loss. Also: a record that keeps naming it is a loss,
//! and the outcome reaches the record.

use std::sync::{Arc, Mutex};

use alkblobs::backend::mem::MemBackend;
use alkblobs::record::{Held, PoolRecord, Record, VerifyOutcome};
use alkblobs::{Key, Result, Store};
use async_trait::async_trait;

/// A record whose page names `keys` as published files, and whose
/// lookups answer from `now` (what the record says by the re-check).
#[derive(Debug, Default)]
struct Scripted {
    keys: Vec<Key>,
    now: Mutex<Vec<Key>>,
    outcome: Mutex<Option<VerifyOutcome>>,
    /// A key the first page leaves out (deleted between the statement that
    /// picked the page and the one that described it): a short page.
    drop_once: Mutex<Option<Key>>,
}

fn file(k: &Key) -> Record {
    Record {
        key: k.as_bytes().to_vec(),
        held: Some(Held::File { generation: 0 }),
        size: None,
        refs: vec!["liveness app.refs".into()],
    }
}

#[async_trait]
impl PoolRecord for Scripted {
    async fn page(&self, after: Option<&[u8]>, limit: usize) -> Result<Vec<Record>> {
        let mut keys = self.keys.clone();
        keys.sort();
        let dropped = self.drop_once.lock().unwrap().take();
        Ok(keys
            .iter()
            .filter(|k| after.is_none_or(|a| k.as_bytes().as_slice() > a))
            .take(limit)
            .filter(|k| Some(**k) != dropped)
            .map(file)
            .collect())
    }
    async fn lookup(&self, keys: &[Vec<u8>], _refs: bool) -> Result<Vec<Record>> {
        let now = self.now.lock().unwrap();
        let mut out: Vec<Record> = now
            .iter()
            .filter(|k| keys.iter().any(|x| x.as_slice() == k.as_bytes().as_slice()))
            .map(file)
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }
    async fn unchecked_sources(&self) -> Result<Vec<(String, String)>> {
        Ok(Vec::new())
    }
    fn tier_recorded(&self) -> bool {
        true
    }
    fn large_indexed(&self) -> bool {
        true
    }
    async fn finished(&self, outcome: &VerifyOutcome) -> Result<bool> {
        *self.outcome.lock().unwrap() = Some(*outcome);
        Ok(true)
    }
}

#[tokio::test]
async fn a_sweep_racing_verify_is_not_a_loss() {
    let held = Key::from_hash(blake3::hash(b"held"));
    let swept = Key::from_hash(blake3::hash(b"swept meanwhile"));
    let lost = Key::from_hash(blake3::hash(b"lost"));
    let record = Arc::new(Scripted {
        keys: vec![held, swept, lost],
        // By the re-check a sweep has deleted `swept` and its record; the
        // record still names `lost`.
        now: Mutex::new(vec![held, lost]),
        ..Scripted::default()
    });
    let store = Store::builder()
        .kv(MemBackend::new())
        .large(MemBackend::new())
        .threshold(1)
        .record(record.clone())
        .build()
        .unwrap();
    let _ = store.put(bytes::Bytes::from_static(b"held")).await.unwrap();
    let report = store.verify().await.unwrap();
    assert_eq!(report.checked, 1, "{report:?}");
    assert_eq!(report.vanished, 1, "{report:?}");
    let missing: Vec<Key> = report.missing.iter().map(|m| m.key).collect();
    assert_eq!(missing, vec![lost], "{report:?}");
    assert_eq!(
        report.missing[0].referenced_by,
        vec!["liveness app.refs".to_owned()]
    );
    let o = record
        .outcome
        .lock()
        .unwrap()
        .expect("the outcome reached the record");
    assert_eq!((o.whole, o.checked, o.missing, o.corrupt), (true, 1, 1, 0));
}

/// Many pages, one of them short in the middle (a key deleted between the
/// two statements that read a page): the walk goes on to the empty page,
/// every key once; `after` resumes past a key, `until` stops at one.
#[tokio::test]
async fn the_walk_goes_on_past_a_short_page_and_honours_its_bounds() {
    let values: Vec<Vec<u8>> = (0..25u32)
        .map(|i| format!("value {i}").into_bytes())
        .collect();
    let mut keys: Vec<Key> = values.iter().map(|v| Key::of(v)).collect();
    keys.sort();
    let record = Arc::new(Scripted {
        keys: keys.clone(),
        now: Mutex::new(keys.clone()),
        drop_once: Mutex::new(Some(keys[3])),
        ..Scripted::default()
    });
    let store = Store::builder()
        .kv(MemBackend::new())
        .large(MemBackend::new())
        .threshold(1)
        .record(record.clone())
        .build()
        .unwrap();
    for v in &values {
        let _ = store.put(v.clone()).await.unwrap();
    }
    let opts = alkblobs::VerifyOptions::default().page(10);
    let report = store.verify_with_options(opts, |_| {}).await.unwrap();
    assert!(report.is_clean() && report.whole, "{report:?}");
    assert_eq!(
        report.checked, 24,
        "every key but the one dropped: {report:?}"
    );
    let slice = store
        .verify_with_options(opts.after(Some(keys[4])).until(Some(keys[20])), |_| {})
        .await
        .unwrap();
    assert!(!slice.whole && slice.checked == 16, "{slice:?}");
}
