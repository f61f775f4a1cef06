//! The server's side of verified streaming: a blob's range encoded from
//! its bytes (a kv-tier blob, held whole) or streamed a page at a time
//! from a [`Source`] (a large one), every pair and group checked against
//! the key before it is sent.

use std::io::{self, Write};
use std::ops::Range;
use std::sync::{Arc, Mutex};

use bao_tree::io::EncodeError;
use bao_tree::io::outboard::PostOrderOutboard;
use bao_tree::io::sync::{ReadAt, encode_ranges_validated};
use bytes::{Bytes, BytesMut};

use super::chunk_ranges;
use crate::integrity::Source;
use crate::integrity::outboard::{self, PAIR};
use crate::{Error, Key, Result};

/// A blob's encoded range, streaming.
pub struct Encoded {
    /// The blob's size (what [`super::decode`] needs besides the key and range).
    pub size: u64,
    /// The byte range encoded: the one asked for, clamped to the blob.
    pub range: Range<u64>,
    /// The encoding. An error ends it early: the blob or its outboard did
    /// not verify while it was encoded, and the rest is not sent.
    pub body: futures::stream::BoxStream<'static, io::Result<Bytes>>,
}

impl std::fmt::Debug for Encoded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoded")
            .field("size", &self.size)
            .field("range", &self.range)
            .finish_non_exhaustive()
    }
}

/// The encoding of `range` of `bytes` (a blob held whole: the kv tier's).
pub(crate) fn encode_bytes(bytes: &[u8], range: Range<u64>) -> Result<Vec<u8>> {
    let size = bytes.len() as u64;
    let (key, ob) = outboard::of(bytes);
    let ob = PostOrderOutboard {
        root: bao_tree::blake3::Hash::from_bytes(*key.as_bytes()),
        tree: outboard::tree(size),
        data: ob,
    };
    let mut out = Vec::new();
    encode_ranges_validated(bytes, ob, &chunk_ranges(size, range), &mut out)
        .map_err(|e| Error::engine("bao", format!("encoding {key}: {e}")))?;
    Ok(out)
}

/// Bytes of the blob read per engine call while encoding.
const DATA_PAGE: u64 = 4 << 20;
/// Bytes of the outboard read per engine call (the pairs of 16 MiB of
/// data); at most [`OUTBOARD_PAGES`] are kept.
const OUTBOARD_PAGE: u64 = 64 << 10;
const OUTBOARD_PAGES: usize = 32;
/// Encoded bytes handed to the response per message.
const SEND: usize = 256 << 10;

/// Streams the encoding of `range` of the large blob `key` (`size` bytes)
/// from `large`: a task reads the blob and its outboard a page at a time
/// (never more than a few MiB in memory), checks every pair and group
/// against the key before sending it, and sends the encoding. A blob
/// without a stored outboard is encoded from one computed by streaming it
/// whole once (as verified reads do). Damage found while encoding ends the
/// stream with an error (the response is cut short, never completed with
/// bad bytes) and is logged.
pub(crate) async fn encode_stream(
    large: Arc<dyn Source>,
    key: Key,
    size: u64,
    range: Range<u64>,
) -> Result<tokio::sync::mpsc::Receiver<io::Result<Bytes>>> {
    let tree = outboard::tree(size);
    let ob_len = tree.outboard_size();
    // The stored outboard, if it is there and ends in the root's pair.
    let stored = if ob_len == 0 {
        true
    } else if size <= large.outboard_floor() {
        false
    } else {
        match large.read_outboard(&key, ob_len - PAIR, PAIR).await {
            Ok(Some(b)) => b.len() as u64 == PAIR,
            Ok(None) | Err(Error::InvalidRange { .. }) => false,
            Err(e) => return Err(e),
        }
    };
    let computed = if stored {
        None
    } else {
        tracing::info!(%key, engine = %large, "no stored outboard: computing one for a bao response (alkblobs verify --repair-outboards stores it)");
        Some(crate::integrity::verified::computed_outboard(large.as_ref(), &key, size).await?)
    };
    let handle = tokio::runtime::Handle::current();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let engine = large.to_string();
    let fetch = |of_outboard: bool| {
        let (large, handle) = (large.clone(), handle.clone());
        move |w: Range<u64>| -> io::Result<Bytes> {
            let got = handle.block_on(async {
                if of_outboard {
                    large.read_outboard(&key, w.start, w.end - w.start).await
                } else {
                    large.read_range(&key, w.start, w.end - w.start).await
                }
            });
            match got {
                Ok(Some(b)) => Ok(b),
                Ok(None) => Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{key} is gone"),
                )),
                Err(e) => Err(io::Error::other(e)),
            }
        }
    };
    let data = Paged::new(size, DATA_PAGE, 2, fetch(false));
    let ob_data = match computed {
        Some(b) => Outboard::Mem(b),
        None => Outboard::Paged(Paged::new(
            ob_len,
            OUTBOARD_PAGE,
            OUTBOARD_PAGES,
            fetch(true),
        )),
    };
    let ob = PostOrderOutboard {
        root: bao_tree::blake3::Hash::from_bytes(*key.as_bytes()),
        tree,
        data: ob_data,
    };
    let ranges = chunk_ranges(size, range);
    tokio::task::spawn_blocking(move || {
        let mut w = ChannelWriter {
            tx: tx.clone(),
            buf: BytesMut::with_capacity(SEND),
        };
        let r = encode_ranges_validated(data, ob, &ranges, &mut w).and_then(|()| {
            w.send().map_err(EncodeError::Io)?;
            Ok(())
        });
        if let Err(e) = r {
            let gone = matches!(&e, EncodeError::Io(io) if io.kind() == io::ErrorKind::BrokenPipe);
            if !gone {
                tracing::warn!(%key, engine, error = %e,
                    "a bao response was cut short: the blob or its stored outboard does not verify (alkblobs verify says which)");
                let _ = tx.blocking_send(Err(io::Error::other(format!("encoding {key}: {e}"))));
            }
        }
    });
    Ok(rx)
}

