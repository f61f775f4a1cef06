//! Verified reads over any large engine: a range of a blob checked
//! against its key through the blob's BLAKE3 outboard ([`crate::outboard`]),
//! reading only the 16 KiB chunk groups the range covers and the outboard
//! entries on their paths to the root. The store's verified reads
//! (`Store::get_range_verified`, `Store::open_range_verified`) and the
//! `routed` engine (which checks what a storage node sends) both read
//! through here.
//!
//! A blob without a usable outboard (stored before outboards existed, or
//! its outboard damaged) is still read verified: the reader streams the
//! whole blob once through the outboard builder, checks the key, and then
//! verifies the range against the outboard it computed. That costs a whole
//! read, which is why `stat` says so and `verify --repair-outboards` stores
//! the outboard.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use tokio::io::AsyncReadExt;
use tokio::sync::OnceCell;

use super::{BlobReader, Source, clamp_range};
use crate::integrity::outboard::{self, GroupHash, Mismatch, PAIR};
use crate::{Error, Key, Result};

/// Bytes one step of a verified stream reads and checks (a whole number
/// of chunk groups).
const WINDOW: u64 = 4 << 20;

/// Outboard entries closer than this are read in one request.
const OUTBOARD_GAP: u64 = 16 * 1024;

/// Windows of a verified stream in flight at once (reading the next while
/// one is checked).
const AHEAD: usize = 2;

/// Windows up to this many bytes (a 1 MiB range and the groups its ends
/// fall in) are hashed on the async worker; see `Verifier::read_hashed`.
const INLINE_HASH: u64 = (1 << 20) + 2 * outboard::GROUP;

/// Windows from this many bytes hash on every core (rayon).
const RAYON_FROM: u64 = 16 << 20;

/// Chunk size of the whole-blob pass that computes a missing outboard.
const CHUNK: usize = 1 << 20;

/// One large blob being read verified.
struct Verifier {
    large: Arc<dyn Source>,
    key: Key,
    size: u64,
    /// The outboard computed from the whole blob, once the stored one
    /// turned out missing or damaged.
    computed: OnceCell<Bytes>,
}

impl Verifier {
    fn corrupt_at(&self, offset: u64) -> Error {
        Error::CorruptAt {
            key: self.key,
            engine: self.large.to_string(),
            offset,
        }
    }

    /// The verified bytes of `range` (inside the blob, not empty).
    async fn window(&self, range: Range<u64>) -> Result<Bytes> {
        let plan = Arc::new(outboard::plan(self.size, range.clone()));
        let want = plan.data.end - plan.data.start;
        // The bytes and the outboard windows at once: the windows on a
        // task of their own, so that an engine's blocking reads (a file's
        // pages, say) run on several workers.
        // (A blob under the engine's outboard floor has none by design:
        // it is read whole, once.)
        let stored_windows = match self.computed.get() {
            Some(_) => None,
            None if self.size <= self.large.outboard_floor() => None,
            None => {
                let (large, key) = (self.large.clone(), self.key);
                let want = plan.outboard_windows(OUTBOARD_GAP);
                Some(tokio::spawn(async move {
                    stored_windows(large.as_ref(), &key, &want).await
                }))
            }
        };
        let read = self.read_hashed(plan.clone()).await;
        let stored = match stored_windows {
            None => Ok(None),
            Some(task) => task.await.map_err(|e| {
                Error::engine(&*self.large, format!("reading an outboard failed: {e}"))
            })?,
        };
        let (data, cvs) = read?;
        if (data.len() as u64) < want {
            // Shorter than its recorded size: damaged from where it ends.
            return Err(self.corrupt_at(plan.data.start + data.len() as u64));
        }
        // The groups are hashed; what is left is the walk up the tree (a
        // merge per pair: cheap, done here).
        let checked = match (self.computed.get(), stored?) {
            (Some(ob), _) => Some(walk(&self.key, &plan, cvs.clone(), &[(0, ob.clone())])),
            (None, Some(windows)) => match walk(&self.key, &plan, cvs.clone(), &windows) {
                Err(Mismatch::Outboard(at)) => {
                    tracing::warn!(key = %self.key, engine = %self.large, offset = at,
                        "the stored outboard is damaged; verifying by the whole blob (alkblobs verify --repair-outboards mends it)");
                    None
                }
                v => Some(v),
            },
            (None, None) => None,
        };
        let verdict = match checked {
            Some(v) => v,
            None => {
                let ob = self.computed_outboard().await?;
                walk(&self.key, &plan, cvs, &[(0, ob)])
            }
        };
        match verdict {
            Ok(()) => {
                let from = (range.start - plan.data.start) as usize;
                Ok(data.slice(from..from + (range.end - range.start) as usize))
            }
            Err(Mismatch::Data(at)) => Err(self.corrupt_at(at)),
            // The computed outboard is right for the key (it was checked):
            // an outboard mismatch against it is data damage too.
            Err(Mismatch::Outboard(at)) => Err(self.corrupt_at(at)),
        }
    }

