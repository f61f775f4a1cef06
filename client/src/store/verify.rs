//! Verification: verified reads (whole and streaming) and the scrub that
//! checks the pool against its record of what must exist (a PostgreSQL
//! pool's database; an embedded store's engines and roots).

use std::collections::HashMap;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};

use super::{Store, Tier};
use crate::backend::{Backend, BlobReader};
use crate::integrity::hash::hash;
use crate::record::{AbandonedUpload, Held, PoolRecord, Record};
use crate::{Error, Key, Result, outboard};

/// One damaged entry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CorruptEntry {
    /// The entry.
    pub key: Key,
    /// Its tier.
    pub tier: Tier,
    /// What was found.
    pub detail: String,
}

/// A key whose content must be there and is not: recorded by the pool (an
/// entry, a published file) or referenced (a root, a liveness row), and
/// re-checked against the record before it was reported.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MissingEntry {
    /// The key.
    pub key: Key,
    /// What references it: `root`, or `liveness <table>`; empty when only
    /// the pool's record names it.
    pub referenced_by: Vec<String>,
    /// What the pool records for it (`None`: only references name it).
    pub recorded: Option<Held>,
}

/// A key of the record that is not a key (a liveness row of the wrong
/// length): named, never checked.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MalformedKey {
    /// The value, in hex.
    pub value: String,
    /// What holds it.
    pub referenced_by: Vec<String>,
}

/// A reference this verify could not check; see [`VerifyReport::unchecked_sources`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct UncheckedSource {
    /// The source, e.g. `liveness app.refs`.
    pub source: String,
    /// Why it was not read.
    pub problem: String,
}

/// The outcome of [`Store::verify`].
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct VerifyReport {
    /// Entries re-hashed (corrupt ones included).
    pub checked: u64,
    /// Bytes re-hashed (corrupt ones included).
    pub bytes: u64,
    /// Entries whose content or recorded size does not match their key.
    pub corrupt: Vec<CorruptEntry>,
    /// Keys whose content must be there and is gone: recorded by a
    /// PostgreSQL pool or referenced (a root, a liveness row), content
    /// absent. An embedded store's large tier is its own index, so there
    /// only a root without content is missing.
    pub missing: Vec<MissingEntry>,
    /// Keys the record or a reference names that are not keys.
    pub malformed: Vec<MalformedKey>,
    /// Objects of the large tier that no record names (a pool whose tier
    /// records each object: a fleet's `local` or `s3`): left by a crash,
    /// or by a loss of the database's rows. Not an integrity failure; the
    /// pool's next audit stages them (`alkblobs_request_audit`), and they
    /// go a delete window later.
    pub unrecorded: Vec<Key>,
    /// Large objects a PostgreSQL pool created for uploads that ended
    /// without becoming an entry: no entry references them. Not an
    /// integrity failure; the pool's next sweep unlinks them.
    pub abandoned_uploads: Vec<AbandonedUpload>,
    /// Keys listed but gone by the time they were read (a concurrent
    /// sweep), or recorded and gone but no longer recorded at the re-check;
    /// not an error.
    pub vanished: u64,
    /// Keys with a file record not yet published (a put in flight) or
    /// being deleted (a tombstone): not checked, not missing.
    pub in_flight: u64,
    /// Keys named only by liveness tables registered with forward
    /// references and not put yet: not missing.
    pub forward: u64,
    /// Recorded keys this store cannot read (a kv-only node of a pool
    /// with a large tier): not checked, so the run is not whole.
    pub skipped: u64,
    /// References that could not be checked (a liveness table the caller
    /// may not read, or that fails validation): a key only they name is
    /// not checked.
    pub unchecked_sources: Vec<UncheckedSource>,
    /// Whether the whole pool was verified (not a slice of it).
    pub whole: bool,
    /// Whether the outcome was kept in the pool's database (a PostgreSQL
    /// pool keeps the runs of roles with sweep access, which
    /// `alkblobs_health` reads).
    pub recorded: bool,
    /// Large blobs whose content is intact but that have no outboard
    /// (stored before outboards existed): their ranges are verified by
    /// reading them whole until [`VerifyOptions::repair_outboards`].
    pub outboards_missing: u64,
    /// Large blobs whose content is intact but whose stored outboard is
    /// not theirs (damaged): the same, until repaired.
    pub outboards_damaged: u64,
    /// Outboards stored by this pass ([`VerifyOptions::repair_outboards`]).
    pub outboards_repaired: u64,
}