/// A `Write` handing what it is given to a response, [`SEND`] bytes at a
/// time; `BrokenPipe` once the response is gone.
struct ChannelWriter {
    tx: tokio::sync::mpsc::Sender<io::Result<Bytes>>,
    buf: BytesMut,
}

impl ChannelWriter {
    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = self.buf.split().freeze();
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the client went away"))
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(b);
        if self.buf.len() >= SEND {
            self.send()?;
        }
        Ok(b.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

type Fetch = Box<dyn Fn(Range<u64>) -> io::Result<Bytes> + Send + Sync>;

/// Positioned reads over an engine, a page at a time, the last `keep`
/// pages kept (the encoder reads the blob forwards and the outboard near
/// where it last read).
struct Paged {
    len: u64,
    page: u64,
    keep: usize,
    fetch: Fetch,
    pages: Mutex<Vec<(u64, Bytes)>>,
}

impl Paged {
    fn new(
        len: u64,
        page: u64,
        keep: usize,
        fetch: impl Fn(Range<u64>) -> io::Result<Bytes> + Send + Sync + 'static,
    ) -> Paged {
        Paged {
            len,
            page,
            keep,
            fetch: Box::new(fetch),
            pages: Mutex::new(Vec::new()),
        }
    }

    fn page_at(&self, start: u64) -> io::Result<Bytes> {
        let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = pages.iter().position(|(s, _)| *s == start) {
            let p = pages.remove(i);
            pages.push(p.clone());
            return Ok(p.1);
        }
        let want = start..(start + self.page).min(self.len);
        let got = (self.fetch)(want.clone())?;
        if (got.len() as u64) < want.end - want.start {
            // Shorter than the size recorded: the encoder reports the
            // group (or pair) that cannot be read.
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{} bytes at {start}, wanted {}",
                    got.len(),
                    want.end - want.start
                ),
            ));
        }
        if pages.len() >= self.keep {
            pages.remove(0);
        }
        pages.push((start, got.clone()));
        Ok(got)
    }
}

impl ReadAt for Paged {
    fn read_at(&self, pos: u64, buf: &mut [u8]) -> io::Result<usize> {
        if pos >= self.len || buf.is_empty() {
            return Ok(0);
        }
        let start = pos / self.page * self.page;
        let page = self.page_at(start)?;
        let from = (pos - start) as usize;
        let n = buf.len().min(page.len() - from);
        buf[..n].copy_from_slice(&page[from..from + n]);
        Ok(n)
    }
}

impl bao_tree::io::sync::Size for Paged {
    fn size(&self) -> io::Result<Option<u64>> {
        Ok(Some(self.len))
    }
}

/// An outboard read through the engine, or computed and held whole.
enum Outboard {
    Paged(Paged),
    Mem(Bytes),
}

