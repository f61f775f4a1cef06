//! The PostgreSQL-independent heart of alkblobs: content keys and the
//! sharded on-disk layout.
//!
//! This crate has no async runtime and no database driver so that both the
//! client crate and the pgrx extension can share one definition of what a key
//! is and where a blob lives.

mod key;
mod layout;

pub use key::{KEY_LEN, Key, KeyError};
pub use layout::{all_shards, shard_dir, shard_path};