    /// The plan's bytes and their groups' chaining values (the bytes are
    /// shorter than the plan's when the blob ended early). Up to
    /// [`INLINE_HASH`] bytes hash right here, on the async worker (~200
    /// µs): handing them to another thread costs more than it saves on a
    /// small machine (measured on 2 vCPUs, a warm 1 MiB range: 323 µs
    /// inline, 448 µs through the blocking pool and rayon, whose threads'
    /// wake-ups dominate). Bigger windows hash on the blocking pool, on
    /// rayon's threads from [`RAYON_FROM`].
    async fn read_hashed(&self, plan: Arc<outboard::Plan>) -> Result<(Bytes, Vec<GroupHash>)> {
        let (start, want) = (plan.data.start, plan.data.end - plan.data.start);
        let data = self
            .large
            .read_range(&self.key, start, want)
            .await?
            .ok_or(Error::NotFound { key: self.key })?;
        if want <= INLINE_HASH {
            let cvs = outboard::hash_groups(&plan, &data, false);
            return Ok((data, cvs));
        }
        let d = data.clone();
        let cvs = crate::offload::blocking("blake3", move || {
            Ok(outboard::hash_groups(&plan, &d, want >= RAYON_FROM))
        })
        .await?;
        Ok((data, cvs))
    }

    /// The outboard of the whole blob, streamed through the builder once
    /// and checked against the key.
    async fn computed_outboard(&self) -> Result<Bytes> {
        self.computed
            .get_or_try_init(|| computed_outboard(self.large.as_ref(), &self.key, self.size))
            .await
            .cloned()
    }
}

/// The outboard of the whole blob `key` (`size` bytes) on `large`,
/// streamed through the builder once and checked against the key.
pub(crate) async fn computed_outboard(large: &dyn Source, key: &Key, size: u64) -> Result<Bytes> {
    let (k, ob, n) = outboard_of_stream(large, key, size).await?;
    if k != *key || n != size {
        return Err(Error::Corrupt {
            key: *key,
            engine: large.to_string(),
            detail: format!("its {n} bytes hash to {k}"),
        });
    }
    Ok(Bytes::from(ob))
}