/// How [`Store::verify_with_options`] runs.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct VerifyOptions {
    /// Store the outboard of every intact large blob that has none or a
    /// damaged one (computed in the same pass that re-hashes it). Needs a
    /// writable store.
    pub repair_outboards: bool,
    /// Blobs read and hashed at once (at least 1).
    pub jobs: usize,
    /// Verify only keys after this one (a resumed or sliced run).
    pub after: Option<Key>,
    /// Verify only keys up to this one, inclusive.
    pub until: Option<Key>,
    /// Keys of a pool's record read per page (1 to 10,000).
    pub page: usize,
}

impl Default for VerifyOptions {
    fn default() -> Self {
        VerifyOptions {
            repair_outboards: false,
            jobs: 2,
            after: None,
            until: None,
            page: 1000,
        }
    }
}

impl VerifyOptions {
    /// Repairs missing and damaged outboards.
    pub fn repair_outboards(mut self, yes: bool) -> Self {
        self.repair_outboards = yes;
        self
    }

    /// Blobs read and hashed at once.
    pub fn jobs(mut self, jobs: usize) -> Self {
        self.jobs = jobs.max(1);
        self
    }

    /// Only keys after `key` (exclusive): resume after the last key a run
    /// reached.
    pub fn after(mut self, key: Option<Key>) -> Self {
        self.after = key;
        self
    }

    /// Only keys up to `key` (inclusive).
    pub fn until(mut self, key: Option<Key>) -> Self {
        self.until = key;
        self
    }

    /// Keys of a pool's record read per page (clamped to 1..=10,000).
    pub fn page(mut self, keys: usize) -> Self {
        self.page = keys.clamp(1, 10_000);
        self
    }

    fn whole(&self) -> bool {
        self.after.is_none() && self.until.is_none()
    }

    fn in_range(&self, key: &[u8]) -> bool {
        self.after.is_none_or(|a| key > a.as_bytes().as_slice())
            && self.until.is_none_or(|u| key <= u.as_bytes().as_slice())
    }
}

impl VerifyReport {
    /// True when nothing is corrupt or missing.
    pub fn is_clean(&self) -> bool {
        self.corrupt.is_empty() && self.missing.is_empty()
    }
}

/// Progress of a verify pass.
#[derive(Debug, Clone, Copy)]
pub struct VerifyProgress {
    /// Entries re-hashed so far.
    pub checked: u64,
    /// Bytes re-hashed so far.
    pub bytes: u64,
    /// The last key reached (a run stopped here resumes with
    /// [`VerifyOptions::after`]).
    pub at: Option<Key>,
}

enum Check {
    Ok(u64, Outboard),
    Vanished,
    /// The bytes read, and what was wrong.
    Corrupt(u64, String),
    /// Recorded, content gone ([`Error::Lost`] from the engine).
    Lost,
}

/// A large blob's stored outboard against the one its bytes give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outboard {
    /// Right (or a kv entry, which needs none).
    Good,
    Missing,
    Damaged,
}

/// A kv value against its key and its recorded length. A kv value is at
/// most the threshold and arrives whole: hashed as it is (no reader, no
/// buffer: a 1 MiB buffer zeroed per key cost more than the hashing of
/// small values).
fn check_value(key: &Key, recorded: u64, v: &[u8]) -> Check {
    let n = v.len() as u64;
    let actual = Key::from_hash(blake3::hash(v));
    if actual != *key {
        return Check::Corrupt(n, format!("content ({n} bytes) hashes to {actual}"));
    }
    if n != recorded {
        return Check::Corrupt(
            n,
            format!("recorded size is {recorded} bytes but the content has {n}"),
        );
    }
    Check::Ok(n, Outboard::Good)
}

