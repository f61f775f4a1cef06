//! The record of what must exist in a pool: what `verify` walks instead of
//! the tiers' listings. A tier that lost an object lists nothing for it,
//! so only a record kept elsewhere — the pool's database — can tell a loss
//! from a key never stored. A [`PoolRecord`] pages through it in key
//! order; a store whose pool keeps one (a PostgreSQL pool, single-instance
//! or fleet) carries it, an embedded store has none (its large tier is its
//! own index: docs/operations.md, "Verify").

use async_trait::async_trait;

use crate::{Key, Result};

/// What a pool's record holds for a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Held {
    /// An entry with its bytes inline (the kv tier).
    Kv,
    /// An entry whose bytes are a large object.
    LargeObject,
    /// An entry whose large object is gone: content lost.
    LargeObjectLost,
    /// A published file record of a shared tier (`local` or `s3`): the
    /// tier must hold the object of `generation`.
    File {
        /// Which object of the key holds its bytes (0: the key's own name).
        generation: u64,
    },
    /// A file record not yet published: a put in flight, not a loss.
    InFlight,
    /// A tombstone: a sweep is deleting the key's file, not a loss.
    Deleting,
}

impl Held {
    /// Whether the record says the content must be there now.
    pub fn must_exist(&self) -> bool {
        matches!(
            self,
            Held::Kv | Held::LargeObject | Held::LargeObjectLost | Held::File { .. }
        )
    }
}

/// One key of the record: what the pool holds for it and what references
/// it. The key is raw bytes: a registered liveness table may hold a value
/// of the wrong length, which is reported, not refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The key as recorded.
    pub key: Vec<u8>,
    /// What the pool holds for it (`None`: only references name it).
    pub held: Option<Held>,
    /// The entry's size, where the record keeps one.
    pub size: Option<u64>,
    /// What references it: `root`, or `liveness <table>` (with
    /// ` (forward references)` for a table registered to accept them).
    pub refs: Vec<String>,
}

impl Record {
    /// The key, if it is one (32 bytes).
    pub fn key(&self) -> Option<Key> {
        Key::from_slice(&self.key).ok()
    }

    /// Whether only references to content not yet put name it: every
    /// reference is a forward one, and nothing is recorded.
    pub fn forward_only(&self) -> bool {
        self.held.is_none()
            && !self.refs.is_empty()
            && self.refs.iter().all(|r| r.ends_with(FORWARD))
    }
}

/// How a reference from a table registered with forward references ends.
pub const FORWARD: &str = " (forward references)";

/// A pool's record of what must exist; see the module docs.
#[async_trait]
pub trait PoolRecord: Send + Sync + std::fmt::Debug {
    /// At most `limit` keys of the record after `after` (from the start
    /// when `None`), ascending by their bytes.
    async fn page(&self, after: Option<&[u8]>, limit: usize) -> Result<Vec<Record>>;

    /// The record of exactly `keys` now (a re-check before a key is called
    /// missing): one row per key the record names, ascending. Without
    /// `refs`, only what the pool holds (the references are not read: what
    /// a tier's listing is compared with).
    async fn lookup(&self, keys: &[Vec<u8>], refs: bool) -> Result<Vec<Record>>;

    /// References this reader cannot check (a liveness table the caller
    /// may not read, or that fails validation): `(source, problem)`. Asked
    /// before and after a walk: it includes the sources a page skipped
    /// while it read them (one that failed mid-run).
    async fn unchecked_sources(&self) -> Result<Vec<(String, String)>>;

    /// The record's clock: when a verify starts, as the record will judge
    /// it against other runs (a client's clock may run ahead). The default
    /// is this machine's.
    async fn clock(&self) -> Result<std::time::SystemTime> {
        Ok(std::time::SystemTime::now())
    }

    /// Whether the large tier's objects are recorded one by one (a fleet's
    /// shared tier), so that an object no record names is `unrecorded`.
    fn tier_recorded(&self) -> bool;

    /// Whether the record holds the large tier's content one by one (large
    /// objects as entries, a fleet's file records; or there is no large
    /// tier). `false` for a single-instance pool on `local` or `s3`, whose
    /// tier is its own index: verify then hashes what that tier lists, and
    /// a reference into it is missing only if the tier does not hold it.
    fn large_indexed(&self) -> bool;

    /// Large objects the pool created for uploads that ended without
    /// becoming an entry (a client that committed, or ran in autocommit,
    /// without `alkblobs_lo_commit`): no entry references them, and the
    /// pool's next sweep unlinks them. The default: a record that keeps
    /// no uploads has none.
    async fn abandoned_uploads(&self) -> Result<Vec<AbandonedUpload>> {
        Ok(Vec::new())
    }

    /// Keeps the outcome of a verify where operators look. `Ok(false)`
    /// when the caller may not record it (a PostgreSQL pool records the
    /// runs of roles with sweep access only).
    async fn finished(&self, outcome: &VerifyOutcome) -> Result<bool>;
}

/// A large object created for an upload that ended without becoming an
/// entry; see [`PoolRecord::abandoned_uploads`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct AbandonedUpload {
    /// The large object.
    pub loid: u32,
    /// Its bytes.
    pub bytes: u64,
}

/// What a verify found, as the record keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifyOutcome {
    /// When it started.
    pub started: std::time::SystemTime,
    /// Whether it walked the whole record (not a slice).
    pub whole: bool,
    /// Keys whose content was read and hashed.
    pub checked: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Recorded or referenced keys whose content is gone.
    pub missing: u64,
    /// Keys whose content does not match.
    pub corrupt: u64,
    /// Tier objects no record names, and abandoned uploads.
    pub unrecorded: u64,
}