/// The stored outboard's `want` windows, with their offsets: `None` when
/// there is none or it is shorter than the tree.
async fn stored_windows(
    large: &dyn Source,
    key: &Key,
    want: &[Range<u64>],
) -> Result<Option<Vec<(u64, Bytes)>>> {
    match large.read_outboard_windows(key, want).await {
        Ok(Some(got)) if got.len() == want.len() => {
            Ok(Some(want.iter().map(|w| w.start).zip(got).collect()))
        }
        Ok(_) | Err(Error::InvalidRange { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Streams a large blob through the outboard builder: its key, outboard and
/// length (hashing off the async workers).
/// At most `size + 1` bytes are read: an engine that sends more (a lying
/// node streaming forever) is cut off there and fails the key check.
async fn outboard_of_stream(
    large: &dyn Source,
    key: &Key,
    size: u64,
) -> Result<(Key, Vec<u8>, u64)> {
    let mut reader = large
        .open_read(key)
        .await?
        .ok_or(Error::NotFound { key: *key })?;
    let mut builder = outboard::Builder::new();
    let mut reader = (&mut reader).take(size.saturating_add(1));
    loop {
        let mut buf = Vec::with_capacity(CHUNK);
        let n = (&mut reader)
            .take(CHUNK as u64)
            .read_to_end(&mut buf)
            .await
            .map_err(|e| Error::engine(large, format!("reading {key}: {e}")))?;
        if n == 0 {
            break;
        }
        builder = tokio::task::spawn_blocking(move || {
            builder.update(&buf);
            builder
        })
        .await
        .map_err(|e| Error::engine("blake3", format!("a hashing task failed: {e}")))?;
    }
    let n = builder.len();
    let (k, ob) = builder.finish();
    Ok((k, ob, n))
}

/// Walks `cvs` (the plan's groups, hashed) up to `key` through an outboard
/// given as windows `(start, bytes)`.
fn walk(
    key: &Key,
    plan: &outboard::Plan,
    cvs: Vec<GroupHash>,
    windows: &[(u64, Bytes)],
) -> std::result::Result<(), Mismatch> {
    outboard::check_hashed(key, plan, cvs, |o| {
        let (start, w) = windows
            .iter()
            .rev()
            .find(|(s, w)| *s <= o && o + PAIR <= s + w.len() as u64)?;
        let at = (o - start) as usize;
        w.get(at..at + PAIR as usize)?.try_into().ok()
    })
}

/// `key`'s verifier over `large`, or `None` if it holds no such blob.
async fn verifier(large: &Arc<dyn Source>, key: &Key) -> Result<Option<Verifier>> {
    let Some(size) = large.size(key).await? else {
        return Ok(None);
    };
    Ok(Some(Verifier {
        large: large.clone(),
        key: *key,
        size,
        computed: OnceCell::new(),
    }))
}

/// Up to `len` bytes of `key` from `offset` on `large`, checked against
/// the key through its outboard (see `Store::get_range_verified`). With
/// `windowed` (an engine whose claimed size is not to be trusted with an
/// allocation: `routed`), read and checked 4 MiB at a time; else in one
/// read, one check.
pub(crate) async fn range_verified(
    large: &Arc<dyn Source>,
    key: &Key,
    offset: u64,
    len: u64,
    windowed: bool,
) -> Result<Option<Bytes>> {
    let Some(v) = verifier(large, key).await? else {
        return Ok(None);
    };
    let r = clamp_range(key, v.size, offset, len)?;
    if r.is_empty() {
        return Ok(Some(Bytes::new()));
    }
    if !windowed || r.end - r.start <= WINDOW {
        return v.window(r).await.map(Some);
    }
    // Window by window, so memory follows the bytes that arrived and
    // checked, not a size the engine claims.
    let mut out = bytes::BytesMut::new();
    let mut at = r.start;
    while at < r.end {
        let next = ((at / WINDOW + 1) * WINDOW).min(r.end);
        out.extend_from_slice(&v.window(at..next).await?);
        at = next;
    }
    Ok(Some(out.freeze()))
}

/// A reader yielding only verified bytes of `key` on `large` (see
/// `Store::open_range_verified`).
pub(crate) async fn reader_verified(
    large: &Arc<dyn Source>,
    key: &Key,
    offset: u64,
    len: u64,
) -> Result<Option<BlobReader>> {
    let Some(verifier) = verifier(large, key).await? else {
        return Ok(None);
    };
    let r = clamp_range(key, verifier.size, offset, len)?;
    let verifier = Arc::new(verifier);
    // Window edges on chunk-group multiples of WINDOW, so every window
    // but the first and last is whole; made as they are read (a size
    // claimed by a lying engine allocates nothing).
    let edges = futures::stream::unfold(r.start, move |at| async move {
        (at < r.end).then(|| {
            let next = ((at / WINDOW + 1) * WINDOW).min(r.end);
            (at..next, next)
        })
    });
    let stream = edges
        .map(move |w| {
            let v = verifier.clone();
            async move { v.window(w).await }
        })
        .buffered(AHEAD)
        .map_err(io_error);
    Ok(Some(Box::pin(tokio_util::io::StreamReader::new(stream))))
}

/// A verified read's error as the reader's I/O error: damage is
/// `InvalidData` (as `Store::open_read_verified` reports it).
fn io_error(e: Error) -> std::io::Error {
    if e.kind() == crate::ErrorKind::Corrupt {
        std::io::Error::new(std::io::ErrorKind::InvalidData, e)
    } else {
        std::io::Error::other(e)
    }
}