/// Re-hashes one entry of `tier`, streaming large ones; a large one's
/// outboard is checked too, and stored if `repair` and it is missing or
/// damaged. `generation`: the object generation a fleet's file record
/// names, which the tier must hold (another generation holding the same
/// bytes does not stand in for it: a late delete may still remove it).
async fn check(
    store: &Store,
    tier: Tier,
    key: &Key,
    generation: Option<u64>,
    repair: bool,
) -> Result<Check> {
    let engine: &dyn Backend = match tier {
        Tier::Kv => store.kv().as_ref(),
        Tier::Large => store.large_engine()?.as_ref(),
    };
    let lost = |e: Error| match e {
        Error::Lost { .. } => Ok(Check::Lost),
        e => Err(e),
    };
    let size = match (tier, generation) {
        (Tier::Large, Some(g)) => store.large_engine()?.generation_size(key, g).await,
        _ => engine.size(key).await,
    };
    let recorded = match size {
        Ok(Some(n)) => n,
        Ok(None) => return Ok(Check::Vanished),
        Err(e) => return lost(e),
    };
    if tier == Tier::Kv {
        return match engine.get(key).await {
            Ok(Some(v)) => Ok(check_value(key, recorded, &v)),
            Ok(None) => Ok(Check::Vanished),
            Err(e) => lost(e),
        };
    }
    // One pass gives the key and, for a large blob, the outboard to hold
    // the stored one against.
    let (actual, n, computed) = match store.large_engine()?.digest(key, recorded).await {
        Ok(Some(outboard::Digest::Whole {
            hash,
            len,
            outboard,
        })) => (hash, len, outboard),
        Ok(Some(outboard::Digest::Unreadable { after, error })) => {
            return Ok(Check::Corrupt(
                after,
                format!("unreadable after {after} bytes: {error}"),
            ));
        }
        Ok(None) => return Ok(Check::Vanished),
        Err(e) => return lost(e),
    };
    if actual != *key {
        let mut detail = format!("content ({n} bytes) hashes to {actual}");
        if tier == Tier::Large
            && let Some(at) = first_bad_offset(store, key).await
        {
            detail.push_str(&format!(
                "; the first damaged 16 KiB group starts at byte {at}"
            ));
        }
        return Ok(Check::Corrupt(n, detail));
    }
    if n != recorded {
        return Ok(Check::Corrupt(
            n,
            format!("recorded size is {recorded} bytes but the content has {n}"),
        ));
    }
    if tier == Tier::Kv || computed.is_empty() {
        return Ok(Check::Ok(n, Outboard::Good));
    }
    let large = store.large_engine()?;
    // (Under the engine's outboard floor a blob has none, by design.)
    if n <= large.outboard_floor() {
        return Ok(Check::Ok(n, Outboard::Good));
    }
    let stored = match large.read_outboard(key, 0, computed.len() as u64).await {
        Ok(Some(b)) if b[..] == computed[..] => Outboard::Good,
        Ok(Some(_)) | Err(Error::InvalidRange { .. }) => Outboard::Damaged,
        Ok(None) => Outboard::Missing,
        Err(e) => return Err(e),
    };
    if stored != Outboard::Good && repair {
        large.put_outboard(key, computed.into()).await?;
    }
    Ok(Check::Ok(n, stored))
}

/// Where a corrupt large blob's damage starts, found through its stored
/// outboard (window by window, stopping at the first bad one); `None`
/// when it has no usable outboard.
async fn first_bad_offset(store: &Store, key: &Key) -> Option<u64> {
    let large = store.large_engine().ok()?;
    let size = large.size(key).await.ok()??;
    // Only with a stored outboard: the fallback would compute one from the
    // damaged bytes, which locates nothing.
    large
        .read_outboard(key, 0, outboard::outboard_len(size))
        .await
        .ok()??;
    let mut r = store.open_range_verified(key, 0, size).await.ok()??;
    let mut sink = vec![0u8; 1 << 20];
    loop {
        match r.read(&mut sink).await {
            Ok(0) => return None,
            Ok(_) => {}
            Err(e) => {
                return match e.into_inner()?.downcast::<Error>() {
                    Ok(err) => match *err {
                        Error::CorruptAt { offset, .. } => Some(offset),
                        _ => None,
                    },
                    Err(_) => None,
                };
            }
        }
    }
}

