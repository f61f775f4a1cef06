//! Content keys. The definition lives in `alkblobs-core` so that the
//! PostgreSQL extension shares it; this module re-exports it.

pub use alkblobs_core::{KEY_LEN, Key, KeyError};
