//! The single-node arbiter's state: staged delete candidates and roots.
//!
//! An embedded SQL database hosts these as durable rows beside its entries
//! ([`super::SqliteTables`]: the staged table survives a crash, and a put
//! clears a key's staged row in the same transaction as the entry). Stores
//! whose preset supplies no durable tables keep them in process with
//! [`MemGcTables`], and a sweep then waits its window out inline.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Mutex;

use async_trait::async_trait;

use crate::{Key, Result};

/// One staged delete candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct StagedRow {
    /// The candidate.
    pub key: Key,
    /// When it was staged (Unix milliseconds).
    pub staged_at_ms: i64,
    /// When its delete window ends (Unix milliseconds); `None` while the
    /// sweep that staged it is still marking.
    pub visible_after_ms: Option<i64>,
}

/// Durable (or in-process) GC state; see the module docs.
///
/// Only one sweep runs at a time per store (the sweeper lock) and only one
/// instance writes an embedded store (the instance lock), so rows staged but
/// not yet sealed always belong to the sweep in progress — or to one that
/// died, which [`GcTables::discard_unsealed`] cleans up.
#[async_trait]
pub trait GcTables: Send + Sync + fmt::Debug {
    /// Whether the rows survive a restart.
    fn durable(&self) -> bool;

    /// Removes unsealed rows left by a sweep that died during its mark.
    async fn discard_unsealed(&self) -> Result<u64>;

    /// Stages `keys` as unsealed rows; a key already staged keeps its row
    /// (and its earlier window). Returns how many rows were added.
    async fn stage(&self, keys: &[Key], now_ms: i64) -> Result<u64>;

    /// Seals every unsealed row with `visible_after = visible_after_ms`.
    async fn seal(&self, visible_after_ms: i64) -> Result<u64>;

    /// Moves every sealed row's `visible_after` to `visible_after_ms` if that
    /// is earlier (a sweep given an explicit, shorter window applies it to
    /// what is already staged). Returns how many rows moved.
    async fn reseal(&self, visible_after_ms: i64) -> Result<u64>;

    /// Sealed rows due at `now_ms`, with key greater than `after`, ascending,
    /// at most `limit`.
    async fn due(&self, now_ms: i64, after: Option<Key>, limit: usize) -> Result<Vec<StagedRow>>;

    /// Removes the keys' staged rows. Returns how many existed.
    async fn unstage(&self, keys: &[Key]) -> Result<u64>;

    /// Staged rows with key greater than `after`, ascending, at most `limit`.
    async fn staged(&self, after: Option<Key>, limit: usize) -> Result<Vec<StagedRow>>;

    /// Adds keys to the persistent roots (a liveness source). Returns how
    /// many were new.
    async fn add_roots(&self, keys: &[Key]) -> Result<u64>;

    /// Removes keys from the roots. Returns how many were present.
    async fn remove_roots(&self, keys: &[Key]) -> Result<u64>;

    /// Roots with key greater than `after`, ascending, at most `limit`.
    async fn roots(&self, after: Option<Key>, limit: usize) -> Result<Vec<Key>>;

    /// For each key: is it a root?
    async fn roots_contain(&self, keys: &[Key]) -> Result<Vec<bool>>;
}

/// In-process GC tables for stores without a SQL engine. Not durable: a
/// restart forgets staged rows (nothing is deleted without a fresh window)
/// and roots.
#[derive(Debug, Default)]
pub struct MemGcTables {
    inner: Mutex<MemTables>,
}

#[derive(Debug, Default)]
struct MemTables {
    staged: BTreeMap<Key, StagedRow>,
    roots: BTreeSet<Key>,
}

impl MemGcTables {
    fn lock(&self) -> std::sync::MutexGuard<'_, MemTables> {
        // A panic while holding this lock leaves plain maps in a consistent
        // state (every mutation is a single map call), so poisoning is moot.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn after_range<V>(map: &BTreeMap<Key, V>, after: Option<Key>) -> impl Iterator<Item = (&Key, &V)> {
    use std::ops::Bound;
    map.range((
        after.map_or(Bound::Unbounded, Bound::Excluded),
        Bound::Unbounded,
    ))
}

#[async_trait]
impl GcTables for MemGcTables {
    fn durable(&self) -> bool {
        false
    }

    async fn discard_unsealed(&self) -> Result<u64> {
        let mut t = self.lock();
        let before = t.staged.len();
        t.staged.retain(|_, r| r.visible_after_ms.is_some());
        Ok((before - t.staged.len()) as u64)
    }

    async fn stage(&self, keys: &[Key], now_ms: i64) -> Result<u64> {
        let mut t = self.lock();
        let mut added = 0;
        for k in keys {
            if !t.staged.contains_key(k) {
                t.staged.insert(
                    *k,
                    StagedRow {
                        key: *k,
                        staged_at_ms: now_ms,
                        visible_after_ms: None,
                    },
                );
                added += 1;
            }
        }
        Ok(added)
    }

    async fn seal(&self, visible_after_ms: i64) -> Result<u64> {
        let mut t = self.lock();
        let mut n = 0;
        for r in t.staged.values_mut() {
            if r.visible_after_ms.is_none() {
                r.visible_after_ms = Some(visible_after_ms);
                n += 1;
            }
        }
        Ok(n)
    }

    async fn reseal(&self, visible_after_ms: i64) -> Result<u64> {
        let mut t = self.lock();
        let mut n = 0;
        for r in t.staged.values_mut() {
            if r.visible_after_ms.is_some_and(|v| v > visible_after_ms) {
                r.visible_after_ms = Some(visible_after_ms);
                n += 1;
            }
        }
        Ok(n)
    }

    async fn due(&self, now_ms: i64, after: Option<Key>, limit: usize) -> Result<Vec<StagedRow>> {
        let t = self.lock();
        Ok(after_range(&t.staged, after)
            .map(|(_, r)| *r)
            .filter(|r| r.visible_after_ms.is_some_and(|v| v <= now_ms))
            .take(limit)
            .collect())
    }

    async fn unstage(&self, keys: &[Key]) -> Result<u64> {
        let mut t = self.lock();
        Ok(keys.iter().filter(|k| t.staged.remove(k).is_some()).count() as u64)
    }

    async fn staged(&self, after: Option<Key>, limit: usize) -> Result<Vec<StagedRow>> {
        let t = self.lock();
        Ok(after_range(&t.staged, after)
            .map(|(_, r)| *r)
            .take(limit)
            .collect())
    }

    async fn add_roots(&self, keys: &[Key]) -> Result<u64> {
        let mut t = self.lock();
        Ok(keys.iter().filter(|k| t.roots.insert(**k)).count() as u64)
    }

    async fn remove_roots(&self, keys: &[Key]) -> Result<u64> {
        let mut t = self.lock();
        Ok(keys.iter().filter(|k| t.roots.remove(k)).count() as u64)
    }

    async fn roots(&self, after: Option<Key>, limit: usize) -> Result<Vec<Key>> {
        use std::ops::Bound;
        let t = self.lock();
        let lower = after.map_or(Bound::Unbounded, Bound::Excluded);
        Ok(t.roots
            .range((lower, Bound::Unbounded))
            .take(limit)
            .copied()
            .collect())
    }

    async fn roots_contain(&self, keys: &[Key]) -> Result<Vec<bool>> {
        let t = self.lock();
        Ok(keys.iter().map(|k| t.roots.contains(k)).collect())
    }
}