impl Store {
    /// Like [`Store::get`], re-hashing the bytes: corruption is
    /// [`Error::Corrupt`], blaming the engine that answered.
    pub async fn get_verified(&self, key: &Key) -> Result<Option<Bytes>> {
        self.check_open()?;
        let Some((v, tier)) = self.first(self.kv().get(key), |l| l.get(key)).await? else {
            self.absent_unless_lost(key).await?;
            return Ok(None);
        };
        let actual = hash(&v).await;
        if actual != *key {
            let engine = match tier {
                Tier::Kv => self.kv().to_string(),
                Tier::Large => self.large_engine()?.to_string(),
            };
            return Err(Error::Corrupt {
                key: *key,
                engine,
                detail: format!("content hashes to {actual}"),
            });
        }
        Ok(Some(v))
    }

    /// A streaming reader that re-hashes as it goes: if the content does not
    /// match the key, the read that reaches the end fails with
    /// `io::ErrorKind::InvalidData` instead of returning end-of-file.
    pub async fn open_read_verified(&self, key: &Key) -> Result<Option<BlobReader>> {
        Ok(self.open_read(key).await?.map(|inner| {
            Box::pin(VerifyingReader {
                inner,
                hasher: blake3::Hasher::new(),
                expected: *key,
            }) as BlobReader
        }))
    }

    /// Re-hashes every blob the store must hold (streaming large ones) and
    /// names what is corrupt or missing; see [`Store::verify_with_options`].
    pub async fn verify(&self) -> Result<VerifyReport> {
        self.verify_with(|_| {}).await
    }

    /// [`Store::verify`] with a progress callback.
    pub async fn verify_with(&self, progress: impl Fn(VerifyProgress)) -> Result<VerifyReport> {
        self.verify_with_options(VerifyOptions::default(), progress)
            .await
    }

    /// [`Store::verify`] with options (repairing outboards, parallel reads,
    /// a slice of the key space) and a progress callback.
    ///
    /// A store whose pool keeps a record of what must exist (a PostgreSQL
    /// pool, single-instance or fleet: [`Store::record`]) walks that
    /// record, in key order, a page at a time: every recorded key is read
    /// and hashed, and a recorded or referenced key whose content is gone
    /// is [`VerifyReport::missing`] — re-checked against the record first,
    /// so a put in flight or a key a sweep is deleting is not — and the run
    /// goes on to the end. Then, where the tier records each object, its
    /// listing is compared with the record ([`VerifyReport::unrecorded`]).
    /// The outcome is kept in the pool's database (`alkblobs_health`).
    ///
    /// An embedded store has no such record: its engines' listings are
    /// its index, and only a root without content can be missing.
    pub async fn verify_with_options(
        &self,
        opts: VerifyOptions,
        progress: impl Fn(VerifyProgress),
    ) -> Result<VerifyReport> {
        self.check_open()?;
        let mut report = VerifyReport {
            whole: opts.whole(),
            ..VerifyReport::default()
        };
        match self.inner.record.clone() {
            Some(record) => {
                let started = record.clock().await?;
                self.verify_record(record.as_ref(), &opts, &progress, &mut report)
                    .await?;
                // A source may have failed while the walk read it.
                for (source, problem) in record.unchecked_sources().await? {
                    if !report.unchecked_sources.iter().any(|u| u.source == source) {
                        report
                            .unchecked_sources
                            .push(UncheckedSource { source, problem });
                    }
                }
                if !record.large_indexed() && self.large().is_some() {
                    self.verify_large_listing(&opts, &progress, &mut report)
                        .await?;
                }
                if record.tier_recorded() && self.large().is_some() {
                    self.find_unrecorded(record.as_ref(), &opts, &mut report)
                        .await?;
                }
                report.abandoned_uploads = record.abandoned_uploads().await?;
                // Not whole if part of the record could not be read here.
                report.whole &= report.skipped == 0 && report.unchecked_sources.is_empty();
                report.recorded = record
                    .finished(&crate::record::VerifyOutcome {
                        started,
                        whole: report.whole,
                        checked: report.checked,
                        bytes: report.bytes,
                        missing: report.missing.len() as u64,
                        corrupt: report.corrupt.len() as u64,
                        unrecorded: (report.unrecorded.len() + report.abandoned_uploads.len())
                            as u64,
                    })
                    .await?;
            }
            None => self.verify_listings(&opts, &progress, &mut report).await?,
        }
        Ok(report)
    }

