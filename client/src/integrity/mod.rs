//! Verification, in one place: everything that holds bytes against their
//! key.
//!
//! - `hash`: a whole buffer's key (and outboard), off the async workers
//!   when it is big: every put and whole-value check.
//! - [`outboard`]: BLAKE3's tree over a blob's 16 KiB chunk groups — the
//!   key and the outboard in one pass ([`outboard::Builder`], and
//!   [`outboard::digest_sync`] / [`outboard::digest_async`] over a
//!   reader), and what checking a byte range needs ([`outboard::plan`],
//!   [`outboard::check`]).
//! - `verified`: verified reads over any [`Source`] — a range, or a
//!   reader that yields only verified bytes — reading only the groups a
//!   range covers and their outboard entries.
//! - [`bao`]: verified streaming, the encoding a server sends
//!   (`bao/encode.rs`) and its decoding by a client (`bao/decode.rs`).
//!
//! The module sits under the engines: it reads a blob through
//! [`Source`], the few reads it needs, which every large engine offers
//! (`backend` implements it for each). The engines, the store (`verify`,
//! verified reads) and `serve` call down into it; it calls up into none
//! of them.

use std::fmt;
use std::pin::Pin;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::io::AsyncRead;

use crate::{Key, Result};

pub mod bao;
pub(crate) mod hash;
pub mod outboard;
pub(crate) mod verified;

/// A reader over one blob's bytes.
pub type BlobReader = Pin<Box<dyn AsyncRead + Send>>;

/// What verification reads a large blob through: its size, its bytes
/// (whole or a window) and windows of its stored outboard. Every large
/// engine is one (`backend`: `impl<T: LargeBackend> Source for T`); the
/// engine contract (`LargeBackend`) says what each read promises. Its
/// name (`Display`) is the engine's, for errors.
#[async_trait]
pub trait Source: fmt::Display + Send + Sync {
    /// The blob's size, or `None` when it is absent.
    async fn size(&self, key: &Key) -> Result<Option<u64>>;
    /// A reader over the whole blob, or `None`.
    async fn open_read(&self, key: &Key) -> Result<Option<BlobReader>>;
    /// Up to `len` bytes from `offset`, clamped to the end.
    async fn read_range(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>>;
    /// Up to `len` bytes of the stored outboard from `offset`, or `None`
    /// when the blob has none.
    async fn read_outboard(&self, key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>>;
    /// Several windows of the stored outboard in one call (by default all
    /// asked for at once, [`each_window`]).
    async fn read_outboard_windows(
        &self,
        key: &Key,
        windows: &[std::ops::Range<u64>],
    ) -> Result<Option<Vec<Bytes>>> {
        each_window(windows, |w| {
            self.read_outboard(key, w.start, w.end - w.start)
        })
        .await
    }
    /// Blobs of at most this many bytes carry no outboard, by design.
    fn outboard_floor(&self) -> u64;
}

/// `windows` read by `read`, all asked for at once (a network reader's
/// round trips overlap); `None` when any answers `None` (no outboard).
pub(crate) async fn each_window<'a, F, Fut>(
    windows: &'a [std::ops::Range<u64>],
    read: F,
) -> Result<Option<Vec<Bytes>>>
where
    F: FnMut(&'a std::ops::Range<u64>) -> Fut,
    Fut: std::future::Future<Output = Result<Option<Bytes>>>,
{
    let got = futures::future::try_join_all(windows.iter().map(read)).await?;
    Ok(got.into_iter().collect())
}

/// The `[offset, offset+len)` window of a blob of `size` bytes, clamped to
/// its end; a start past the end is [`crate::Error::InvalidRange`]. Every
/// engine's ranged read answers by it.
pub(crate) fn clamp_range(
    key: &Key,
    size: u64,
    offset: u64,
    len: u64,
) -> Result<std::ops::Range<u64>> {
    if offset > size {
        return Err(crate::Error::InvalidRange {
            key: *key,
            offset,
            size,
        });
    }
    Ok(offset..offset.saturating_add(len).min(size))
}
