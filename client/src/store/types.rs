//! What the store's operations return.

use super::Tier;
use crate::Key;
use crate::arbiter::PinGuard;
use crate::backend::PutOutcome;

/// An entry's metadata, from the cheap `size` probe (never a value load).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct EntryMeta {
    /// The key.
    pub key: Key,
    /// Length in bytes.
    pub size: u64,
    /// The tier holding it.
    pub tier: Tier,
}

/// A completed put.
#[derive(Debug)]
#[must_use = "the pin guard protects the new entry only while it is held"]
pub struct Put {
    /// The content key.
    pub key: Key,
    /// Length in bytes.
    pub size: u64,
    /// Where it went.
    pub tier: Tier,
    /// Whether the entry is new or was already present.
    pub outcome: PutOutcome,
    /// The pin taken before the content was published. Record the key in
    /// your liveness, then drop this.
    pub pin: PinGuard,
}

/// One entry of a [`Store::put_many`](crate::Store::put_many).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PutInfo {
    /// The content key.
    pub key: Key,
    /// Length in bytes.
    pub size: u64,
    /// Where it went.
    pub tier: Tier,
    /// New or already present.
    pub outcome: PutOutcome,
}

/// A completed batched put: per-blob results and one guard pinning them all.
#[derive(Debug)]
#[must_use = "the pin guard protects the new entries only while it is held"]
pub struct PutMany {
    /// One entry per input blob, in input order.
    pub entries: Vec<PutInfo>,
    /// Pins on every key.
    pub pin: PinGuard,
}

/// Entries and bytes in one tier.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TierUsage {
    /// The engine's display name.
    pub engine: String,
    /// Entry count.
    pub entries: u64,
    /// Total bytes (of the blobs).
    pub bytes: u64,
    /// Bytes of the blobs' BLAKE3 outboards beside them (large tier), when
    /// the engine can tell; 64 bytes per 16 KiB of blob.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outboard_bytes: Option<u64>,
    /// The engine's files on disk and their free space, when the engine
    /// keeps files of its own ([`crate::Backend::disk_space`]: a SQLite
    /// database).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk: Option<crate::backend::DiskSpace>,
}

/// Pool accounting per tier.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Usage {
    /// The kv tier.
    pub kv: TierUsage,
    /// The large tier (absent in kv-only mode).
    pub large: Option<TierUsage>,
    /// Staged delete candidates.
    pub staged: u64,
    /// Persistent roots.
    pub roots: u64,
}