    /// An embedded store: every entry its engines list, then every root.
    async fn verify_listings(
        &self,
        opts: &VerifyOptions,
        progress: &impl Fn(VerifyProgress),
        report: &mut VerifyReport,
    ) -> Result<()> {
        // The kv tier in one scan of its rows (key, length and value a page
        // at a time): a lookup per key cost a third of the run.
        let mut entries = self
            .kv()
            .scan(opts.after)
            .try_take_while(|(k, _, _)| std::future::ready(Ok(opts.in_range(k.as_bytes()))));
        while let Some((key, recorded, value)) = entries.try_next().await? {
            tally(
                report,
                Tier::Kv,
                key,
                check_value(&key, recorded, &value),
                opts,
            );
            progress(VerifyProgress {
                checked: report.checked,
                bytes: report.bytes,
                at: Some(key),
            });
        }
        drop(entries);
        if self.large().is_some() {
            let tier = Tier::Large;
            let keys = self.large_engine()?.list();
            let checks = keys
                .try_filter(|k| std::future::ready(opts.in_range(k.as_bytes())))
                .map_ok(|key| async move {
                    let c = check(self, tier, &key, None, opts.repair_outboards).await?;
                    Ok::<_, Error>((key, c))
                })
                .try_buffered(opts.jobs.max(1));
            futures::pin_mut!(checks);
            while let Some((key, c)) = checks.try_next().await? {
                if let Some(Check::Lost | Check::Vanished) = tally(report, tier, key, c, opts) {
                    report.vanished += 1;
                }
                progress(VerifyProgress {
                    checked: report.checked,
                    bytes: report.bytes,
                    at: Some(key),
                });
            }
        }
        let mut roots = self.roots();
        while let Some(root) = roots.try_next().await? {
            if opts.in_range(root.as_bytes()) && !self.has(&root).await? {
                report.missing.push(MissingEntry {
                    key: root,
                    referenced_by: vec!["root".to_owned()],
                    recorded: None,
                });
            }
        }
        Ok(())
    }

