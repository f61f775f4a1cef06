//! Verified streaming: a byte range of a blob in BLAKE3's tree encoding
//! ("bao"), so a client checks every byte it receives against the key as
//! it arrives, trusting neither the server nor the network.
//!
//! The encoding is `bao-tree`'s (iroh-blobs speaks it too), with the
//! outboard's 16 KiB chunk groups ([`crate::outboard`]): in the tree's pre
//! order, each parent node on the way to the requested chunks as its two
//! children's chaining values (64 bytes), and each chunk group the range
//! touches as its bytes (a group the range covers only partly as the
//! chunks it needs with the pairs above them inside the group). Decoding
//! needs the key, the blob's size and the range asked for: the stream
//! carries nothing else.
//!
//! The ranges encoded are the 1 KiB chunks covering the byte range, and
//! always the blob's last chunk: BLAKE3 hashes a chunk with its position
//! and length, so the last chunk verifying proves the size a server
//! claimed (a smaller or larger size changes the tree). That costs at most
//! one chunk and one path of pairs.
//!
//! - [`chunk_ranges`]: what a range encodes, for both sides.
//! - [`decode`] (`decode.rs`): a client's side, for any [`std::io::Read`].
//! - `encode.rs`: a server's side, from a blob's bytes or streamed from a
//!   a source (an engine) in bounded memory. `alkblobs serve` answers
//!   `GET /blobs/{key}/bao?range=START-END` with it, through
//!   `Store::bao_encode`, which picks the tier's way.

use std::ops::Range;

use bao_tree::{ChunkNum, ChunkRanges};

mod decode;
pub(crate) mod encode;

pub use decode::decode;
pub use encode::Encoded;

/// The media type of an encoded response.
pub const MEDIA_TYPE: &str = "application/x-bao";

/// The chunks the encoding of `range` (bytes, clamped to the blob) of a
/// blob of `size` bytes carries: those covering the range, and the last
/// chunk (which binds the size).
pub fn chunk_ranges(size: u64, range: Range<u64>) -> ChunkRanges {
    let end = range.end.min(size);
    let start = range.start.min(end);
    let last = ChunkNum::chunks(size).0.saturating_sub(1);
    let mut r = ChunkRanges::from(ChunkNum(last)..ChunkNum(last + 1));
    if start < end {
        r |= ChunkRanges::from(ChunkNum::full_chunks(start)..ChunkNum::chunks(end));
    }
    r
}
