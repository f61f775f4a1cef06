//! The PostgreSQL-independent heart of alkblobs: content keys and the
//! sharded on-disk layout.
//!
//! This crate has no async runtime and no database driver, so that code which
//! cannot carry them (a pgrx extension, a `no-tokio` tool) can share one
//! definition of what a key is and where a blob lives. The client crate uses
//! it; the extension today hashes with `blake3` directly and uses none of it.

mod key;
mod layout;

pub use key::{KEY_LEN, Key, KeyError};
pub use layout::{all_shards, shard_dir, shard_path};