    /// A pool with a record: walk it, page by page, until a page comes
    /// back empty (a page can be short in the middle: its keys are picked
    /// and described by two statements, and a key a sweep deleted between
    /// them drops out) or passes `until`.
    async fn verify_record(
        &self,
        record: &dyn PoolRecord,
        opts: &VerifyOptions,
        progress: &impl Fn(VerifyProgress),
        report: &mut VerifyReport,
    ) -> Result<()> {
        report.unchecked_sources = record
            .unchecked_sources()
            .await?
            .into_iter()
            .map(|(source, problem)| UncheckedSource { source, problem })
            .collect();
        let mut after: Option<Vec<u8>> = opts.after.map(|k| k.as_bytes().to_vec());
        loop {
            let page = record.page(after.as_deref(), opts.page).await?;
            let Some(last) = page.last() else {
                return Ok(());
            };
            after = Some(last.key.clone());
            let past_end = |r: &Record| {
                opts.until
                    .is_some_and(|u| r.key.as_slice() > u.as_bytes().as_slice())
            };
            let done = page.last().is_some_and(past_end);
            let page: Vec<Record> = page.into_iter().filter(|r| !past_end(r)).collect();
            // The page's kv entries in one read (a size and a get per key
            // cost a round trip each), then each record's content, `jobs`
            // at a time, in key order.
            let kv_keys: Vec<Key> = page
                .iter()
                .filter(|r| matches!(r.held, Some(Held::Kv)))
                .filter_map(Record::key)
                .collect();
            let kv_values: HashMap<Key, Option<(u64, Bytes)>> = kv_keys
                .iter()
                .copied()
                .zip(self.kv().get_many(&kv_keys).await?)
                .collect();
            let kv_values = &kv_values;
            let indexed = record.large_indexed();
            let checks = futures::stream::iter(page.into_iter().map(|r| async move {
                let c = self.check_record(&r, opts, indexed, kv_values).await?;
                Ok::<_, Error>((r, c))
            }))
            .buffered(opts.jobs.max(1));
            futures::pin_mut!(checks);
            let mut suspects: Vec<Vec<u8>> = Vec::new();
            while let Some((r, c)) = checks.try_next().await? {
                match (r.key(), c) {
                    (None, _) => report.malformed.push(MalformedKey {
                        value: hex(&r.key),
                        referenced_by: r.refs.clone(),
                    }),
                    (Some(_), RecordCheck::Skip) => report.skipped += 1,
                    (Some(_), RecordCheck::Listed) => {}
                    (Some(key), RecordCheck::Content(tier, c)) => {
                        if let Some(Check::Lost | Check::Vanished) =
                            tally(report, tier, key, c, opts)
                        {
                            suspects.push(r.key.clone());
                        }
                    }
                    (Some(_), RecordCheck::Gone) => suspects.push(r.key.clone()),
                    (Some(_), RecordCheck::InFlight) => report.in_flight += 1,
                    (Some(_), RecordCheck::Forward) => report.forward += 1,
                }
                progress(VerifyProgress {
                    checked: report.checked,
                    bytes: report.bytes,
                    at: r.key(),
                });
            }
            self.recheck(record, suspects, opts, report).await?;
            if done {
                return Ok(());
            }
        }
    }

    /// What one key of the record needs. `indexed`: the record holds the
    /// large tier's content one by one ([`PoolRecord::large_indexed`]).
    /// `kv`: the page's kv entries, read in one go.
    async fn check_record(
        &self,
        r: &Record,
        opts: &VerifyOptions,
        indexed: bool,
        kv: &HashMap<Key, Option<(u64, Bytes)>>,
    ) -> Result<RecordCheck> {
        let Some(key) = r.key() else {
            // (Named as malformed by the caller.)
            return Ok(RecordCheck::Gone);
        };
        Ok(match r.held {
            Some(Held::Kv) => RecordCheck::Content(
                Tier::Kv,
                match kv.get(&key) {
                    Some(Some((recorded, v))) => check_value(&key, *recorded, v),
                    Some(None) => Check::Vanished,
                    None => check(self, Tier::Kv, &key, None, opts.repair_outboards).await?,
                },
            ),
            Some(held @ (Held::LargeObject | Held::File { .. })) => match self.large() {
                Some(_) => {
                    let generation = match held {
                        Held::File { generation } => Some(generation),
                        _ => None,
                    };
                    RecordCheck::Content(
                        Tier::Large,
                        check(self, Tier::Large, &key, generation, opts.repair_outboards).await?,
                    )
                }
                // A kv-only node cannot read the pool's large tier: not a
                // loss here, and not a whole verify either.
                None => RecordCheck::Skip,
            },
            Some(Held::LargeObjectLost) => RecordCheck::Gone,
            Some(Held::InFlight | Held::Deleting) => RecordCheck::InFlight,
            None if r.forward_only() => RecordCheck::Forward,
            // A reference into a large tier that is its own index (a
            // single-instance pool on local or s3): the walk of its
            // listing hashes the blob; here, only whether it is there.
            None if !indexed && self.large().is_some() => {
                if self.large_engine()?.has(&key).await? {
                    RecordCheck::Listed
                } else {
                    RecordCheck::Gone
                }
            }
            None => RecordCheck::Gone,
        })
    }

