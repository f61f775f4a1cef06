use std::path::PathBuf;

use crate::key::{Key, KeyError};

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
    /// A verified ranged read found stored bytes that do not match their
    /// key: the first damaged 16 KiB chunk group starts at `offset` (the
    /// blob's BLAKE3 outboard locates it without reading the rest).
    #[error(
        "blob {key} in {engine} is corrupt from byte {offset} (the 16 KiB chunk group there does not hash to what the key says); restore it with a verified put of the original bytes"
    )]
    CorruptAt {
        /// The damaged entry.
        key: Key,
        /// The engine holding it.
        engine: String,
        /// The first byte of the first damaged chunk group.
        offset: u64,
    },
    /// The pool records the key (an entry, a published file) but its
    /// content is gone from the tier: a large object unlinked, an object
    /// deleted from the bucket, a file removed behind the store's back.
    /// An integrity failure, not "never stored" (SQLSTATE AB006 at the
    /// extension).
    #[error(
        "blob {key} is recorded in {engine} but its content is lost ({detail}); restore it by putting the original bytes again (alkblobs put, or a verified put from a node that holds them), then run alkblobs verify"
    )]
    Lost {
        /// The key whose content is gone.
        key: Key,
        /// Where it is recorded.
        engine: String,
        /// What is gone.
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
    /// A PostgreSQL pool that does not exist, or that the role may not read.
    #[error(
        "{at}: no pool {pool:?} that this role may read; create it (alkblobs pool create {pool} --single-instance, or --fleet for a fleet pool; or SELECT alkblobs_create_pool('{pool}', …)) or have its admin grant access (alkblobs_grant_pool)"
    )]
    NoPool {
        /// The pool's name.
        pool: String,
        /// Where it was looked for (`pool@host:port/db`).
        at: String,
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
    #[error("{} is in use by another process ({holder}); in-process pins are invisible across processes, so only one instance may write or sweep an embedded store. Stop the other process, wait for its lock, open read-only, or share the pool through PostgreSQL fleet mode", resource.display())]
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
    /// A transient conflict the engine reported (a serialization failure or
    /// a deadlock, SQLSTATE 40001 / 40P01): nothing was changed, and the
    /// same call may succeed if retried.
    #[error("{engine}: conflict with a concurrent transaction (retryable): {source}")]
    Conflict {
        /// The engine's display name.
        engine: String,
        /// The engine's report.
        #[source]
        source: BoxError,
    },
    /// The engine's server cannot be reached or the connection was lost
    /// mid-call. The call's effect is unknown only for operations the
    /// contract calls idempotent (puts, deletes); retrying is safe.
    #[error("{engine} is unavailable (retryable): {source}")]
    Unavailable {
        /// The engine's display name.
        engine: String,
        /// The underlying failure.
        #[source]
        source: BoxError,
    },
    /// Content referenced by a liveness write or a pin was collected (or was
    /// never put): the pool does not hold it. Put the content again, then
    /// reference it (SQLSTATE AB002 at the extension).
    #[error(
        "blob {key} is not in the pool (collected, or never put); put its content first, then reference it"
    )]
    Collected {
        /// The key that was referenced.
        key: Key,
    },
    /// A fleet store instance's pin lapsed before it was renewed (the
    /// instance stalled past the pool's pin TTL, or lost the database):
    /// nothing protected the content since, so it may have been collected.
    /// Put it again (a re-put restores it byte for byte).
    #[error(
        "the pin on blob {key} lapsed before this instance renewed it (stalled or cut off past the pool's pin TTL); it may have been collected: put its content again"
    )]
    PinExpired {
        /// The key whose pin lapsed.
        key: Key,
    },
    /// The database lacks the alkblobs extension, or has a version this
    /// client does not speak.
    #[error("{engine}: {detail}")]
    Extension {
        /// The engine's display name.
        engine: String,
        /// What is wrong and the SQL that fixes it (`CREATE EXTENSION
        /// alkblobs`, `ALTER EXTENSION alkblobs UPDATE`).
        detail: String,
    },
    /// The store builder refused a topology whose sweeps could delete
    /// another instance's protected content: an in-process arbiter over an
    /// engine other instances can reach (ADR-008 §2).
    #[error(
        "{engine} is shared with other instances, but the {arbiter} arbiter sees only this process's pins: \
         sweeping a shared pool from one instance can delete another's in-flight puts. \
         Declare the topology: single_instance() if this is the only instance of the pool, \
         or a fleet arbiter if several share it"
    )]
    UnsafeTopology {
        /// The shared engine's display name.
        engine: String,
        /// The arbiter's name.
        arbiter: String,
    },
    /// The store was closed ([`crate::Store::close`]); open it again.
    #[error("the store was closed; open it again to use it")]
    Closed,
    /// A database engine reported an error with a SQLSTATE that is neither
    /// a conflict nor a lost connection; `kind` is its class
    /// ([`sqlstate_kind`]).
    #[error("{engine}: {source} (SQLSTATE {sqlstate})")]
    Database {
        /// The engine's display name.
        engine: String,
        /// The five-character SQLSTATE.
        sqlstate: String,
        /// Its class.
        kind: ErrorKind,
        /// The database's report.
        #[source]
        source: BoxError,
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

/// The class of an [`Error`]: what a caller can branch on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorKind {
    /// The key is not in the pool ([`Error::NotFound`]).
    NotFound,
    /// Content does not match its key: stored corruption or a put whose
    /// bytes are not the claimed key ([`Error::Corrupt`], [`Error::HashMismatch`]).
    Corrupt,
    /// The pool records the key but its content is gone ([`Error::Lost`]).
    Lost,
    /// Over the kv threshold in kv-only mode ([`Error::TooLarge`]).
    TooLarge,
    /// The caller's input is malformed or unreadable: a key, a range, a
    /// file ([`Error::InvalidKey`], [`Error::InvalidRange`], [`Error::Input`]).
    InvalidInput,
    /// The store or database is configured in a way that cannot work
    /// ([`Error::Config`], [`Error::Extension`], [`Error::UnsafeTopology`]).
    Config,
    /// Read-only store asked to write ([`Error::ReadOnly`]).
    ReadOnly,
    /// Another process holds the store ([`Error::InUse`]).
    InUse,
    /// A transient conflict; retry ([`Error::Conflict`]).
    Conflict,
    /// The server is unreachable or the connection dropped; retry
    /// ([`Error::Unavailable`]).
    Unavailable,
    /// Referenced content is gone; put it again ([`Error::Collected`]).
    Collected,
    /// The store was closed ([`Error::Closed`]).
    Closed,
    /// Any other engine failure ([`Error::Engine`]).
    Engine,
}

