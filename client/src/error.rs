use std::path::PathBuf;

use crate::Key;
use crate::key::KeyError;

/// A boxed error from an engine, a liveness source or a caller's stream.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong, classified so callers can act on the class.
///
/// A missing key is not an error for reads (they return `None`); it is one
/// for operations that need the key to exist, such as [`crate::Store::pin`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The key is not in the pool (or was collected before it could be pinned).
    #[error("no blob with key {key} in the pool; put its content again to restore it")]
    NotFound {
        /// The key looked for.
        key: Key,
    },
    /// Bytes offered under a key do not hash to it.
    #[error(
        "hash mismatch: the bytes hash to {actual}, not to the claimed key {expected}; nothing was stored"
    )]
    HashMismatch {
        /// The key the caller claimed.
        expected: Key,
        /// The key the bytes actually hash to.
        actual: Key,
    },
    /// Stored content no longer matches its key (bit rot, tampering, a torn file).
    #[error(
        "blob {key} in {engine} is corrupt ({detail}); restore it with a verified put of the original bytes"
    )]
    Corrupt {
        /// The damaged entry.
        key: Key,
        /// The engine holding it.
        engine: String,
        /// What the check found.
        detail: String,
    },
    /// A put over the kv threshold on a store with no large tier.
    #[error(
        "blob of {size} bytes is over the kv threshold of {threshold} bytes and this store is kv-only (no large tier); configure a large tier or route large content to a storage node"
    )]
    TooLarge {
        /// Size of the refused blob.
        size: u64,
        /// The store's kv threshold.
        threshold: u64,
    },
    /// A malformed key.
    #[error("invalid key: {0}")]
    InvalidKey(#[from] KeyError),
    /// A ranged read that starts past the end of the blob.
    #[error("range starts at byte {offset}, past the end of the {size}-byte blob {key}")]
    InvalidRange {
        /// The blob read.
        key: Key,
        /// Requested start.
        offset: u64,
        /// The blob's length.
        size: u64,
    },
    /// The store was configured in a way that cannot work.
    #[error("configuration error: {0}")]
    Config(String),
    /// A write to an engine opened read-only.
    #[error("{engine} was opened read-only; open it for writing to {action}")]
    ReadOnly {
        /// The engine.
        engine: String,
        /// What was attempted.
        action: &'static str,
    },
    /// Another process holds the store's instance lock.
    #[error("{} is in use by another process ({holder}); in-process pins are invisible across processes, so only one instance may write or sweep an embedded store. Stop the other process, wait for it (--wait), open read-only, or use PostgreSQL fleet mode to share a pool", resource.display())]
    InUse {
        /// The locked resource (a lock file).
        resource: PathBuf,
        /// Who holds it, as recorded in the lock file.
        holder: String,
    },
    /// Reading the caller's input (a file path or a stream) failed.
    #[error("cannot read {what}: {source}")]
    Input {
        /// The input, e.g. a file path.
        what: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// An engine failed; `engine` names it (e.g. `sqlite(/data/index.sqlite)`).
    #[error("{engine}: {source}")]
    Engine {
        /// The failing engine's display name.
        engine: String,
        /// What failed, with the engine's own context.
        #[source]
        source: BoxError,
    },
}

impl Error {
    /// Wraps an engine-specific failure.
    pub fn engine(engine: impl std::fmt::Display, source: impl Into<BoxError>) -> Error {
        Error::Engine {
            engine: engine.to_string(),
            source: source.into(),
        }
    }

    /// True for [`Error::NotFound`].
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound { .. })
    }
}
