//! The client's side of verified streaming: a bao stream checked against
//! the key as it is read.

use std::io::{self, Read};
use std::ops::Range;

use bao_tree::io::sync::DecodeResponseIter;
use bao_tree::io::{BaoContentItem, DecodeError};
use bytes::{Bytes, BytesMut};

use super::chunk_ranges;
use crate::integrity::outboard;
use crate::{Error, Key, Result};

/// Decodes `encoded`, the encoding of `range` of the blob `key` of `size`
/// bytes, checking every pair and chunk against the key as it is read,
/// and returns the range's bytes.
///
/// # Errors
/// - [`Error::CorruptAt`] (engine `"bao stream"`) at the first byte that
///   does not verify: a flipped byte, another blob's bytes, a wrong size,
///   a stream cut short, or bytes after its end;
/// - [`Error::InvalidRange`] when `range` starts past `size`;
/// - [`Error::Input`] when reading `encoded` fails.
///
/// Memory is the range's length, whatever the stream sends.
pub fn decode(key: &Key, size: u64, range: Range<u64>, mut encoded: impl Read) -> Result<Bytes> {
    if range.start > size {
        return Err(Error::InvalidRange {
            key: *key,
            offset: range.start,
            size,
        });
    }
    let want = range.start..range.end.min(size).max(range.start);
    let ranges = chunk_ranges(size, want.clone());
    let root = bao_tree::blake3::Hash::from_bytes(*key.as_bytes());
    let corrupt = |offset: u64| Error::CorruptAt {
        key: *key,
        engine: "bao stream".into(),
        offset,
    };
    let mut out = BytesMut::zeroed((want.end - want.start) as usize);
    let items = DecodeResponseIter::new(root, outboard::tree(size), &mut encoded, &ranges);
    for item in items {
        match item {
            Ok(BaoContentItem::Parent(_)) => {}
            Ok(BaoContentItem::Leaf(leaf)) => {
                let at = leaf.offset;
                let from = at.max(want.start);
                let to = (at + leaf.data.len() as u64).min(want.end);
                if from < to {
                    out[(from - want.start) as usize..(to - want.start) as usize]
                        .copy_from_slice(&leaf.data[(from - at) as usize..(to - at) as usize]);
                }
            }
            Err(DecodeError::Io(e)) if e.kind() != io::ErrorKind::UnexpectedEof => {
                return Err(Error::Input {
                    what: "a bao stream".into(),
                    source: e,
                });
            }
            Err(e) => return Err(corrupt(decode_error_offset(&e, want.start))),
        }
    }
    // Nothing may follow the encoding.
    let mut extra = [0u8; 1];
    match encoded.read(&mut extra) {
        Ok(0) => Ok(out.freeze()),
        Ok(_) => Err(corrupt(size)),
        Err(e) => Err(Error::Input {
            what: "a bao stream".into(),
            source: e,
        }),
    }
}

/// The first byte a decoding error concerns.
fn decode_error_offset(e: &DecodeError, otherwise: u64) -> u64 {
    match e {
        DecodeError::ParentNotFound(n) | DecodeError::ParentHashMismatch(n) => {
            n.chunk_range().start.to_bytes()
        }
        DecodeError::LeafNotFound(c) | DecodeError::LeafHashMismatch(c) => c.to_bytes(),
        DecodeError::Io(_) => otherwise,
    }
}