impl Error {
    /// The error's class.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::NotFound { .. } | Error::NoPool { .. } => ErrorKind::NotFound,
            Error::HashMismatch { .. } | Error::Corrupt { .. } | Error::CorruptAt { .. } => {
                ErrorKind::Corrupt
            }
            Error::Lost { .. } => ErrorKind::Lost,
            Error::TooLarge { .. } => ErrorKind::TooLarge,
            Error::InvalidKey(_) | Error::InvalidRange { .. } | Error::Input { .. } => {
                ErrorKind::InvalidInput
            }
            Error::Config(_) | Error::Extension { .. } | Error::UnsafeTopology { .. } => {
                ErrorKind::Config
            }
            Error::Closed => ErrorKind::Closed,
            Error::Database { kind, .. } => *kind,
            Error::ReadOnly { .. } => ErrorKind::ReadOnly,
            Error::InUse { .. } => ErrorKind::InUse,
            Error::Conflict { .. } => ErrorKind::Conflict,
            Error::Unavailable { .. } => ErrorKind::Unavailable,
            Error::Collected { .. } | Error::PinExpired { .. } => ErrorKind::Collected,
            Error::Engine { .. } => ErrorKind::Engine,
        }
    }

    /// Whether the same call may succeed if retried unchanged: conflicts and
    /// lost connections. Everything else fails the same way again.
    pub fn is_retryable(&self) -> bool {
        matches!(self.kind(), ErrorKind::Conflict | ErrorKind::Unavailable)
    }
}

/// The one home of the SQLSTATE → [`ErrorKind`] mapping, shared by every
/// PostgreSQL engine: the extension raises deliberate codes and the client
/// classifies them here.
///
/// | SQLSTATE | kind |
/// |---|---|
/// | `40001` serialization failure, `40P01` deadlock, `55P03` lock not available, `55006` object in use (a file being deleted) | [`ErrorKind::Conflict`] |
/// | class `08` connection exception, `57P01`–`57P03` admin shutdown / cannot connect now, `53300` too many connections | [`ErrorKind::Unavailable`] |
/// | `AB002` content not present | [`ErrorKind::Collected`] |
/// | `AB001` hash mismatch, `AB005` the key is stored with other bytes (a server that trusts writers' keys: one of the two is forged) | [`ErrorKind::Corrupt`] |
/// | `AB006` the key is recorded but its content is gone (a large object unlinked behind the pool's back) | [`ErrorKind::Lost`] |
/// | `42501` insufficient privilege, `3F000` no schema (extension missing), `42883` undefined function (wrong extension version) | [`ErrorKind::Config`] |
/// | `22P02`, `22023`, `22004`, `22003` invalid input | [`ErrorKind::InvalidInput`] |
/// | anything else | [`ErrorKind::Engine`] |
pub fn sqlstate_kind(code: &str) -> ErrorKind {
    match code {
        "40001" | "40P01" | "55P03" | "55006" => ErrorKind::Conflict,
        "57P01" | "57P02" | "57P03" | "53300" => ErrorKind::Unavailable,
        c if c.starts_with("08") => ErrorKind::Unavailable,
        "AB002" => ErrorKind::Collected,
        "AB001" | "AB005" => ErrorKind::Corrupt,
        "AB006" => ErrorKind::Lost,
        "42501" | "3F000" | "42883" => ErrorKind::Config,
        "22P02" | "22023" | "22004" | "22003" => ErrorKind::InvalidInput,
        _ => ErrorKind::Engine,
    }
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

    /// Classifies an engine failure that carries a SQLSTATE (see
    /// [`sqlstate_kind`]): conflicts and lost connections become the
    /// retryable variants, `AB002` about a known key [`Error::Collected`],
    /// and the rest an [`Error::Database`] whose `kind()` is the table's.
    pub fn from_sqlstate(
        engine: impl std::fmt::Display,
        code: &str,
        key: Option<Key>,
        source: impl Into<BoxError>,
    ) -> Error {
        let engine = engine.to_string();
        let source = source.into();
        match (sqlstate_kind(code), key) {
            (ErrorKind::Conflict, _) => Error::Conflict { engine, source },
            (ErrorKind::Unavailable, _) => Error::Unavailable { engine, source },
            (ErrorKind::Collected, Some(key)) => Error::Collected { key },
            (ErrorKind::Lost, Some(key)) => Error::Lost {
                key,
                // (The driver's own text is its kind; the server's
                // message is its source.)
                detail: std::error::Error::source(&*source)
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| source.to_string()),
                engine,
            },
            (kind, _) => Error::Database {
                engine,
                sqlstate: code.to_owned(),
                kind,
                source,
            },
        }
    }
}