    /// Keys found without their content, looked up again before any is
    /// called missing: a sweep may have claimed it (a tombstone, or no
    /// record and no reference any more), a put may have published it
    /// since the page was read. An entry's row is its content's record,
    /// so an entry absent at the second read was deleted, not lost; a
    /// published file absent at the second read is looked up once more,
    /// after that read, and missing only if still published.
    async fn recheck(
        &self,
        record: &dyn PoolRecord,
        suspects: Vec<Vec<u8>>,
        opts: &VerifyOptions,
        report: &mut VerifyReport,
    ) -> Result<()> {
        if suspects.is_empty() {
            return Ok(());
        }
        let now: HashMap<Vec<u8>, Record> = record
            .lookup(&suspects, true)
            .await?
            .into_iter()
            .map(|r| (r.key.clone(), r))
            .collect();
        let indexed = record.large_indexed();
        let mut files_gone: Vec<Record> = Vec::new();
        for k in suspects {
            let Some(r) = now.get(&k) else {
                report.vanished += 1;
                continue;
            };
            let key = r.key().expect("suspects are keys");
            match self.check_record(r, opts, indexed, &HashMap::new()).await? {
                RecordCheck::Content(tier, c) => match tally(report, tier, key, c, opts) {
                    Some(Check::Lost) => report.missing.push(missing_entry(key, r)),
                    Some(_) if matches!(r.held, Some(Held::File { .. })) => {
                        files_gone.push(r.clone())
                    }
                    Some(_) => report.vanished += 1,
                    None => {}
                },
                RecordCheck::Gone => report.missing.push(missing_entry(key, r)),
                RecordCheck::Skip => report.skipped += 1,
                RecordCheck::Listed => {}
                RecordCheck::InFlight => report.in_flight += 1,
                RecordCheck::Forward => report.forward += 1,
            }
        }
        if files_gone.is_empty() {
            return Ok(());
        }
        let keys: Vec<Vec<u8>> = files_gone.iter().map(|r| r.key.clone()).collect();
        let last: HashMap<Vec<u8>, Record> = record
            .lookup(&keys, true)
            .await?
            .into_iter()
            .map(|r| (r.key.clone(), r))
            .collect();
        for r in files_gone {
            match last.get(&r.key) {
                Some(now) if now.held == r.held => report
                    .missing
                    .push(missing_entry(r.key().expect("a key"), now)),
                _ => report.vanished += 1,
            }
        }
        Ok(())
    }

    /// A large tier that is its own index under a record (a single-instance
    /// pool on local or s3): every blob it lists is hashed, as in an
    /// embedded store (references into it were checked by the record walk).
    async fn verify_large_listing(
        &self,
        opts: &VerifyOptions,
        progress: &impl Fn(VerifyProgress),
        report: &mut VerifyReport,
    ) -> Result<()> {
        let keys = self.large_engine()?.list();
        let checks = keys
            .try_filter(|k| std::future::ready(opts.in_range(k.as_bytes())))
            .map_ok(|key| async move {
                let c = check(self, Tier::Large, &key, None, opts.repair_outboards).await?;
                Ok::<_, Error>((key, c))
            })
            .try_buffered(opts.jobs.max(1));
        futures::pin_mut!(checks);
        while let Some((key, c)) = checks.try_next().await? {
            if let Some(Check::Lost | Check::Vanished) = tally(report, Tier::Large, key, c, opts) {
                report.vanished += 1;
            }
            progress(VerifyProgress {
                checked: report.checked,
                bytes: report.bytes,
                at: Some(key),
            });
        }
        Ok(())
    }