impl ReadAt for Outboard {
    fn read_at(&self, pos: u64, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Outboard::Paged(p) => p.read_at(pos, buf),
            Outboard::Mem(b) => b.as_ref().read_at(pos, buf),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::decode;
    use super::*;
    use crate::integrity::BlobReader;
    use proptest::prelude::*;

    /// `n` bytes no window of which repeats.
    fn blob(n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        bao_tree::blake3::Hasher::new()
            .update(b"bao tests")
            .finalize_xof()
            .fill(&mut v);
        v
    }

    /// One blob and its stored outboard, as an engine would hand them out
    /// (either can be damaged).
    struct Held(Mutex<(Bytes, Option<Bytes>)>);

    impl std::fmt::Display for Held {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("held")
        }
    }

    impl Held {
        fn bytes(&self) -> Bytes {
            self.0.lock().unwrap().0.clone()
        }
        fn set_bytes(&self, b: Bytes) {
            self.0.lock().unwrap().0 = b;
        }
        fn set_outboard(&self, b: Bytes) {
            self.0.lock().unwrap().1 = Some(b);
        }
    }

    fn window(b: &Bytes, offset: u64, len: u64) -> Result<Bytes> {
        let r = crate::integrity::clamp_range(&Key::of(b""), b.len() as u64, offset, len)?;
        Ok(b.slice(r.start as usize..r.end as usize))
    }

    #[async_trait::async_trait]
    impl Source for Held {
        async fn size(&self, _key: &Key) -> Result<Option<u64>> {
            Ok(Some(self.bytes().len() as u64))
        }
        async fn open_read(&self, _key: &Key) -> Result<Option<BlobReader>> {
            Ok(Some(Box::pin(std::io::Cursor::new(self.bytes()))))
        }
        async fn read_range(&self, _key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
            window(&self.bytes(), offset, len).map(Some)
        }
        async fn read_outboard(&self, _key: &Key, offset: u64, len: u64) -> Result<Option<Bytes>> {
            let ob = self.0.lock().unwrap().1.clone();
            ob.map(|ob| window(&ob, offset, len)).transpose()
        }
        async fn read_outboard_windows(
            &self,
            key: &Key,
            windows: &[Range<u64>],
        ) -> Result<Option<Vec<Bytes>>> {
            let mut out = Vec::new();
            for w in windows {
                match self.read_outboard(key, w.start, w.end - w.start).await? {
                    Some(b) => out.push(b),
                    None => return Ok(None),
                }
            }
            Ok(Some(out))
        }
        fn outboard_floor(&self) -> u64 {
            0
        }
    }

    /// A source holding `bytes` (with its outboard unless `bare`).
    async fn engine(bytes: &[u8], bare: bool) -> (Arc<dyn Source>, Arc<Held>, Key) {
        let (key, ob) = outboard::of(bytes);
        let held = Arc::new(Held(Mutex::new((
            Bytes::copy_from_slice(bytes),
            (!bare).then(|| Bytes::from(ob)),
        ))));
        (held.clone(), held, key)
    }

    async fn streamed(
        large: Arc<dyn Source>,
        key: Key,
        size: u64,
        r: Range<u64>,
    ) -> io::Result<Vec<u8>> {
        let mut rx = encode_stream(large, key, size, r).await.unwrap();
        let mut out = Vec::new();
        while let Some(c) = rx.recv().await {
            out.extend_from_slice(&c?);
        }
        Ok(out)
    }

