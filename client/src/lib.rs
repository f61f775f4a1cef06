//! # alkblobs
//!
//! A content-addressed blob store: a blob's key is the BLAKE3 hash of its
//! bytes, equal bytes are stored once, content is immutable once committed,
//! and unreferenced content is garbage-collected without ever losing a blob
//! that a pin or a liveness source protects.
//!
//! ```no_run
//! # async fn tour() -> alkblobs::Result<()> {
//! use alkblobs::Store;
//! let store = Store::open_dir("/var/lib/myapp/blobs").await?;
//! let put = store.put(b"hello".to_vec()).await?;   // pinned until `put.pin` drops
//! // ... record put.key in your own index (a liveness source), then:
//! drop(put.pin);
//! assert_eq!(store.get(&put.key).await?.as_deref(), Some(&b"hello"[..]));
//! store.close().await?;                            // checkpoint, remove the WAL
//! # Ok(()) }
//! ```
//!
//! The pieces, one seam each:
//! - [`Key`]: 32-byte BLAKE3 keys, 64 lowercase hex characters.
//! - [`backend`]: storage. The object-safe [`Backend`] contract (and
//!   [`LargeBackend`] for the large tier) and the engines that ship
//!   (`mem`, `sqlite`, `local`). Engines know nothing of garbage collection.
//! - [`arbiter`]: who may delete what. The [`Arbiter`] trait — pins, the
//!   delete window, staged candidates, roots, liveness, sweeps — and its
//!   single-node implementation.
//! - [`Store`]: the facade over both: tier dispatch, verification,
//!   accounting; built by [`StoreBuilder`] or a preset ([`Store::open_dir`]).
//! - [`Error`]: one classified error type ([`Error::kind`],
//!   [`Error::is_retryable`]).
//! - `conformance` (feature `conformance`): the suites every engine, store
//!   configuration and arbiter in this crate passes, for third parties.

pub mod arbiter;
pub mod backend;
#[cfg(feature = "conformance")]
pub mod conformance;
mod error;
mod integrity;
mod key;
mod offload;
mod pager;
#[cfg(feature = "postgres")]
pub(crate) mod pg;
pub mod record;
#[cfg(feature = "serve")]
pub mod serve;
pub mod store;
mod tier;

pub use arbiter::{
    Arbiter, GcAbortCause, LiveCheck, LiveSet, LiveSnapshot, LivenessSource, PinGuard, Registry,
    StagedRow, SweepOptions, SweepPhase, SweepProgress, SweepReport,
};
pub use backend::{
    Backend, BackendExt, DiskSpace, Durability, LargeBackend, OpenMode, PutOutcome, Sharing,
};
pub use error::{BoxError, Error, ErrorKind, Result, sqlstate_kind};
pub use integrity::{bao, outboard};
pub use key::{KEY_LEN, Key, KeyError};
pub use store::{
    Compacted, CorruptEntry, DirOptions, EntryMeta, Explanation, Put, PutInfo, PutMany, RangeCheck,
    Store, StoreBuilder, Tier, TierUsage, Usage, VerifyOptions, VerifyProgress, VerifyReport,
};
