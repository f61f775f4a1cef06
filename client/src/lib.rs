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
//! # Ok(()) }
//! ```
//!
//! The pieces:
//! - [`Key`]: 32-byte BLAKE3 keys, 64 lowercase hex characters.
//! - [`Backend`]: the object-safe engine contract; engines live in
//!   [`backend`] (`mem`, `sqlite`, `local`).
//! - [`Store`]: the facade: tier dispatch, verification, pins and GC.

pub mod backend;
mod error;
mod key;
pub mod store;

pub use backend::StagedRow;
pub use backend::{Backend, BackendExt, Durability, OpenMode, PutOutcome};
pub use error::{BoxError, Error, ErrorKind, Result, sqlstate_kind};
pub use key::{KEY_LEN, Key, KeyError};
pub use store::{
    CorruptEntry, DirOptions, EntryMeta, PinGuard, Put, PutInfo, PutMany, Store, StoreBuilder,
    Tier, TierUsage, Usage, VerifyProgress, VerifyReport,
    gc::{
        GcAbortCause, LiveCheck, LiveSet, LiveSnapshot, LivenessSource, SweepOptions, SweepPhase,
        SweepProgress, SweepReport,
    },
};