    /// The streamed encoder (paging the blob and its outboard through an
    /// engine) writes what bao-tree writes from the whole blob in memory,
    /// across pages of both, with and without a stored outboard; and the
    /// decoder returns exactly the range.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn streamed_encodings_are_bao_trees_and_decode_to_the_range() {
        // Over 16 MiB: the outboard spans two of its pages.
        let big = 17 * (1 << 20) + 3 * 1024 + 5;
        for n in [
            0usize,
            1,
            1024,
            1025,
            16 * 1024,
            16 * 1024 + 1,
            5 * 16 * 1024 + 7,
            big,
        ] {
            let bytes = blob(n);
            let size = n as u64;
            let ranges = [
                0..size,
                0..1,
                size / 3..size / 3 + 1,
                size / 2..size,
                size.saturating_sub(1)..size,
                size / 5..(size / 5 + (4 << 20) + 3).min(size),
                size..size,
            ];
            for bare in [false, true] {
                let (large, _, key) = engine(&bytes, bare).await;
                for r in ranges.clone() {
                    let want = encode_bytes(&bytes, r.clone()).unwrap();
                    let got = streamed(large.clone(), key, size, r.clone()).await.unwrap();
                    assert!(
                        got == want,
                        "size {n} range {r:?} bare {bare}: the encodings differ"
                    );
                    let back = decode(&key, size, r.clone(), &got[..]).unwrap();
                    let end = r.end.min(size) as usize;
                    assert_eq!(
                        &back[..],
                        &bytes[r.start as usize..end],
                        "size {n} range {r:?}"
                    );
                }
            }
        }
    }

    proptest! {
        // (No persisted failures: a mutation run would leave files.)
        #![proptest_config(ProptestConfig {
            cases: 64,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// Any byte of an encoding changed, any cut, anything appended, a
        /// wrong size or another key: the decoder refuses (never returns
        /// the range's bytes).
        #[test]
        fn any_damage_is_refused(
            n in 1usize..200_000,
            a in 0u64..200_000,
            len in 0u64..100_000,
            flip in any::<prop::sample::Index>(),
            cut in any::<prop::sample::Index>(),
        ) {
            let bytes = blob(n);
            let size = n as u64;
            let start = a % size;
            let r = start..(start + len).min(size);
            let (key, _) = outboard::of(&bytes);
            let enc = encode_bytes(&bytes, r.clone()).unwrap();
            prop_assert_eq!(&decode(&key, size, r.clone(), &enc[..]).unwrap()[..], &bytes[r.start as usize..r.end as usize]);

            let mut bad = enc.clone();
            bad[flip.index(enc.len())] ^= 0x40;
            let e = decode(&key, size, r.clone(), &bad[..]).unwrap_err();
            prop_assert!(matches!(e, Error::CorruptAt { .. }), "{e}");

            let short = &enc[..cut.index(enc.len())];
            prop_assert!(decode(&key, size, r.clone(), short).is_err());
            let mut long = enc.clone();
            long.push(0);
            prop_assert!(decode(&key, size, r.clone(), &long[..]).is_err());
            for lie in [size - 1, size + 1, size + 16 * 1024, size * 2] {
                if lie >= r.end {
                    prop_assert!(decode(&key, lie, r.clone(), &enc[..]).is_err(), "size {} taken for {}", lie, size);
                }
            }
            let other = Key::of(b"another");
            prop_assert!(decode(&other, size, r.clone(), &enc[..]).is_err());
        }
    }

    /// A flipped byte of the blob is named by the decoder at its chunk.
    #[test]
    fn damage_is_named_at_its_chunk() {
        let bytes = blob(200_000);
        let size = bytes.len() as u64;
        let (key, _) = outboard::of(&bytes);
        let r = 50_000..150_000;
        // A lying server's encoding: the honest one with a byte of one
        // group changed.
        let enc = encode_bytes(&bytes, r.clone()).unwrap();
        let honest = decode(&key, size, r.clone(), &enc[..]).unwrap();
        let pos = enc
            .windows(64)
            .position(|w| w == &bytes[100_000 - 32..100_000 + 32])
            .expect("the group's bytes are in the encoding");
        let mut bad = enc.clone();
        bad[pos + 32] ^= 1;
        match decode(&key, size, r.clone(), &bad[..]).unwrap_err() {
            Error::CorruptAt { offset, .. } => {
                assert!(
                    offset <= 100_000 && 100_000 < offset + 16 * 1024,
                    "{offset}"
                )
            }
            e => panic!("{e}"),
        }
        assert_eq!(honest.len(), 100_000);
    }

    /// A stored outboard damaged, or the blob under it: the stream ends
    /// with an error rather than completing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn damage_found_while_encoding_cuts_the_stream() {
        let bytes = blob(300_000);
        let size = bytes.len() as u64;
        let (large, mem, key) = engine(&bytes, false).await;
        let mut bad = bytes.clone();
        bad[200_000] ^= 1;
        mem.set_bytes(Bytes::from(bad));
        assert!(streamed(large.clone(), key, size, 0..size).await.is_err());
        // Away from the damage, a range still encodes.
        let ok = streamed(large, key, size, 0..1000).await.unwrap();
        assert_eq!(
            &decode(&key, size, 0..1000, &ok[..]).unwrap()[..],
            &bytes[..1000]
        );

        let (large, mem, key) = engine(&bytes, false).await;
        let (_, mut ob) = outboard::of(&bytes);
        ob[0] ^= 1;
        mem.set_outboard(Bytes::from(ob));
        assert!(streamed(large, key, size, 0..size).await.is_err());
    }
}
