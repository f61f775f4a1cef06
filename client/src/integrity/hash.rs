//! Keys of whole buffers, off the async workers when they are big: what
//! every put and every whole-value check hashes with.

use bytes::Bytes;

use super::outboard;
use crate::Key;

/// Above this size, hashing a buffer moves off the async worker threads.
pub(crate) const HASH_INLINE_MAX: usize = 256 * 1024;

/// From this size a buffer is hashed on rayon's threads (see [`hash`]).
const HASH_PARALLEL_MIN: usize = 4 << 20;

/// Hashes a buffer, off the async workers when it is big.
pub(crate) async fn hash(bytes: &Bytes) -> Key {
    if bytes.len() <= HASH_INLINE_MAX {
        return Key::of(bytes);
    }
    let b = bytes.clone();
    match tokio::task::spawn_blocking(move || key_of_big(&b)).await {
        Ok(k) => k,
        Err(_) => Key::of(bytes),
    }
}

/// The key and outboard of a large-tier buffer, off the async workers.
pub(crate) async fn key_and_outboard(bytes: &Bytes) -> (Key, Bytes) {
    let b = bytes.clone();
    let (key, ob) = match tokio::task::spawn_blocking(move || outboard::of(&b)).await {
        Ok(done) => done,
        Err(_) => outboard::of(bytes),
    };
    (key, ob.into())
}

/// The key of a big buffer, on every core from [`HASH_PARALLEL_MIN`]
/// (BLAKE3's tree splits it): an object store's put waits for the key
/// before its first byte goes out. Blocks; call it off the async workers.
fn key_of_big(bytes: &[u8]) -> Key {
    if bytes.len() >= HASH_PARALLEL_MIN {
        Key::from_hash(blake3::Hasher::new().update_rayon(bytes).finalize())
    } else {
        Key::of(bytes)
    }
}