    /// The large tier's listing against the record: objects no record
    /// names (and that are still there: one a sweep deleted with its
    /// record after the listing is not), then outboards whose blob is gone
    /// and that no record names.
    async fn find_unrecorded(
        &self,
        record: &dyn PoolRecord,
        opts: &VerifyOptions,
        report: &mut VerifyReport,
    ) -> Result<()> {
        let large = self.large_engine()?;
        self.unrecorded_of(record, large.list(), true, opts, report)
            .await?;
        self.unrecorded_of(record, large.orphan_outboards(), false, opts, report)
            .await
    }

    /// The keys of `keys` that no record names (`blobs`: confirmed still
    /// present first).
    async fn unrecorded_of(
        &self,
        record: &dyn PoolRecord,
        keys: crate::backend::KeyStream<'_>,
        blobs: bool,
        opts: &VerifyOptions,
        report: &mut VerifyReport,
    ) -> Result<()> {
        let large = self.large_engine()?;
        let mut keys = keys.try_filter(|k| std::future::ready(opts.in_range(k.as_bytes())));
        let mut batch: Vec<Vec<u8>> = Vec::new();
        loop {
            let next = keys.try_next().await?;
            if let Some(k) = &next {
                batch.push(k.as_bytes().to_vec());
            }
            if batch.len() == opts.page || (next.is_none() && !batch.is_empty()) {
                let known = record.lookup(&batch, false).await?;
                let held: std::collections::HashSet<&[u8]> = known
                    .iter()
                    .filter(|r| r.held.is_some())
                    .map(|r| r.key.as_slice())
                    .collect();
                for k in &batch {
                    if !held.contains(k.as_slice()) {
                        let key = Key::from_slice(k)?;
                        if !blobs || large.has(&key).await? {
                            report.unrecorded.push(key);
                        }
                    }
                }
                batch.clear();
            }
            if next.is_none() {
                return Ok(());
            }
        }
    }
}

/// What a key of the record needs.
enum RecordCheck {
    /// Its content was read.
    Content(Tier, Check),
    /// The record says it must exist, and nothing holds it.
    Gone,
    /// A put in flight or a delete in progress.
    InFlight,
    /// Only forward references name it.
    Forward,
    /// In a large tier that is its own index: its listing's walk hashes it.
    Listed,
    /// This node cannot read its tier.
    Skip,
}

fn missing_entry(key: Key, r: &Record) -> MissingEntry {
    MissingEntry {
        key,
        referenced_by: r.refs.clone(),
        recorded: r.held,
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Counts one check into the report; returns the check back when its
/// content was not there (for the caller to decide: gone or missing).
fn tally(
    report: &mut VerifyReport,
    tier: Tier,
    key: Key,
    c: Check,
    opts: &VerifyOptions,
) -> Option<Check> {
    match c {
        Check::Ok(n, ob) => {
            report.checked += 1;
            report.bytes += n;
            match ob {
                Outboard::Good => {}
                Outboard::Missing => report.outboards_missing += 1,
                Outboard::Damaged => {
                    tracing::warn!(%key, "damaged outboard");
                    report.outboards_damaged += 1;
                }
            }
            if ob != Outboard::Good && opts.repair_outboards {
                report.outboards_repaired += 1;
            }
            None
        }
        Check::Corrupt(n, detail) => {
            report.checked += 1;
            report.bytes += n;
            tracing::warn!(%key, %tier, %detail, "corrupt entry");
            report.corrupt.push(CorruptEntry { key, tier, detail });
            None
        }
        gone @ (Check::Vanished | Check::Lost) => Some(gone),
    }
}

/// Re-hashes a blob as it is read; see [`Store::open_read_verified`].
struct VerifyingReader {
    inner: BlobReader,
    hasher: blake3::Hasher,
    expected: Key,
}

impl AsyncRead for VerifyingReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        match this.inner.as_mut().poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let new = &buf.filled()[before..];
                if new.is_empty() && buf.remaining() > 0 {
                    let actual = Key::from_hash(this.hasher.finalize());
                    if actual != this.expected {
                        return Poll::Ready(Err(std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            format!(
                                "blob {} is corrupt: its content hashes to {actual}",
                                this.expected
                            ),
                        )));
                    }
                } else {
                    this.hasher.update(new);
                }
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}
